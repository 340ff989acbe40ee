"""A decoder layer's GEMMs at batch 4 x 1,024 tokens, each way lorabench.fast.fused could run them (2026-11-27_searched.sh).

Qwen2.5-7B's and Llama-3.1-8B's shapes, bf16, on the GPU: the attention's input gradients (q, k, v with the
adapters' term; o) as lorabench.fast.kernels.grad' Triton GEMM with its 128 x 256 tiles and with 128 x 128 (more tiles
per wave where the output is small), and as cuBLAS; the MLP's gate and up as two GEMMs or one over both weights
(forward: N = 2 x intermediate; backward: K = 2 x intermediate, where dG and dU lie side by side). Median of 30
calls (CUDA events, after 5 warm-up calls), with TFLOP/s. Prints one markdown table per model."""
import torch
from cuda_timing import median_ms

from lorabench.fast.kernels import grad as grad_kernels


def triton_bn(bn):
    def run(pairs):
        old = grad_kernels._bn
        grad_kernels._bn = lambda n: bn
        try:
            return grad_kernels.input_grad(pairs)
        finally:
            grad_kernels._bn = old
    return run


def chain(pairs):
    dx = None
    for a, b in pairs:
        dx = a @ b if dx is None else dx.addmm_(a, b)
    return dx


def main():
    dev, bf = torch.device("cuda"), torch.bfloat16
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    m, r = 4096, 16
    for name, (h, kv, inter) in {"qwen2.5-7b": (3584, 512, 18944), "llama-3.1-8b": (4096, 1024, 14336)}.items():
        t = lambda *s: torch.randn(*s, device=dev, dtype=bf) * 0.02  # noqa: E731
        dq, dk, dv, g, do = t(m, h), t(m, kv), t(m, kv), t(m, 3 * r), t(m, h)
        wq, wk, wv, a, wo = t(h, h), t(kv, h), t(kv, h), t(3 * r, h), t(h, h)
        x, wg, wu = t(m, h), t(inter, h), t(inter, h)
        wgu = torch.cat([wg, wu])
        dgu = t(m, 2 * inter)
        dg, du = dgu[:, :inter].contiguous(), dgu[:, inter:].contiguous()
        qkv = [(dq, wq), (dk, wk), (dv, wv), (g, a)]
        flops_qkv = 2 * m * h * (h + 2 * kv + 3 * r)
        flops_o, flops_mlp = 2 * m * h * h, 2 * m * h * 2 * inter
        rows = [
            ("q/k/v dX, Triton 128 x 256 (as is)", lambda: triton_bn(256)(qkv), flops_qkv),
            ("q/k/v dX, Triton 128 x 128", lambda: triton_bn(128)(qkv), flops_qkv),
            ("q/k/v dX, cuBLAS mm + 3 addmm_", lambda: chain(qkv), flops_qkv),
            ("o dX, Triton 128 x 256 (as is)", lambda: triton_bn(256)([(do, wo)]), flops_o),
            ("o dX, Triton 128 x 128", lambda: triton_bn(128)([(do, wo)]), flops_o),
            ("o dX, cuBLAS mm", lambda: do @ wo, flops_o),
            ("gate, up forward: two GEMMs (as is)", lambda: (x @ wg.t(), x @ wu.t()), flops_mlp),
            ("gate, up forward: one GEMM over both", lambda: x @ wgu.t(), flops_mlp),
            ("gate, up dX: mm + addmm_ (as is)", lambda: chain([(dg, wg), (du, wu)]), flops_mlp),
            ("gate, up dX: one GEMM, K = 2 x intermediate", lambda: dgu @ wgu, flops_mlp),
            ("gate, up dX: Triton 128 x 256, two pairs", lambda: triton_bn(256)([(dg, wg), (du, wu)]), flops_mlp),
        ]
        print(f"\n| {name}, {m} tokens | ms | TFLOP/s |\n|---|---|---|")
        for label, fn, flops in rows:
            ms = median_ms(fn)
            print(f"| {label} | {ms:.3f} | {flops / ms / 1e9:,.0f} |")


if __name__ == "__main__":
    main()
