"""Where a training step's time goes: a torch.profiler breakdown of a few steps after warmup.

Opt-in (train.profile_steps > 0). The profiled steps come right after the warmup steps and are not
in the timed window (profiling slows a step down). Each profiled step's wall time, from one
synchronised step boundary to the next, is split into categories that add up to it:

  matmul      dense matrix products (base layers, LoRA adapters, lm_head)
  dequant     4-bit / 8-bit (de)quantisation kernels of bitsandbytes (and lorabench.fast.kernels.nf4')
  attention   scaled-dot-product attention, forward and backward
  elementwise norms, activations, rotary embeddings, casts, adds: everything else on the device
  loss        log-softmax and NLL of the cross-entropy, forward and backward
  optimizer   optimizer step and gradient clipping
  data        host-to-device copies, and device idle while the DataLoader produces the batch
  idle        device idle for any other reason: Python, kernel launch latency, synchronisation
              (a step waiting for train.offload_fraction's copies; those copies run beside the compute
              on streams of their own and are left out of the partition)

On CUDA the device's work is its kernels and copies; on CPU it is the operators' own time on the
host, and "idle" is host time outside any operator (Python between them). Device work is attributed once, in time order (overlapping kernels on other streams count for
the first), so the categories partition the step exactly; a kernel is classified by the operators
that launched it (e.g. a GEMM inside scaled_dot_product_attention is attention, any kernel inside
Optimizer.step is optimizer) and by its own name when no operator is known, except that PyTorch's
elementwise kernels and device copies are never matmul or attention (MEMORY_KERNELS).
"""

from __future__ import annotations

import gc
import logging
from collections import Counter
from pathlib import Path

import torch
from transformers import TrainerCallback

from lorabench.core.devices import COPY_RANGE
from lorabench.measure.metrics import CATEGORIES

log = logging.getLogger(__name__)

STEP_RANGE = "lorabench/profiled_step"
DATA_RANGE = "enumerate(DataLoader)"  # torch.utils.data annotates every DataLoader __next__ so

# (category, substrings of an operator or kernel name, lower case). A kernel's category is the first
# rule that matches any name on its launch stack (operator, its parents, and the kernel itself).
RULES = (
    ("data", (DATA_RANGE.lower(), "memcpy htod")),
    ("optimizer", ("optimizer.step", "optimizer.zero_grad", "_foreach_", "clip_grad")),
    ("attention", ("attention", "flash", "fmha", "sdpa")),
    ("loss", ("log_softmax", "nll_loss", "cross_entropy", "logsoftmax", "nllloss")),
    # bitsandbytes' (de)quantisation ops and kernels; not its gemm_4bit op as a whole: when no fused
    # kernel fits, that op dequantises (dequant) and then calls a GEMM (matmul).
    # lorabench.fast.kernels.nf4' Triton kernel (_nf4_kernel) too.
    ("dequant", ("quantize", "dequant", "kquant", "_quant", "_nf4_")),
    # lorabench.fast.kernels.grad' Triton GEMM (_sum_mm_kernel) too.
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                "gemm", "gemv", "nvjet", "cutlass", "xmma", "cublas", "scaled_mm", "linear_matmul", "_sum_mm")),
)


# PyTorch's own elementwise kernels (copies, casts, adds) and device-to-device copies: memory-bound wherever
# they run. Inside a matrix product's or an attention's operator (torch.matmul's copy of an expanded operand,
# autocast's cast of a weight inside aten::linear) they are still no matrix product: lorabench.report.projection scales
# matmul and attention by the GEMM rate and these by the bandwidth.
MEMORY_KERNELS = ("elementwise_kernel", "memcpy dtod")


def classify(names: list[str]) -> str:
    """Category of one piece of device work, from the names on its launch stack (the kernel first)."""
    lowered = [n.lower() for n in names]
    for category, needles in RULES:
        if any(needle in name for name in lowered for needle in needles):
            if category in ("matmul", "attention") and any(k in lowered[0] for k in MEMORY_KERNELS):
                return "elementwise"
            return category
    return "elementwise"


def _stack(event) -> list[str]:
    names = []
    while event is not None:
        names.append(event.name)
        event = event.cpu_parent
    return names


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _overlap(start: float, end: float, merged: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in merged)


