"""Each kept decoder layer's forward and backward replayed as CUDA graphs (backend.cuda_graphs).

Where a fast cell's batch is small for its model, its step is as long as its host's work: tens of launches
per decoder layer from Python, forward and backward (docs/fast-path.md, "When the host sets the pace"). Each
kept layer's forward and backward are captured once, and each step then launches two graphs per layer instead.
What changes between steps is not in a graph but in memory the graphs read: the layers' inputs, LoRA dropout's
seeds (one int64 per adapted projection, drawn again on the device before each step: lorabench.fast.kernels.dropout
reads them there), the adapters' bf16 copy (flat_optim.LowCopy, cast again before each step) and the adapters
themselves (updated in place by the optimizer).

The capture follows torch.cuda.make_graphed_callables (warm up on a side stream, capture the forwards in
order and the backwards in reverse, one memory pool), with one change: consecutive captured layers are
chained. make_graphed_callables gives every layer its own static input, output, output gradient and input
gradient, so that each layer's hidden states and their gradient are held three more times than eagerly
(Qwen2.5-7B at batch 4 x 1,024 tokens: 3 x 29 MB x 28 layers = 2.5 GiB). Here a layer's static input is the
previous layer's static output (not copied), and the input gradients alternate between two buffers, each
layer's output gradient being the next one's input gradient: two gradient buffers in all over the eager step.

Which layers: the kept ones and the recomputed ones (not the offloaded ones: host copies are not captured),
once, at the first step, from what the model's forward gives them then (a forward without gradients over the
first batch). A layer whose call carries a mask that depends on the batch (padding, packed rows' boundaries as
a mask) or a cache is not captured. A flex attention block mask that depends on shapes alone (Gemma-2's causal
and sliding-window masks over fixed-length rows) is part of the captured call. Packed rows with varlen
attention (lorabench.fast.packed_attention) are: their segments' offsets are an input the graphs read, like the
position embeddings, in shapes the collator keeps fixed (lorabench.builders.data.build_collator: rows of seq_len
tokens, room for a fixed number of segments, the longest one the row). At any later call whose shapes, mask or
arguments differ from the captured ones the layer runs its own forward. On one GPU (DDP's gradient hooks are
not captured).

A recomputed layer (activation checkpointing) is captured as checkpointing computes it: its forward graph runs
without keeping activations, its backward graph runs the forward again and then the backward, so that its
activations live only while its backward graph runs, as in the eager step. Its checkpointing wrapper
(transformers' GradientCheckpointingLayer) is turned off, the graphs doing what it did; a call that runs the
layer's own forward is checkpointed as before.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

log = logging.getLogger(__name__)
# Keyword arguments a decoder layer may get that the captured computation does not depend on (the position
# embeddings are its inputs; attention ignores the ids and cache positions without a cache).
IGNORED = {"position_ids", "cache_position", "use_cache", "num_items_in_batch", "output_attentions",
           "output_hidden_states"}
# Packed rows' segments for varlen attention (lorabench.builders.data.segments): their offsets are inputs of
# the graphs (copied in before each replay, as the position embeddings), their longest lengths part of the call
# (the kernel's grid is sized by them when it is captured).
BOUNDARIES = ("cu_seq_lens_q", "cu_seq_lens_k")
LENGTHS = ("max_length_q", "max_length_k")
WARMUP = 3  # eager forwards and backwards per layer before its capture (as make_graphed_callables)


class _Call(nn.Module):
    """One layer's forward as a function of its tensor inputs (what is captured); its parameters are the
    layer's, and a mask that depends on shapes alone is part of the call (`static`)."""

    def __init__(self, layer: nn.Module, forward, static: dict, boundaries: tuple = ()):
        super().__init__()
        self.layer, self.run, self.static, self.boundaries = layer, forward, static, boundaries

    def forward(self, hidden, cos, sin, *boundaries):
        return self.run(hidden, position_embeddings=(cos, sin), **dict(zip(self.boundaries, boundaries)),
                        **self.static)


def _inputs(kwargs: dict) -> tuple:
    """The tensors a captured call reads besides the hidden states: the position embeddings, then packed rows'
    segment offsets where the call has them."""
    return (*kwargs["position_embeddings"], *(kwargs[k] for k in BOUNDARIES if kwargs.get(k) is not None))


