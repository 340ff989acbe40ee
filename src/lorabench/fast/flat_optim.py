"""The LoRA adapters as one flat tensor for the optimizer (backend.flat_optimizer).

bitsandbytes' 8-bit optimizers update one tensor at a time and wait for the GPU after each
(`torch.cuda.synchronize()` per tensor in `Optimizer8bit.step`). LoRA r16 on q/k/v/o of a 32-layer
model is 256 tensors (32 layers x 4 projections x A and B): the whole-GPU profile (b32, seq 512) shows
the optimizer's step spanning 28.6 ms of a 962 ms step for 1.4 ms of kernels, the GPU idle in between.

`flatten` gives the optimizer one flat Parameter per parameter group instead: each adapter tensor
becomes a view into it (its storage moves, the module still holds the same Parameter), the
optimizer's hook gathers their gradients into the flat gradient before each step (one torch.cat) and
the update writes through the views. One launch and one wait per step.

The arithmetic is the same. Adam's update is elementwise (torch's AdamW, bitsandbytes' 32-bit ones);
bitsandbytes' 8-bit states are quantised in blocks of 256 elements with one absmax each, so there a
tensor joins the flat one only when its size is a multiple of 256 (its blocks stay its own) and at
least `min_8bit_size` (4,096: smaller tensors keep 32-bit states). LoRA r16 on Mistral-7B: 65,536 (A)
and 65,536 or 16,384 (B) elements, all join. Adafactor factors each matrix's second moment by rows and
columns, so it is refused. Per-tensor options (bitsandbytes' max_unorm, its per-parameter overrides)
would see the flat tensor: lorabench sets none of them.

The adapters compute in the activations' dtype (bf16 under autocast), so each use casts them from fp32:
lorabench.fast.fused cast each adapter tensor in every forward and again in every backward, ~16 launches per
decoder layer for LoRA on q/k/v/o, each a host launch and nothing for the GPU (a 16 x 4,096 cast). Each
flat tensor here also keeps `LowCopy`: itself in that dtype, cast in one launch at the first use after each
optimizer step, whose views the adapters' uses read (`low`). The same rounding as the casts it replaces.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

BLOCK = 256  # bitsandbytes' blockwise 8-bit optimizer states: elements per absmax


def _joins(optimizer: torch.optim.Optimizer):
    """Which tensors can be one range of a flat tensor without a change to `optimizer`'s arithmetic."""
    args = getattr(optimizer, "args", None)  # bitsandbytes' optimizers keep their options here
    if args is not None and getattr(args, "optim_bits", 32) == 8:
        return lambda p: p.numel() % BLOCK == 0 and p.numel() >= args.min_8bit_size
    if args is not None or isinstance(optimizer, (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)):
        return lambda p: True  # elementwise updates
    raise ValueError(f"backend.flat_optimizer: {type(optimizer).__name__} does not update each element "
                     f"on its own; use backend.flat_optimizer=false")


class LowCopy:
    """A flat parameter in the dtypes its views are used in, cast again at the first use after each
    optimizer step (`stale`); before the first use nothing is cast (a DDP wrap may still overwrite the
    adapters with rank 0's values after the optimizer is built, as the Trainer does)."""

    def __init__(self, flat: nn.Parameter, ps: list[nn.Parameter]):
        self.flat, self.shapes = flat, [p.shape for p in ps]
        self.copies: dict[torch.dtype, torch.Tensor] = {}  # dtype: the flat cast
        self.views: dict[torch.dtype, list[torch.Tensor]] = {}  # dtype: its views, in ps' order
        self.fresh: set[torch.dtype] = set()

    def stale(self, *_) -> None:
        self.fresh.clear()

    def view(self, i: int, dtype: torch.dtype) -> torch.Tensor:
        """The `i`th tensor of the flat parameter in `dtype`, as `p.to(dtype)` would give it."""
        if dtype not in self.fresh:
            if dtype not in self.copies:
                low = self.copies[dtype] = torch.empty(self.flat.shape, dtype=dtype, device=self.flat.device)
                self.views[dtype] = [v.view(s) for v, s in zip(low.split([s.numel() for s in self.shapes]),
                                                                self.shapes)]
            self.copies[dtype].copy_(self.flat.detach())
            self.fresh.add(dtype)
        return self.views[dtype][i]


def low(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`p` in `dtype`: a view of its flat parameter's LowCopy where `flatten` gave it one, else a cast."""
    if p.dtype == dtype:
        return p
    copy = getattr(p, "lorabench_low", None)
    return p.to(dtype) if copy is None else copy[0].view(copy[1], dtype)


def flatten(optimizer: torch.optim.Optimizer) -> int:
    """Replace the parameters of `optimizer` (before its first step) by flat ones; returns how many
    tensors now live in flat ones. The model's Parameters stay where they are as objects."""
    joins = _joins(optimizer)
    if optimizer.state:
        raise ValueError("flat_optim.flatten: the optimizer has stepped already")
    flats: list[tuple[nn.Parameter, list[nn.Parameter]]] = []
    for group in optimizer.param_groups:
        kept, same = [], defaultdict(list)
        for p in group["params"]:
            (same[(p.dtype, p.device)] if joins(p) else kept).append(p)
        for ps in same.values():
            if len(ps) < 2:
                kept += ps
                continue
            flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in ps]))
            copy = LowCopy(flat, ps)
            for i, (p, view) in enumerate(zip(ps, flat.detach().split([p.numel() for p in ps]))):
                p.data = view.view_as(p)  # the same Parameter object, its storage now inside `flat`
                p.lorabench_low = (copy, i)
            optimizer.register_step_post_hook(copy.stale)
            flats.append((flat, ps))
            kept.append(flat)
        group["params"] = kept

    def gather(*_):
        for flat, ps in flats:
            grads = [p.grad for p in ps]
            flat.grad = None if all(g is None for g in grads) else torch.cat(
                [(torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(ps, grads)])

    def release(*_):
        for flat, _ in flats:
            flat.grad = None  # the model's own gradients are what zero_grad clears

    optimizer.register_step_pre_hook(gather)
    optimizer.register_step_post_hook(release)
    return sum(len(ps) for _, ps in flats)
