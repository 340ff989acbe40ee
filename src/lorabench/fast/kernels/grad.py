"""The backward's input gradients as one Triton GEMM each (backend.triton_input_grad), and SwiGLU's
backward inside the down projection's (backend.swiglu_in_gemm).

Every projection's input gradient is a sum of GEMMs in one layout, dX = sum_i dY_i W_i, with dY_i
[tokens x out_i] and the dequantised weight W_i [out_i x in], both row-major: q, k and v (and their
adapters' G [A_q; A_k; A_v]) sum into one dX; gate and up into another. lorabench.fast.fused ran them as
cuBLAS calls accumulating into dX (beta = 1), each re-reading and re-writing dX, the adapters' term a
separate addmm_. Alone on the H200 at b48 x 512 rows (docs/runs/scripts/2026-11-24_swiglu_gemm.py),
cuBLAS's kernel for dH = dOut W_down ran at 705 TFLOP/s; a Triton GEMM with 128 x 256 tiles, 64-deep
K steps, 4 stages and two warpgroups ran it at 783-792.

Here one program owns a [128 x BN] tile of the output and runs each pair's K loop into one fp32
accumulator (TMA loads; a K that is not a multiple of 64, like r = 48, is zero-filled by the copy
engine), then stores the tile once, rounded to bf16. So dX is written once, never re-read.

With `swiglu` the sum is dH, the gradient of H = silu(G) U, and the epilogue turns it into dG and dU
with G and U's tiles, writing them over G and U as Liger's SwiGLU backward does, with Liger's
arithmetic (dH rounded to bf16 first, as cuBLAS would have stored it): dH never reaches memory,
1.4 GB less traffic per layer at b48 (write and read of [24,576 x 14,336] bf16).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

BM, BK, STAGES, WARPS, GROUP = 128, 64, 4, 8, 8
MAX_PAIRS = 4
# The fewest waves of output tiles (per SM of the GPU) for which this kernel runs; below, cuBLAS does (`fills`).
MIN_WAVES = 8


def _bn(n: int) -> int:
    return 256 if n >= 256 else 128


@triton.jit
def _tile(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    # GROUP row tiles sweep the columns together, so the B tiles they share stay in L2
    num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    in_group = GROUP * num_n
    first_m = (pid // in_group) * GROUP
    size_m = min(num_m - first_m, GROUP)
    return first_m + (pid % in_group) % size_m, (pid % in_group) // size_m


@triton.jit
def _accumulate(acc, a_desc, b_desc, om, on, K, BK: tl.constexpr, STAGES: tl.constexpr):
    for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES):
        acc = tl.dot(a_desc.load([om, k * BK]), b_desc.load([k * BK, on]), acc)
    return acc


@triton.jit
def _sum_mm_kernel(a0, b0, a1, b1, a2, b2, a3, b3, o_desc, u_desc, M, N, K0, K1, K2, K3,
                   NUM: tl.constexpr, SWIGLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, GROUP: tl.constexpr, STAGES: tl.constexpr):
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BM, BN, GROUP)
    om, on = pid_m * BM, pid_n * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc = _accumulate(acc, a0, b0, om, on, K0, BK, STAGES)
    if NUM > 1:
        acc = _accumulate(acc, a1, b1, om, on, K1, BK, STAGES)
    if NUM > 2:
        acc = _accumulate(acc, a2, b2, om, on, K2, BK, STAGES)
    if NUM > 3:
        acc = _accumulate(acc, a3, b3, om, on, K3, BK, STAGES)
    if SWIGLU:
        dh = acc.to(tl.bfloat16).to(tl.float32)
        g = o_desc.load([om, on]).to(tl.float32)
        u = u_desc.load([om, on])
        sig = tl.sigmoid(g)
        silu = g * sig
        o_desc.store([om, on], (dh * (silu * (1 - sig) + sig) * u).to(tl.bfloat16))
        u_desc.store([om, on], (dh * silu).to(tl.bfloat16))
    else:
        o_desc.store([om, on], acc.to(tl.bfloat16))


def _tma_ok(t: torch.Tensor) -> bool:
    # the copy engine's rules: rows of unit stride, 16-byte aligned start and row stride
    return (t.is_cuda and t.dim() == 2 and t.dtype == torch.bfloat16 and t.stride(1) == 1
            and (t.stride(0) * 2) % 16 == 0 and t.data_ptr() % 16 == 0)


@functools.lru_cache
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def fills(m: int, n: int, sms: int) -> bool:
    """Whether an [m x n] output gives this kernel at least MIN_WAVES waves of its tiles over `sms` SMs. With
    fewer, the last wave's idle SMs weigh, and cuBLAS's kernels were faster: on an H200 at 4,096 tokens
    (docs/runs/2026-11-27_searched/gemm_c2.md; 3.4 waves of 128 x 256 tiles for Qwen2.5-7B's 3,584 features,
    3.9 for Llama-3.1-8B's 4,096) cuBLAS took 0.65-0.88x this kernel's time for q/k/v's and o's input gradients
    (0.2 ms a layer less on Qwen2.5-7B, timed alone; the cell's step moved less than its spread from one call to
    the next); at 24,576 tokens x 4,096 (23 waves) this kernel ran at 783-792 TFLOP/s and cuBLAS at 705 (the
    module's docstring). Between 4 and 23 waves the switch at 8 is not measured."""
    return triton.cdiv(m, BM) * triton.cdiv(n, _bn(n)) >= MIN_WAVES * sms


def runs(pairs, swiglu=None) -> bool:
    """Whether input_grad takes these operands: bf16 on CUDA in TMA's layout, at most MAX_PAIRS pairs, an output
    that fills the GPU with enough waves of tiles (`fills`)."""
    tensors = [t for pair in pairs for t in pair] + list(swiglu or ())
    return 0 < len(pairs) <= MAX_PAIRS and all(_tma_ok(t) for t in tensors) \
        and fills(pairs[0][0].shape[0], pairs[0][1].shape[1], _sms(pairs[0][0].device))


def input_grad(pairs, swiglu=None):
    """sum_i a_i @ b_i for pairs [(a_i [M x K_i], b_i [K_i x N])]: a new [M x N] tensor; with
    swiglu=(g, u) ([M x N] each) SwiGLU's backward of that sum, dG and dU written over g and u: (g, u)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, n = pairs[0][0].shape[0], pairs[0][1].shape[1]
    bn = _bn(n)
    out, u = swiglu if swiglu is not None else (torch.empty(m, n, device=pairs[0][0].device,
                                                            dtype=torch.bfloat16),) * 2
    descs, ks = [], []
    for a, b in pairs:
        descs += [TensorDescriptor.from_tensor(a, [BM, BK]), TensorDescriptor.from_tensor(b, [BK, bn])]
        ks.append(a.shape[1])
    descs += descs[:2] * (MAX_PAIRS - len(pairs))  # unused slots: never read (NUM says how many are real)
    ks += [0] * (MAX_PAIRS - len(pairs))
    grid = (triton.cdiv(m, BM) * triton.cdiv(n, bn),)
    _sum_mm_kernel[grid](*descs, TensorDescriptor.from_tensor(out, [BM, bn]), TensorDescriptor.from_tensor(u, [BM,
    bn]), m, n, *ks, NUM=len(pairs), SWIGLU=swiglu is not None, BM=BM, BN=bn, BK=BK, GROUP=GROUP,
                         STAGES=STAGES, num_warps=WARPS)
    return (out, u) if swiglu is not None else out
