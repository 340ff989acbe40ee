"""The saved activations of chosen decoder layers held in pinned host memory between the forward and
the backward pass (train.offload_fraction), copied on side streams so that the copies overlap compute.

Within a memory budget a decoder layer either keeps what its backward needs (Mistral-7B under
backend=fast: ~100 KiB per token, 1.2 GiB at 6 x 2,048 tokens) or is recomputed in the backward
(+~35% of its compute: all but the down projection runs twice). Offloading is a third choice: the
layer's saved tensors go to host memory while the layers above it compute their forward, and come back
while the layers above it compute their backward. The host link bounds how much: an H100's PCIe 5
moves ~55 GB/s each way (bench.py's hw/d2h_pinned_gbs), ~0.5 GB during the ~9 ms forward of one layer
at 12,288 tokens, so one layer's 1.2 GB takes the forward time of ~2.4 layers. So offloaded layers are
interleaved with recomputed ones (which save almost nothing in the forward and take longest in the
backward) instead of stacked (`layer_plan`), and a layer's tensors are fetched back two layers ahead
(LOOKAHEAD). An A10's PCIe 4 moves about half as much: there fewer layers can be offloaded for free.
Measured on an H100 within 22 GiB at 12,288 tokens a step (docs/runs/2026-11-24_h100_offload): 8 of 32 layers
offloaded instead of recomputed, +6%; 12, a little slower than none: the link is full.

torch.autograd.graph.save_on_cpu copies on the compute stream and waits for each copy (the forward
stops for every copy out, the backward for every copy back): nothing overlaps. Here the copies run on
two streams of their own; the compute stream waits only when a tensor it needs has not arrived yet.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from lorabench.core.devices import COPY_RANGE

# Tensors under this stay where they are: LoRA's [tokens x r] products, attention's log-sum-exp.
MIN_BYTES = 1 << 20
# A layer's tensors start back when the backward reaches the layer this many above it: one layer's
# backward (~19 ms at 12,288 tokens) is a little shorter than its copy back (1.2 GB / 55 GB/s = 22 ms).
LOOKAHEAD = 2

RECOMPUTE, OFFLOAD, KEEP = "recompute", "offload", "keep"


def layer_plan(n_layers: int, recompute: int, offload: int) -> list[str]:
    """Each layer's treatment, bottom first: the lowest recompute + offload layers hold both kinds,
    spread evenly (recompute, offload, recompute, offload, ... when they are as many), the rest keep."""
    if recompute < 0 or offload < 0 or recompute + offload > n_layers:
        raise ValueError(f"{recompute} recomputed + {offload} offloaded layers: more than {n_layers}")
    mixed = recompute + offload
    # Layer i is offloaded where the running share of offloaded layers, i x offload / mixed, steps up.
    plan = [OFFLOAD if (i + 1) * offload // mixed > i * offload // mixed else RECOMPUTE for i in range(mixed)]
    return plan + [KEEP] * (n_layers - mixed)


@dataclass(eq=False)
class _Saved:
    """One offloaded buffer (bytes): its host copy, when that copy is complete, and its way back."""
    host: torch.Tensor
    layer: int
    copied: torch.cuda.Event | None  # None on CPU (the copy is done when pack returns)
    gpu: torch.Tensor | None = None
    ready: torch.cuda.Event | None = None


@dataclass(frozen=True, eq=False)
class _View:
    """What autograd keeps for one saved tensor: the buffer it lies in and where."""
    saved: _Saved
    shape: torch.Size
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype


class Offloader:
    """Saved-tensor hooks for the offloaded layers and the prefetch that the backward triggers."""

    def __init__(self, device: torch.device, weights: set[int] = frozenset()):
        self.device = device
        self.weights = weights  # the layers' parameters' storage addresses: saved views of them stay
        self.cuda = device.type == "cuda"
        self.d2h = torch.cuda.Stream(device) if self.cuda else None
        self.h2d = torch.cuda.Stream(device) if self.cuda else None
        self.waiting: dict[int, list[_Saved]] = {}  # layer -> its host copies not yet fetched back
        self.seen: dict = {}  # this layer's forward: the buffer's address and version -> (original, copy)
        self.first = -1  # the lowest offloaded layer: its forward starts a micro-batch's copies
        self.batch_bytes = 0  # sent to host memory in this micro-batch's forward
        self.peak_bytes = 0  # the most of it held at once: the pinned host memory this needs
        self.late = 0  # tensors the backward needed before a prefetch had asked for them

    def pack(self, layer: int, t: torch.Tensor):
        nbytes = t.numel() * t.element_size()
        if t.device != self.device or nbytes < MIN_BYTES:
            return t
        # A frozen linear layer saves its weight (a transposed view, not the Parameter) for the input's
        # gradient: it is on the GPU for good, sending it would only cost the link.
        if t.untyped_storage().data_ptr() in self.weights:
            return t
        # The bytes that travel are t's whole storage, once per layer however many views of it are
        # saved (attention's output and the o projection's input are one buffer: 96 of ~1,300 MiB
        # per layer at 12,288 tokens); a small view of a large buffer travels alone, made contiguous.
        # `seen` holds the originals until the layer's forward ends, so no address is reused meanwhile.
        storage = t.untyped_storage()
        if storage.nbytes() <= 2 * nbytes:
            key = (storage.data_ptr(), t._version)
            data = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
            view = (t.shape, t.stride(), t.storage_offset(), t.dtype)
        else:
            key = (t.data_ptr(), t.shape, t.stride(), t.dtype, t._version)
            data = t.contiguous().reshape(-1).view(torch.uint8)
            view = (t.shape, torch.empty(t.shape, device="meta").stride(), 0, t.dtype)
        if key not in self.seen:
            self.seen[key] = (t, self._send(layer, data))
        return _View(self.seen[key][1], *view)

    def _send(self, layer: int, data: torch.Tensor) -> _Saved:
        """A pinned host copy of `data` (bytes), started on the copy-out stream."""
        host = torch.empty_like(data, device="cpu", pin_memory=self.cuda)
        copied = None
        if self.cuda:
            self.d2h.wait_stream(torch.cuda.current_stream(self.device))  # data is written
            with torch.cuda.stream(self.d2h), torch.profiler.record_function(COPY_RANGE):
                host.copy_(data, non_blocking=True)
                copied = self.d2h.record_event()
            data.record_stream(self.d2h)  # its memory is not reused before the copy has read it
        else:
            host.copy_(data)
        saved = _Saved(host, layer, copied)
        self.waiting.setdefault(layer, []).append(saved)
        self.batch_bytes += host.numel()
        self.peak_bytes = max(self.peak_bytes, self.batch_bytes)
        return saved

    def unpack(self, packed):
        if not isinstance(packed, _View):
            return packed
        saved = packed.saved
        if saved.gpu is None:  # not prefetched: its layer is fetched now, the compute stream waits for it
            self.late += 1
            self._fetch_layer(saved.layer)
            if saved.gpu is None:  # its layer's list was reset by a later forward: this one alone
                self._fetch(saved)
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(saved.ready)
        return saved.gpu.view(packed.dtype).as_strided(packed.shape, packed.stride, packed.offset)

    def _fetch(self, saved: _Saved) -> None:
        if not self.cuda:
            saved.gpu = saved.host
            return
        compute = torch.cuda.current_stream(self.device)
        gpu = torch.empty_like(saved.host, device=self.device)  # from the compute stream's memory
        self.h2d.wait_stream(compute)  # that memory's previous users are done
        self.h2d.wait_event(saved.copied)
        with torch.cuda.stream(self.h2d), torch.profiler.record_function(COPY_RANGE):
            gpu.copy_(saved.host, non_blocking=True)
            saved.ready = self.h2d.record_event()
        gpu.record_stream(self.h2d)
        saved.gpu = gpu

    def _fetch_layer(self, layer: int) -> None:
        for saved in self.waiting.pop(layer, []):  # popped: from now on only autograd holds them
            self._fetch(saved)

    def prefetch(self, below: int) -> None:
        """The backward has reached layer `below`: start fetching the LOOKAHEAD layers under it."""
        for layer in range(below - LOOKAHEAD, below):
            self._fetch_layer(layer)

    def wrap(self, layer_module: nn.Module, index: int) -> None:
        """Layer `index`'s forward under the hooks that send its saved tensors to host memory."""
        forward = layer_module.forward

        def offloaded(*args, **kwargs):
            if not torch.is_grad_enabled():
                return forward(*args, **kwargs)
            self.waiting[index] = []  # what an earlier forward left (one never followed by a backward)
            if index == self.first:
                self.batch_bytes = 0
            # The originals are let go when the forward ends, not with the pack hook: autograd keeps
            # each saved tensor's pack hook (and what it holds) until the backward releases that tensor.
            self.seen = {}
            try:
                with torch.autograd.graph.saved_tensors_hooks(functools.partial(self.pack, index), self.unpack):
                    return forward(*args, **kwargs)
            finally:
                self.seen = {}

        layer_module.forward = offloaded

    def watch(self, layer_module: nn.Module, index: int) -> None:
        """When the backward reaches this layer's output, prefetch the offloaded layers just below."""
        def on_output(module, args, output):
            if isinstance(output, torch.Tensor) and output.requires_grad and torch.is_grad_enabled():
                output.register_hook(lambda grad: self.prefetch(index))
        layer_module.register_forward_hook(on_output)

    def metrics(self) -> dict:
        return {"mem/host_offload_peak_gib": self.peak_bytes / 2**30, "count/offload_late_tensors": self.late}


