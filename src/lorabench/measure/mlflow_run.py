"""MLflow (`logger=mlflow`): one run per cell, nested under a parent run per sweep that holds the sweep's table
and report.

The tracking URI and experiment are MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME where the config leaves them
unset, else a SQLite store in outputs/mlflow/ (artifacts beside it) and the experiment `lorabench`: by default
nothing leaves the machine. The parent run is made before the first cell (lorabench.sweep.callbacks.Preflight) and
its id kept in <sweep dir>/mlflow.json, so that cells in other processes (SLURM, submitit) nest under it too, and
so does a sweep run again with the same hydra.sweep.dir. A cell's run is the process's active run while it
trains: transformers' MLflowCallback logs each step into it.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

from lorabench.core.config import MlflowConfig
from lorabench.core.results import CellResult, Status, atomic_write_json, flatten
from lorabench.measure.tracking import (
    RunInfo,
    numbers,
    quiet,
    shared_config,
    status_line,
    table,
    trainer_logs,
)

SWEEP_FILE = "mlflow.json"  # in the sweep dir: the parent run's tracking URI, experiment and id
# A cell's end, in MLflow's run states: a measurement ends FINISHED (its status tag says ok, oom or skipped).
STATUS = {Status.ok: "FINISHED", Status.skipped: "FINISHED", Status.oom: "FAILED", Status.failed: "FAILED",
          Status.interrupted: "KILLED", Status.running: "KILLED"}


def load():
    """mlflow, imported with its console lines sent to the run dir's log: its loggers' INFO (the store's
    migrations on first use) and the run links it prints for a server (MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT
    unless set; lorabench prints the sweep's link once, at its end)."""
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    import mlflow

    quiet("mlflow", "alembic")
    return mlflow


def client(cfg: MlflowConfig):
    mlflow = load()
    if cfg.tracking_uri.startswith("sqlite:///") and ":memory:" not in cfg.tracking_uri:
        sqlite_dir(cfg).mkdir(parents=True, exist_ok=True)  # (SQLite makes the file, not its folder)
    mlflow.set_tracking_uri(cfg.tracking_uri)  # (also what MLflowCallback finds set)
    return mlflow, mlflow.MlflowClient(cfg.tracking_uri)


def sqlite_dir(cfg: MlflowConfig) -> Path:
    """The folder of a SQLite store's file (sqlite:///relative.db, sqlite:////absolute.db)."""
    return Path(cfg.tracking_uri.removeprefix("sqlite:///")).absolute().parent


def experiment_id(cfg: MlflowConfig, client) -> str:
    """The experiment's id, made where missing; in a SQLite store its artifacts go beside the database
    (MLflow's default would be ./mlruns in whatever directory train.py was started from)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(cfg.experiment)
    if found is not None:
        return found.experiment_id
    location = None
    if cfg.tracking_uri.startswith("sqlite:///") and ":memory:" not in cfg.tracking_uri:
        location = (sqlite_dir(cfg) / "artifacts").as_uri()
    try:  # (the kind: MLflow's UI opens it on its runs, not on the GenAI pages)
        return client.create_experiment(cfg.experiment, artifact_location=location,
                                        tags={"mlflow.experimentKind": "custom_model_development"})
    except MlflowException:  # another cell made it meanwhile
        return client.get_experiment_by_name(cfg.experiment).experiment_id


def params(config: dict) -> dict:
    """The resolved config as MLflow shows it: one param per leaf, dotted keys (optimizer.lr), text values."""
    return param_texts(flatten(config))


def param_texts(flat: dict) -> dict:
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    return {k: (json.dumps(list(v)) if isinstance(v, tuple) else str(v))[:MAX_PARAM_VAL_LENGTH]
            for k, v in flat.items()}


def metric_key(key: str) -> str:
    return re.sub(r"[^0-9A-Za-z_\-. :/]", "_", key)  # MLflow's metric names (as MLflowCallback sanitises them)


def log_batch(client, run_id: str, params: dict | None = None, metrics: list | None = None,
              tags: dict | None = None) -> None:
    """Params, metrics and tags in MLflow's batch sizes (100 params or tags, 1,000 metrics a call)."""
    from mlflow.entities import Param, RunTag

    for chunk in _chunks([Param(k, v) for k, v in (params or {}).items()], 100):
        client.log_batch(run_id, params=chunk)
    for chunk in _chunks([RunTag(k, str(v)[:8000]) for k, v in (tags or {}).items()], 100):
        client.log_batch(run_id, tags=chunk)
    for chunk in _chunks(metrics or [], 1000):
        client.log_batch(run_id, metrics=chunk)


def _chunks(items: list, n: int):
    return (items[i:i + n] for i in range(0, len(items), n))


def metrics_at(values: dict, step: int = 0) -> list:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(metric_key(k), v, now, step) for k, v in values.items() if not math.isinf(v)]


def parent_of(sweep_dir: Path | None, cfg: MlflowConfig, exp_id: str) -> str | None:
    """The sweep's parent run, where the preflight made it in this store and experiment."""
    try:
        saved = json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (TypeError, OSError, ValueError):
        return None
    same = saved.get("tracking_uri") == cfg.tracking_uri and saved.get("experiment_id") == exp_id
    return saved.get("run_id") if same else None


