"""What a sweep's cells bought: time and $ to one target eval loss, over repeats, and each backend's eval loss against
hf's after the same tokens (cells with quality.eval_every > 0; their eval.jsonl, lorabench.measure.quality).

A token is not what a user pays for: a larger batch at the same learning rate, a lower LoRA rank, fp16, packing,
dropout or a backend whose arithmetic differs can make each token buy less. So each cell is also read as MLPerf
Training reads a run: the wall time (training steps and every evaluation, the untimed first steps included) until its
eval loss first reaches the target, and its price.

- The target: the cell's quality.target_loss, or quality.target_relative x hf's eval loss after
  quality.reference_tokens non-pad training tokens (the median over hf's cells of the same held-out tokens; null
  tokens: the fewest that every one of those hf cells trained on).
- Repeats: cells that differ only in train.seed are one configuration; its time to target is their median, with
  their spread (fastest - slowest) and, from 5 repeats, MLPerf's score: the fastest and the slowest dropped, the mean
  of the rest. A repeat that did not reach the target counts as infinitely slow (MLPerf drops at most it). Two
  configurations whose medians differ by less than the wider of their spreads are "within noise".
- Parity: a backend's eval loss after the same tokens as hf's (linear between evaluations: cells that pack or batch
  differently evaluate after different counts), against a tolerance from the arithmetic and the repeats: 3 standard
  deviations of the difference of the two medians, the standard deviation of one run estimated from the spread of
  each side's repeats (range / d2(n), d2 the expected range of n normal draws in standard deviations), plus the
  rounding of the coarser matmul dtype (2 eps of it, relative to the loss: bf16's 2^-7). Without repeats the
  tolerance is the rounding alone, and the report says that it is.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import mean, median

from lorabench.core.results import CellResult
from lorabench.measure.quality import Eval, Reached, first_reaching, loss_at_tokens, read_evals
from lorabench.report.analysis import (
    BACKEND_AXES,
    TOK,
    _group,
    label,
    md_table,
    money,
    value,
)

MLPERF_MIN = 5  # repeats from which MLPerf's score (fastest and slowest dropped) is given
PARITY_SIGMAS = 3.0  # a false "differs from hf" costs a user more than a missed one: 0.3% of them by chance
D2 = {2: 1.128, 3: 1.693, 4: 2.059, 5: 2.326, 6: 2.534, 7: 2.704, 8: 2.847, 9: 2.970, 10: 3.078}
EPS = {"bf16": 2.0**-7, "fp16": 2.0**-10, "fp32": 2.0**-23}  # machine epsilon of the matmuls' dtype
MATMUL_DTYPE = {"nf4": "bf16", "int8": "bf16", "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


# ---------------------------------------------------------------------------- cells against a target

@dataclass
class ToTarget:
    """One cell against its target: its evaluations, the target and how it was set, and where it reached it."""
    cell: CellResult
    evals: list[Eval]
    target: float | None
    how: str  # "quality.target_loss=2.1", "1.02 x hf's ...", or why there is none
    reached: Reached | None

    @property
    def time_s(self) -> float:
        """Seconds to the target; inf where not reached in the budget (or no target)."""
        return self.reached.at.time_s if self.reached and self.reached.at else math.inf

    @property
    def usd(self) -> float:
        at = self.reached.at if self.reached else None
        return at.usd if at is not None and at.usd is not None else math.inf


def eval_set(r: CellResult):
    """The held-out tokens a cell evaluated (quality/eval_set_id): cells with different ones are not compared."""
    return r.metrics.get("quality/eval_set_id")


def evaluated(results: list[CellResult]) -> list[tuple[CellResult, list[Eval]]]:
    """The ok cells that evaluated held-out data, with their eval.jsonl."""
    return [(r, e) for r in results if r.ok and (e := read_evals(r.dir or r.run_dir))]


def quality_of(r: CellResult) -> dict:
    return r.config.get("quality") or {}


def reference_loss(hf: list[tuple[CellResult, list[Eval]]], tokens: float | None) -> tuple[float | None, float, str]:
    """(median eval loss of the hf cells after `tokens`, the tokens, words); tokens None: the fewest every one of
    them trained on."""
    if not hf:
        return None, 0.0, "no hf cell evaluated these held-out tokens"
    at = tokens if tokens is not None else min(e[-1].tokens for _, e in hf)
    losses = [x for _, e in hf if (x := loss_at_tokens(e, at)) is not None]
    if not losses:
        return None, at, f"no hf cell was evaluated around {at:,.0f} tokens"
    return median(losses), at, f"median of {len(losses)} hf cell{'s' * (len(losses) > 1)}"


def to_target(results: list[CellResult]) -> list[ToTarget]:
    """Every evaluated cell against its target (module docstring)."""
    cells = evaluated(results)
    out = []
    for r, evals in cells:
        q = quality_of(r)
        if q.get("target_loss") is not None:
            target, how = q["target_loss"], f"quality.target_loss={q['target_loss']:g}"
        elif q.get("target_relative") is not None:
            hf = [(x, e) for x, e in cells if x.config["backend"]["name"] == "hf" and eval_set(x) == eval_set(r)]
            ref, at, words = reference_loss(hf, q.get("reference_tokens"))
            target = None if ref is None else q["target_relative"] * ref
            how = (f"{q['target_relative']:g} x hf's eval loss after {at:,.0f} non-pad tokens ({ref:.4f}, {words})"
                   if ref is not None else f"quality.target_relative={q['target_relative']:g}: {words}")
        else:
            target, how = None, "no target (quality.target_loss or quality.target_relative)"
        out.append(ToTarget(r, evals, target, how, first_reaching(evals, target) if target is not None else None))
    return out


# ---------------------------------------------------------------------------- repeats

@dataclass
class Repeats:
    """A configuration's repeated cells (all axes but train.seed) against one target."""
    name: str
    cells: list[ToTarget]

    @property
    def times(self) -> list[float]:
        return sorted(c.time_s for c in self.cells)

    @property
    def median_s(self) -> float:
        return median(self.times)

    @property
    def median_usd(self) -> float:
        return median(sorted(c.usd for c in self.cells))

    @property
    def spread_s(self) -> float:
        """Slowest minus fastest (inf where a repeat did not reach the target); 0 for one cell."""
        t = self.times
        return t[-1] - t[0] if len(t) > 1 else 0.0

    @property
    def mlperf_s(self) -> float | None:
        """MLPerf Training's score from 5 repeats: the fastest and the slowest dropped, the mean of the rest."""
        t = self.times
        return mean(t[1:-1]) if len(t) >= MLPERF_MIN else None

    @property
    def tok_s(self) -> float:
        return median(c.cell.metrics[TOK] for c in self.cells)

    @property
    def reached(self) -> int:
        return sum(math.isfinite(c.time_s) for c in self.cells)


