"""Each backend at its best within a memory budget: a small deterministic search over layout x batch.

    python train.py +experiment=tune backend=hf,unsloth,fast gpu=a10 seq_len=512

The user's overrides form the outer grid (one cell per backend here, expanded as Hydra's basic sweeper
does, lorabench.sweep.grid.expand). For each outer cell the search measures at most search.max_cells cells
of its layout space, launched one at a time by the sweeper (lorabench.sweep.sweeper) through the configured
Hydra launcher, each an ordinary cell dir of the sweep (so the report reads it):

  layouts   hf, fast (any backend but unsloth): recomputed fraction of layers (search.checkpoint_fractions)
            x offloaded fraction (search.offload_fractions, where the two add up to at most 1); where the memory
            model (lorabench.sweep.memory) says the row needs them, the long-context layouts too: every layer
            recomputed with its input in host memory (train.offload_checkpoints), on fast also its MLP in tiles
            (backend.tiled_mlp) and its loss in Liger's own chunks (long_layouts);
            unsloth: its own checkpointing off / on (plain) / offloaded (backend.unsloth_offload), off only
            where search.checkpoint_fractions holds 0, on and offloaded where it holds a share above 0.
  batch     search.batches, per layout.

With search.target=max_context (+experiment=max_context) each outer cell's search is lorabench.sweep.context's
instead: its backend's longest seq_len at batch 1, through the same launcher, cell dirs and search.json.

Why a deterministic search and not a TPE sampler (hydra-optuna-sweeper): memory is monotone in what we
search (a larger batch, or a layout that recomputes and offloads no more layers, never uses less), so
one OOM cell rules out a whole corner of the grid and one cell that fits rules in another; an OOM cell
costs a model load like a measured one, and TPE, which sees only a score, would keep sampling that
corner. Twelve trials are too few for TPE's model to beat a bisection that knows the structure, and a
bisection gives the same cells on every run (a comparison between backends must be reproducible).

How cells are chosen (`search`):
  1. Layouts in order of expected speed at equal batch (the most layers kept first, then the fewest
     recomputed: an offloaded layer costs host-link time, a recomputed one a third of its compute), except
     that the layout saving the most memory goes second: both ends are measured before the cap can run out.
  2. Per layout, the first batch is the largest one the memory model (`fixed_gib` + `token_bytes`:
     weights plus per-token activations, its line refitted on the peaks of the cells measured so far)
     puts within the budget; an OOM lowers it (bisection guided by the refitted model), a cell that fits
     raises it one step of the ladder until an OOM, a known or estimated OOM, or a throughput that rose
     less than search.plateau. A layout that met the memory wall after one cell gets one cell a step
     below, when cells are to spare, to learn whether a larger batch still pays (`probe_plateau`).
  3. A cell implied OOM by a measured one (no larger batch, a layout saving no more memory) is never
     run: it is recorded as skipped with its witness, as is one the refitted model puts 10% over the
     budget and, before any cell is measured, a layout whose smallest batch the raw model puts over twice
     the budget (the raw model is within 2x of the measured peaks). A layout is skipped when one that saves
     less memory reached its plateau or the top of the ladder (saving more memory only buys a larger batch,
     which no longer pays), or when it would fit no larger batch than such a layout's best. A cell out of
     memory while its model was built (before its first step) ends the search: no batch or layout holds less.
  4. With cells to spare (hf, fast): a layout halfway, in layers recomputed, between the fastest cell's and its
     nearest neighbour, climbed as the others; again around the fastest, search.refine_layouts at most (`refine`).
  5. The best is the fastest measured cell (non-pad tokens/s); search.json says why it won.
With search.allow_dropout_zero=true the best layout is measured again with lora.dropout=0 (a second,
labelled row: it changes the training recipe, so it is the user's call).

Cells are launched one at a time: each choice depends on the cell before, and one GPU runs one cell at
a time anyway. Being deterministic, the same command run again into the same sweep dir proposes the
same cells with the same job numbers, and each one already ok is read back, not run (lorabench.run.cell).
A sweep stopped mid-search (SIGTERM, Ctrl-C, sweep.deadline_s) keeps the search so far in search.json and
the report, its best marked cut short, before the process exits; the same command then resumes it (a cell that
ran out of memory in the earlier run is read back from its dir too: earlier_oom).
Hydra instantiates a sweeper only from under the hydra_plugins package: the class it names lives in
src/hydra_plugins/lorabench_search and is this module's BudgetSearch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from lorabench.core.results import (
    Trial,
)
from lorabench.sweep import memory

GIB = 2**30
FIT_MARGIN = 0.02  # a batch is started on when the model puts it this far under the budget
SKIP_MARGIN = 0.10  # and skipped on the model's word only when it puts it this far over (once calibrated)
# Before any cell, only a cell the raw estimate puts over this many budgets: the raw model is within 2x of every
# backend's measured peaks (tests/sweep/test_memory.py holds hf, fast and Unsloth within 16%)
RAW_SKIP = 2.0
# The keys a search sets in each cell: an outer override of one of them would be overwritten.
SEARCH_KEYS = ("batch", "train.gradient_checkpointing", "train.checkpoint_fraction", "train.offload_fraction",
               "train.offload_checkpoints", "backend.tiled_mlp", "backend.unsloth_offload")


@dataclass(frozen=True)
class Layout:
    """Which layers recompute or offload their activations, as cell overrides."""

    label: str  # "ckpt 0.5 offload 0.25", "unsloth offloaded"
    overrides: tuple[str, ...]
    # (recomputed, offloaded, tiled): fractions of layers recomputed and offloaded (a recomputed layer whose input
    # waits in host memory counts as both), and whether the MLP runs in tiles; more of any never uses more memory
    saves: tuple[float, ...]
    gib_per_sample: float  # the estimate's activation memory per sample at this layout (GiB)
    plan: memory.Plan = memory.Plan()  # what the memory model was told of the layout
    gib_fixed: float = 0.0  # what the layout holds whatever the batch (MemoryModel.layout_gib), GiB

    def uses_no_less_than(self, other: "Layout") -> bool:
        """At the same batch this layout needs at least the memory of `other` (it saves no more)."""
        return all(a <= b + 1e-9 for a, b in zip(self.saves, other.saves))


@dataclass
class Measured:
    """What one launched cell gave back."""

    status: str  # ok, oom, skipped, failed, interrupted
    tok_s: Optional[float] = None  # perf/tokens_per_s (non-pad)
    peak_gib: Optional[float] = None  # mem/peak_reserved_gib
    job: Optional[int] = None  # its job number (cell dir) in the sweep
    error: Optional[str] = None
    device_gib: Optional[float] = None  # mem/device_total_gib: the budget when the gpu option names none
    last: str = ""  # why the sweep ends after this cell (SIGTERM, Ctrl-C, sweep.deadline_s): its result counts
    tok_s_p50: Optional[float] = None  # the same tokens a step over the median step (lorabench.report.analysis)
    # out of memory while its model was built, before any step (its error says so: sweeper.at_load): the weights,
    # adapters and upcasts, which no batch or layout of a search changes
    at_load: bool = False


@dataclass
class Space:
    layouts: list[Layout]  # in search order (fastest per step first)
    batches: list[int]  # ascending
    budget_gib: Optional[float]  # None: unknown until a cell reports its device's memory
    fixed_gib: float  # the estimate's memory that does not grow with batch
    max_cells: int = 12
    plateau: float = 0.03
    budget_read: bool = False  # budget_gib is the device's size read before any cell (NVML): a cell's own replaces it
    # The layout of r recomputed and o offloaded fractions of layers (hf's and fast's), for the layouts halfway
    # between the space's own that `refine` adds, at most `refine` of them; None: none added (Unsloth's)
    make: Optional[Callable[[float, float], Layout]] = None
    refine: int = 0
    layers: int = 0  # decoder layers: a fraction f recomputes round(f x layers) of them


@dataclass
class Outcome:
    trials: list[Trial] = field(default_factory=list)
    best: Optional[Trial] = None
    why: str = ""
    stops: dict = field(default_factory=dict)  # layout label -> why its climb ended
    budget_gib: Optional[float] = None
    cut_short: str = ""  # why the search ended before its space or cap did (the sweep was stopped)
    at_load: Optional[int] = None  # the cell that ran out of memory while its model was built (the search ends)


Measure = Callable[[Layout, int], Measured]


class Search:
    """The search's state over one outer cell: every trial, the memory model, each layout's end."""

    def __init__(self, space: Space, measure: Measure, log: Callable[[str], None] = lambda s: None):
        self.s, self.measure, self.log = space, measure, log
        self.out = Outcome()
        self.by_label = {L.label: L for L in space.layouts}
        self.budget = self.out.budget_gib = space.budget_gib
        self.stopped = False  # the backend cannot run here (skipped cell, e.g. not installed)

    # ------------------------------------------------------------------ what is known
    def done(self, L: Layout, status: str | None = None) -> list[Trial]:
        return [t for t in self.out.trials if t.layout == L.label and t.job is not None
                and (status is None or t.status == status)]

    def implied_oom(self, L: Layout, b: int) -> Trial | None:
        """A measured OOM at no larger batch with a layout that saves no less memory than L."""
        return next((t for t in self.out.trials if t.status == "oom" and t.job is not None and t.batch <= b
                     and L.uses_no_less_than(self.by_label[t.layout])), None)

    def implied_fit(self, L: Layout) -> int:
        """The largest batch L is known to fit: an ok cell at no smaller batch saving no more memory."""
        return max((t.batch for t in self.out.trials if t.status == "ok" and t.job is not None
                    and self.by_label[t.layout].uses_no_less_than(L)), default=0)

    def cells_left(self) -> int:
        return self.s.max_cells - sum(t.job is not None for t in self.out.trials)

    # ------------------------------------------------------------------ the memory model
    def calibration(self) -> tuple[float, float] | None:
        """(fixed GiB, scale of the per-sample estimate) from the ok cells' peaks: a least-squares line
        over (estimated activations, peak) when two or more differ, else the estimate's fixed part
        and the scale through the one point; every OOM cell then held above the budget."""
        pts = [(self.by_label[t.layout].gib_per_sample * t.batch, t.peak_gib - self.by_label[t.layout].gib_fixed)
               for t in self.out.trials if t.status == "ok" and t.peak_gib is not None and t.job is not None]
        fixed, scale = self.s.fixed_gib, 1.0
        if len({x for x, _ in pts}) >= 2:
            mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
            scale = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
            fixed = my - scale * mx
        elif pts:
            scale = (pts[0][1] - fixed) / pts[0][0]
        if scale <= 0 or fixed < 0:  # a line the points do not support: the estimate through the largest point
            x, y = max(pts, key=lambda p: p[0]) if pts else (1.0, self.s.fixed_gib + 1.0)
            fixed, scale = min(self.s.fixed_gib, 0.9 * y), (y - min(self.s.fixed_gib, 0.9 * y)) / x
        if self.budget:
            for t in self.out.trials:
                if t.status == "oom" and t.job is not None:
                    L = self.by_label[t.layout]
                    scale = max(scale, (self.budget - fixed - L.gib_fixed) / (L.gib_per_sample * t.batch) * 1.01)
        return (fixed, scale) if pts else None

    def predict(self, L: Layout, b: int) -> float:
        """Peak GiB of L at batch b: along L's own two largest ok cells where there are two (its memory
        per sample measured: the estimate's split between layouts can be off, e.g. where the logits of a
        152k vocabulary dominate, or LoRA dropout's copies on every linear layer), from its largest ok cell
        where there is one (its activations over the calibrated fixed part: its own memory per sample), else
        from the calibrated line (or the raw estimate)."""
        cal = self.calibration()
        fixed, scale = cal or (self.s.fixed_gib, 1.0)
        own = sorted((t for t in self.done(L, "ok") if t.peak_gib is not None), key=lambda t: t.batch)
        if len(own) >= 2 and own[-1].batch > own[-2].batch and own[-1].peak_gib > own[-2].peak_gib:
            per_sample = (own[-1].peak_gib - own[-2].peak_gib) / (own[-1].batch - own[-2].batch)
            return own[-1].peak_gib + per_sample * (b - own[-1].batch)
        if own:
            t = own[-1]
            base = fixed + L.gib_fixed
            per_sample = (t.peak_gib - base) / t.batch if t.peak_gib > base else scale * L.gib_per_sample
            return t.peak_gib + per_sample * (b - t.batch)
        return fixed + L.gib_fixed + scale * L.gib_per_sample * b

    def fits_estimate(self, L: Layout, b: int) -> bool:
        margin = FIT_MARGIN if self.calibration() is None else FIT_MARGIN / 4  # measured peaks: a tighter start
        return self.budget is None or self.predict(L, b) <= self.budget * (1 - margin)

    def estimated_oom(self, L: Layout, b: int) -> str | None:
        """Why L at batch b would run out of memory on the memory model's word, else None: once cells calibrated it,
        where it puts it SKIP_MARGIN over the budget; before, the raw estimate (off by up to 2x: it chooses where to
        start) only where it puts it over RAW_SKIP budgets (Unsloth's checkpointing off at b16 on Qwen3.5-9B: 71
        GiB in 22)."""
        if self.budget is None:
            return None
        p = self.predict(L, b)
        if self.calibration() is None:
            return (f"estimated {p:.1f} GiB, over {RAW_SKIP:g}x the budget of {self.budget:g} GiB (the memory "
                    "model, before any cell)") if p > RAW_SKIP * self.budget else None
        return (f"estimated {p:.1f} GiB > budget {self.budget:g} GiB (the memory model calibrated on the "
                f"cells measured)") if p > self.budget * (1 + SKIP_MARGIN) else None

    # ------------------------------------------------------------------ trials
    def skip(self, L: Layout, b: int | None, reason: str) -> None:
        self.out.trials.append(Trial(L.label, b, "skipped", reason=reason))
        self.log(f"b{b} {L.label}: skipped ({reason})" if b else f"{L.label}: skipped ({reason})")

    def run(self, L: Layout, b: int) -> Trial:
        m = self.measure(L, b)
        t = Trial(L.label, b, m.status, m.tok_s, m.peak_gib, m.job if m.job is not None else -1, m.error or "",
                  m.tok_s_p50)
        self.out.trials.append(t)
        if m.device_gib and (self.budget is None or self.s.budget_read):  # gpu=auto: what torch sees, once known
            self.budget = self.out.budget_gib = m.device_gib
        # A cell skipped (the backend is not installed) says the same of every other; two failures in a
        # row (CUDA missing, a bad value) most likely too; an interrupted one means stop (SIGTERM).
        failed = [x.status in ("failed", "interrupted") for x in self.out.trials if x.job is not None][-2:]
        if m.last:
            self.stopped, self.out.cut_short = True, f"the sweep stopped after cell {t.job} ({m.last})"
            self.log(f"search stopped: {self.out.cut_short}; the same command resumes it")
        elif m.status == "oom" and m.at_load:
            self.stopped, self.out.at_load = True, t.job
            self.log(f"search stopped: cell {t.job} ran out of memory while its model was built, before its first "
                     "step: no batch or layout of this search holds less")
        elif m.status in ("skipped", "interrupted") or failed == [True, True]:
            self.stopped = True
            self.log(f"search stopped: cell {t.job} {m.status}" + (" twice in a row" if m.status == "failed" else ""))
        return t


def search(space: Space, measure: Measure, log: Callable[[str], None] = lambda s: None) -> Outcome:
    """The fastest cell of the space within its budget, in at most space.max_cells measured cells."""
    st = Search(space, measure, log)
    # The two ends first, then the middle: the fastest layout at equal batch, then the one that saves the
    # most memory (its largest batch). A cap spent on the first layouts' OOM boundaries then still leaves
    # the largest-batch end measured: on hf within 22 GiB at seq 512 that end (every layer recomputed,
    # batch 16-24) is the fastest, and a search in plain order ran out of cells before it passed b12.
    ends = [space.layouts[0], space.layouts[-1]] if len(space.layouts) > 1 else list(space.layouts)
    for L in ends + [L for L in space.layouts if L not in ends]:
        if st.stopped:
            break
        if st.cells_left() <= 0:
            st.skip(L, None, f"the cell cap (search.max_cells={space.max_cells}) is spent")
            continue
        if reason := dominated(st, L):
            st.skip(L, None, reason)
            st.out.stops[L.label] = "dominated"
            continue
        climb(st, L)
        probe_plateau(st, L)
    refine(st)
    best_and_why(st)
    return st.out


def refine(st: Search) -> None:
    """With cells to spare once the space's layouts are done: a layout halfway, in layers recomputed, between the
    fastest cell's and its nearest neighbour of the space (the one keeping more layers first), climbed as the others
    were; then again around the fastest cell, `space.refine` layouts at most. Whether a kept layer pays more than a
    larger batch is a question of memory per layer, and the space's fractions are a coarse grid (Qwen3.5-9B within
    22 GiB: 12 of 32 layers kept at b8 ran 5% faster than every layer recomputed at b24)."""
    for _ in range(st.s.refine if st.s.make else 0):
        best = max((t for t in st.out.trials if t.status == "ok" and t.tok_s), key=lambda t: t.tok_s, default=None)
        if st.stopped or st.cells_left() <= 0 or best is None or any(st.by_label[best.layout].saves[1:]):
            return  # (an offloaded or long-context best is not refined: its neighbours differ in more than one way)
        mid = halfway(st, st.by_label[best.layout].saves[0])
        if mid is None:
            return
        M = st.s.make(mid, 0.0)
        st.s.layouts.append(M)
        st.by_label[M.label] = M
        st.log(f"{M.label}: halfway between {best.layout} (the fastest so far) and its neighbour")
        climb(st, M)


def halfway(st: Search, r: float) -> float | None:
    """The recomputed fraction halfway between r and its nearest neighbour among the plain layouts (nothing offloaded)
    on the side keeping more layers, else on the other: the first that recomputes a layer count of its own."""
    plain = sorted({L.saves[0] for L in st.by_label.values() if not any(L.saves[1:])})
    n = st.s.layers or 1_000_000  # (unknown: any fraction its own)
    below, above = [x for x in plain if x < r - 1e-9], [x for x in plain if x > r + 1e-9]
    for other in below[-1:] + above[:1]:
        mid = (r + other) / 2
        if round(mid * n) not in (round(r * n), round(other * n)):
            return mid
    return None


def dominated(st: Search, L: Layout) -> str | None:
    """Why L cannot beat a layout that saves less memory (and so runs as fast or faster at equal batch)."""
    for K in st.s.layouts:
        if K is L or not K.uses_no_less_than(L) or K.saves == L.saves:
            continue
        ok = st.done(K, "ok")
        if not ok:
            continue
        best = max(ok, key=lambda t: t.tok_s)
        why = st.out.stops.get(K.label, "")
        if why.startswith(("plateau", "top")):
            return f"{K.label} already at its best batch ({why}): saving more memory only buys a larger batch, " \
                   "which no longer pays"
        bigger = [b for b in st.s.batches if b > best.batch]
        if not bigger:
            return f"{K.label} already runs the largest batch (b{best.batch})"
        if w := st.implied_oom(L, bigger[0]):
            return f"fits no larger batch than {K.label}'s best b{best.batch}: b{bigger[0]} implied OOM by cell " \
                   f"{w.job} ({w.name()})"
        if e := st.estimated_oom(L, bigger[0]):
            return f"fits no larger batch than {K.label}'s best b{best.batch}: at b{bigger[0]} {e}"
    return None


def climb(st: Search, L: Layout) -> None:
    """L's fastest batch: start where the memory model says it still fits, bisect down on OOM, step up
    while it fits and the throughput still rises by search.plateau."""
    over = next((b for b in st.s.batches if st.implied_oom(L, b)), None)
    cands = [b for b in st.s.batches if over is None or b < over]
    if not cands:
        w = st.implied_oom(L, st.s.batches[0])
        st.skip(L, st.s.batches[0], f"implied OOM by cell {w.job} ({w.name()})")
        st.out.stops[L.label] = "nothing fits"
        return
    known = st.implied_fit(L)
    fitting = [b for b in cands if st.fits_estimate(L, b)]
    # a first cell is skipped on the raw estimate alone (a calibrated one still measures the layout's smallest batch)
    if not fitting and not known and st.calibration() is None and (e := st.estimated_oom(L, cands[0])):
        st.skip(L, cands[0], e)
        st.out.stops[L.label] = "nothing fits (estimated)"
        return
    b = max(max(fitting, default=cands[0]), min((c for c in cands if c >= known), default=cands[-1]))
    while True:
        if st.cells_left() <= 0:
            st.out.stops[L.label] = "cell cap"
            return
        t = st.run(L, b)
        if st.out.cut_short:
            st.out.stops[L.label] = "cut short"
            return
        if st.out.at_load is not None:
            st.out.stops[L.label] = "out of memory while the model was built"
            return
        if t.status == "oom":
            ok = max((x.batch for x in st.done(L, "ok")), default=0)
            lower = [c for c in cands if ok < c < b and c >= known]  # known: fits, its throughput not yet measured
            if not lower:
                st.out.stops[L.label] = f"oom boundary: b{b} out of memory" + (f", b{ok} fits" if ok else "")
                return
            fit = [c for c in lower if st.fits_estimate(L, c)]
            b = max(fit) if fit else lower[len(lower) // 2]
            continue
        if t.status != "ok":
            st.out.stops[L.label] = f"{t.status}: {t.reason}"
            return
        if stop := step_up(st, L, t, cands):
            st.out.stops[L.label] = stop
            return
        b = next(c for c in cands if c > b)


def probe_plateau(st: Search, L: Layout) -> None:
    """A layout whose climb met the memory wall after a single cell that fit says nothing about whether a
    larger batch still pays, which is all that a layout saving more memory could buy: one cell a step
    below tells, when some layout left to search saves more (a plateau then skips all of them) and the
    cap leaves cells to spare."""
    if st.stopped:
        return
    ok = st.done(L, "ok")
    later = st.s.layouts[st.s.layouts.index(L) + 1:]
    saving_more = [M for M in later if L.uses_no_less_than(M) and M.saves != L.saves]
    # only with cells to spare: about two per layout left to search
    if (len(ok) != 1 or not st.out.stops.get(L.label, "").startswith("oom boundary") or not saving_more
            or st.cells_left() <= 2 * len(later)):
        return
    below = [b for b in st.s.batches if b < ok[0].batch]
    if not below:
        return
    t = st.run(L, below[-1])
    if t.status == "ok":
        gain = ok[0].tok_s / t.tok_s - 1
        if gain < st.s.plateau:
            st.out.stops[L.label] = (f"plateau: b{t.batch} -> b{ok[0].batch} {100 * gain:+.1f}% tok/s "
                                     f"(< {100 * st.s.plateau:g}%), and {st.out.stops[L.label]}")
        else:
            st.out.stops[L.label] += f" (tok/s still rising: b{t.batch} -> b{ok[0].batch} {100 * gain:+.1f}%)"


def step_up(st: Search, L: Layout, t: Trial, cands: list[int]) -> str | None:
    """Why L's climb ends after its ok cell t (None: go on to the next batch)."""
    prev = [x for x in st.done(L, "ok") if x.batch < t.batch]
    if prev:
        p = max(prev, key=lambda x: x.batch)
        gain = t.tok_s / p.tok_s - 1
        if gain < st.s.plateau:
            return f"plateau: b{p.batch} -> b{t.batch} {100 * gain:+.1f}% tok/s (< {100 * st.s.plateau:g}%)"
    up = [c for c in cands if c > t.batch]
    if not up:
        return f"top of the batch range (b{t.batch})" if t.batch == st.s.batches[-1] else \
            f"oom boundary: b{t.batch} fits, b{next(c for c in st.s.batches if c > t.batch)} does not"
    if any(x.status == "oom" and x.batch == up[0] for x in st.done(L)):
        return f"oom boundary: b{t.batch} fits, b{up[0]} does not"
    if w := st.implied_oom(L, up[0]):
        st.skip(L, up[0], f"implied OOM by cell {w.job} ({w.name()})")
        return f"oom boundary: b{t.batch} fits, b{up[0]} implied OOM"
    if e := st.estimated_oom(L, up[0]):
        st.skip(L, up[0], e)
        return f"oom boundary: b{t.batch} fits, b{up[0]} {e}"
    return None