def _static(kwargs: dict) -> dict:
    """What of a layer's call is part of its captured computation: a mask that depends on shapes alone, the
    longest segments of packed rows."""
    return {k: kwargs[k] for k in ("attention_mask", *LENGTHS) if kwargs.get(k) is not None}


@dataclass(eq=False)
class _Slot:
    """One captured layer: its graphs and the memory they read and write."""
    x: torch.Tensor  # the input (the previous captured layer's output where they are consecutive)
    out: torch.Tensor
    params: tuple  # the layer's trainable parameters
    fwd: torch.cuda.CUDAGraph
    bwd: torch.cuda.CUDAGraph | None = None
    grad_out: torch.Tensor | None = None  # the next captured layer's input gradient where consecutive
    grads: tuple = ()  # the input's gradient, then each parameter's
    clone_grads: bool = False  # with gradient accumulation (see _Replay.backward)
    recompute: bool = False  # its forward graph keeps no activations, its backward graph computes them again


class _Replay(torch.autograd.Function):
    """A captured layer's forward and backward, each one graph replayed."""

    @staticmethod
    def forward(ctx, slot: _Slot, x, *params):
        if x.data_ptr() != slot.x.data_ptr():  # not the previous captured layer's output
            slot.x.copy_(x)
        slot.fwd.replay()
        ctx.slot = slot
        return slot.out.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        slot = ctx.slot
        if grad.data_ptr() != slot.grad_out.data_ptr():
            slot.grad_out.copy_(grad)
        slot.bwd.replay()
        # A parameter's first gradient may be taken as its .grad without a copy (autograd's AccumulateGrad):
        # that .grad would be this graph's memory, which the next micro-batch's replay overwrites before it
        # is added to. With gradient accumulation each parameter's gradient is a copy (one launch each).
        grads = [g if g is None or not slot.clone_grads or i == 0 else g.clone() for i, g in enumerate(slot.grads)]
        return None, *(g if g is None else g.detach() for g in grads)


@dataclass
class Graphs:
    """The captured layers and what their graphs read that changes between steps."""
    seeds: torch.Tensor | None = None  # one dropout seed per adapted projection with dropout
    copies: list = field(default_factory=list)  # flat_optim.LowCopy of the adapters
    layers: int = 0
    dtype: torch.dtype = torch.bfloat16  # the activations' (the adapters' copy is in it)
    pool_bytes: int = 0  # what the capture added to the memory reserved: the graphs' private pool, at most
    unowned_bytes: int = 0  # of it, what no tensor owns (the graphs' activations and temporaries)
    slots: list = field(default_factory=list)  # each captured layer's graphs and memory (_Slot), bottom first

    def metrics(self, memory: dict) -> dict:
        """The cell's record: how many layers were captured, and the peak allocated with the graphs' memory in
        it. A replay allocates nothing through the caching allocator, so its peak allocated alone leaves out what
        the graphs hold that no tensor owns (their activations and temporaries), reserved in their pool; the
        tensors of the pool the layers return (hidden states, gradients) are counted already."""
        out = {"graphs/layers": self.layers, "mem/graph_pool_gib": self.pool_bytes / 2**30}
        if "mem/peak_allocated_gib" in memory:
            out["mem/peak_allocated_gib"] = memory["mem/peak_allocated_gib"] + self.unowned_bytes / 2**30
        return out

    def before_step(self) -> None:
        """New dropout seeds on the device, the adapters cast again (outside any graph): two launches."""
        if self.seeds is not None:
            self.seeds.random_(0, 2**31 - 1)
        for copy in self.copies:
            copy.stale()
            copy.view(0, self.dtype)


def _closure_key(fn, depth: int = 0):
    """What a mask function computes, as a comparable value: its code and what it closes over, recursively;
    None where it closes over a tensor (a mask that depends on the batch: padding, packed rows) or anything
    else whose value a key cannot hold."""
    if depth > 8:
        return None
    parts = [fn.__code__]
    for cell in fn.__closure__ or ():
        v = cell.cell_contents
        items = v if isinstance(v, tuple) else (v,)
        for item in items:
            if callable(item) and hasattr(item, "__code__"):
                k = _closure_key(item, depth + 1)
                if k is None:
                    return None
                parts.append(k)
            elif item is None or isinstance(item, (bool, int, float, str)):
                parts.append(item)
            else:
                return None
    return tuple(parts)


