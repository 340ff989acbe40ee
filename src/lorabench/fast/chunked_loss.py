"""The causal LM's loss from its hidden states in chunks of rows, for any family (backend.chunked_loss).

transformers' causal LMs compute the whole [tokens x vocabulary] logits, upcast them to fp32 for the loss and
keep them for the backward: at batch 8 x 1,024 tokens and Qwen3.5's 248,320 ids that is 8,192 x 248,320 x 4
bytes = 8.1 GB, and its gradient as much again, where the rest of a 9B QLoRA step needs a few GB. Liger's fused
linear cross-entropy computes each chunk's logits, its loss and its logits' gradient (softmax minus the
one-hot target) in the forward, multiplies that gradient into the hidden states' gradient at once and drops
the chunk: no full-vocabulary logits live at any time. Liger ships it per family (its patch); here the same
function is put behind any family's causal LM whose head is plain (logits = h W^T, then, where the family does,
a soft-cap or a division: Gemma 4's final_logit_softcapping, Granite's logits_scaling): Liger's own on CUDA,
and the same chunks in PyTorch elsewhere (the tests' CPU).

The loss is transformers' ForCausalLMLoss: labels shifted by one (the last position predicts nothing), -100
ignored, summed, and divided by num_items_in_batch (the Trainer's count over the whole optimizer step) where
it is given, else by this batch's labelled tokens.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

IGNORE = -100
CHUNK_ROWS = 1024  # rows a chunk on CPU: 1,024 x a 256k vocabulary in fp32 is 1 GB, freed after each chunk


class _ChunkedCE(torch.autograd.Function):
    """sum over rows of CE(softcap(h W^T)), the hidden states' gradient computed in the forward, chunk by chunk."""

    @staticmethod
    def forward(ctx, h, w, labels, softcap):
        grad, total = torch.zeros_like(h), h.new_zeros((), dtype=torch.float32)
        for i in range(0, h.shape[0], CHUNK_ROWS):
            z = (h[i:i + CHUNK_ROWS] @ w.t()).float()  # fp32 logits, as transformers' ForCausalLMLoss upcasts them
            y = labels[i:i + CHUNK_ROWS]
            if softcap:
                t = torch.tanh(z / softcap)
                z = t * softcap
            keep = y != IGNORE
            rows = torch.arange(len(y), device=y.device)
            target = y.clamp(min=0)
            total += ((torch.logsumexp(z, -1) - z[rows, target]) * keep).sum()
            g = torch.softmax(z, -1)
            g[rows, target] -= 1  # d CE / d z: softmax - one-hot
            g *= keep[:, None]
            if softcap:
                g *= 1 - t * t  # d softcap(x) / dx = 1 - tanh^2(x / cap)
            grad[i:i + CHUNK_ROWS] = (g.to(w.dtype) @ w).to(h.dtype)
        ctx.save_for_backward(grad)
        return total

    @staticmethod
    def backward(ctx, upstream):
        (grad,) = ctx.saved_tensors
        return grad * upstream.to(grad.dtype), None, None, None


def summed_loss(h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """sum of the cross-entropy of h W^T (soft-capped) against labels over the labelled rows."""
    if h.is_cuda:
        from liger_kernel.transformers import functional

        # (lorabench.fast.parts._loss_head puts backend.ce_chunk_mem and loss_on_device behind this name)
        return functional.liger_fused_linear_cross_entropy(h, w, labels, ignore_index=IGNORE, reduction="sum",
                                                           softcap=softcap)
    return _ChunkedCE.apply(h, w, labels, softcap)


def causal_lm_loss(model, hidden: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """transformers' causal LM loss of `model` (its head, soft-cap and logit scaling) from the last hidden states."""
    cfg = model.config.get_text_config()
    h = hidden
    if scale := getattr(cfg, "logits_scaling", None):  # Granite: logits / logits_scaling = (h / s) W^T
        h = h / scale
    shifted = F.pad(labels, (0, 1), value=IGNORE)[..., 1:]  # as ForCausalLMLoss shifts them
    w = model.get_output_embeddings().weight  # frozen (LoRA adapts no head): no gradient is returned for it
    h, y = h.reshape(-1, h.shape[-1]).to(w.dtype), shifted.reshape(-1).to(h.device)
    total = summed_loss(h, w, y, getattr(cfg, "final_logit_softcapping", None))
    count = num_items_in_batch if num_items_in_batch is not None else (y != IGNORE).sum()
    return total / (count.to(total.device) if isinstance(count, torch.Tensor) else count)


def _forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
             labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    """The causal LM's forward with its loss through causal_lm_loss (no logits returned) where labels are given."""
    if labels is None:
        return self.lorabench_forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                      past_key_values=past_key_values, inputs_embeds=inputs_embeds, labels=labels,
                                      use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    items = kwargs.pop("num_items_in_batch", None)
    out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache, **kwargs)
    loss = causal_lm_loss(self, out.last_hidden_state, labels, items)
    return CausalLMOutputWithPast(loss=loss, logits=None, past_key_values=out.past_key_values)


def patch(model) -> None:
    """`model` (a transformers causal LM, before LoRA wraps it) computes its loss in chunks."""
    model.lorabench_forward = model.forward
    model.forward = types.MethodType(_forward, model)
