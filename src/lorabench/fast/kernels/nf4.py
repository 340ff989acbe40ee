"""nf4 weights dequantised by one Triton kernel (backend.triton_dequant), bit for bit bitsandbytes'.

QLoRA dequantises every 4-bit weight twice a step: for the forward's GEMM and for the backward's
dX = dY W (the bf16 copy is a temporary). That is 7.0e9 weights x 2 x 2.5 bytes (0.5 read, 2 written)
= 35 GB a step for Mistral-7B: 7.3 ms at the H200's 4.8 TB/s. bitsandbytes' kernel
(kDequantizeBlockwise) took 21 ms of a 1,239 ms step in the H200 profile (b48, seq 512), ~1.7 TB/s.

Here one program reads whole quantisation blocks (1,024 or 4,096 packed bytes: `_bytes`), as rows of 32
bytes (64 weights) with one scale each, loaded once per block rather than once per weight: each byte holds
two codes, high nibble first; a weight is NF4[code] x absmax[its block], multiplied in fp32 and
rounded once to bf16, as bitsandbytes does. The double-quantised absmax (8-bit codes, an fp32 scale
per 256 blocks and an offset) is undone inside the same kernel, in bitsandbytes' order and rounding:
code2[q] x absmax2 rounded to fp32, then + offset rounded again (fp contraction off, so no fused
multiply-add rounds once instead). bitsandbytes undoes it with calls of its own (dequantize_blockwise,
then an add): two more launches per weight, ~450 times a step for a 32-layer model (7 projections,
forward and backward), 48 + 19 us of host time each under the profiler (docs/results.md, the head
section: 21.5 + 8.3 ms a step), where the fast path's step at batch 4 waits on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _bytes(n_bytes: int) -> int:
    """Packed bytes per program: 4,096 for a weight over 16M (Qwen2.5-7B's 18,944 x 3,584 gate and down: the
    fastest size in both timings on an H200, docs/runs/2026-11-27_searched/dequant_c1.md and dequant_c2.md), 1,024
    up to it (its 3,584 x 3,584 q: the fastest in one timing, the 2,048 in the other; a weight this small takes
    about as long as its launch, so these differ less than the timings do)."""
    return 1024 if n_bytes <= 2**23 else 4096


@triton.jit
def _nf4_kernel(q_ptr, absmax_ptr, table_ptr, out_ptr, n_bytes, code2_ptr, absmax2_ptr, offset_ptr,
                BLOCKSIZE: tl.constexpr, BLOCKSIZE2: tl.constexpr, NESTED: tl.constexpr, BYTES: tl.constexpr):
    HALF: tl.constexpr = BLOCKSIZE // 2  # packed bytes per quantisation block
    NB: tl.constexpr = BYTES // HALF  # blocks per program: [NB x HALF] bytes, one scale per row
    pid = tl.program_id(0).to(tl.int64)
    block = pid * NB + tl.arange(0, NB)
    offs = block[:, None] * HALF + tl.arange(0, HALF)[None, :]
    q = tl.load(q_ptr + offs, mask=offs < n_bytes, other=0).to(tl.int32)
    some = block * HALF < n_bytes
    if NESTED:  # absmax = code2[8-bit code] x absmax2[block // 256] + offset, two roundings as bitsandbytes'
        code = tl.load(absmax_ptr + block, mask=some, other=0).to(tl.int32)
        scale = tl.load(code2_ptr + code) * tl.load(absmax2_ptr + block // BLOCKSIZE2, mask=some, other=0.0)
        scale = scale + tl.load(offset_ptr)
    else:
        scale = tl.load(absmax_ptr + block, mask=some, other=0.0)
    hi = tl.load(table_ptr + (q >> 4)) * scale[:, None]
    lo = tl.load(table_ptr + (q & 15)) * scale[:, None]
    out = tl.interleave(hi, lo).to(out_ptr.dtype.element_ty)  # weight 2i is byte i's high nibble
    out_offs = block[:, None] * BLOCKSIZE + tl.arange(0, BLOCKSIZE)[None, :]
    tl.store(out_ptr + out_offs, out, mask=out_offs < 2 * n_bytes)


def runs(weight: torch.Tensor, state) -> bool:
    """Whether this kernel dequantises `weight` (nf4 on CUDA, an even number of weights); else bitsandbytes does."""
    return weight.is_cuda and state.quant_type == "nf4" and state.shape.numel() % 2 == 0 \
        and state.blocksize >= 2 and state.blocksize & (state.blocksize - 1) == 0


def _absmax(state, keep: bool) -> torch.Tensor:
    """The fp32 scale of each 64-weight block. Double-quantised (8-bit, QLoRA's 0.37 bits a weight
    saved) it is dequantised by bitsandbytes' own steps, so it has the same bits; with `keep` once per
    weight (frozen, so it never changes), kept on its quant state: 4 bytes per 64 weights, 0.44 GB for
    Mistral-7B, what double quantisation saves, for one launch less per dequantisation."""
    import bitsandbytes.functional as bnbf

    if not state.nested:
        return state.absmax.float()
    kept = getattr(state, "lorabench_absmax", None)
    if kept is not None:
        return kept
    absmax = bnbf.dequantize_blockwise(state.absmax, state.state2)
    absmax += state.offset
    absmax = absmax.float()
    if keep:
        state.lorabench_absmax = absmax
    return absmax


def _scales(weight: torch.Tensor, state, keep_absmax: bool):
    """The kernels' scale arguments: (absmax, (code2, absmax2, offset), blocksize2), the double-quantised absmax
    undone inside the kernel (blocksize2 > 1), or fp32 scales (blocksize2 1: the three nested arguments are
    placeholders the kernel never reads)."""
    if state.nested and not keep_absmax and getattr(state, "lorabench_absmax", None) is None \
            and state.offset.device == weight.device:  # (a quant state built on the host keeps it there)
        return state.absmax, (state.state2.code, state.state2.absmax, state.offset), state.state2.blocksize
    absmax = _absmax(state, keep_absmax)
    return absmax, (absmax, absmax, absmax), 1


def dequantize(weight: torch.Tensor, state, keep_absmax: bool = False, program_bytes: int | None = None,
               num_warps: int | None = None) -> torch.Tensor:
    """bitsandbytes.functional.dequantize_4bit(weight, state) for nf4 on CUDA: [out x in] in state.dtype.
    A double-quantised absmax is undone inside the kernel, unless it is kept in fp32 (`keep_absmax`).
    program_bytes, num_warps: another program size (a power of 2, whole blocks) and warp count than `_bytes`'
    and Triton's (docs/runs/scripts/dequant_variants.py times them)."""
    absmax, nest, blocksize2 = _scales(weight, state, keep_absmax)
    out = torch.empty(state.shape, dtype=state.dtype, device=weight.device)
    n_bytes = state.shape.numel() // 2
    table = state.code.to(device=weight.device, dtype=torch.float32)
    per = program_bytes or max(_bytes(n_bytes), state.blocksize // 2)
    _nf4_kernel[(triton.cdiv(n_bytes, per),)](
        weight.reshape(-1), absmax, table, out, n_bytes, *nest, BLOCKSIZE=state.blocksize, BLOCKSIZE2=blocksize2,
        NESTED=blocksize2 > 1, BYTES=per, enable_fp_fusion=False, **({"num_warps": num_warps} if num_warps else {}))
    return out