def best_and_why(st: Search) -> None:
    ok = sorted((t for t in st.out.trials if t.status == "ok" and t.tok_s), key=lambda t: -t.tok_s)
    n = sum(t.job is not None for t in st.out.trials)
    if not ok:
        st.out.why = f"no cell fitted or ran among the {n} measured" + \
            (f"; cell {st.out.at_load} ran out of memory while its model was built, which no batch or layout "
             "changes" if st.out.at_load is not None else "") + \
            (f"; cut short: {st.out.cut_short}" if st.out.cut_short else "")
        return
    best = st.out.best = ok[0]
    why = (f"fastest of {len(ok)} cells that ran ({n} measured, {len(st.out.trials) - n} skipped): "
           f"{best.tok_s:,.0f} tok/s")
    if len(ok) > 1:
        nxt = ok[1]
        why += f"; next {nxt.name()} at {nxt.tok_s:,.0f} ({100 * (nxt.tok_s / best.tok_s - 1):+.1f}%)"
        if best.tok_s_p50 and nxt.tok_s_p50 and nxt.tok_s_p50 > best.tok_s_p50:  # slow steps decided it
            why += (f", faster at the median step ({nxt.tok_s_p50:,.0f} against {best.tok_s_p50:,.0f}): the two "
                    "are within their own step-to-step spread, measure both again before choosing")
    stop = st.out.stops.get(best.layout)
    st.out.why = why + (f"; its layout stopped at {stop}" if stop else "") + \
        (f"; cut short: {st.out.cut_short}" if st.out.cut_short else "")


