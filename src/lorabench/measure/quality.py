"""What a cell's training bought: its eval loss on held-out data against what it spent, and when it first reached a
target (quality.*, lorabench.core.config.QualityConfig).

eval.jsonl, beside steps.jsonl, one line per evaluation:
  step        optimizer steps done (0: before the first, quality.eval_at_start)
  tokens      non-pad training tokens so far, every step's (the untimed first ones too), every rank's
  train_s     the training steps' seconds so far, back to back as steps.jsonl times them (untimed steps included:
              they are paid for; the evaluations are not in them)
  eval_s      the evaluations' seconds so far, this one included
  time_s      train_s + eval_s: the wall time to this evaluation's result, as MLPerf counts it (the model's load and
              the data's tokenisation before the first step are not in it: cell.json's model.load_s has the load)
  usd         time_s at the GPU's hourly price (x the GPUs of the cell); null without a price
  eval_loss   the mean cross-entropy over every loss-carrying held-out token (not a mean of batch means: the same
              number whatever the evaluation batch, packed or padded)
  this_eval_s this evaluation's seconds

Time to target is time_s at the first evaluation whose eval_loss is at or under the target: the training and every
evaluation before it, this one's included. A target that no evaluation reached is "not reached in the budget"
(train.max_steps). The same functions serve the cell (quality.target_loss) and the report (a target relative to
hf's loss, known only once hf's cells have run).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

EVAL_FILE = "eval.jsonl"


@dataclass(frozen=True)
class Eval:
    """One evaluation, as a line of eval.jsonl."""
    step: int
    tokens: int
    train_s: float
    eval_s: float
    eval_loss: float
    this_eval_s: float
    usd: float | None = None

    @property
    def time_s(self) -> float:
        return self.train_s + self.eval_s

    def record(self) -> dict:
        return {**asdict(self), "time_s": self.time_s}


def read_evals(run_dir: Path | str) -> list[Eval]:
    """A cell's eval.jsonl ([] where it has none)."""
    try:
        lines = (Path(run_dir) / EVAL_FILE).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        d = json.loads(line)
        out.append(Eval(**{k: d.get(k) for k in Eval.__dataclass_fields__}))
    return out


@dataclass(frozen=True)
class Reached:
    """A cell's curve against a target: the first evaluation at or under it (None: not reached in the budget), and
    the lowest loss it did reach."""
    target: float
    at: Eval | None
    best: Eval | None

    @property
    def reached(self) -> bool:
        return self.at is not None

    def words(self) -> str:
        if self.at is not None:
            return f"step {self.at.step}, {self.at.time_s:,.1f} s"
        if self.best is None:
            return "no evaluation"
        return f"not reached in the budget (best {self.best.eval_loss:.4f} at step {self.best.step})"


def first_reaching(evals: list[Eval], target: float) -> Reached:
    at = next((e for e in evals if e.eval_loss <= target), None)
    best = min(evals, key=lambda e: e.eval_loss, default=None)
    return Reached(target, at, best)


def loss_at_tokens(evals: list[Eval], tokens: float) -> float | None:
    """The eval loss after `tokens` non-pad training tokens, linear between the two evaluations around it (cells
    that pack or batch differently evaluate after different token counts); None outside the evaluated range."""
    pts = sorted((e.tokens, e.eval_loss) for e in evals)
    for (t0, l0), (t1, l1) in zip(pts, pts[1:]):
        if t0 <= tokens <= t1:
            return l0 if t1 == t0 else l0 + (l1 - l0) * (tokens - t0) / (t1 - t0)
    return pts[0][1] if len(pts) == 1 and pts[0][0] == tokens else None


def summary(evals: list[Eval], target: float | None, warmup_s: float) -> dict:
    """The cell's quality/ metrics: its last, first and best eval loss, the evaluations' time apart, and with a
    target the step, tokens, time (training and evaluations, apart too) and $ to it."""
    if not evals:
        return {}
    out = {"quality/evals": len(evals), "quality/eval_loss_first": evals[0].eval_loss,
           "quality/eval_loss_final": evals[-1].eval_loss, "quality/eval_loss_best": min(e.eval_loss for e in evals),
           "quality/eval_s": evals[-1].eval_s, "quality/train_s": evals[-1].train_s,
           "quality/wall_s": evals[-1].time_s, "quality/tokens_final": evals[-1].tokens,
           # the untimed first steps (kernel selection, allocator growth) are in train_s and time to target: a user
           # pays for them; steps.jsonl's throughput window leaves them out
           "quality/warmup_s_included": warmup_s}
    if target is None:
        return out
    r = first_reaching(evals, target)
    out.update({"quality/target_loss": target, "quality/reached": int(r.reached)})
    if r.at is not None:
        out.update({"quality/step_to_target": r.at.step, "quality/tokens_to_target": r.at.tokens,
                    "quality/time_to_target_s": r.at.time_s, "quality/train_s_to_target": r.at.train_s,
                    "quality/eval_s_to_target": r.at.eval_s, "quality/usd_to_target": r.at.usd})
    return out


class EvalLog:
    """eval.jsonl as the cell writes it: a record per evaluation (lorabench.run.trainer.MeasuredTrainer.evaluate
    times it), kept also in memory for the cell's metrics. After a resume, the records up to the checkpoint's step
    are kept and the evaluations' seconds go on from theirs."""

    def __init__(self, path: Path, usd_per_s: float | None, earlier: list[Eval] = ()):
        from lorabench.measure.meter import JsonLines

        self.usd_per_s = usd_per_s
        self.evals: list[Eval] = list(earlier)
        self._file = JsonLines(path)

    def add(self, step: int, tokens: int, train_s: float, eval_loss: float, seconds: float) -> Eval:
        eval_s = (self.evals[-1].eval_s if self.evals else 0.0) + seconds
        usd = None if self.usd_per_s is None else (train_s + eval_s) * self.usd_per_s
        e = Eval(step, tokens, train_s, eval_s, eval_loss, seconds, usd)
        if not math.isfinite(eval_loss):
            raise FloatingPointError(f"eval loss is {eval_loss} at step {step}: stopping this cell")
        self.evals.append(e)
        self._file.append(e.record())
        return e

    def close(self) -> None:
        self._file.close()