def repeat_groups(tt: list[ToTarget], axes_: list[str]) -> list[Repeats]:
    others = [a for a in axes_ if a != "train.seed"]
    groups: dict[tuple, list[ToTarget]] = defaultdict(list)
    for c in tt:
        groups[tuple(repr(value(c.cell, a)) for a in others)].append(c)
    return [Repeats(label(cs[0].cell, others) if others else "all cells", cs) for cs in groups.values()]


def within_noise(a: Repeats, b: Repeats) -> bool:
    """Two configurations' median times to target differ by less than the wider of their spreads."""
    if not (math.isfinite(a.median_s) and math.isfinite(b.median_s)):
        return False
    return abs(a.median_s - b.median_s) <= max(a.spread_s, b.spread_s)


def seconds(v: float | None) -> str:
    if v is None:
        return "-"
    return "not reached" if not math.isfinite(v) else f"{v:,.1f}"


def target_table(tt: list[ToTarget], axes_: list[str]) -> str:
    """One row per evaluated cell: its target, where it reached it, the time to it (training and evaluations apart)
    and $; its last eval loss and the tokens it took."""
    rows = []
    for c in tt:
        at = c.reached.at if c.reached else None
        rows.append([label(c.cell, axes_), "-" if c.target is None else f"{c.target:.4f}",
                     c.reached.words() if c.reached else "no target",
                     "-" if at is None else f"{at.tokens:,}", seconds(at.time_s) if at else "-",
                     "-" if at is None else f"{at.train_s:,.1f} + {at.eval_s:,.1f}",
                     money(at.usd) if at else "-", f"{c.evals[-1].eval_loss:.4f}", f"{c.evals[-1].tokens:,}"])
    return md_table(["cell", "target", "reached at", "tokens to target", "s to target",
                     "s steps + s evals", "$ to target", "eval loss last", "tokens trained"], rows)


