"""The trackers a cell reports to beside its own files (the `logger` group: none, wandb, mlflow,
tensorboard, or several: `logger=[mlflow,tensorboard]`), and the sweep's side of them.

Each step reaches a tracker through that tracker's own HF Trainer callback (transformers' WandbCallback,
MLflowCallback, TensorBoardCallback: loss, grad_norm, learning_rate), with the StepMeter's non-pad tokens/s, step
time, memory and power added to the Trainer's logs (lorabench.run.trainer.MeasuredTrainer.log). lorabench's own
code logs only what those callbacks do not:
  - the cell's run itself, started before the cell's checks so that a cell failing one has its run too: a name
    unique across sweeps (<sweep dir name>/<cell name>), its group, the resolved config;
  - at its end: its status and reason, its final metrics (metrics.json's), its files;
  - the steps of a cell that trained in other processes (train.nproc > 1, backend=unsloth), from its steps.jsonl;
  - per sweep: the group (a W&B group and aggregate run, an MLflow parent run, a TensorBoard dir) with the
    results table and the report's files (publish_sweep).

The run dir's own files are always written; a tracker only mirrors them. The config sent is the resolved Hydra
config: it never holds a key or token (those stay in the environment, WANDB_API_KEY / HF_TOKEN), and lorabench
never copies the environment anywhere. A tracker that cannot start or finish is named in one warning and the cell
goes on: a tracker never turns a measured cell into a lost one.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
from pathlib import Path
from typing import Protocol

from lorabench.core.config import LoggerConfig
from lorabench.core.results import CellResult, RunContext
from lorabench.measure.tracking import JOB_TYPE, RunInfo, quiet, read_steps

log = logging.getLogger(__name__)


class MetricLogger(Protocol):
    """What a cell tells its trackers: the Trainer callbacks that log each step into its runs, then its result."""

    run_name: str | None  # the Trainer's run_name (TrainingArguments)

    def callbacks(self) -> list: ...

    def finish(self, result: CellResult) -> None: ...


class NullLogger:
    """The default: the run dir's own files are the record; nothing else is told."""

    run_name = None

    def callbacks(self) -> list:
        return []

    def finish(self, result: CellResult) -> None:
        pass




class Trackers:
    """A cell's run in each tracker selected; every one of them finished, whatever happens to another."""

    def __init__(self, runs: list, info: RunInfo):
        self.runs, self.info, self.run_name = runs, info, info.name
        self._handed = False  # whether a Trainer in this process got the callbacks (else: steps from steps.jsonl)

    def callbacks(self) -> list:
        self._handed = True
        return [cb for run in self.runs for cb in run.callbacks()]

    def finish(self, result: CellResult) -> None:
        steps = [] if self._handed else read_steps(self.info.run_dir / "steps.jsonl")
        for run in self.runs:
            try:
                if steps:  # a cell trained by other processes: its Trainer's callbacks ran there, untracked
                    run.log_steps(steps)
                run.finish(result)
                where = run.where()
            except Exception as e:
                where = f"{run.tool}: the run could not be finished ({first_line(e)})"
                log.warning("%s", where)
            tracker_log.info("%s", where)
            if self.info.sweep_dir is None:  # a single run: where to look, on the console (a sweep's: at its end)
                print(where, file=sys.stderr)


def build_logger(cfg: LoggerConfig, ctx: RunContext, config: dict, job_type: str = JOB_TYPE) -> MetricLogger:
    """The cell's runs in the trackers `cfg` selects (NullLogger for none). A tracker that cannot start (a server
    down, a package missing) is left out with one warning: the cell runs and keeps its own files."""
    kinds = cfg.kinds
    if not kinds:
        return NullLogger()
    quiet()
    info = RunInfo(name=f"{ctx.group}/{ctx.name}", group=ctx.group, job_type=job_type, config=config,
                   run_dir=Path(ctx.run_dir), sweep_dir=ctx.sweep_dir)
    runs = []
    for kind in kinds:
        try:
            runs.append(TRACKERS[kind]().Run(getattr(cfg, kind).resolved(), info))
        except Exception as e:
            log.warning("%s: the cell's run could not be started, this cell is not tracked there (%s)",
                        TOOL_NAMES[kind], first_line(e))
    return Trackers(runs, info) if runs else NullLogger()


# ---------------------------------------------------------------------------- checks

def check_logger(cfg: LoggerConfig) -> None:
    """The trackers' settings and the environment variables lorabench reads for them, before any run starts
    or model is built: one line naming the variable (or key) and what it accepts."""
    found = logger_problems(cfg)
    if found:
        raise found[0] if len(found) == 1 else ValueError("; ".join(str(e) for e in found))