class Run:
    tool = "MLflow"

    def __init__(self, cfg: MlflowConfig, info: RunInfo):
        self.mlflow, self.client = client(cfg)
        self.cfg, self.info = cfg, info
        self.exp_id = experiment_id(cfg, self.client)
        parent = parent_of(info.sweep_dir, cfg, self.exp_id)
        tags = {"cell": info.name.split("/", 1)[-1], "sweep": info.group, "job_type": info.job_type,
                "run_dir": str(info.run_dir), **info.tags}
        while self.mlflow.active_run() is not None:  # (never left open by a cell: finish ends it)
            self.mlflow.end_run("KILLED")
        self.run_id = self.mlflow.start_run(experiment_id=self.exp_id, run_name=info.name, parent_run_id=parent,
                                            tags=tags).info.run_id
        log_batch(self.client, self.run_id, params=params(info.config))

    def callbacks(self) -> list:
        from transformers.integrations import MLflowCallback

        return [MLflowCallback()]  # logs into the active run: this cell's

    def log_steps(self, records: list[dict]) -> None:
        log_batch(self.client, self.run_id, metrics=[m for rec in records
                                                     for m in metrics_at(trainer_logs(rec), rec["step"])])

    def finish(self, result: CellResult) -> None:
        try:
            self.mlflow.flush_async_logging()  # MLflowCallback's steps, logged asynchronously
            tags = {"status": result.status.value}
            if result.error:
                tags.update(error=result.error, **{"mlflow.note.content": status_line(result)})
            log_batch(self.client, self.run_id, metrics=metrics_at(numbers(result.metrics)), tags=tags)
            for name in ("metrics.json", "steps.jsonl", "error.txt", ".hydra/config.yaml"):  # as cell/<file name>
                if (f := self.info.run_dir / name).is_file():
                    self.client.log_artifact(self.run_id, str(f), artifact_path="cell")
        finally:
            self.mlflow.end_run(STATUS[result.status])

    def where(self) -> str:
        return f"MLflow: run {self.info.name} in experiment {self.cfg.experiment} at {self.cfg.tracking_uri}" + \
            ui_hint(self.cfg, self.exp_id)


def ui_hint(cfg: MlflowConfig, exp_id: str, run_id: str | None = None) -> str:
    uri = cfg.tracking_uri
    if uri.startswith(("http://", "https://")):
        return f": {uri.rstrip('/')}/#/experiments/{exp_id}" + (f"/runs/{run_id}" if run_id else "")
    return f" (to browse: mlflow ui --backend-store-uri {uri})"


def open_sweep(cfg: MlflowConfig, sweep_dir: Path) -> str:
    """The sweep's parent run (made, or the one <sweep dir>/mlflow.json names, running again); its id."""
    _, mlflow_client = client(cfg)
    exp_id = experiment_id(cfg, mlflow_client)
    run_id = parent_of(sweep_dir, cfg, exp_id)
    if run_id is not None:
        try:
            if mlflow_client.get_run(run_id).info.lifecycle_stage == "active":
                mlflow_client.update_run(run_id, status="RUNNING")
                return run_id
        except Exception:
            pass  # deleted from the store meanwhile: a new one
    run = mlflow_client.create_run(exp_id, run_name=sweep_dir.name, tags={"sweep": sweep_dir.name,
                                                                         "sweep_dir": str(sweep_dir)})
    atomic_write_json(sweep_dir / SWEEP_FILE, {"tracking_uri": cfg.tracking_uri, "experiment_id": exp_id,
                                               "run_id": run.info.run_id})
    return run.info.run_id


def publish_sweep(cfg: MlflowConfig, sweep_dir: Path, report) -> str:
    """The parent run: what every cell shares as its params, cells per status as metrics, the results table
    (results_table.json, MLflow's table view) and the report's files as artifacts; then FINISHED (FAILED
    where the report could not be written)."""
    mlflow, mlflow_client = client(cfg)
    exp_id = experiment_id(cfg, mlflow_client)
    run_id = parent_of(sweep_dir, cfg, exp_id) or open_sweep(cfg, sweep_dir)
    results, keys = (report.results, report.axes) if report is not None else ([], [])
    try:
        counts = {f"cells_{s.value}": float(sum(r.status is s for r in results))
                  for s in Status if s is not Status.running}
        log_batch(mlflow_client, run_id, params={**param_texts(shared_config(results)), "swept": json.dumps(keys)},
                  metrics=metrics_at({"cells": float(len(results)), **counts}))
        if report is not None:
            columns, rows = table(results, keys)
            mlflow_client.log_table(run_id, {c: [row[i] for row in rows] for i, c in enumerate(columns)},
                                    "results_table.json")
            for f in report.files:
                if f.is_file():
                    rel = f.relative_to(sweep_dir).parent
                    mlflow_client.log_artifact(run_id, str(f), artifact_path=None if str(rel) == "." else str(rel))
    finally:
        mlflow_client.set_terminated(run_id, "FINISHED" if report is not None else "FAILED")
    return (f"MLflow: experiment {cfg.experiment}, parent run {sweep_dir.name} with {len(results)} cell runs "
            f"at {cfg.tracking_uri}" + ui_hint(cfg, exp_id, run_id))
