"""Where a training step's GPU memory goes at its peak, measured: PyTorch's allocator history over one step.

Opt-in (train.memory_snapshot, CUDA). One step after the warmup and any profiled steps, untimed (recording every
allocation's Python stack slows a step down), runs with torch.cuda.memory._record_memory_history on. Its snapshot is
written to the cell's run dir as memory_snapshot.pickle (drag it onto https://pytorch.org/memory_viz), and
memory_at_peak.json says what was allocated at the step's peak:

  before_gib  what was allocated when the step began (the weights, the adapters and their optimizer states, what
              the allocator's earlier steps left): one figure, no stacks
  peak_gib    before_gib plus the most the step's own allocations held at once: the step's peak allocated memory
  sites       the step's allocations alive at that moment, by the call that made them (the innermost frame in
              lorabench, transformers, peft, bitsandbytes, liger_kernel, unsloth or fla), largest first, in GiB

The memory model's parts (lorabench.sweep.memory) are estimates; these are the allocations.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback

log = logging.getLogger(__name__)
GIB = 2**30
PACKAGES = ("lorabench", "transformers", "peft", "bitsandbytes", "liger_kernel", "unsloth", "unsloth_zoo", "fla")
MAX_ENTRIES = 1_000_000  # allocator events kept: a long-row step of a 32-layer model makes ~10^5


@dataclass
class AtPeak:
    before_gib: float
    peak_gib: float
    sites: list = field(default_factory=list)  # [{"site": "file.py:function", "gib": float, "blocks": int}]


def site(frames: list[dict]) -> str:
    """The innermost frame of a stack (innermost first) in one of PACKAGES, as `package/file.py:function`; else the
    innermost frame's; `?` without frames."""
    for f in frames:
        parts = f.get("filename", "").replace("\\", "/").split("/")
        for i, part in enumerate(parts[:-1]):
            if part in PACKAGES:
                return f"{'/'.join(parts[i:])}:{f.get('name', '?')}"
    return f"{frames[0].get('filename', '?').rsplit('/', 1)[-1]}:{frames[0].get('name', '?')}" if frames else "?"


def at_peak(trace: list[dict], before_bytes: int, top: int = 20) -> AtPeak:
    """The step's peak from its allocator trace (one device's events in order): each `alloc` adds its block, each
    `free_requested` takes its block away (one allocated before the trace began, part of before_bytes, too); the
    sites of the step's blocks alive at the highest point."""
    live: dict[int, tuple[int, str]] = {}
    held = peak = 0
    at = {}
    for e in trace:
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            live[addr] = (e["size"], site(e.get("frames") or []))
            held += e["size"]
            if held > peak:
                peak, at = held, dict(live)
        elif action == "free_requested":
            held -= live.pop(addr)[0] if addr in live else e["size"]
    sizes, counts = defaultdict(int), defaultdict(int)
    for size, where in at.values():
        sizes[where] += size
        counts[where] += 1
    ranked = sorted(sizes, key=sizes.get, reverse=True)[:top]
    return AtPeak(before_bytes / GIB, (before_bytes + peak) / GIB,
                  [{"site": s, "gib": sizes[s] / GIB, "blocks": counts[s]} for s in ranked])


class MemorySnapshot(TrainerCallback):
    """Records the allocator's history over optimizer step `step` (1-based) and writes what the module's docstring
    says into run_dir."""

    def __init__(self, device: torch.device, step: int, run_dir: Path):
        self.device, self.step, self.run_dir = device, step, Path(run_dir)
        self.before = 0
        self.result: AtPeak | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            torch.cuda.synchronize(self.device)
            self.before = torch.cuda.memory_allocated(self.device)
            torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.step:
            return
        torch.cuda.synchronize(self.device)
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(self.run_dir / "memory_snapshot.pickle", "wb") as f:
            pickle.dump(snapshot, f)
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.result = at_peak(snapshot["device_traces"][index], self.before)
        (self.run_dir / "memory_at_peak.json").write_text(json.dumps(asdict(self.result), indent=1) + "\n")
        log.info("memory at step %d's peak: %.2f GiB allocated (%.2f before it); memory_at_peak.json", self.step,
                 self.result.peak_gib, self.result.before_gib)

    def metrics(self) -> dict:
        return {} if self.result is None else {"mem/snapshot_peak_gib": self.result.peak_gib,
                                               "mem/snapshot_before_gib": self.result.before_gib}