def apply(layers, plan: list[str], device: torch.device) -> Offloader | None:
    """Hooks on the decoder layers that `plan` offloads (and on those above them, for the prefetch)."""
    if OFFLOAD not in plan:
        return None
    off = Offloader(device, {p.untyped_storage().data_ptr() for layer in layers for p in layer.parameters()})
    off.first = plan.index(OFFLOAD)
    for i, (layer, how) in enumerate(zip(layers, plan)):
        if how == OFFLOAD:
            off.wrap(layer, i)
        if OFFLOAD in plan[max(0, i - LOOKAHEAD):i]:
            off.watch(layer, i)
    return off


# ---------------------------------------------------------------------------- recomputed layers' inputs on the host

class HostCheckpoints:
    """train.offload_checkpoints: each recomputed decoder layer keeps its input (the residual stream, tokens x
    hidden) in pinned host memory instead of the GPU, and is recomputed from it in the backward (Unsloth's
    offloaded gradient checkpointing). With every layer recomputed, the GPU then holds no layer's activations
    between the forward and the backward, only the one layer being recomputed: at 65,536 tokens of Mistral-7B's
    4,096 features the 32 inputs are 32 x 512 MiB = 16 GiB of host memory instead of GPU memory. Each input goes
    out on a copy stream while the layers above compute, and comes back on another while the layer above runs its
    backward (the layer below's is fetched as each layer's backward starts). The recompute restores the RNG
    states the forward ran with (LoRA dropout's masks, the fused path's seeds), as PyTorch's checkpoint does."""

    def __init__(self, device: torch.device):
        self.device, self.cuda = device, device.type == "cuda"
        self.d2h = torch.cuda.Stream(device) if self.cuda else None
        self.h2d = torch.cuda.Stream(device) if self.cuda else None
        self.order: list = []  # this step's saved inputs, in forward order (the backward walks it down)
        self.peak_bytes = 0

    def checkpoint(self, fn, hidden: torch.Tensor, *args):
        """What GradientCheckpointingLayer calls in place of torch.utils.checkpoint (fn: the layer's call)."""
        if not torch.is_grad_enabled():
            return fn(hidden, *args)
        return _OnHost.apply(self, fn, hidden, *args)

    def send(self, hidden: torch.Tensor) -> dict:
        entry = {"host": torch.empty(hidden.shape, dtype=hidden.dtype, pin_memory=self.cuda), "gpu": None,
                 "index": len(self.order)}
        if self.cuda:
            self.d2h.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.d2h), torch.profiler.record_function(COPY_RANGE):
                entry["host"].copy_(hidden, non_blocking=True)
                entry["copied"] = self.d2h.record_event()
            hidden.record_stream(self.d2h)
        else:
            entry["host"].copy_(hidden)
        self.order.append(entry)
        held = sum(e["host"].numel() * e["host"].element_size() for e in self.order if e["gpu"] is None)
        self.peak_bytes = max(self.peak_bytes, held)
        return entry

    def fetch(self, entry: dict) -> None:
        if entry["gpu"] is not None:
            return
        if not self.cuda:
            entry["gpu"] = entry["host"]
            return
        gpu = torch.empty(entry["host"].shape, dtype=entry["host"].dtype, device=self.device)
        self.h2d.wait_stream(torch.cuda.current_stream(self.device))  # gpu's memory is free to write
        self.h2d.wait_event(entry["copied"])
        with torch.cuda.stream(self.h2d), torch.profiler.record_function(COPY_RANGE):
            gpu.copy_(entry["host"], non_blocking=True)
            entry["ready"] = self.h2d.record_event()
        gpu.record_stream(self.h2d)
        entry["gpu"] = gpu

    def receive(self, entry: dict) -> torch.Tensor:
        """The layer's input back on the GPU; the layer below's starts coming back meanwhile."""
        self.fetch(entry)
        if entry["index"] > 0 and entry["index"] <= len(self.order):
            self.fetch(self.order[entry["index"] - 1])
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_event(entry["ready"])
        hidden = entry["gpu"]
        if entry["index"] == 0:
            self.order = []  # the lowest layer's backward: this step's inputs are all back
        return hidden

    def metrics(self) -> dict:
        return {"mem/host_checkpoints_peak_gib": self.peak_bytes / 2**30}