def dropout_zero(space: Space, best: Trial, measure: Measure, cells: int,
                 log: Callable[[str], None] = lambda s: None) -> list[Trial]:
    """The best cell's layout again with lora.dropout=0 (`measure` adds the override): at its batch, then
    one step up if that fits (no dropout masks or input copies to keep: a little less memory)."""
    L = next(x for x in space.layouts if x.label == best.layout)
    sub = Search(Space([L], space.batches, space.budget_gib, space.fixed_gib, cells, space.plateau), measure, log)
    t = sub.run(L, best.batch)
    up = [c for c in space.batches if c > best.batch]
    if t.status == "ok" and up and sub.cells_left() > 0:
        sub.run(L, up[0])
    return sub.out.trials


# ---------------------------------------------------------------------------- the space of one outer cell
# The memory model (weights, LoRA's states, bytes a token by layout) is lorabench.sweep.memory's.
token_bytes, fixed_gib = memory.token_bytes, memory.fixed_gib
MLP_TILE = 4096  # tokens a tile of the MLP (backend.tiled_mlp): Arctic's and Unsloth's ceil(seq / hidden) tiles
LONG = 8192  # tokens a row from which a search whose budget is unknown yet (gpu=auto) also tries the long layouts


def layout_label(r: float, o: float, inputs_to_host: bool = False, tile: int = 0) -> str:
    """A layout's name, as the report names a cell's (lorabench.report.analysis.layout_name)."""
    return f"ckpt {r:g} offload {o:g}" + (" +inputs to host" if inputs_to_host else "") + \
        (f" +mlp tile {tile}" if tile else "")


