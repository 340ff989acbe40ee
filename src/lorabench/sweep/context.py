"""Each backend's longest context within a memory budget: seq_len at batch 1 bisected on measured OOMs, refined
by the memory model.

    python train.py +experiment=max_context backend=fast,unsloth,hf gpu=a10 model=llama-3.1-8b

A mode of +experiment=tune's sweeper (search.target=max_context, lorabench.sweep.sweeper.BudgetSearch): the same
outer grid, launcher, cell dirs, search.json and resume. Per outer cell (a backend) one layout, the one that saves
the most memory: hf and fast every layer recomputed with its input in host memory (train.offload_checkpoints),
fast also its MLP in tiles (backend.tiled_mlp) and its loss in Liger's own chunks; Unsloth its tiled MLP and
offloaded checkpointing. Each probe is an ordinary cell at batch 1 with a few timed steps, so the ceiling's tokens/s is
measured as well.

How probes are chosen (`max_context`):
  1. The first is the longest seq_len the memory model (lorabench.sweep.memory) puts within the budget.
  2. A cell that fits raises the lower bound, an OOM lowers the upper; the model is refitted after each cell: its
     per-token part scaled through the peaks of the cells that fit, and raised until every OOM cell's estimate
     is over the budget.
  3. The next probe is where the refitted model crosses the budget, at least one resolution step inside the
     bracket (so that one cell can close it). The bracket's midpoint instead (a bisection at worst) where the
     model's shape is wrong (the line through the cells that fit puts the shortest OOM within the budget) or it
     is off on one side (its last two probes each moved the same bound by at most two resolution steps). With no
     cell fitted yet, an OOM halves the length (the raw model may be 2x off).
  4. It stops when the longest that fits and the shortest that does not are within max(search.resolution_tokens,
     search.resolution_pct x the longest that fits), when the longest asked fits (search.max_seq_len or the
     model's window, the shorter), when search.min_seq_len runs out of memory, or at search.max_cells.
Every probe is a trial in search.json with its status; the stop says why the search ended. A cell that fails
(or is skipped: the backend is not installed) ends the search with its reason: nothing is refused silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from lorabench.core.results import Ceiling, Trial
from lorabench.sweep.search import FIT_MARGIN, Layout, Measured

Probe = Callable[[Layout, int], Measured]  # one cell of the layout at batch 1 and this many tokens a row


@dataclass
class ContextSpace:
    layout: Layout
    min_seq: int  # search.min_seq_len
    max_seq: int  # the longest asked: search.max_seq_len or the model's window, the shorter
    budget_gib: Optional[float]  # None: unknown until a cell reports its device's memory
    estimate: Callable[[int], float]  # the memory model's peak GiB at batch 1 and this seq_len
    fixed_gib: float  # its part that does not grow with seq_len
    multiple: int = 256  # probes are multiples of this many tokens
    resolution_tokens: int = 1024
    resolution_pct: float = 0.03
    max_cells: int = 10
    budget_read: bool = False  # budget_gib is the device's size read before any cell: a cell's own replaces it
    breakdown: Callable[[int], dict] = lambda seq: {}  # the model's GiB by part at this seq_len, for the report
    limit_why: str = "search.max_seq_len"  # what sets max_seq


@dataclass
class ContextOutcome:
    trials: list[Trial] = field(default_factory=list)
    ceiling: Optional[Ceiling] = None
    budget_gib: Optional[float] = None
    cut_short: str = ""  # why the search ended before its bracket closed (the sweep was stopped)


class ContextSearch:
    """One backend's max-context search: its trials, bracket and refitted memory model."""

    def __init__(self, space: ContextSpace, measure: Probe, log: Callable[[str], None] = lambda s: None):
        self.s, self.measure, self.log = space, measure, log
        self.out = ContextOutcome(budget_gib=space.budget_gib)
        self.budget = space.budget_gib
        self.moves: list[tuple[str, int]] = []  # (status, tokens its bound moved) of each probe inside a bracket
        self.stopped = ""  # why a cell ended the search (failed, skipped, interrupted, the sweep stopped)

    # ------------------------------------------------------------------ what is known
    def measured(self, status: str) -> list[Trial]:
        return [t for t in self.out.trials if t.job is not None and t.status == status]

    def bounds(self) -> tuple[Optional[Trial], Optional[Trial]]:
        """(the longest cell that fitted, the shortest that ran out of memory)."""
        ok, oom = self.measured("ok"), self.measured("oom")
        return (max(ok, key=lambda t: t.seq_len, default=None), min(oom, key=lambda t: t.seq_len, default=None))

    def resolution(self, seq: int) -> int:
        return max(self.s.resolution_tokens, int(self.s.resolution_pct * seq))

    def creeping(self, step: int) -> bool:
        """The refitted model is off on one side: its last two probes moved the same bound by at most `step`
        each (two fitting a little higher, or two running out of memory a little lower)."""
        last = self.moves[-2:]
        return len(last) == 2 and last[0][0] == last[1][0] and all(moved <= step for _, moved in last)

    def cells_left(self) -> int:
        return self.s.max_cells - sum(t.job is not None for t in self.out.trials)

    # ------------------------------------------------------------------ the memory model
    def refit(self, held: bool = True) -> tuple[float, float]:
        """(fixed GiB, scale of the per-token part): a line over (the model's per-token part, measured peak) of the
        cells that fitted where two differ, through the one point where there is one; each OOM cell then held
        over the budget (unless not `held`)."""
        f0 = self.s.fixed_gib
        pts = [(self.s.estimate(t.seq_len) - f0, t.peak_gib) for t in self.measured("ok") if t.peak_gib]
        fixed, scale = f0, 1.0
        if len({x for x, _ in pts}) >= 2:
            mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
            scale = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
            fixed = my - scale * mx
        if len(pts) == 1 or scale <= 0 or fixed < 0:  # through the largest point, the fixed part as estimated
            x, y = max(pts)
            fixed = min(f0, 0.9 * y)
            scale = (y - fixed) / x
        if self.budget and held:
            for t in self.measured("oom"):
                scale = max(scale, (self.budget - fixed) / max(self.s.estimate(t.seq_len) - f0, 1e-9) * 1.01)
        return fixed, scale

    def crossing(self, held: bool = True) -> int:
        """The longest seq_len that the refitted model puts within the budget (max_seq when the budget is unknown
        yet)."""
        if not self.budget:
            return self.s.max_seq
        fixed, scale = self.refit(held)
        room = self.budget * (1 - FIT_MARGIN) - fixed
        lo, hi = 0, self.s.max_seq + 1  # the model grows with seq_len: bisect its crossing of the room left
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if scale * (self.s.estimate(mid) - self.s.fixed_gib) <= room else (lo, mid)
        return lo

    # ------------------------------------------------------------------ the next probe
    def next_probe(self) -> tuple[Optional[int], str]:
        """(the next seq_len to measure, or None and why the search ends)."""
        ok, oom = self.bounds()
        m = self.s.multiple
        if ok and ok.seq_len >= self.s.max_seq:
            return None, f"the longest asked fits ({self.s.max_seq:,} tokens, {self.s.limit_why})"
        if oom and oom.seq_len <= self.s.min_seq:
            return None, f"nothing fits: search.min_seq_len={self.s.min_seq:,} ran out of memory"
        if ok and oom and oom.seq_len - ok.seq_len <= self.resolution(ok.seq_len):
            return None, (f"within the resolution: {ok.seq_len:,} fits, {oom.seq_len:,} does not "
                          f"({oom.seq_len - ok.seq_len:,} tokens apart, at most {self.resolution(ok.seq_len):,})")
        guess = self.crossing()
        if oom and not ok:  # the model (its first estimate, or refitted on OOMs alone) was wrong once: halve
            guess = min(guess, oom.seq_len // 2)
        if ok:
            guess = max(guess, ok.seq_len + self.resolution(ok.seq_len))
        if ok and oom:
            guess = min(guess, oom.seq_len - self.resolution(ok.seq_len))
            # the line through the cells that fit puts the OOM cell within the budget: the model's shape is wrong
            # above them (a term it lacks), or it is off on one side: the midpoint
            if self.crossing(held=False) >= oom.seq_len or self.creeping(2 * self.resolution(ok.seq_len)):
                guess = (ok.seq_len + oom.seq_len) // 2
        low = ok.seq_len + 1 if ok else self.s.min_seq
        high = oom.seq_len - 1 if oom else self.s.max_seq
        seq = max(min(guess, high), low) // m * m
        if seq < low:  # the step below `low` rounds out of the bracket: the one above it
            seq += m
        if seq > high:
            return None, f"no multiple of search.seq_multiple={m} left between the bounds"
        return seq, ""

    def run(self, seq: int) -> Trial:
        ok, oom = self.bounds()
        m = self.measure(self.s.layout, seq)
        t = Trial(self.s.layout.label, 1, m.status, m.tok_s, m.peak_gib, m.job if m.job is not None else -1,
                  m.error or "", m.tok_s_p50, seq)
        self.out.trials.append(t)
        if m.device_gib and (self.budget is None or self.s.budget_read):
            self.budget = self.out.budget_gib = m.device_gib
        if ok and oom and m.status in ("ok", "oom"):  # (the bracket before this cell)
            self.moves.append((m.status, seq - ok.seq_len if m.status == "ok" else oom.seq_len - seq))
        if m.last:
            self.stopped = self.out.cut_short = f"the sweep stopped after cell {t.job} ({m.last})"
        elif m.status == "oom" and m.at_load:  # before its first step: no shorter row holds less
            self.stopped = f"nothing fits: cell {t.job} ran out of memory while its model was built"
        elif m.status not in ("ok", "oom"):
            self.stopped = f"cell {t.job} at seq {seq:,} {m.status}: {m.error or 'no reason given'}"
        return t


def max_context(space: ContextSpace, measure: Probe, log: Callable[[str], None] = lambda s: None) -> ContextOutcome:
    """The longest seq_len of space.layout within the budget, to the space's resolution, in at most max_cells cells."""
    st = ContextSearch(space, measure, log)
    while True:
        seq, stop = st.next_probe()
        if seq is None:
            break
        if st.cells_left() <= 0:
            stop = f"the cell cap (search.max_cells={space.max_cells}) is spent"
            break
        st.run(seq)
        if st.stopped:
            stop = st.stopped
            break
    log(f"stopped: {stop}")
    st.out.ceiling = ceiling(st, stop)
    return st.out


def ceiling(st: ContextSearch, stop: str) -> Ceiling:
    ok, oom = st.bounds()
    scale = st.refit()[1] if ok else None
    return Ceiling(st.s.layout.label, ok.seq_len if ok else None, oom.seq_len if oom else None, st.s.max_seq,
                   st.resolution(ok.seq_len if ok else st.s.min_seq), stop, ok.tok_s if ok else None,
                   ok.peak_gib if ok else None, ok.job if ok else None,
                   st.s.breakdown(ok.seq_len) if ok else {}, scale)


# ---------------------------------------------------------------------------- the space of one outer cell

def context_layout(c) -> Layout:
    """The layout saving the most memory on c's backend (lorabench.sweep.search.long_layouts; Unsloth's offloaded
    checkpointing, with its tiled MLP where backend.unsloth_tiled_mlp is on: its own two memory parts for long
    rows; +experiment=max_context turns it on, with PEFT's LoRA forward in place of Unsloth's fused LoRA kernels,
    which fail under it)."""
    from lorabench.core.config import Backend
    from lorabench.sweep import memory
    from lorabench.sweep.search import long_layouts

    if c.backend.name is Backend.unsloth:  # its tiled MLP as backend.unsloth_tiled_mlp says (the experiment: on)
        plan, tiled = memory.Plan(1.0, 0.0, True), c.backend.unsloth_tiled_mlp
        label = "unsloth checkpointing offloaded" + (", tiled MLP" if tiled else "") \
            + ("" if c.backend.unsloth_fused_lora else ", PEFT's LoRA forward")
        return Layout(label,
                      ("train.gradient_checkpointing=true", "train.checkpoint_fraction=1",
                       "backend.unsloth_offload=true"), (1, 1, int(tiled)), 0.0, plan)
    return long_layouts(c, memory.MemoryModel.of(c))[-1]


def context_space(c, device_gib: float | None = None) -> ContextSpace:
    """c's max-context space: its layout, seq_len within [search.min_seq_len, search.max_seq_len] and the model's
    window, the budget as lorabench.sweep.search.space_for sets it, and the memory model with the layout's settings."""
    from dataclasses import replace

    from lorabench.models import architecture_of
    from lorabench.sweep import memory

    layout, s = context_layout(c), c.search
    chunks = next((int(o.split("=")[1]) for o in layout.overrides if o.startswith("backend.ce_chunk_mem=")), None)
    mm = memory.MemoryModel.of(replace(c, backend=replace(c.backend, ce_chunk_mem=chunks)) if chunks else c)
    window = architecture_of(c.model).max_positions
    limit_why = "the model's window (max_position_embeddings)" if window < s.max_seq_len else "search.max_seq_len"
    auto = c.gpu.name == "auto"
    budget = device_gib if auto else c.gpu.memory_gib
    return ContextSpace(layout, s.min_seq_len, min(s.max_seq_len, window), budget,
                        lambda seq: mm.breakdown(layout.plan, seq).device, mm.fixed_gib, s.seq_multiple,
                        s.resolution_tokens, s.resolution_pct, s.max_cells, auto and budget is not None,
                        lambda seq: mm.breakdown(layout.plan, seq).as_dict(), limit_why)