W_AND_B_NAME = re.compile(r"[/\\#?%:\s]")  # what W&B refuses in a project or entity name
MLFLOW_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks", "databricks-uc",
                  "uc", "mlflow-artifacts")
EXTRAS = {"mlflow": "mlflow", "tensorboard": "tensorboard"}  # logger -> the package it needs (an extra of lorabench)


def source(key: str, value, var: str) -> str:
    """How a setting is named in a message: the config key where set there, else the environment variable."""
    return f"{key}={value!r}" if value is not None else f"{var}={os.environ.get(var)!r}"


def logger_problems(cfg: LoggerConfig) -> list[Exception]:
    found: list[Exception] = []
    if cfg.wandb is not None:
        try:
            cfg.wandb.resolved()  # WANDB_MODE
        except ValueError as e:
            found.append(e)
        for key, var in (("project", "WANDB_PROJECT"), ("entity", "WANDB_ENTITY")):
            value = getattr(cfg.wandb, key) or os.environ.get(var) or None
            if value is not None and (W_AND_B_NAME.search(value) or len(value) > 128):
                found.append(ValueError(f"{source(f'logger.wandb.{key}', getattr(cfg.wandb, key), var)} is not a W&B "
                                        f"{key} name: at most 128 characters, none of / \\ # ? % : or spaces"))
    if cfg.mlflow is not None:
        m = cfg.mlflow.resolved()
        scheme = re.match(r"^([A-Za-z][A-Za-z0-9.+-]*):", m.tracking_uri)
        host_port = re.fullmatch(r"[\w.-]+:\d+/?", m.tracking_uri)  # localhost:5000, without http://
        if host_port or (scheme and len(scheme[1]) > 1 and scheme[1].split("+")[0].lower() not in MLFLOW_SCHEMES):
            found.append(ValueError(
                f"{source('logger.mlflow.tracking_uri', cfg.mlflow.tracking_uri, 'MLFLOW_TRACKING_URI')} is not a "
                "tracking URI MLflow reads: use http://host:port (a tracking server), sqlite:///path/mlflow.db or "
                "another database URL"))
        if not m.experiment.strip():
            named = source("logger.mlflow.experiment", cfg.mlflow.experiment, "MLFLOW_EXPERIMENT_NAME")
            found.append(ValueError(f"{named} is not an experiment name: give a non-blank one"))
    for kind, package in EXTRAS.items():
        if getattr(cfg, kind) is not None and importlib.util.find_spec(package) is None:
            found.append(ValueError(f"logger={kind} needs the {package} package, which is not installed: "
                                    f"pip install -e '.[{package}]' (or pip install {package})"))
    return found


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__














# ---------------------------------------------------------------------------- quiet trackers

# Each tracker's own lines (W&B's `wandb:` lines aside: settings(silent=True)) and lorabench's line per cell run go
# to the run dir's log (the file handler Hydra gives each cell), not to the console; their warnings reach both.
tracker_log = logging.getLogger("lorabench.trackers")






# ---------------------------------------------------------------------------- the sweep's side

def open_sweep(cfg: LoggerConfig, sweep_dir: Path) -> None:
    """Before a multirun's first cell: what its cells' runs nest under (MLflow's parent run). Raises where the
    tracker cannot be reached, so that the preflight names it before any cell runs."""
    if "mlflow" in cfg.kinds:
        TRACKERS["mlflow"]().open_sweep(cfg.mlflow.resolved(), Path(sweep_dir))


def publish_sweep(cfg: LoggerConfig, sweep_dir: Path, report) -> list[str]:
    """After a multirun: the sweep's group in each tracker with the results table and the report's files
    (`report`: lorabench.report.page.Report, None where it could not be written). One line per tracker,
    for the console; a tracker that fails is named in its line, the others still publish."""
    lines = []
    for kind in cfg.kinds:
        try:
            lines.append(TRACKERS[kind]().publish_sweep(getattr(cfg, kind).resolved(), Path(sweep_dir), report))
        except Exception as e:
            lines.append(f"{TOOL_NAMES[kind]}: the sweep could not be published ({first_line(e)})")
    return lines






def _wandb():
    from lorabench.measure import wandb_run
    return wandb_run


def _mlflow():
    from lorabench.measure import mlflow_run
    return mlflow_run


def _tensorboard():
    from lorabench.measure import tensorboard_run
    return tensorboard_run


# Each tracker's module, imported only where it is selected (mlflow and tensorboard are optional packages).
TRACKERS = {"wandb": _wandb, "mlflow": _mlflow, "tensorboard": _tensorboard}
TOOL_NAMES = {"wandb": "W&B", "mlflow": "MLflow", "tensorboard": "TensorBoard"}