def long_layouts(c, mm: memory.MemoryModel) -> list[Layout]:
    """What saves the most memory on hf and fast: every layer recomputed with its input in host memory
    (train.offload_checkpoints) and, on fast, the MLP in tiles (backend.tiled_mlp) with the loss in Liger's own
    chunks (backend.ce_chunk_mem=1: at 131,072 tokens its default 8 holds 8 GiB of logits on a 4,096-wide model)."""
    from lorabench.core.config import Backend

    base = ("train.gradient_checkpointing=true", "train.checkpoint_fraction=1", "train.offload_fraction=0",
            "train.offload_checkpoints=true")
    plan = memory.Plan(1.0, 0.0, True, 0)
    out = [Layout(layout_label(1, 0, True), base, (1, 1, 0),
                  mm.per_sample_gib(plan, c.seq_len), plan, mm.layout_gib(plan, c.seq_len))]
    if c.backend.name is Backend.fast:
        tiled = memory.Plan(1.0, 0.0, True, MLP_TILE)
        small_chunks = memory.MemoryModel.of(replace(c, backend=replace(c.backend, ce_chunk_mem=1)))
        out.append(Layout(layout_label(1, 0, True, MLP_TILE),
                          base + (f"backend.tiled_mlp={MLP_TILE}", "backend.ce_chunk_mem=1"), (1, 1, 1),
                          small_chunks.per_sample_gib(tiled, c.seq_len), tiled, mm.layout_gib(tiled, c.seq_len)))
    return out