def breakdown(events, device_events=(), trace_start_ns: int = 0) -> tuple[list[dict], Counter]:
    """Per profiled step: {category: milliseconds} plus "step_ms"; and the milliseconds by
    (category, "kernel <- operator") over all steps, to show what each category holds (for idle:
    by what the device waited for, "before <operator> in <outermost operator>").

    events: the profiler's FunctionEvents (host operators, with their parents and children, times
    in us from the trace start); device_events: its raw kineto events of the device (kernels and
    copies, times in ns), each linked to the operator that launched it by correlation id. Without
    device events the host's operators are the work (a CPU run)."""
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    by_id = {e.id: e for e in cpu}
    steps = sorted((e.time_range.start, e.time_range.end) for e in cpu if e.name == STEP_RANGE)
    data_ranges = _merge([(e.time_range.start, e.time_range.end) for e in cpu if e.name.startswith(DATA_RANGE)])

    work = []  # (start_us, end_us, category)
    if device_events:
        # Kineto mirrors each host annotation (the step range, Optimizer.step, ...) on the device's
        # timeline; those spans are not device work, and kineto marks them (torch's own device-time sum
        # skips them so). Not by name: a kernel can share its host range's name (torch.compile's
        # triton_poi_fused_* kernels are launched inside a range named after them: Unsloth's
        # compiled MLP and dropout, which were dropped from the split as idle before). Without the mark
        # (an older torch), a device span that shares a host name is taken for a mirror.
        host_names = {e.name for e in cpu}
        for k in device_events:
            if k.is_user_annotation() if hasattr(k, "is_user_annotation") else k.name() in host_names:
                continue
            parent = by_id.get(k.linked_correlation_id())
            names = [k.name()] + (_stack(parent) if parent is not None else [])
            if COPY_RANGE in names:
                continue
            start = (k.start_ns() - trace_start_ns) / 1e3  # the FunctionEvents' clock: us from the trace start
            work.append((start, start + k.duration_ns() / 1e3, classify(names), _who(names), _waiting(names)))
    else:  # the host is the device: each operator's own time (outside its children) is work
        for e in cpu:
            if e.name == STEP_RANGE:
                continue
            names = _stack(e)
            category, who, cursor = classify(names), _who(names), e.time_range.start
            for child in sorted(e.cpu_children, key=lambda c: c.time_range.start):
                if child.time_range.start > cursor:
                    work.append((cursor, child.time_range.start, category, who, _waiting(names)))
                cursor = max(cursor, child.time_range.end)
            if e.time_range.end > cursor:
                work.append((cursor, e.time_range.end, category, who, _waiting(names)))
    work.sort()

    out, by_who = [], Counter()
    for s0, s1 in steps:
        ms = dict.fromkeys(CATEGORIES, 0.0)
        cursor = s0
        for a, b, category, who, waiting in work:
            if b <= cursor or a >= s1:
                continue
            a = max(a, cursor)
            b = min(b, s1)
            gap_data = _overlap(cursor, a, data_ranges)  # device idle before this work
            ms["data"] += gap_data
            ms["idle"] += (a - cursor) - gap_data
            by_who["idle", waiting] += ((a - cursor) - gap_data) / 1e3
            ms[category] += b - a
            by_who[category, who] += (b - a) / 1e3
            cursor = b
        gap_data = _overlap(cursor, s1, data_ranges)
        ms["data"] += gap_data
        ms["idle"] += (s1 - cursor) - gap_data
        by_who["idle", "after the step's last work, to its end"] += ((s1 - cursor) - gap_data) / 1e3
        out.append({k: v / 1e3 for k, v in ms.items()} | {"step_ms": (s1 - s0) / 1e3})
    return out, by_who


def _who(names: list[str]) -> str:
    """"kernel <- the operator that launched it" (on CPU: "operator <- its parent")."""
    return f"{names[0][:70]} <- {names[1][:50]}" if len(names) > 1 else names[0][:70]


def _waiting(names: list[str]) -> str:
    """What an idle device waited for before a piece of work: its operator, and the outermost
    operator above it (Optimizer.step, an autograd backward node, the DataLoader...)."""
    ops = [n for n in names[1:] if n != STEP_RANGE] or names[:1]
    return f"before {ops[0][:50]}" + (f" in {ops[-1][:60]}" if len(ops) > 1 else "")