def mask_key(mask):
    """A flex attention block mask's key where it depends on shapes alone (None for no mask), else False:
    two masks with one key are the same mask."""
    if mask is None:
        return None
    if type(mask).__name__ != "BlockMask":
        return False
    fn = _closure_key(mask.mask_mod)
    return False if fn is None else (tuple(mask.seq_lengths), tuple(mask.BLOCK_SIZE), tuple(mask.shape), fn)


def _refusal(kwargs: dict, key=None) -> str | None:
    """Why a layer's call with these keyword arguments cannot be a captured one, or None; key: its mask's
    mask_key where the caller has it already."""
    mask = kwargs.get("attention_mask")
    if (mask_key(mask) if key is None else key) is False:
        return f"an attention mask that depends on the batch ({type(mask).__name__})"
    if kwargs.get("past_key_values") is not None:
        return "a cache"
    if kwargs.get("position_embeddings") is None:
        return "no position embeddings"
    other = set(kwargs) - IGNORED - {"attention_mask", "past_key_values", "position_embeddings", *BOUNDARIES,
                                     *LENGTHS}
    return f"other arguments {sorted(other)}" if other else None


def _seed_slots(layers, device) -> torch.Tensor | None:
    """Give each adapted projection of `layers` (lorabench.fast.fused's groups) its dropout seed in device memory."""
    loras = [proj.lora for layer in layers for owner in (layer.self_attn, layer.mlp)
             for name in ("lorabench_qkv", "lorabench_o", "lorabench_gate_up", "lorabench_down")
             for proj in getattr(owner, name, ()) if proj.lora is not None]
    if not loras:
        return None
    seeds = torch.randint(2**31 - 1, (len(loras),), device=device)
    for i, lora in enumerate(loras):
        lora.lorabench_seed = seeds[i:i + 1]
    return seeds


class _Stop(Exception):
    """Raised by the probe at the last layer's input: what comes after it (the final norm, the head) is not needed."""


