"""Liger's RMSNorm launched for a frozen weight (backend.norm_backward_grid: its backward on a full grid,
its forward and backward without LigerRMSNormFunction's per-call wrappers), and the attention's residual
add inside the MLP's RMSNorm (backend.fused_add_norm).

Liger launches its RMSNorm backward with one program per SM (132 on an H100), each walking
n_rows / 132 rows one after another, so that each program sums its rows' share of dW in registers.
QLoRA freezes the norms' weights: there is no dW, and a program at a time per SM keeps too few loads
in flight. In the H200 profile (b48, seq 512) the backward of a [24,576 x 4,096] bf16 norm took
0.28 ms for 0.6 GB of reads and writes, 2.1 TB/s of the card's 4.8. Without dW the same kernel is
launched here with one program per ROWS rows: the same arithmetic per row, so the same bits. The
same holds for Liger's fused add + RMSNorm, whose backward is launched the same way.

fused_add_norm: a decoder layer adds the attention's output to the residual stream (a [tokens x 4096]
bf16 add: 2 reads, 1 write) and normalises the sum (1 read, 1 write); in the backward autograd adds
the norm's input gradient to the residual's (2 reads, 1 write). Liger's fused add + RMSNorm does the
add inside the norm's kernels (forward: 2 reads, 2 writes; backward: the residual's gradient read
inside the norm's backward): 3 passes over a 201 MB tensor less per layer at b48 x 512. The sum is
rounded to bf16 before it is normalised, as the unfused add rounds it.
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch

ROWS = 4  # rows per program: 6,144 programs at 24,576 rows


def _frozen_backward(dY, X, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, in_place) -> torch.Tensor:
    """dX of Liger's RMSNorm of a frozen weight (no dW), its backward kernel on the full grid; dY [rows x cols]."""
    import triton
    from liger_kernel.ops import rms_norm as ln

    n_rows, n_cols = dY.shape
    dX = dY if in_place else torch.empty_like(dY)  # the kernel writes every row of dX
    ln._rms_norm_backward_kernel[(triton.cdiv(n_rows, ROWS),)](
        dY, dY.stride(0), dX, dX.stride(0), X, X.stride(0), ln.torch_to_triton_dtype[X.dtype],
        W, W.stride(0), RSTD, RSTD.stride(0), None, 0, n_rows, n_cols, offset, ROWS, casting_mode,
        elementwise_affine=True, BLOCK_SIZE=BLOCK_SIZE, COMPUTE_DW=False, num_warps=num_warps)
    return dX


def _backward(original):
    def rms_norm_backward(dY, X, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, in_place, row_mode,
                          needs_dw=None):
        if W is None or needs_dw is not False or not dY.is_cuda:
            return original(dY, X, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, in_place, row_mode,
                            needs_dw)
        shape = dY.shape
        dX = _frozen_backward(dY.view(-1, shape[-1]), X, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps,
                              in_place)
        return dX.view(*shape), None

    return rms_norm_backward


def _fused_backward(original):
    import triton
    from liger_kernel.ops import fused_add_rms_norm as fa

    def fused_add_rms_norm_backward(dY, dS_out, S, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps,
                                    num_stages, in_place, needs_dw=None):
        if needs_dw is not False or dS_out is None or not dY.is_cuda:
            return original(dY, dS_out, S, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, num_stages,
                            in_place, needs_dw)
        shape = dY.shape
        dY, dS_out, S = (t.view(-1, shape[-1]) for t in (dY, dS_out, S))
        n_rows, n_cols = dY.shape
        dX = dY if in_place else torch.empty_like(dY)
        fa._fused_add_rms_norm_backward_kernel[(triton.cdiv(n_rows, ROWS),)](
            dY, dY.stride(0), dS_out, dS_out.stride(0), dX, dX.stride(0), S, S.stride(0),
            fa.torch_to_triton_dtype[S.dtype], W, W.stride(0), RSTD, RSTD.stride(0), None, 0, n_rows, n_cols,
            offset, ROWS, casting_mode, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps, num_stages=num_stages,
            has_dS_out=True, COMPUTE_DW=False)
        dX = dX.view(*shape)
        return dX, dX, None

    return fused_add_rms_norm_backward


class _FrozenRMSNorm(torch.autograd.Function):
    """Liger's RMSNorm of a frozen weight, its own forward kernel (one program per row, as Liger launches it
    for rows wider than 256) and its backward on the full grid above, launched without
    LigerRMSNormFunction's per-call wrappers (its argument copies, device context, DTensor checks, settings),
    a forward and a backward per norm and layer, host time on a host-bound step. The same kernels with the
    same arguments: the same bits (tests/fast/test_fast_parts.py)."""

    @staticmethod
    def forward(ctx, x, w, eps, offset, mode, block, warps, in_place):
        from liger_kernel.ops import rms_norm as ln

        x2 = x.view(-1, x.shape[-1])
        n_rows, n_cols = x2.shape
        y = torch.empty_like(x2)
        rstd = torch.empty(n_rows, dtype=torch.float32 if mode >= 0 else x.dtype, device=x.device)  # as Liger
        ln._rms_norm_forward_kernel[(n_rows,)](y, y.stride(0), x2, x2.stride(0), w, w.stride(0), rstd, rstd.stride(0),
                                               n_cols, eps, offset, mode, elementwise_affine=True, BLOCK_SIZE=block,
                                               num_warps=warps)
        ctx.save_for_backward(x2, w, rstd)
        ctx.meta = offset, mode, block, warps, in_place
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, rstd = ctx.saved_tensors
        offset, mode, block, warps, in_place = ctx.meta
        dx = _frozen_backward(dy.contiguous().view(-1, dy.shape[-1]), x2, w, rstd, offset, mode, block, warps,
                              in_place)
        return dx.view(dy.shape), None, None, None, None, None, None, None


