"""Liger's RMSNorm backward launched for a frozen weight (backend.norm_backward_grid).

Liger launches its RMSNorm backward with one program per SM (132 on an H100), each walking
n_rows / 132 rows one after another, so that each program sums its rows' share of dW in registers.
QLoRA freezes the norms' weights: there is no dW, and a program at a time per SM keeps too few loads
in flight. In the H200 profile (b48, seq 512) the backward of a [24,576 x 4,096] bf16 norm took
0.28 ms for 0.6 GB of reads and writes, 2.1 TB/s of the card's 4.8. Without dW the same kernel is
launched here with one program per ROWS rows: the same arithmetic per row, so the same bits.
"""

from __future__ import annotations

import contextlib

import torch

ROWS = 4  # rows per program: 6,144 programs at 24,576 rows


def _backward(original):
    import triton
    from liger_kernel.ops import rms_norm as ln

    def rms_norm_backward(dY, X, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, in_place, row_mode,
                          needs_dw=None):
        if W is None or needs_dw is not False or not dY.is_cuda:
            return original(dY, X, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, in_place, row_mode,
                            needs_dw)
        shape = dY.shape
        dY = dY.view(-1, shape[-1])
        n_rows, n_cols = dY.shape
        dX = dY if in_place else torch.zeros_like(dY)
        ln._rms_norm_backward_kernel[(triton.cdiv(n_rows, ROWS),)](
            dY, dY.stride(0), dX, dX.stride(0), X, X.stride(0), ln.torch_to_triton_dtype[X.dtype],
            W, W.stride(0), RSTD, RSTD.stride(0), None, 0, n_rows, n_cols, offset, ROWS, casting_mode,
            elementwise_affine=True, BLOCK_SIZE=BLOCK_SIZE, COMPUTE_DW=False, num_warps=num_warps)
        return dX.view(*shape), None

    return rms_norm_backward


@contextlib.contextmanager
def frozen_weight_grid(on: bool):
    """Within: Liger's RMSNorm backward as above where the weight gets no gradient; undone after."""
    if not on:
        yield
        return
    from liger_kernel.ops import rms_norm as ln

    original = ln.rms_norm_backward
    ln.rms_norm_backward = _backward(original)
    try:
        yield
    finally:
        ln.rms_norm_backward = original