def _probe(model, inputs: dict, layers) -> list[tuple | None]:
    """(hidden states, keyword arguments) each layer's forward gets from the model's forward over `inputs`
    (no gradients), stopped at the last layer's input: no logits (at batch 32 x 1,024 tokens, Qwen2.5's
    152,064-word head would give 18.6 GiB of them in fp32, past a 22 GiB budget whose training step needs none).
    Every layer after the first is given the first one's hidden states where their shape is the same: a sample
    for its warm-up and capture, whose values the graphs do not keep (at batch 32 x 1,024 tokens each layer's
    own would hold 229 MiB of Qwen2.5's 3,584 features, 6.3 GiB for 28 layers)."""
    seen: list[tuple | None] = [None] * len(layers)

    def record(i, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        first = next((s[0] for s in seen if s is not None), None)
        if first is not None and first.shape == hidden.shape and first.dtype == hidden.dtype:
            hidden = first
        seen[i] = hidden, {k: v for k, v in kwargs.items() if k != "hidden_states"}
        if i == len(layers) - 1:
            raise _Stop
    hooks = [layer.register_forward_pre_hook(lambda m, args, kw, i=i: record(i, args, kw), with_kwargs=True)
             for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            model(**inputs, use_cache=False)  # as in training: no cache
    except _Stop:
        pass
    finally:
        for h in hooks:
            h.remove()
    return seen


def capture(model, inputs: dict, layers, keep: list[bool], dtype: torch.dtype, accumulate: bool = False,
            recompute: list[bool] | None = None) -> Graphs:
    """Capture the kept and the recomputed layers of `layers` whose first call is eligible, and route their later
    calls through their graphs; returns what each step must refresh. accumulate: gradients are accumulated over
    micro-batches; recompute: which layers are checkpointed (their activations computed again in the backward)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        raise RuntimeError("backend.cuda_graphs runs on one GPU (DDP's gradient hooks are not captured): use "
                           "backend.cuda_graphs=false with several")
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=dtype):
        seen = _probe(model, inputs, layers)
    again = recompute or [False] * len(layers)
    keep = [k or r for k, r in zip(keep, again)]
    chosen = [i for i, (k, s) in enumerate(zip(keep, seen)) if k and s is not None and _refusal(s[1]) is None]
    graphs = Graphs(copies=list({id(c): c for p in model.parameters()
                                 for c in [getattr(p, "lorabench_low", (None,))[0]] if c is not None}.values()),
                    dtype=dtype)
    if not chosen:
        why = next((_refusal(s[1]) for k, s in zip(keep, seen) if k and s is not None), "every layer offloaded")
        log.info("backend.cuda_graphs: no decoder layer to capture (%s)", why)
        return graphs
    graphs.seeds = _seed_slots([layers[i] for i in chosen], device)
    graphs.before_step()
    originals = [layers[i].forward for i in chosen]
    calls = [_Call(layers[i], f, _static(seen[i][1]), tuple(k for k in BOUNDARIES if seen[i][1].get(k) is not None))
             for i, f in zip(chosen, originals)]
    # The probe's hidden states are the samples (not copied: nothing writes them; one tensor for every layer of
    # its shape); each layer's position embeddings (and packed rows' offsets) are the static tensors its graphs read
    statics = _Statics()
    samples = [(seen[i][0].detach().requires_grad_(), statics.static(_inputs(seen[i][1]))) for i in chosen]
    del seen  # the other layers' hidden states
    recomputed = [again[i] for i in chosen]
    with torch.autocast(device.type, dtype=dtype, cache_enabled=False):
        _warm_up(calls, samples, recomputed)
        torch.cuda.empty_cache()  # the warmup's blocks, cached for its side stream, back to the device
        reserved, allocated = torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)
        slots = _capture_chain(calls, samples, [b - a == 1 for a, b in zip(chosen, chosen[1:])], accumulate,
                               recomputed)
    graphs.pool_bytes = torch.cuda.memory_reserved(device) - reserved
    graphs.unowned_bytes = graphs.pool_bytes - (torch.cuda.memory_allocated(device) - allocated)
    for i, call, slot, (_, pe) in zip(chosen, calls, slots, samples):
        layers[i].forward = _replayed(slot, call, pe, statics)
        if slot.recompute:  # the graphs recompute it; transformers' wrapper would checkpoint the replay itself
            layers[i].gradient_checkpointing = False
    graphs.layers, graphs.slots = len(chosen), slots
    log.info("backend.cuda_graphs: %d of %d decoder layers captured (forward and backward; %d of them recomputed "
             "in their backward graph), their pool %.2f GiB (activations included)", len(chosen), len(layers),
             sum(s.recompute for s in slots), graphs.pool_bytes / 2**30)
    return graphs


def _warm_up(calls, samples, again: list[bool]) -> None:
    """Each layer's forward and backward run eagerly on a side stream first (as make_graphed_callables): lazy
    initialisation (cuBLAS workspaces, Triton's and flex attention's compilations) kept out of the captures;
    again: the recomputed layers, whose forward graph runs without gradients (warmed up so too)."""
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        for call, (x, pe), recomputed in zip(calls, samples, again):
            params = tuple(p for p in call.parameters() if p.requires_grad)
            for _ in range(WARMUP):
                if recomputed:
                    with torch.no_grad():
                        call(x, *pe)
                out = call(x, *pe)
                torch.autograd.grad(out, (x, *params), torch.empty_like(out), allow_unused=True)
            del out
    torch.cuda.synchronize()


def _capture_chain(calls, samples, consecutive: list[bool], accumulate: bool, again: list[bool]) -> list[_Slot]:
    """The forwards captured in order and the backwards in reverse, in one pool, as they replay. Where layer
    i + 1 follows layer i, its input is layer i's output and layer i's output gradient is its input gradient:
    the memory is shared, not copied. again: the layers whose backward graph computes their forward again."""
    pool, slots, x = torch.cuda.graph_pool_handle(), [], samples[0][0]
    for i, (call, (_, pe)) in enumerate(zip(calls, samples)):
        fwd = torch.cuda.CUDAGraph()
        # A recomputed layer's forward keeps nothing for the backward: its temporaries go back to the pool when
        # its capture ends, for the captures after it (they replay after it too).
        with torch.cuda.graph(fwd, pool=pool), torch.set_grad_enabled(not again[i]):
            out = call(x, *pe)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"a decoder layer returned {type(out).__name__}, not its hidden states")
        slots.append(_Slot(x=x, out=out, params=tuple(p for p in call.parameters() if p.requires_grad), fwd=fwd,
                           clone_grads=accumulate, recompute=again[i]))
        if i + 1 < len(calls):
            # A layer after one that is not captured (offloaded) starts a chain: its input is memory of its own,
            # which its forward copies the hidden states into and its backward reads (its saved input, or the
            # input its recomputation starts from). The samples are one tensor for every layer: chains that
            # started in it would overwrite each other's inputs before their backward.
            x = (out.detach() if consecutive[i] else samples[i + 1][0].detach().clone()).requires_grad_()
    # The input gradients alternate between two buffers: layer i's is copied into pingpong[i % 2] (one device
    # copy, ~20 us for 29 MB), which layer i - 1 reads while writing the other; autograd's own buffer goes back
    # to the pool for the captures below it. Holding each layer's input gradient instead would keep one buffer
    # per layer over the eager step (Qwen2.5-7B at batch 4: 28 x 29 MB).
    last = len(slots) - 1
    pingpong = [torch.empty_like(slots[-1].out) for _ in range(2)]
    grad_out = pingpong[(last + 1) % 2]
    for i in reversed(range(len(slots))):
        slot = slots[i]
        slot.bwd, slot.grad_out = torch.cuda.CUDAGraph(), grad_out
        with torch.cuda.graph(slot.bwd, pool=pool):
            # a recomputed layer's forward again, reading the same input, position embeddings and dropout seeds
            out = calls[i](slot.x, *samples[i][1]) if slot.recompute else slot.out
            grads = torch.autograd.grad(out, (slot.x, *slot.params), grad_out, allow_unused=True)
            pingpong[i % 2].copy_(grads[0])
            del out
        slot.grads = (pingpong[i % 2], *grads[1:])
        del grads
        if i > 0:
            grad_out = slot.grads[0] if consecutive[i - 1] else torch.empty_like(slots[i - 1].out)
    return slots


class _Statics:
    """The position embeddings' static copies, one per distinct tensor the layers were given (every layer of a
    model with one rotary embedding shares one pair), copied into at most once per forward."""

    def __init__(self):
        self.by_id: dict[int, torch.Tensor] = {}
        self.last: dict[int, weakref.ref] = {}  # static's id: the tensor last copied into it

    def static(self, tensors) -> tuple:
        return tuple(self.by_id.setdefault(id(t), t.detach().clone()) for t in tensors)

    def load(self, statics, tensors) -> None:
        for static, t in zip(statics, tensors):
            last = self.last.get(id(static))
            if last is None or last() is not t:  # a new forward's tensor (the previous step's is freed)
                static.copy_(t)
                self.last[id(static)] = weakref.ref(t)


def _replayed(slot: _Slot, call: _Call, pe: tuple, statics: _Statics):
    """A layer's forward that replays its graphs where the call matches the captured one, else runs as before;
    pe: the static position embeddings (and segment offsets) its graphs read."""
    shapes = [(t.shape, t.dtype) for t in (slot.x, *pe)]
    key, fell_back = mask_key(call.static.get("attention_mask")), []
    lengths = [call.static.get(k) for k in LENGTHS]

    def forward(hidden_states, **kwargs):
        mine = mask_key(kwargs.get("attention_mask"))  # once per call: it walks the mask function's closures
        why = _refusal(kwargs, mine)
        new = _inputs(kwargs) if why is None else ()
        if why is None and [(t.shape, t.dtype) for t in (hidden_states, *new)] != shapes:
            why = "other shapes or dtypes"
        if why is None and mine != key:
            why = "another attention mask"
        if why is None and [kwargs.get(k) for k in LENGTHS] != lengths:
            why = "other longest segments"
        if why is not None or not torch.is_grad_enabled():
            if why is not None and not fell_back:
                fell_back.append(why)
                log.info("backend.cuda_graphs: a captured layer ran its own forward: %s", why)
            if slot.recompute and torch.is_grad_enabled():  # checkpointed, as its wrapper did before the capture
                return checkpoint(call.run, hidden_states, use_reentrant=False, **kwargs)
            return call.run(hidden_states, **kwargs)
        statics.load(pe, new)
        return _Replay.apply(slot, hidden_states, *slot.params)

    return forward
