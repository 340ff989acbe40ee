"""The backward's input gradients dX = sum_i dY_i W_i with the dequantised weight in each of two layouts
(2026-11-27_h100d.sh): W row-major [out x in] as lorabench.fused has run them (cuBLAS reads B along N), and W^T
[in x out] row-major, passed as its [out x in] view (B read along K, the forward's layout), which
nf4_kernels.dequantize_t writes directly. Qwen2.5-7B's and Llama-3.1-8B's decoder-layer shapes, bf16, at 4,096 rows
(issue 34's batch 4 x 1,024) and 16,384; with the forward's GEMMs for reference. Then the nf4 dequantisation of
each weight shape into each layout (double-quantised as QLoRA stores them), both checked bit for bit against
bitsandbytes. Median of 30 calls (CUDA events, after 5 warm-up calls). Prints markdown tables."""
import bitsandbytes.functional as bnbf
import torch
import triton
from cuda_timing import median_ms

from lorabench import nf4_kernels


def chain(pairs):
    dx = None
    for a, b in pairs:
        dx = a @ b if dx is None else dx.addmm_(a, b)
    return dx


def gemms(m, h, kv, inter, dev):
    t = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16) * 0.02  # noqa: E731
    w = {"q": t(h, h), "k": t(kv, h), "v": t(kv, h), "o": t(h, h), "gate": t(inter, h), "up": t(inter, h),
         "down": t(h, inter)}
    wt = {k: v.t().contiguous().t() for k, v in w.items()}  # the same values, W^T's layout
    dy = {k: t(m, v.shape[0]) for k, v in w.items()}
    x, xi = t(m, h), t(m, inter)
    groups = {"q/k/v": ("q", "k", "v"), "o": ("o",), "gate/up": ("gate", "up"), "down (dH)": ("down",)}
    rows = []
    for g, names in groups.items():
        flops = sum(2 * m * w[n].shape[0] * w[n].shape[1] for n in names)
        for layout, ws in (("W row-major (as is)", w), ("W^T row-major, its view", wt)):
            fn = lambda ws=ws, names=names: chain([(dy[n], ws[n]) for n in names])  # noqa: E731
            rows.append((f"{g} dX, {layout}", median_ms(fn), flops))
        ref = x if g != "down (dH)" else xi
        fwd = lambda names=names, ref=ref: [ref @ w[n].t() for n in names]  # noqa: E731
        if g == "down (dH)":
            fwd = lambda: xi @ w["down"].t()  # noqa: E731
        rows.append((f"{g} forward (reference)", median_ms(fwd), flops))
    return rows


def dequants(h, kv, inter, dev):
    rows = []
    for name, shape in {"q/o": (h, h), "k/v": (kv, h), "gate/up": (inter, h), "down": (h, inter)}.items():
        q, state = bnbf.quantize_4bit(torch.randn(shape, device=dev, dtype=torch.bfloat16) * 0.02, quant_type="nf4",
                                      compress_statistics=True)
        ref = bnbf.dequantize_4bit(q, state)
        same = (torch.equal(nf4_kernels.dequantize(q, state), ref), torch.equal(nf4_kernels.dequantize_t(q, state), ref))
        moved = shape[0] * shape[1] * 2.5  # bytes: 0.5 packed read, 2 written
        for label, fn, ok in (("dequantize (W)", lambda: nf4_kernels.dequantize(q, state), same[0]),
                              ("dequantize_t (W^T)", lambda: nf4_kernels.dequantize_t(q, state), same[1])):
            ms = median_ms(fn)
            rows.append((f"{name} {shape[0]}x{shape[1]}, {label}", ms, moved / ms / 1e6, ok))
    return rows


def main():
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for name, (h, kv, inter) in {"qwen2.5-7b": (3584, 512, 18944), "llama-3.1-8b": (4096, 1024, 14336)}.items():
        for m in (4096, 16384):
            print(f"\n| {name}, {m} rows | ms | TFLOP/s |\n|---|---|---|")
            for label, ms, flops in gemms(m, h, kv, inter, dev):
                print(f"| {label} | {ms:.3f} | {flops / ms / 1e9:,.0f} |")
        print(f"\n| {name} nf4 dequantisation | ms | GB/s | bits equal to bitsandbytes |\n|---|---|---|---|")
        for label, ms, gbs, ok in dequants(h, kv, inter, dev):
            print(f"| {label} | {ms:.4f} | {gbs:,.0f} | {ok} |")


if __name__ == "__main__":
    main()