def plain_layout(c, mm: memory.MemoryModel) -> Callable[[float, float], Layout]:
    """The layout of r recomputed and o offloaded fractions of c's layers (hf, fast), the memory model's estimate in
    it."""
    def make(r: float, o: float) -> Layout:
        plan = memory.Plan(r, o)
        return Layout(layout_label(r, o), (f"train.gradient_checkpointing={str(r > 0).lower()}",
                                           f"train.checkpoint_fraction={r:g}", f"train.offload_fraction={o:g}"),
                      (r, o, 0), mm.per_sample_gib(plan, c.seq_len), plan, mm.layout_gib(plan, c.seq_len))
    return make


def layouts(c, budget_gib: float | None = None) -> list[Layout]:
    """The layouts of c's backend, in search order: the most layers kept first, then the fewest recomputed. On hf
    and fast the long-context layouts (long_layouts) join them where the memory model says the row needs them:
    where the layout saving the most memory of the others fits no more than the ladder's first batch within the
    budget (or, the budget unknown yet, from LONG tokens a row)."""
    from lorabench.core.config import Backend

    mm = memory.MemoryModel.of(c)

    def per_sample(r: float, o: float) -> float:  # r recomputed and o offloaded fractions of layers
        return mm.per_sample_gib(memory.Plan(r, o), c.seq_len)

    if c.backend.name is Backend.unsloth:
        ckpt = ("train.gradient_checkpointing=true", "train.checkpoint_fraction=1")
        offloaded = memory.Plan(1.0, 0.0, True)
        # search.checkpoint_fractions narrows Unsloth's layouts as it does the others': 0 keeps its checkpointing
        # off, any share above 0 its checkpointing of every layer (on, and offloaded).
        fractions = set(c.search.checkpoint_fractions)
        wanted = {0: 0 in fractions, 1: any(f > 0 for f in fractions)}
        own = [Layout("unsloth checkpointing off", ("train.gradient_checkpointing=false",), (0, 0, 0),
                      per_sample(0, 0), memory.Plan()),
               Layout("unsloth checkpointing on", ckpt + ("backend.unsloth_offload=false",), (1, 0, 0),
                      per_sample(1, 0), memory.Plan(1.0)),
               Layout("unsloth checkpointing offloaded", ckpt + ("backend.unsloth_offload=true",), (1, 1, 0),
                      mm.per_sample_gib(offloaded, c.seq_len), offloaded)]
        return [L for L in own if wanted[L.saves[0]]]
    make = plain_layout(c, mm)
    out = [make(r, o) for r in sorted(set(c.search.checkpoint_fractions))
           for o in sorted(set(c.search.offload_fractions)) if r + o <= 1 + 1e-9]
    out = sorted(out, key=lambda L: (sum(L.saves), L.saves[0]))
    batches = sorted(set(c.search.batches))
    second = batches[1] if len(batches) > 1 else batches[0]
    least = min(L.gib_per_sample for L in out)
    if (mm.fixed_gib + least * second > budget_gib) if budget_gib else c.seq_len >= LONG:
        out += long_layouts(c, mm)
    return out


