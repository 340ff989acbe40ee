"""The fused linear cross-entropy without a host round trip (backend.loss_on_device).

Liger's fused linear cross-entropy (0.8.5) reads the number of labelled tokens on the host before its first
chunk (`target_mask.sum().item()`), and its backward compares the upstream gradient with 1.0 on the host
(`torch.equal`). Each is a wait for everything queued before it: the whole forward, then the loss head. After
each the GPU idles while the host launches what comes next (on an H200, Qwen2.5-7B b4 x 1,024: 0.5 ms before
the head's first GEMM and 1.3 ms before the backward's first layer, docs/results.md's Qwen2.5-7B profile). The
count only divides the loss where reduction="mean"; the Trainer asks for "sum" and divides by its own count
(num_items_in_batch, on the device).

Here the same chunks, GEMMs and Liger's cross-entropy kernel run with reduction "sum" (each row's loss and
logit gradient unscaled), a mean is divided by a count kept on the device, and the backward scales the kept
input gradient by the upstream gradient on the device, whatever it is. The arithmetic is Liger's "sum" path's;
its "mean" path divides each row by the count before summing, so a mean differs from it by fp32 rounding only.
What this does not compute (a bias, class weights, z-loss, label smoothing, token scaling, accuracies, a
trainable head, reduction "none", CPU tensors) goes to Liger's own function, as called. What it bought on an
H100 (Qwen2.5-7B, the same round with and without): docs/results.md's h100e section.
"""

from __future__ import annotations

import torch


