"""Metric loggers for the `logger` group (a do-nothing default, one W&B run per cell) and the
W&B side of the sweep report (an aggregate run with the results table, and a workspace).

The run dir's own files (steps.jsonl, metrics.json) are always written; a logger only mirrors them.
The config sent to W&B is the resolved Hydra config: it never holds a key or token (those stay in
the environment, WANDB_API_KEY / HF_TOKEN), and lorabench never copies the environment anywhere.
"""

from __future__ import annotations

from typing import Protocol

from lorabench.config import LoggerConfig, LoggerKind, WandbMode
from lorabench.results import CellResult, Status, flatten

JOB_TYPE = "train-cell"


class MetricLogger(Protocol):
    """What a cell tells a logger: each optimizer step's record (steps.jsonl's line), then its result."""

    def log_step(self, record: dict) -> None: ...

    def finish(self, result: CellResult) -> None: ...


class NullLogger:
    """The default: the run dir's own files are the record; nothing else is told."""

    def log_step(self, record: dict) -> None:
        pass

    def finish(self, result: CellResult) -> None:
        pass


class WandbLogger:
    """One W&B run per cell, grouped by sweep, always finished (also when the cell fails), so that
    cells of a multirun never merge into one run and a multirun never hangs."""

    def __init__(self, cfg: LoggerConfig, name: str, group: str, config: dict, run_dir: str, job_type: str):
        import wandb

        picks = {"suite": config.get("suite"), "model": config.get("model", {}).get("name"),
                 "precision": config.get("precision", {}).get("name"), "data": config.get("data", {}).get("kind"),
                 "seq_len": config.get("seq_len"), "batch": config.get("batch")}
        tags = [f"{k}={v}" for k, v in picks.items() if v is not None]
        # reinit="create_new": each cell is its own run even though a multirun keeps one process.
        self.run = wandb.init(project=cfg.project, entity=cfg.entity, group=group, name=name, job_type=job_type,
                              tags=tags, config=config, dir=run_dir, mode=cfg.resolved_mode().value,
                              reinit="create_new")
        self.run.define_metric("step")
        self.run.define_metric("train/*", step_metric="step")

    def log_step(self, record: dict) -> None:
        self.run.log({"step": record["step"], "train/loss": record.get("loss"), "train/lr": record.get("lr"),
                      "train/step_time_s": record["time_s"], "train/tokens_nonpad": record["tokens_nonpad"]})

    def finish(self, result: CellResult) -> None:
        self.run.summary.update({"status": result.status.value, "error": result.error, **result.metrics})
        self.run.finish(exit_code=0 if result.status in (Status.ok, Status.skipped) else 1)


def build_logger(cfg: LoggerConfig, name: str, group: str, config: dict, run_dir: str,
                 job_type: str = JOB_TYPE) -> MetricLogger:
    if cfg.kind is LoggerKind.wandb:
        return WandbLogger(cfg, name, group, config, run_dir, job_type)
    return NullLogger()


# ---------------------------------------------------------------------------- the sweep's aggregate

def aggregate_rows(results: list[CellResult], keys: list[str]) -> tuple[list[str], list[list]]:
    """The sweep's table for W&B: one row per cell, swept keys then status and headline metrics."""
    metrics = ["perf/tokens_per_s", "perf/samples_per_s", "perf/mfu_pct", "mem/peak_reserved_gib",
               "cost/usd_per_1k_samples", "cost/usd_per_1m_tokens"]
    columns = ["cell", *keys, "status", "error", *metrics]
    rows = []
    for r in results:
        flat = flatten(r.config)
        rows.append([r.cell, *[str(flat.get(k)) for k in keys], r.status.value, r.error,
                     *[r.metrics.get(k) for k in metrics]])
    return columns, rows


def build_workspace(entity: str, project: str, group: str, keys: list[str]):
    """A W&B workspace comparing the cells of one sweep: bars of throughput, memory and cost per cell,
    and a parallel-coordinates panel over the swept keys. Built offline; `.save()` publishes it."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    def bars(title, metric):
        return wr.BarPlot(title=title, metrics=[wr.SummaryMetric(metric)], orientation="h")

    columns = [wr.ParallelCoordinatesPlotColumn(metric=wr.Config(k)) for k in keys]
    columns.append(wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric("perf/tokens_per_s"),
                                                    display_name="non-pad tokens/s"))
    return ws.Workspace(
        entity=entity, project=project, name=f"lorabench {group}",
        sections=[ws.Section(name=f"Sweep {group}", is_open=True, panels=[
            bars("non-pad tokens/s", "perf/tokens_per_s"),
            bars("samples/s", "perf/samples_per_s"),
            bars("peak reserved GiB", "mem/peak_reserved_gib"),
            bars("USD per 1K samples", "cost/usd_per_1k_samples"),
            bars("USD per 1M tokens", "cost/usd_per_1m_tokens"),
            wr.ParallelCoordinatesPlot(title="swept keys -> non-pad tokens/s", columns=columns),
        ])],
        runset_settings=ws.RunsetSettings(filters=[ws.Metric("Group") == group, ws.Metric("JobType") == JOB_TYPE]),
    )


def publish_aggregate(cfg: LoggerConfig, group: str, results: list[CellResult], keys: list[str],
                      sweep_dir: str) -> None:
    """An aggregate run in the sweep's group holding the results table; online, also the workspace."""
    import wandb

    columns, rows = aggregate_rows(results, keys)
    with wandb.init(project=cfg.project, entity=cfg.entity, group=group, name=f"{group} aggregate",
                    job_type="aggregate", dir=sweep_dir, mode=cfg.resolved_mode().value, reinit="create_new") as run:
        run.log({"sweep/results": wandb.Table(columns=columns, data=rows)})
        entity = run.entity
    if cfg.resolved_mode() is WandbMode.online:
        build_workspace(entity, cfg.project, group, keys).save()