def repeats_table(groups: list[Repeats]) -> str:
    """Per configuration: its repeats, median time and $ to target, spread, MLPerf's score from 5 repeats, and
    whether it is told apart from the fastest configuration."""
    if not any(len(g.cells) > 1 for g in groups):
        return ""
    best = min(groups, key=lambda g: g.median_s)
    rows = [[g.name, len(g.cells), f"{g.reached}/{len(g.cells)}", seconds(g.median_s), seconds(g.spread_s),
             seconds(g.mlperf_s) if g.mlperf_s is not None else f"- (needs {MLPERF_MIN} repeats)",
             money(g.median_usd), "fastest" if g is best else ("within noise" if within_noise(g, best) else
                                                                f"{g.median_s / best.median_s:.2f}x slower"
                                                                if math.isfinite(g.median_s) else "-")]
            for g in sorted(groups, key=lambda g: g.median_s)]
    return md_table(["configuration", "repeats", "reached", "median s to target", "spread s (slowest - fastest)",
                     "MLPerf score s (drop fastest and slowest)", "median $ to target", "against the fastest"], rows)


def backend_bests(groups: list[Repeats]) -> dict[str, Repeats]:
    """Each backend's configuration with the shortest median time to the target: its best of what the sweep
    tried (batch, layout, packing...), the one a comparison of backends holds against the others'."""
    out: dict[str, Repeats] = {}
    for g in groups:
        k = g.cells[0].cell.config["backend"]["name"]
        if math.isfinite(g.median_s) and (k not in out or g.median_s < out[k].median_s):
            out[k] = g
    return out


def bests_table(groups: list[Repeats]) -> str:
    """Per backend: its fastest configuration to the target, of how many it tried, and its time against hf's
    fastest (best against best); empty with fewer than two backends that reached the target."""
    best = backend_bests(groups)
    if len(best) < 2:
        return ""
    tried = defaultdict(int)
    for g in groups:
        tried[g.cells[0].cell.config["backend"]["name"]] += 1
    hf = best.get("hf")
    rows = [[k, g.name, tried[k], len(g.cells), seconds(g.median_s), money(g.median_usd), f"{g.tok_s:,.0f}",
             "-" if hf is None or g is hf else "within noise" if within_noise(g, hf) else
             f"{g.median_s / hf.median_s:.2f}x"]
            for k, g in sorted(best.items(), key=lambda kv: kv[1].median_s)]
    return md_table(["backend", "its fastest configuration", "configurations tried", "repeats", "median s to target",
                     "median $ to target", "non-pad tok/s (median)", "time against hf's fastest"], rows)


# ---------------------------------------------------------------------------- parity with hf

@dataclass
class Parity:
    """A backend's eval loss after the same tokens as hf's, against the tolerance the arithmetic and repeats give."""
    name: str
    reference: str
    tokens: float
    loss: float  # the candidate's median
    hf_loss: float
    tolerance: float
    rounding: float
    sigma: float | None  # one run's standard deviation, from the repeats (None: no repeats on either side)
    n: int
    m: int
    notes: list[str] = field(default_factory=list)

    @property
    def delta(self) -> float:
        return self.loss - self.hf_loss

    @property
    def matches(self) -> bool:
        return abs(self.delta) <= self.tolerance

    def sentence(self) -> str:
        how = (f"±{self.tolerance:.4f}: {PARITY_SIGMAS:g} sd of the difference of medians ({self.m} vs {self.n} "
               f"repeats, sd {self.sigma:.4f} a run) + rounding {self.rounding:.4f}" if self.sigma is not None else
               f"±{self.tolerance:.4f}: rounding alone, no repeats to measure the run-to-run spread "
               "(repeat the cells with train.seed=0,1,2)")
        verdict = "matches hf" if self.matches else "DIFFERS from hf"
        return (f"{self.name}: eval loss {self.loss:.4f} after {self.tokens:,.0f} non-pad tokens, hf's "
                f"{self.hf_loss:.4f} ({self.reference}): {self.delta:+.4f}, {verdict} ({how}).")