def chunk_rows(tokens: int, vocab: int, hidden: int, chunk_mem: int) -> int:
    """Liger's chunk size: each chunk's [rows x vocab] logits at most chunk_mem x [tokens x hidden] elements,
    rows a power of 2 (Qwen2.5-7B at 4,096 tokens, 152,064 x 3,584, chunk_mem 8: 4,096 / ceil(152,064 / 28,672)
    = 683, so 1,024 rows, 4 chunks)."""
    per = -(-vocab // (chunk_mem * hidden))
    rows = 1 << (max(1, -(-tokens // per)) - 1).bit_length()
    return min(rows, tokens)


# The keywords _row_losses gives Liger's kernel (0.8.5's): a Liger whose kernel takes other ones is refused
# (lorabench.fast.parts), not called wrongly.
KERNEL_ARGS = ("X_ptr", "X_stride", "Y_ptr", "Y_stride", "weight_ptr", "loss_ptr", "z_loss_ptr", "loss_stride",
               "token_accuracy_ptr", "token_accuracy_stride", "predicted_tokens_ptr", "predicted_tokens_stride",
               "n_cols", "n_non_ignore", "sum_non_ignore_weight", "weight_sum", "ignore_index", "lse_square_scale",
               "label_smoothing", "reduction", "softcap", "RETURN_Z_LOSS", "RETURN_TOKEN_ACCURACY",
               "RETURN_PREDICTED_TOKENS", "BLOCK_SIZE", "HAS_WEIGHT", "HAS_SOFTCAPPING", "HAS_GRADIENTS")


def kernel_differs() -> str | None:
    """Why Liger's installed cross-entropy kernel is not the one _row_losses launches, or None."""
    from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel

    names = getattr(liger_cross_entropy_kernel, "arg_names", ())
    return None if set(names) == set(KERNEL_ARGS) else \
        f"Liger's liger_cross_entropy_kernel takes {tuple(names)}, not 0.8.5's arguments"


def _row_losses(logits: torch.Tensor, target: torch.Tensor, losses: torch.Tensor, ignore_index: int,
                softcap: float | None) -> None:
    """Each row's loss into `losses` (fp32) and its logits' gradient over them, unscaled (reduction "sum"):
    Liger's kernel, launched as its fused linear cross-entropy launches it."""
    from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel
    from liger_kernel.ops.fused_linear_cross_entropy import MAX_FUSED_SIZE

    vocab = logits.shape[1]
    liger_cross_entropy_kernel[(logits.shape[0],)](
        X_ptr=logits, X_stride=logits.stride(-2), Y_ptr=target, Y_stride=target.stride(-1), weight_ptr=None,
        loss_ptr=losses, z_loss_ptr=None, loss_stride=losses.stride(-1), token_accuracy_ptr=None,
        token_accuracy_stride=0, predicted_tokens_ptr=None, predicted_tokens_stride=0, n_cols=vocab,
        n_non_ignore=1, sum_non_ignore_weight=1, weight_sum=0.0, ignore_index=ignore_index, lse_square_scale=0.0,
        label_smoothing=0.0, reduction="sum", softcap=softcap, RETURN_Z_LOSS=False, RETURN_TOKEN_ACCURACY=False,
        RETURN_PREDICTED_TOKENS=False, HAS_WEIGHT=False, HAS_SOFTCAPPING=softcap is not None, HAS_GRADIENTS=True,
        BLOCK_SIZE=min(MAX_FUSED_SIZE, 1 << (vocab - 1).bit_length()), num_warps=32)


def _scale(grad: torch.Tensor, upstream: torch.Tensor) -> None:
    """grad *= upstream (a 0-dim tensor on the device) in place, in fp32 and rounded once: Liger's kernel, as its
    backward launches it where the upstream gradient is not 1.0."""
    from liger_kernel.ops.fused_linear_cross_entropy import MAX_FUSED_SIZE
    from liger_kernel.ops.utils import element_mul_kernel

    rows, hidden = grad.shape
    element_mul_kernel[(rows,)](grad, grad.stride(-2), upstream, hidden,
                                BLOCK_SIZE=min(MAX_FUSED_SIZE, 1 << (hidden - 1).bit_length()),
                                X_col_stride=grad.stride(-1), num_warps=32)


class SummedLoss(torch.autograd.Function):
    """sum over rows of cross_entropy(x @ weight.T, target), chunk by chunk: the input's gradient computed in the
    forward (the logits are never kept), scaled in the backward by the upstream gradient on the device."""

    @staticmethod
    def forward(ctx, x, weight, target, ignore_index: int, softcap: float | None, chunk_mem: int):
        tokens, hidden = x.shape
        rows = chunk_rows(tokens, weight.shape[0], hidden, chunk_mem)
        grad = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        losses = torch.zeros(tokens, dtype=torch.float32, device=x.device)  # an ignored row's stays 0
        logits = torch.empty(rows, weight.shape[0], dtype=x.dtype, device=x.device)
        target = target.contiguous()
        for start in range(0, tokens, rows):
            end = min(start + rows, tokens)
            chunk = logits[: end - start]
            torch.mm(x[start:end], weight.t(), out=chunk)
            _row_losses(chunk, target[start:end], losses[start:end], ignore_index, softcap)  # chunk: its gradient
            if grad is not None:
                torch.mm(chunk, weight, out=grad[start:end])
        ctx.save_for_backward(grad)
        return losses.sum()

    @staticmethod
    def backward(ctx, upstream):
        (grad,) = ctx.saved_tensors
        _scale(grad, upstream)  # in place, as Liger's backward: no second [tokens x hidden] at the step's peak
        return grad, None, None, None, None, None


def computes(input: torch.Tensor, weight: torch.Tensor, options: dict) -> bool:
    """Whether SummedLoss computes a call of Liger's fused linear cross-entropy with these keyword `options`."""
    plain = dict(bias=None, ce_weight=None, lse_square_scale=0.0, label_smoothing=0.0, return_z_loss=False,
                 use_token_scaling=False, return_token_accuracy=False, return_predicted_tokens=False)
    return (all(options[k] is None if v is None else options[k] == v for k, v in plain.items())
            and options["reduction"] in ("mean", "sum") and not weight.requires_grad and input.dtype == weight.dtype)


def fused_linear_cross_entropy(input, weight, target, bias=None, ce_weight=None, ignore_index: int = -100,
                               lse_square_scale: float = 0.0, label_smoothing: float = 0.0, reduction: str = "mean",
                               softcap=None, return_z_loss: bool = False, accum_dtype=None,
                               use_token_scaling: bool = False, return_token_accuracy: bool = False,
                               return_predicted_tokens: bool = False, chunk_mem_const: int = 1, *, liger):
    """liger_kernel.transformers.functional.liger_fused_linear_cross_entropy (`liger`, 0.8.5's signature) without
    its host round trips where SummedLoss computes the call on CUDA; else `liger` itself, given every keyword."""
    options = dict(bias=bias, ce_weight=ce_weight, ignore_index=ignore_index, lse_square_scale=lse_square_scale,
                   label_smoothing=label_smoothing, reduction=reduction, softcap=softcap, return_z_loss=return_z_loss,
                   accum_dtype=accum_dtype, use_token_scaling=use_token_scaling,
                   return_token_accuracy=return_token_accuracy, return_predicted_tokens=return_predicted_tokens,
                   chunk_mem_const=chunk_mem_const)
    if not (input.is_cuda and computes(input, weight, options)):
        return liger(input, weight, target, **options)
    total = SummedLoss.apply(input, weight, target, ignore_index, softcap, chunk_mem_const)
    return total if reduction == "sum" else total / (target != ignore_index).sum()