def space_for(c, device_gib: float | None = None) -> Space:
    """c's search space; the budget is the memory of the gpu option (emulated on a larger GPU); under gpu=auto
    `device_gib`, the device's size read before any cell (the first cell then starts where the estimate fits,
    not at the largest batch: one OOM cell less, a minute for an Unsloth cell), else unknown (None) until the
    first cell reports its device's."""
    auto = c.gpu.name == "auto"
    budget = device_gib if auto else c.gpu.memory_gib
    from lorabench.core.config import Backend

    reserve = 2 if c.search.allow_dropout_zero and c.lora.dropout > 0 else 0
    mm = memory.MemoryModel.of(c)
    return Space(layouts(c, budget), sorted(set(c.search.batches)), budget, fixed_gib(c),
                 max(1, c.search.max_cells - reserve), c.search.plateau, budget_read=auto and budget is not None,
                 make=None if c.backend.name is Backend.unsloth else plain_layout(c, mm),
                 refine=c.search.refine_layouts, layers=mm.layers)


# ---------------------------------------------------------------------------- search.json

def override_key(override: str) -> str:
    """The key an override sets: "+backend.liger=[]" -> "backend.liger"."""
    return override.split("=")[0].lstrip("+~")


def search_keys(config) -> tuple[str, ...]:
    """The keys the sweep's search sets in each cell: a max-context search sets seq_len too."""
    from omegaconf import OmegaConf

    target = OmegaConf.select(config, "search.target", default="throughput")
    return SEARCH_KEYS + (("seq_len",) if getattr(target, "value", target) == "max_context" else ())


def outer_cells(cells: list[list[str]], keys: tuple[str, ...] = SEARCH_KEYS) -> list[list[str]]:
    """The command line's cells less the keys the search sets (one search each, in order, once)."""
    outer = (tuple(o for o in cell if override_key(o) not in keys) for cell in cells)
    return [list(c) for c in dict.fromkeys(outer)]