class _OnHost(torch.autograd.Function):
    @staticmethod
    def forward(ctx, host, fn, hidden, *args):
        ctx.host, ctx.fn, ctx.args = host, fn, args
        kind = hidden.device.type
        ctx.autocast = (torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
        ctx.rng = (torch.get_rng_state(), torch.cuda.get_rng_state(hidden.device) if host.cuda else None)
        ctx.entry = host.send(hidden)
        out = fn(hidden, *args)  # (autograd is off inside a Function's forward: nothing is kept)
        if not isinstance(out, torch.Tensor):
            raise TypeError("train.offload_checkpoints recomputes decoder layers that return a tensor; "
                            f"this one returns {type(out).__name__}: use train.offload_checkpoints=false")
        return out

    @staticmethod
    def backward(ctx, grad):
        host, kind = ctx.host, grad.device.type
        hidden = host.receive(ctx.entry).detach().requires_grad_(True)
        with torch.random.fork_rng(devices=[grad.device] if host.cuda else [], device_type=kind):
            torch.set_rng_state(ctx.rng[0])
            if ctx.rng[1] is not None:
                torch.cuda.set_rng_state(ctx.rng[1], grad.device)
            with torch.enable_grad(), torch.autocast(kind, dtype=ctx.autocast[1], enabled=ctx.autocast[0]):
                out = ctx.fn(hidden, *ctx.args)
        torch.autograd.backward(out, grad)
        ctx.entry["gpu"] = ctx.entry["host"] = None  # let both copies go
        return (None, None, hidden.grad, *([None] * len(ctx.args)))


def offload_checkpoints(layers, device: torch.device) -> HostCheckpoints:
    """Every recomputed layer of `layers` (gradient_checkpointing on) recomputed from its input on the host."""
    host = HostCheckpoints(device)
    for layer in layers:
        if getattr(layer, "gradient_checkpointing", False):
            layer._gradient_checkpointing_func = host.checkpoint
    return host
