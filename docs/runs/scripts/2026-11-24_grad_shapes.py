"""Issue 19, sixth round: one layer's backward input gradients at b48 x 512 rows (Mistral-7B, LoRA r16
on q/k/v/o), as cuBLAS ran them in the fifth round (a chain of addmm_ into dX, then Liger's SwiGLU
backward) and as lorabench.fast.kernels.grad runs them (one Triton GEMM per group), with 128- and
256-wide tiles. Prints ms per group and the layer's sum.
  python docs/runs/scripts/2026-11-24_grad_shapes.py"""
import torch

import cuda_timing as timing  # beside this script
from liger_kernel.ops.swiglu import swiglu_backward

from lorabench.fast.kernels import grad as grad_kernels

M, H, KV, FF, R = 48 * 512, 4096, 1024, 14336, 16
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)



def ms(fn, n=10):
    return timing.ms(fn, n, warmup=2)


def rnd(*shape):
    return torch.randn(*shape, device=dev, dtype=dt) / shape[-1] ** 0.5


def chain(pairs):
    dx = pairs[0][0] @ pairs[0][1]
    for a, b in pairs[1:]:
        dx.addmm_(a, b)
    return dx


groups = {
    "q|k|v + G A (r 3x16)": [(rnd(M, H), rnd(H, H)), (rnd(M, KV), rnd(KV, H)), (rnd(M, KV), rnd(KV, H)),
                             (rnd(M, 3 * R), rnd(3 * R, H))],
    "o + G A (r 16)": [(rnd(M, H), rnd(H, H)), (rnd(M, R), rnd(R, H))],
    "gate|up": [(rnd(M, FF), rnd(FF, H)), (rnd(M, FF), rnd(FF, H))],
}
g0, u0 = rnd(M, FF), rnd(M, FF)
g, u = g0.clone(), u0.clone()
down = [(rnd(M, H), rnd(H, FF))]
t_copy = ms(lambda: (g.copy_(g0), u.copy_(u0)))
print(torch.cuda.get_device_name(), f"(copies of G and U taken out: {t_copy:.3f} ms)")
total = {"cuBLAS": 0.0, "Triton 128": 0.0, "Triton 256": 0.0}
for name, pairs in groups.items():
    row = {"cuBLAS": ms(lambda: chain(pairs))}
    for bn in (128, 256):
        grad_kernels._bn = lambda n, bn=bn: bn
        row[f"Triton {bn}"] = ms(lambda: grad_kernels.input_grad(pairs))
    print(f"{name:22s} " + "  ".join(f"{k} {v:.3f} ms" for k, v in row.items()), flush=True)
    for k in total:
        total[k] += row[k]
row = {"cuBLAS": ms(lambda: (g.copy_(g0), u.copy_(u0), swiglu_backward(g, u, down[0][0] @ down[0][1]))) - t_copy}
for bn in (128, 256):
    grad_kernels._bn = lambda n, bn=bn: bn
    row[f"Triton {bn}"] = ms(lambda: (g.copy_(g0), u.copy_(u0), grad_kernels.input_grad(down, swiglu=(g, u)))) - t_copy
print(f"{'down + SwiGLU bwd':22s} " + "  ".join(f"{k} {v:.3f} ms" for k, v in row.items()))
for k in total:
    total[k] += row[k]
print("one layer: " + "  ".join(f"{k} {v:.3f} ms" for k, v in total.items()))
