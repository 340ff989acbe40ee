"""LoRA dropout whose mask is never stored: drawn from (seed, position) by Philox in a Triton kernel,
and drawn again in the backward (as in Triton's "low-memory dropout" tutorial).

A bool mask costs 1 byte per element: at batch 16 x 512 tokens x 4,096 that is 32 MiB per adapted
projection, 128 MiB per decoder layer for q, k, v and o, kept from the forward to the backward of
every layer that is not recomputed. A seed costs nothing. CUDA only (lorabench.fast.fused falls back to
torch's dropout and its mask elsewhere).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # elements per program: four runs of 1,024, one Philox draw (4 x 32 bits) per 4 elements


@triton.jit
def _drop_run(x_ptr, out_ptr, offs, n, keep, p):
    inside = offs < n
    x = tl.load(x_ptr + offs, mask=inside)
    tl.store(out_ptr + offs, tl.where(keep, x / (1 - p), 0.0).to(x.dtype), mask=inside)


@triton.jit
def _dropout_kernel(x_ptr, out_ptr, n, p, seed, BLOCK: tl.constexpr, SEED_IN_MEMORY: tl.constexpr = False):
    if SEED_IN_MEMORY:  # seed is a pointer to it (a CUDA graph replays the launch, the seed changes in memory)
        seed = tl.load(seed)
    # One Philox call gives four uniform numbers (as torch's dropout draws them, curand4); one call per
    # element (tl.rand) made this kernel compute-bound, ~1.2 TB/s on an H100.
    Q: tl.constexpr = BLOCK // 4
    pid = tl.program_id(0).to(tl.int64)
    r0, r1, r2, r3 = tl.rand4x(seed, pid * Q + tl.arange(0, Q))
    offs = pid * BLOCK + tl.arange(0, Q)
    _drop_run(x_ptr, out_ptr, offs, n, r0 > p, p)
    _drop_run(x_ptr, out_ptr, offs + Q, n, r1 > p, p)
    _drop_run(x_ptr, out_ptr, offs + 2 * Q, n, r2 > p, p)
    _drop_run(x_ptr, out_ptr, offs + 3 * Q, n, r3 > p, p)


@triton.jit
def _add_run(acc_ptr, g_ptr, offs, n, keep, p):
    inside = offs < n
    g = tl.load(g_ptr + offs, mask=inside).to(tl.float32)
    acc = tl.load(acc_ptr + offs, mask=inside)
    out = acc.to(tl.float32) + tl.where(keep, g / (1 - p), 0.0)
    tl.store(acc_ptr + offs, out.to(acc.dtype), mask=inside)


@triton.jit
def _add_dropped_kernel(acc_ptr, g_ptr, n, p, seed, BLOCK: tl.constexpr, SEED_IN_MEMORY: tl.constexpr = False):
    if SEED_IN_MEMORY:
        seed = tl.load(seed)
    Q: tl.constexpr = BLOCK // 4
    pid = tl.program_id(0).to(tl.int64)
    r0, r1, r2, r3 = tl.rand4x(seed, pid * Q + tl.arange(0, Q))
    offs = pid * BLOCK + tl.arange(0, Q)
    _add_run(acc_ptr, g_ptr, offs, n, r0 > p, p)
    _add_run(acc_ptr, g_ptr, offs + Q, n, r1 > p, p)
    _add_run(acc_ptr, g_ptr, offs + 2 * Q, n, r2 > p, p)
    _add_run(acc_ptr, g_ptr, offs + 3 * Q, n, r3 > p, p)


def dropout(x: torch.Tensor, seed: int | torch.Tensor, p: float) -> torch.Tensor:
    """x with each element kept (and scaled by 1/(1-p)) where Philox(seed, index) > p. `seed`: an int, or a
    one-element int64 CUDA tensor read by the kernel (lorabench.fast.graphs: a captured launch, seeds new each step)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _dropout_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, p, seed, BLOCK=BLOCK,
                                              SEED_IN_MEMORY=isinstance(seed, torch.Tensor))
    return out


def add_dropped(acc: torch.Tensor, g: torch.Tensor, seed: int | torch.Tensor, p: float) -> torch.Tensor:
    """acc += dropout(g) with the same mask as dropout(x, seed, p), in place (acc contiguous)."""
    g = g.contiguous()
    n = acc.numel()
    _add_dropped_kernel[(triton.cdiv(n, BLOCK),)](acc, g, n, p, seed, BLOCK=BLOCK,
                                                  SEED_IN_MEMORY=isinstance(seed, torch.Tensor))
    return acc