def one_run_sigma(values: list[float]) -> float | None:
    n = len(values)
    return (max(values) - min(values)) / D2.get(n, 3.078) if n >= 2 else None


def rounding(r: CellResult, loss: float) -> float:
    return 2 * EPS[MATMUL_DTYPE.get(r.config.get("precision", {}).get("name"), "fp32")] * loss


def parity(ref: list[tuple[CellResult, list[Eval]]], cand: list[tuple[CellResult, list[Eval]]], name: str,
           reference: str, tokens: float | None = None) -> Parity | None:
    """`cand`'s cells (one configuration's repeats) against `ref`'s (hf's) after the same tokens: `tokens`, else the
    fewest that every cell of both trained on. None where no cell was evaluated there."""
    at = tokens if tokens is not None else min(e[-1].tokens for _, e in ref + cand)
    a = [x for _, e in ref if (x := loss_at_tokens(e, at)) is not None]
    b = [x for _, e in cand if (x := loss_at_tokens(e, at)) is not None]
    if not a or not b:
        return None
    hf_loss, loss = median(a), median(b)
    sigmas = [s for s in (one_run_sigma(a), one_run_sigma(b)) if s is not None]
    sigma = max(sigmas) if sigmas else None
    rnd = max(rounding(ref[0][0], hf_loss), rounding(cand[0][0], hf_loss))
    tol = rnd + (PARITY_SIGMAS * sigma * math.sqrt(math.pi / 2 * (1 / len(a) + 1 / len(b))) if sigma else 0.0)
    return Parity(name, reference, at, loss, hf_loss, tol, rnd, sigma, len(a), len(b))


def parities(tt: list[ToTarget], axes_: list[str]) -> list[Parity]:
    """Each non-hf configuration against hf's cells of the same comparison group (same model, data, held-out tokens,
    precision...; backend layouts, batch, packing and seeds may differ), those at its own batch where hf ran that
    batch (a larger batch at one learning rate learns less per token: the same batch isolates the backend), at the
    tokens set by quality.reference_tokens or else the fewest every compared cell trained on."""
    if "backend" not in axes_:
        return []
    groups: dict[tuple, list[ToTarget]] = defaultdict(list)
    for c in tt:
        groups[(_group(c.cell, (*BACKEND_AXES, "train.seed", "quality.")), eval_set(c.cell))].append(c)
    out = []
    for cells in groups.values():
        hf = [(c.cell, c.evals) for c in cells if c.cell.config["backend"]["name"] == "hf"]
        if not hf:
            continue
        for g in repeat_groups([c for c in cells if c.cell.config["backend"]["name"] != "hf"], axes_):
            tokens = quality_of(g.cells[0].cell).get("reference_tokens")
            batch = g.cells[0].cell.config.get("batch")
            ref = [x for x in hf if x[0].config.get("batch") == batch] or hf  # like with like where hf ran it
            p = parity(ref, [(c.cell, c.evals) for c in g.cells], g.name,
                       f"median of {len(ref)} hf cell{'s' * (len(ref) > 1)}"
                       + (f" at batch {batch}" if len(ref) < len(hf) else ""), tokens)
            if p is not None:
                out.append(p)
    return out


def per_token_against_target(groups: list[Repeats]) -> list[str]:
    """Configurations faster per token than another but slower to the target (beyond the noise): said so."""
    lines = []
    for a in groups:
        for b in groups:
            if a is b or not math.isfinite(b.median_s) or a.tok_s <= b.tok_s:
                continue
            if a.median_s > b.median_s and not within_noise(a, b):
                lines.append(f"{a.name} runs {a.tok_s / b.tok_s:.2f}x the non-pad tokens/s of {b.name} but reaches "
                             f"the target later ({seconds(a.median_s)} s against {seconds(b.median_s)} s): "
                             "each of its tokens buys less")
    return lines


# ---------------------------------------------------------------------------- the answer's line

