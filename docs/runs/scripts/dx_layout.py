"""The backward's input gradients dX = sum_i dY_i W_i with the dequantised weight in each of two layouts
(2026-11-27_h100d.sh): W row-major [out x in] as lorabench.fast.fused runs them (cuBLAS reads B along N), and W^T
[in x out] row-major, passed as its [out x in] view (B read along K, the forward's layout), which `dequantize_t`
below writes directly (a Triton kernel: lorabench.fast.kernels.nf4' arithmetic, another layout of its output).
Qwen2.5-7B's and Llama-3.1-8B's decoder-layer shapes, bf16, at 4,096 rows (issue 34's batch 4 x 1,024) and
16,384; with the forward's GEMMs for reference. Then the nf4 dequantisation of each weight shape into each layout
(double-quantised as QLoRA stores them), both checked bit for bit against bitsandbytes. Median of 30 calls (CUDA
events, after 5 warm-up calls: a small kernel's time includes its launch from Python). Prints markdown tables."""
import bitsandbytes.functional as bnbf
import torch
import triton
import triton.language as tl
from cuda_timing import median_ms

from lorabench.fast.kernels import nf4 as nf4_kernels


@triton.jit
def _nf4_t_kernel(q_ptr, absmax_ptr, table_ptr, out_ptr, n_out, n_in, code2_ptr, absmax2_ptr, offset_ptr,
                  BLOCKSIZE: tl.constexpr, BLOCKSIZE2: tl.constexpr, NESTED: tl.constexpr, BO: tl.constexpr,
                  BI: tl.constexpr):
    # One [BO x BI] tile of W [out x in] (BI whole quantisation blocks of a row), stored as its transpose into
    # W^T [in x out]: the same codes, scales and arithmetic as _nf4_kernel, another layout of the output.
    HALF: tl.constexpr = BI // 2  # packed bytes of the tile's row
    rows = tl.program_id(0).to(tl.int64) * BO + tl.arange(0, BO)
    col0 = tl.program_id(1).to(tl.int64) * BI
    byte = (rows[:, None] * n_in + col0) // 2 + tl.arange(0, HALF)[None, :]  # [BO x HALF]
    inside = rows[:, None] < n_out
    q = tl.load(q_ptr + byte, mask=inside, other=0).to(tl.int32)
    block = byte * 2 // BLOCKSIZE  # each byte's two weights lie in one block (BLOCKSIZE is even)
    if NESTED:
        code = tl.load(absmax_ptr + block, mask=inside, other=0).to(tl.int32)
        scale = tl.load(code2_ptr + code) * tl.load(absmax2_ptr + block // BLOCKSIZE2, mask=inside, other=0.0)
        scale = scale + tl.load(offset_ptr)
    else:
        scale = tl.load(absmax_ptr + block, mask=inside, other=0.0)
    hi = tl.load(table_ptr + (q >> 4)) * scale
    lo = tl.load(table_ptr + (q & 15)) * scale
    w = tl.interleave(hi, lo).to(out_ptr.dtype.element_ty)  # [BO x BI]: weight 2j is byte j's high nibble
    cols = col0 + tl.arange(0, BI)
    tl.store(out_ptr + cols[:, None] * n_out + rows[None, :], tl.trans(w), mask=rows[None, :] < n_out)


def dequantize_t(weight: torch.Tensor, state, keep_absmax: bool = False) -> torch.Tensor:
    """`nf4_kernels.dequantize(weight, state).t()` with the transpose's own layout: W^T [in x out] contiguous,
    returned as its [out x in] view (strides 1, out), so that dX = dY @ that view reads both operands along K, as
    the forward's GEMM does."""
    absmax, nest, blocksize2 = nf4_kernels._scales(weight, state, keep_absmax)
    n_out, n_in = state.shape
    out = torch.empty(n_in, n_out, dtype=state.dtype, device=weight.device)
    table = state.code.to(device=weight.device, dtype=torch.float32)
    bo, bi = 64, 128
    _nf4_t_kernel[(triton.cdiv(n_out, bo), n_in // bi)](
        weight.reshape(-1), absmax, table, out, n_out, n_in, *nest, BLOCKSIZE=state.blocksize, BLOCKSIZE2=blocksize2,
        NESTED=blocksize2 > 1, BO=bo, BI=bi, enable_fp_fusion=False)
    return out.t()


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
        same = (torch.equal(nf4_kernels.dequantize(q, state), ref), torch.equal(dequantize_t(q, state), ref))
        moved = shape[0] * shape[1] * 2.5  # bytes: 0.5 packed read, 2 written
        for label, fn, ok in (("dequantize (W)", lambda: nf4_kernels.dequantize(q, state), same[0]),
                              ("dequantize_t (W^T)", lambda: dequantize_t(q, state), same[1])):
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
