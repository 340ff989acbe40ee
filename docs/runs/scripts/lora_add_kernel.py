"""The adapters' rank-r update added into a [tokens x features] tensor by one Triton kernel:
Y += alpha * XA B^T, with XA [tokens x r] and B [features x r]. Measured by 2026-11-24_layer_parts.py
(sixth round); not used by lorabench: the backward's dX term now rides in lorabench.fast.kernels.grad' GEMM
and the forward's two updates would save ~0.09 ms a layer.

lorabench.fast.fused adds each adapter's output into its base GEMM's output (forward: Y_q += s XA_q B_q^T)
and its input gradient into the base layers' (backward: dX += G [A_q; A_k; A_v]) with cuBLAS's addmm_
(beta = 1). With r = 16 (48 for q, k, v merged) these GEMMs are pure memory traffic: Y is read and
written once (2 x 24,576 x 4,096 x 2 bytes = 403 MB at b48 x 512 rows), XA and B are ~1% of that.
cuBLAS ran them at 2.5 TB/s on the H200 (0.162 ms; a copy of Y runs at 4.2 TB/s), four of them a
layer (Y_q, Y_o, and both dX): 0.65 ms a layer, 21 ms a step at b48.

Here one program owns a [BM x BN] tile of Y: it loads the tile, XA's BM rows and B's BN rows (all r
columns: r <= 64, one tl.dot), adds alpha x the product in fp32 and stores the tile rounded once, as
cuBLAS's epilogue does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BM, BN = 64, 256  # a tile of Y: 32 KB of bf16 read and written per program


@triton.jit
def _lora_add_kernel(y_ptr, xa_ptr, b_ptr, M, N, R, stride_y, stride_xa, stride_bn, stride_br, alpha,
                     BM: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr):
    pid_n = tl.program_id(0)  # N fastest: neighbouring programs share XA's rows
    pid_m = tl.program_id(1).to(tl.int64)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rr = tl.arange(0, BR)
    xa = tl.load(xa_ptr + rm[:, None] * stride_xa + rr[None, :], mask=(rm[:, None] < M) & (rr[None, :] < R),
                 other=0.0)
    bt = tl.load(b_ptr + rn[None, :] * stride_bn + rr[:, None] * stride_br, mask=(rn[None, :] < N) & (rr[:, None] < R),
                 other=0.0)
    upd = tl.dot(xa, bt)  # [BM x BN] in fp32
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    ptrs = y_ptr + rm[:, None] * stride_y + rn[None, :]
    y = tl.load(ptrs, mask=inside)
    tl.store(ptrs, (y.to(tl.float32) + alpha * upd).to(y.dtype), mask=inside)


def runs(y: torch.Tensor, xa: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the kernel takes this update: CUDA, y's and xa's rows of unit stride, r <= 64, one dtype."""
    return (y.is_cuda and y.dim() == xa.dim() == b.dim() == 2 and y.stride(1) == xa.stride(1) == 1
            and xa.shape[1] == b.shape[1] <= 64 and y.dtype == xa.dtype == b.dtype)


def lora_add_(y: torch.Tensor, xa: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """y += alpha * xa @ b.T in place (y [M x N], xa [M x r], b [N x r], any strides: A^T for dX += G A):
    y.addmm_(xa, b.t(), alpha=alpha)."""
    if not runs(y, xa, b):
        return y.addmm_(xa, b.t(), alpha=alpha)
    m, n = y.shape
    r = xa.shape[1]
    grid = (triton.cdiv(n, BN), triton.cdiv(m, BM))
    _lora_add_kernel[grid](y, xa, b, m, n, r, y.stride(0), xa.stride(0), b.stride(0), b.stride(1), float(alpha),
                           BM=BM, BN=BN, BR=max(16, triton.next_power_of_2(r)))
    return y
