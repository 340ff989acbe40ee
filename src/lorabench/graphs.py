"""Each kept decoder layer's forward and backward replayed as CUDA graphs (backend.cuda_graphs).

Where a fast cell's batch is small for its model, its step is as long as its host's work: tens of launches
per decoder layer from Python, forward and backward (docs/fast-path.md, "When the host sets the pace"). torch.cuda.make_graphed_callables captures a layer's forward and its backward once; each step
then launches two graphs per layer instead. What changes between steps is not in a graph but in memory the
graphs read: the layers' inputs (copied into the graphs' own), LoRA dropout's seeds (one int64 per adapted
projection, drawn again on the device before each step: lorabench.dropout_kernels reads them there), the
adapters' bf16 copy (flat_optim.LowCopy, cast again before each step) and the adapters themselves (updated in
place by the optimizer).

Which layers: the kept ones (not recomputed, not offloaded: checkpointing and host copies are not captured),
once, at the first step, from what the model's forward gives them then (a forward without gradients over the
first batch): a layer whose call carries an attention mask, a cache or packed rows' boundaries (Gemma-2's
block masks, varlen attention) is not captured, and at any later call whose shapes or arguments differ from the
captured ones the layer runs its own forward. On one GPU (DDP's gradient hooks are not captured).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

log = logging.getLogger(__name__)
# Keyword arguments a decoder layer may get that the captured computation does not depend on (the position
# embeddings are its inputs; SDPA ignores the ids and cache positions without a cache).
IGNORED = {"position_ids", "cache_position", "use_cache", "num_items_in_batch", "output_attentions",
           "output_hidden_states"}


class _Call(nn.Module):
    """One layer's forward as a function of tensors only (what make_graphed_callables captures); its
    parameters are the layer's (the adapters' gradients come out of the graph)."""

    def __init__(self, layer: nn.Module, forward):
        super().__init__()
        self.layer, self.run = layer, forward

    def forward(self, hidden, cos, sin):
        return self.run(hidden, position_embeddings=(cos, sin))


@dataclass
class Graphs:
    """The captured layers and what their graphs read that changes between steps."""
    seeds: torch.Tensor | None = None  # one dropout seed per adapted projection with dropout
    copies: list = field(default_factory=list)  # flat_optim.LowCopy of the adapters
    layers: int = 0
    dtype: torch.dtype = torch.bfloat16  # the activations' (the adapters' copy is in it)
    pool_bytes: int = 0  # what the capture added to the memory reserved: the graphs' private pool, at most

    def metrics(self, memory: dict) -> dict:
        """The cell's record: how many layers were captured, and the peak allocated with the graphs' pool in it.
        A replay allocates nothing through the caching allocator, so its peak allocated alone leaves out every
        tensor the graphs hold (their activations and temporaries); the pool is reserved for them alone."""
        out = {"graphs/layers": self.layers, "mem/graph_pool_gib": self.pool_bytes / 2**30}
        if "mem/peak_allocated_gib" in memory:
            out["mem/peak_allocated_gib"] = memory["mem/peak_allocated_gib"] + self.pool_bytes / 2**30
        return out

    def before_step(self) -> None:
        """New dropout seeds on the device, the adapters cast again (outside any graph): two launches."""
        if self.seeds is not None:
            self.seeds.random_(0, 2**31 - 1)
        for copy in self.copies:
            copy.stale()
            copy.view(0, self.dtype)


def _refusal(kwargs: dict) -> str | None:
    """Why a layer's call with these keyword arguments cannot be the captured one, or None."""
    if kwargs.get("attention_mask") is not None:
        return f"an attention mask ({type(kwargs['attention_mask']).__name__})"
    if kwargs.get("past_key_values") is not None:
        return "a cache"
    if kwargs.get("position_embeddings") is None:
        return "no position embeddings"
    other = set(kwargs) - IGNORED - {"attention_mask", "past_key_values", "position_embeddings"}
    return f"other arguments {sorted(other)}" if other else None