def contributors_text(by_who: Counter, steps: int, top: int = 6) -> str:
    """Per category, what filled it: the largest kernels/operators, ms per profiled step."""
    lines = []
    for c in CATEGORIES:
        items = sorted(((ms, who) for (cat, who), ms in by_who.items() if cat == c), reverse=True)[:top]
        if items:
            lines.append(f"{c}:")
            lines += [f"  {ms / steps:9.2f} ms  {who}" for ms, who in items]
    return "\n".join(lines)


def summarize_profile(per_step: list[dict]) -> dict:
    """Mean over the profiled steps: prof/<category>_ms and prof/<category>_frac, prof/step_ms, prof/top."""
    n = len(per_step)
    out = {"prof/steps": n, "prof/step_ms": sum(s["step_ms"] for s in per_step) / n}
    for c in CATEGORIES:
        out[f"prof/{c}_ms"] = sum(s[c] for s in per_step) / n
        out[f"prof/{c}_frac"] = out[f"prof/{c}_ms"] / out["prof/step_ms"]
    out["prof/top"] = max(CATEGORIES, key=lambda c: out[f"prof/{c}_ms"])
    return out


class StepProfiler(TrainerCallback):
    """Profiles the `steps` optimizer steps after `after_step` with torch.profiler.

    Register it after the StepMeter: the meter synchronises the device at each step end, so every
    profiled range starts and ends with an idle device and matches the meter's step time.
    """

    def __init__(self, device: torch.device, after_step: int, steps: int, run_dir: Path, meter):
        self.device, self.after_step, self.steps, self.run_dir, self.meter = device, after_step, steps, run_dir, meter
        self.prof = self._range = None
        self.result: dict = {}

    def _start(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities)
        self.prof.start()  # tens of ms the first time (CUPTI setup): not part of the next step
        self.meter.restart_clock()
        self._open_range()

    def _open_range(self) -> None:
        self._range = torch.profiler.record_function(STEP_RANGE)
        self._range.__enter__()

    def on_train_begin(self, args, state, control, **kwargs):
        if self.after_step == 0:
            self._start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.prof is None:
            if state.global_step == self.after_step:
                self._start()
            return
        self._range.__exit__(None, None, None)
        self._range = None
        self.meter.steps[-1]["profiled"] = True
        if state.global_step < self.after_step + self.steps:
            self._open_range()
            return
        self.prof.stop()
        prof, self.prof = self.prof, None
        log.info("profiled steps %d-%d; attributing device time", self.after_step + 1, state.global_step)
        events = prof.events()
        kineto = prof.profiler.kineto_results
        device_events = [k for k in kineto.events() if k.device_type() == torch.autograd.DeviceType.CUDA
                         and k.duration_ns() > 0] if self.device.type == "cuda" else []
        per_step, by_who = breakdown(events, device_events, kineto.trace_start_ns())
        # The step time of the same steps measured by the meter, to check the attribution against.
        measured = [s["time_s"] * 1e3 for s in self.meter.steps if s.get("profiled")]
        self.result = summarize_profile(per_step) | {"prof/measured_step_ms": sum(measured) / len(measured)}
        sort = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        (self.run_dir / "profile.txt").write_text(
            f"torch.profiler, optimizer steps {self.after_step + 1}-{state.global_step}\n\n"
            "What each category of the breakdown holds (largest first, per profiled step):\n"
            + contributors_text(by_who, len(per_step))
            + "\n\nTop operators by self time (both steps):\n" + events.key_averages().table(sort_by=sort, row_limit=40))
        # The analysis took seconds and left ~10^5 Python objects (a Mistral-7B step launches
        # ~30k kernels): collect them now, or a later timed step pays for that garbage collection
        # (measured on an H100: +1.6 s in one step), and start the next step's clock after it.
        del events, kineto, device_events, prof
        gc.collect()
        self.meter.restart_clock()

    def close(self) -> None:
        """Stops a profile left running by a failed cell."""
        if self.prof is not None:
            if self._range is not None:
                self._range.__exit__(None, None, None)
                self._range = None
            self.prof.stop()
            self.prof = None
