"""Host time per call of the operations a fast-path decoder layer launches, on the GPU (2026-11-26_host.sh).

Each operation runs on small tensors (64 tokens: the device finishes it long before the host launches the
next), 200 times after 20 warm-up calls; the figure is the host's wall time per call (time.perf_counter
around the 200 calls, the device synchronised before the clock starts and after it stops, so a call that waits
for the device counts its wait). The Triton kernels (lorabench's and Liger's RMSNorm) are timed again with
backend.lean_launch's launch (lorabench.fast.lean_launch), Liger's RMSNorm module of a frozen weight also with
backend.norm_backward_grid's launch, and the adapter's cast against flat_optim's copy cast once a step. Prints one markdown table: operation, us per call."""
import functools
import sys
import time

import bitsandbytes.functional as bnbf
import torch
import torch.nn.functional as F

from lorabench.fast.kernels import dropout as dropout_kernels, nf4 as nf4_kernels, norm as norm_kernels
from lorabench.fast import flat_optim, lean_launch

dev, bf = torch.device("cuda"), torch.bfloat16
x = torch.randn(64, 3584, device=dev, dtype=bf)
w = torch.randn(512, 3584, device=dev, dtype=bf)
q, state = bnbf.quantize_4bit(w, quant_type="nf4", compress_statistics=True)
a32 = torch.randn(16, 3584, device=dev)
q4 = torch.randn(1, 28, 64, 128, device=dev, dtype=bf)
k4 = torch.randn(1, 4, 64, 128, device=dev, dtype=bf)
cpu_gen = torch.Generator().manual_seed(0)
p32 = torch.nn.Parameter(torch.randn(16, 3584, device=dev))
flat_optim.flatten(torch.optim.AdamW([p32, torch.nn.Parameter(torch.randn(16, 3584, device=dev))]))
norm_w = torch.ones(3584, device=dev, dtype=bf)


def liger_rms_norm():
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return LigerRMSNormFunction.apply(x, norm_w, 1e-6, 0.0, "llama", False)


def liger_norm_module():
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    return LigerRMSNorm(3584).to(dev, bf).requires_grad_(False)

ops = {
    "torch.mm [64x3584] @ [3584x512]": lambda: x @ w.t(),
    "tensor.add_ (aten elementwise)": lambda: x.add_(0.0),
    "a32.to(bf16) (an fp32 adapter cast)": lambda: a32.to(bf),
    "torch.empty [64x3584]": lambda: torch.empty(64, 3584, device=dev, dtype=bf),
    "int(torch.randint(...)) on the host": lambda: int(torch.randint(2**31 - 1, (1,), generator=cpu_gen)),
    "nf4_kernels.dequantize (Triton)": lambda: nf4_kernels.dequantize(q, state),
    "bitsandbytes dequantize_4bit": lambda: bnbf.dequantize_4bit(q, state),
    "dropout_kernels.dropout (Triton)": lambda: dropout_kernels.dropout(x, 1234, 0.05),
    "SDPA causal, GQA 28/4 heads": lambda: F.scaled_dot_product_attention(q4, k4, k4, is_causal=True, enable_gqa=True),
    "flat_optim.low(p, bf16) (its copy, cast once a step)": lambda: flat_optim.low(p32, bf),
    "Liger RMSNorm forward (Function.apply)": liger_rms_norm,
    "LigerRMSNorm module forward, frozen weight": functools.partial(liger_norm_module(), x),
}
TRITON = ("nf4_kernels.dequantize (Triton)", "dropout_kernels.dropout (Triton)", "Liger RMSNorm forward (Function.apply)")


def host_us(fn, n=200, warmup=20):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n\n| operation | host us per call |\n|---|---|")
for name, fn in ops.items():
    print(f"| {name} | {host_us(fn):.1f} |")
with lean_launch.patched(True):
    for name in TRITON:
        print(f"| {name}, lean_launch | {host_us(ops[name]):.1f} |")
    with norm_kernels.frozen_weight_grid(True):
        name = "LigerRMSNorm module forward, frozen weight"
        print(f"| {name}, lean_launch and norm_backward_grid (lorabench's launch) | {host_us(ops[name]):.1f} |")
sys.stdout.flush()
