"""What every tracker of the `logger` group shares (lorabench.measure.loggers chooses them; wandb_run, mlflow_run and
tensorboard_run speak to one each): a cell's run name and group, its steps as the trackers take them, its status in
one line, the sweep's table, and the console kept quiet of the trackers' chatter."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from lorabench.core.results import CellResult, flatten, unstrict

JOB_TYPE = "train-cell"


# The headline metrics of a sweep's table (W&B's aggregate, MLflow's parent run, TensorBoard's hparams).
HEADLINE = ["perf/tokens_per_s", "perf/samples_per_s", "perf/mfu_pct", "mem/peak_reserved_gib",
            "cost/usd_per_1k_samples", "cost/usd_per_1m_tokens"]


@dataclass
class RunInfo:
    """What every tracker names and groups a cell's run by."""

    name: str  # unique across sweeps: <sweep dir name>/<cell name> (a single run: <run dir name>/<cell name>)
    group: str  # the sweep dir's name (a single run: its run dir's)
    job_type: str  # train-cell, or bench.py's suite
    config: dict  # the resolved config
    run_dir: Path
    sweep_dir: Path | None

    @property
    def tags(self) -> dict:
        c = self.config
        picks = {"suite": c.get("suite"), "model": c.get("model", {}).get("name"),
                 "precision": c.get("precision", {}).get("name"), "data": c.get("data", {}).get("kind"),
                 "seq_len": c.get("seq_len"), "batch": c.get("batch")}
        return {k: str(v) for k, v in picks.items() if v is not None}


def read_steps(path: Path) -> list[dict]:
    try:
        return [unstrict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def step_values(record: dict) -> dict:
    """What a tracker shows of one step besides the Trainer's own loss, grad_norm and learning_rate:
    non-pad tokens/s, the step's time, memory and power (the StepMeter's record, lorabench.measure.meter)."""
    out = {"tokens_per_s": record["tokens_nonpad"] / record["time_s"] if record["time_s"] > 0 else 0.0,
           "step_time_s": record["time_s"]}
    out.update({k: record[k] for k in ("mem_reserved_gib", "host_rss_gib", "power_w") if record.get(k) is not None})
    return out


def trainer_logs(record: dict) -> dict:
    """A steps.jsonl record as the Trainer's logs for that step would have it (MeasuredTrainer.log's keys)."""
    logs = {"loss": record.get("loss"), "grad_norm": record.get("grad_norm"), "learning_rate": record.get("lr"),
            **step_values(record)}
    return {k: v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def train_keys(logs: dict) -> dict:
    """The Trainer's training logs as transformers' W&B and TensorBoard callbacks name them (rewrite_logs)."""
    return {f"train/{k}": v for k, v in logs.items()}


def numbers(metrics: dict) -> dict:
    """The metrics a tracker can plot: numbers (None, text and flags left out)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def status_line(result: CellResult) -> str:
    return result.status.value + (f": {result.error}" if result.error else "")


QUIET = ("lorabench.trackers",)


class _LogFileOnly(logging.Filter):
    """On a console handler: a quieted logger's records below WARNING are left to the log file."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith(QUIET)


def quiet(*names: str) -> None:
    """The Python loggers `names` (with their children) through the root's handlers, at INFO, their INFO lines
    kept off the console (Hydra's console handler, or any other stream handler of the root's). MLflow gives
    its loggers a console handler of their own: removed."""
    global QUIET
    QUIET = tuple(dict.fromkeys((*QUIET, *names)))
    for name in names:
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
        lg.setLevel(logging.INFO)
    for h in logging.getLogger().handlers:  # (a multirun's cells get new handlers: each cell calls this)
        if not isinstance(h, logging.FileHandler) and not any(isinstance(f, _LogFileOnly) for f in h.filters):
            h.addFilter(_LogFileOnly())


def shared_config(results: list[CellResult]) -> dict:
    """The flattened config keys every cell of a sweep has alike (what the sweep's group records as its config)."""
    flats = [flatten(r.config) for r in results if r.config]
    if not flats:
        return {}
    return {k: v for k, v in flats[0].items() if all(f.get(k) == v for f in flats[1:])}


def table(results: list[CellResult], keys: list[str]) -> tuple[list[str], list[list]]:
    """The sweep's results table: one row per cell, the swept keys, then its status, reason and headline metrics."""
    columns = ["cell", *keys, "status", "error", *HEADLINE]
    rows = []
    for r in results:
        flat = flatten(r.config)
        rows.append([r.cell, *[str(flat.get(k)) for k in keys], r.status.value, r.error,
                     *[r.metrics.get(k) for k in HEADLINE]])
    return columns, rows