def _seed_slots(layers, device) -> torch.Tensor | None:
    """Give each adapted projection of `layers` (lorabench.fused's groups) its dropout seed in device memory."""
    loras = [proj.lora for layer in layers for owner in (layer.self_attn, layer.mlp)
             for name in ("lorabench_qkv", "lorabench_o", "lorabench_gate_up", "lorabench_down")
             for proj in getattr(owner, name, ()) if proj.lora is not None]
    if not loras:
        return None
    seeds = torch.randint(2**31 - 1, (len(loras),), device=device)
    for i, lora in enumerate(loras):
        lora.lorabench_seed = seeds[i:i + 1]
    return seeds


def _probe(model, inputs: dict, layers) -> list[tuple | None]:
    """(hidden states, keyword arguments) each layer's forward gets from the model's forward over `inputs`
    (no gradients)."""
    seen: list[tuple | None] = [None] * len(layers)

    def record(i, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        seen[i] = hidden, {k: v for k, v in kwargs.items() if k != "hidden_states"}
    hooks = [layer.register_forward_pre_hook(lambda m, args, kw, i=i: record(i, args, kw), with_kwargs=True)
             for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            model(**inputs, use_cache=False)  # as in training: no cache
    finally:
        for h in hooks:
            h.remove()
    return seen


def capture(model, inputs: dict, layers, keep: list[bool], dtype: torch.dtype) -> Graphs:
    """Capture the kept layers of `layers` whose first call is eligible, and route their later calls through
    their graphs; returns what each step must refresh."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        raise RuntimeError("backend.cuda_graphs runs on one GPU (DDP's gradient hooks are not captured): use "
                           "backend.cuda_graphs=false with several")
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=dtype):
        seen = _probe(model, inputs, layers)
    chosen = [i for i, (k, s) in enumerate(zip(keep, seen)) if k and s is not None and _refusal(s[1]) is None]
    graphs = Graphs(copies=list({id(c): c for p in model.parameters()
                                 for c in [getattr(p, "lorabench_low", (None,))[0]] if c is not None}.values()),
                    dtype=dtype)
    if not chosen:
        why = next((_refusal(s[1]) for k, s in zip(keep, seen) if k and s is not None), "every layer recomputed "
                   "or offloaded")
        log.info("backend.cuda_graphs: no decoder layer to capture (%s)", why)
        return graphs
    graphs.seeds = _seed_slots([layers[i] for i in chosen], device)
    graphs.before_step()
    originals = [layers[i].forward for i in chosen]
    calls = tuple(_Call(layers[i], f) for i, f in zip(chosen, originals))
    samples = tuple((seen[i][0].detach().clone().requires_grad_(),
                     *(t.detach().clone() for t in seen[i][1]["position_embeddings"])) for i in chosen)
    reserved = torch.cuda.memory_reserved(device)
    with torch.autocast(device.type, dtype=dtype, cache_enabled=False):
        graphed = torch.cuda.make_graphed_callables(calls, samples, num_warmup_iters=3)
    graphs.pool_bytes = torch.cuda.memory_reserved(device) - reserved
    for i, call, original, sample in zip(chosen, graphed, originals, samples):
        layers[i].forward = _replayed(call, original, sample)
    graphs.layers = len(chosen)
    log.info("backend.cuda_graphs: %d of %d decoder layers captured (forward and backward)", len(chosen), len(layers))
    return graphs


def _replayed(call, original, sample):
    """A layer's forward that replays its graphs where the call matches the captured one, else runs as before."""
    shapes, fell_back = [(t.shape, t.dtype) for t in sample], []

    def forward(hidden_states, **kwargs):
        pe = kwargs.get("position_embeddings")
        why = _refusal(kwargs)
        if why is None and [(t.shape, t.dtype) for t in (hidden_states, *pe)] != shapes:
            why = "other shapes or dtypes"
        if why is not None or not torch.is_grad_enabled():
            if why is not None and not fell_back:
                fell_back.append(why)
                log.info("backend.cuda_graphs: a captured layer ran its own forward: %s", why)
            return original(hidden_states, **kwargs)
        if not hidden_states.requires_grad:  # the first layer's input: its gradient is computed, not used
            hidden_states = hidden_states.detach().requires_grad_()
        return call(hidden_states, *pe)

    return forward