def answer_lines(tt: list[ToTarget], axes_: list[str]) -> list[str]:
    """The answer's quality lines: the cheapest configuration to the target (median $ over its repeats), the fastest
    where another, and each one faster per token but slower to the target."""
    targeted = [c for c in tt if c.target is not None]
    if not targeted:
        return []
    groups = repeat_groups(targeted, axes_)
    targets = sorted({round(c.target, 6) for c in targeted})
    what = f"eval loss <= {targets[0]:.4f}" if len(targets) == 1 else "each cell's own target"
    reached = [g for g in groups if math.isfinite(g.median_s)]
    if not reached:
        best = min(targeted, key=lambda c: c.evals[-1].eval_loss)
        return [f"- Target ({what}, {targeted[0].how}): no configuration reached it in its budget; the lowest eval "
                f"loss is {label(best.cell, axes_)}'s {best.reached.best.eval_loss:.4f} (raise train.max_steps)."]
    priced = [g for g in reached if math.isfinite(g.median_usd)]
    cheapest = min(priced, key=lambda g: g.median_usd) if priced else None
    fastest = min(reached, key=lambda g: g.median_s)
    lines = []
    if cheapest is not None:
        lines.append(f"- Cheapest to the target ({what}; {targeted[0].how}): {cheapest.name} at "
                     f"{money(cheapest.median_usd)} in {_time_words(cheapest)}; {len(reached)} of {len(groups)} "
                     f"configurations reached it.")
    if fastest is not cheapest:
        lines.append(f"- Fastest to the target: {fastest.name} in {_time_words(fastest)}"
                     + (f" ({'within noise of' if within_noise(fastest, cheapest) else 'against'} the cheapest's "
                        f"{seconds(cheapest.median_s)} s)." if cheapest is not None else "."))
    return lines + [f"- {x}." for x in per_token_against_target(groups)]


def _time_words(g: Repeats) -> str:
    at = [c.reached.at for c in g.cells if c.reached and c.reached.at]
    evals = median(a.eval_s for a in at)
    text = f"{seconds(g.median_s)} s ({evals:,.1f} s of it evaluations)"
    if len(g.cells) > 1:
        spread = f"spread {seconds(g.spread_s)} s" if math.isfinite(g.spread_s) else \
            f"{len(g.cells) - g.reached} of them did not reach it"
        text += f", median of {len(g.cells)} repeats, {spread}"
    if g.mlperf_s is not None:
        text += f", MLPerf score {seconds(g.mlperf_s)} s"
    return text


def cell_columns(tt: list[ToTarget]) -> dict[int, dict]:
    """Per cell (its job number): the quality/ metrics to the target as the report resolved it (a relative target
    is known only here), for the cells table and results.csv."""
    out = {}
    for c in tt:
        if c.reached is None:
            continue
        at = c.reached.at
        out[c.cell.job_num] = {"quality/target_loss": c.target, "quality/reached": int(at is not None),
                               "quality/time_to_target_s": at.time_s if at else None,
                               "quality/eval_s_to_target": at.eval_s if at else None,
                               "quality/usd_to_target": at.usd if at else None,
                               "quality/tokens_to_target": at.tokens if at else None}
    return out


def sections(results: list[CellResult], axes_: list[str]) -> dict[str, str]:
    """The report's quality tables, by title (none for a sweep without evaluations)."""
    tt = to_target(results)
    if not tt:
        return {}
    out = {"Time and $ to the target eval loss (steps and evaluations, untimed first steps included)":
           target_table(tt, axes_),
           "Repeats: time to target per configuration (train.seed)":
           repeats_table(repeat_groups([c for c in tt if c.target is not None], axes_)),
           "Each backend's fastest configuration to the target":
           bests_table(repeat_groups([c for c in tt if c.target is not None], axes_)),
           "Eval loss against hf's after the same tokens (parity)":
           "\n".join(f"- {p.sentence()}" for p in parities(tt, axes_))}
    sets = {eval_set(c.cell) for c in tt}
    if len(sets) > 1:
        out["Held-out tokens"] = (f"The cells evaluated {len(sets)} different held-out sets (quality/eval_set_id): "
                                  "their losses are compared within a set only (set quality.eval_seq_len when "
                                  "sweeping seq_len).")
    return {k: v for k, v in out.items() if v}


def uses_quality(results: list[CellResult]) -> bool:
    return any((r.config.get("quality") or {}).get("eval_every") for r in results)