def _function(original):
    """LigerRMSNormFunction as LigerRMSNorm's forward calls it, through _FrozenRMSNorm where the weight is
    frozen, the input a contiguous CUDA tensor and its rows wider than 256 (else Liger's own)."""
    from liger_kernel.ops import rms_norm as ln
    from liger_kernel.ops.utils import calculate_settings

    settings = functools.cache(calculate_settings)

    def apply(x, w, eps, offset=0.0, casting_mode="llama", in_place=True, row_mode=None):
        if (w is None or w.requires_grad or row_mode or not x.is_cuda or not x.is_contiguous()
                or not isinstance(casting_mode, str)):
            return original.apply(x, w, eps, offset, casting_mode, in_place, row_mode)
        block, warps = settings(x.shape[-1])
        if block <= 256:  # Liger runs its block kernel for narrow rows (QK-norm's head_dim) on many rows
            return original.apply(x, w, eps, offset, casting_mode, in_place, row_mode)
        return _FrozenRMSNorm.apply(x, w, eps, offset, ln._str_to_casting_mode[casting_mode], block, warps,
                                    in_place)

    return types.SimpleNamespace(apply=apply)


@contextlib.contextmanager
def frozen_weight_grid(on: bool):
    """Within: Liger's RMSNorm backward and fused add + RMSNorm backward as above where the weight
    gets no gradient, and LigerRMSNorm's forward through _FrozenRMSNorm; undone after."""
    if not on:
        yield
        return
    from liger_kernel.ops import fused_add_rms_norm as fa
    from liger_kernel.ops import rms_norm as ln
    from liger_kernel.transformers import rms_norm as module

    originals = ln.rms_norm_backward, fa.fused_add_rms_norm_backward, module.LigerRMSNormFunction
    ln.rms_norm_backward, fa.fused_add_rms_norm_backward = _backward(originals[0]), _fused_backward(originals[1])
    module.LigerRMSNormFunction = _function(originals[2])
    try:
        yield
    finally:
        ln.rms_norm_backward, fa.fused_add_rms_norm_backward, module.LigerRMSNormFunction = originals


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, norm: torch.nn.Module):
    """(norm(residual + x), residual + x): in one Liger kernel where `norm` is Liger's RMSNorm on CUDA,
    else as the layer computes it."""
    if x.is_cuda and hasattr(norm, "casting_mode"):  # Liger's RMSNorm (its module or patched in)
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

        return LigerFusedAddRMSNormFunction.apply(x, residual, norm.weight, norm.variance_epsilon,
                                                  norm.offset, norm.casting_mode, False)
    total = residual + x
    return norm(total), total


def _layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                   use_cache=False, position_embeddings=None, **kwargs):
    """transformers 5's MistralDecoderLayer.forward with the attention's residual add inside the
    post-attention RMSNorm (add_rms_norm). The layers of lorabench.fast.parts.MISTRAL_LAYERS are this one
    (Llama, Qwen2/3, Mixtral, Qwen3-MoE; Phi-3 without residual dropout); the fast path refuses others."""
    residual = hidden_states
    hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                                      attention_mask=attention_mask, position_ids=position_ids,
                                      past_key_values=past_key_values, use_cache=use_cache,
                                      position_embeddings=position_embeddings, **kwargs)
    normed, residual = add_rms_norm(hidden_states, residual, self.post_attention_layernorm)
    return residual + self.mlp(normed)


def _hybrid_layer_forward(self, hidden_states, position_embeddings, attention_mask=None, position_ids=None,
                          past_key_values=None, **kwargs):
    """transformers 5's Qwen3_5DecoderLayer.forward (linear or full attention as the layer's block_type says, then
    Mistral's residual adds and pre-norms) with the token mixer's residual add inside the post-attention RMSNorm."""
    residual = hidden_states
    hidden_states = self.input_layernorm(hidden_states)
    if self.block_type == "linear_attention":
        hidden_states = self.linear_attn(hidden_states=hidden_states, cache_params=past_key_values,
                                         attention_mask=attention_mask, **kwargs)
    elif self.block_type == "full_attention":
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                          position_ids=position_ids, past_key_values=past_key_values,
                                          position_embeddings=position_embeddings, **kwargs)
    normed, residual = add_rms_norm(hidden_states, residual, self.post_attention_layernorm)
    return residual + self.mlp(normed)


def patch_add_norm(layers, hybrid: bool = False) -> int:
    """Each decoder layer's forward as `_layer_forward` (Mistral's layer), or `_hybrid_layer_forward` (Qwen3.5's);
    returns how many layers."""
    for layer in layers:
        layer.forward = types.MethodType(_hybrid_layer_forward if hybrid else _layer_forward, layer)
    return len(layers)
