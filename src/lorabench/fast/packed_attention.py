"""Attention over packed rows without a mask: PyTorch's variable-length flash attention
(torch.nn.attention.varlen), told where each sample of the batch starts.

Packed rows hold several samples, and a token may only attend within its own. transformers' SDPA path
says so with a block-diagonal mask built from position_ids, and a mask costs twice (seq 512, batch 24,
Mistral-7B: 8 key/value heads of 128 for 32 query heads):
  - with a mask transformers repeats the 8 key/value heads to 32 before SDPA (its GQA needs no mask), so
    the keys and values the backward keeps are 4x larger: 2 x 12,288 tokens x 32 x 128 x 2 bytes = 201 MB
    per layer instead of 50 MB;
  - and SDPA takes the memory-efficient kernel with an additive bias instead of flash attention.
Here the batch is one flat sequence of 24 x 512 tokens cut at cu_seq_lens (the padding at a row's end is
a segment of its own, as the collator gives it positions 0, 1, ...), keys and values keep their 8 heads,
and no mask exists. cu_seq_lens comes with the batch (lorabench.builders.data.PackedCollator computes it on the
host), under the names transformers' flash-attention kwargs use, and reaches each layer's attention
through the model's **kwargs: no device-to-host read per layer or per step.
"""

from __future__ import annotations

import torch

NAME = "lorabench_varlen"




def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
              sliding_window=None, cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """transformers' attention interface ([batch, heads, seq, dim] in, [batch, seq, heads, dim] out)
    over the segments cu_seq_lens_q names."""
    if cu_seq_lens_q is None:
        raise ValueError("backend.varlen_attention: this batch has no cu_seq_lens_q; it runs on packed "
                         "rows only (lorabench.builders.data.PackedCollator)")
    if dropout:
        raise ValueError(f"backend.varlen_attention runs without attention dropout, not {dropout}")
    b, h, s, d = query.shape
    # Causal within each segment; Mistral's sliding window (transformers: key > query - window) reaches
    # window - 1 keys back.
    left = sliding_window - 1 if sliding_window and sliding_window < max_length_q else None
    out = flash_varlen(_flat(query), _flat(key), _flat(value), cu_seq_lens_q, max_length_q, scaling, left)
    return out.view(b, s, h, d), None


def flash_varlen(q, k, v, cu_seq_lens: torch.Tensor, longest: int, scale: float | None,
                 window_left: int | None) -> torch.Tensor:
    """Causal attention of [tokens, heads, dim] within each segment: PyTorch's flash-attention kernel,
    the one behind torch.nn.attention.varlen.varlen_attn. Called directly because torch 2.11's wrapper
    refuses 8 key/value heads for 32 query heads (enable_gqa came in 2.12) while the kernel takes them;
    aten's derivative formula runs the kernel's backward."""
    window = {} if window_left is None else {"window_size_left": window_left, "window_size_right": 0}
    out, *_ = torch.ops.aten._flash_attention_forward(q, k, v, cu_seq_lens, cu_seq_lens, longest, longest,
                                                      0.0, True, False, scale=scale, **window)
    return out


def _flat(t: torch.Tensor) -> torch.Tensor:
    # [batch, heads, seq, dim] -> [batch x seq, heads, dim]: one long sequence of the batch's rows
    return t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])


def runs_on(device: torch.device) -> bool:
    """PyTorch's varlen attention is its flash kernel: CUDA only."""
    return device.type == "cuda"


def use(model) -> None:
    """Run this model's attention through `attention` (registered with transformers once)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, attention)
    model.set_attn_implementation(NAME)
