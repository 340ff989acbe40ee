"""The MLP over a long row in tiles of tokens, its intermediates recomputed tile by tile in the backward
(backend.tiled_mlp: tokens a tile, 0 off).

A gated MLP keeps its gate, its up projection and their product for the backward: 3 x tokens x intermediate
values, at 65,536 tokens of Mistral-7B's 14,336-wide MLP 3 x 1.75 GiB in bf16, more than everything else one
recomputed layer holds. The MLP computes each token on its own, so the tiles' outputs are the whole MLP's; here
the forward keeps only the MLP's input, and the backward recomputes one tile at a time and backpropagates it:
the tensors of one tile are alive at once (4,096 tokens: 3 x 112 MiB). The cost is one more forward of the MLP
(its matmuls run 3 times instead of 2 in a recomputed layer). Each tile's recompute restores the RNG states its
forward ran with, so LoRA dropout on the MLP's projections draws the tile's forward masks again; the masks are
drawn tile by tile (the same distribution as one draw over the row, other draws).
"""

from __future__ import annotations

import types

import torch
from torch import nn


class _Tiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, forward, tile: int, x):
        ctx.forward, ctx.tile = forward, tile
        kind = x.device.type
        ctx.autocast = (torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
        ctx.rngs = []
        out = _in_tiles(forward, tile, x, ctx.rngs)
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        kind, dx = x.device.type, torch.empty_like(x)
        for i, (part, g) in enumerate(zip(x.split(ctx.tile, dim=-2), grad.split(ctx.tile, dim=-2))):
            part = part.detach().requires_grad_(True)
            with torch.random.fork_rng(devices=[x.device] if x.is_cuda else [], device_type=kind):
                cpu, cuda = ctx.rngs[i]
                torch.set_rng_state(cpu)
                if cuda is not None:
                    torch.cuda.set_rng_state(cuda, x.device)
                with torch.enable_grad(), torch.autocast(kind, dtype=ctx.autocast[1], enabled=ctx.autocast[0]):
                    out = ctx.forward(part)
            torch.autograd.backward(out, g)
            dx.narrow(-2, i * ctx.tile, part.shape[-2]).copy_(part.grad)
        return None, None, dx


def _in_tiles(forward, tile: int, x, rngs: list | None = None):
    """forward over x's tokens, `tile` at a time, each tile's output written into the whole one (no list of tile
    outputs beside it); rngs: where to note the RNG states each tile starts from."""
    out = None
    for i, part in enumerate(x.split(tile, dim=-2)):
        if rngs is not None:
            rngs.append((torch.get_rng_state(), torch.cuda.get_rng_state(x.device) if x.is_cuda else None))
        y = forward(part)
        if out is None:
            out = y.new_empty((*x.shape[:-1], y.shape[-1]))
        out.narrow(-2, i * tile, part.shape[-2]).copy_(y)
    return out


def _tiled_forward(self, x, *args, **kwargs):
    if x.shape[-2] <= self.lorabench_tile or args or kwargs:
        return self.lorabench_mlp_forward(x, *args, **kwargs)
    if not torch.is_grad_enabled():
        # A layer's first forward under a recompute that runs it without autograd (its input kept on the host,
        # lorabench.fast.offload.HostCheckpoints) is tiled too: the whole row's [tokens x intermediate] tensors
        # (3.5 GiB each at 131,072 tokens of Llama-3.1-8B's 14,336-wide MLP) never exist, and LoRA dropout draws
        # the masks tile by tile in the order the recompute (_Tiled) draws them again.
        return _in_tiles(self.lorabench_mlp_forward, self.lorabench_tile, x)
    return _Tiled.apply(self.lorabench_mlp_forward, self.lorabench_tile, x)


def patch_mlps(layers, tile: int) -> int:
    """Each decoder layer's MLP (its `mlp` or `feed_forward`) over rows longer than `tile` tokens in tiles."""
    n = 0
    for layer in layers:
        mlp = getattr(layer, "mlp", None) or getattr(layer, "feed_forward", None)
        if not isinstance(mlp, nn.Module):
            continue
        mlp.lorabench_mlp_forward, mlp.lorabench_tile = mlp.forward, tile
        mlp.forward = types.MethodType(_tiled_forward, mlp)
        n += 1
    return n
