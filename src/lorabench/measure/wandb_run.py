"""W&B (`logger=wandb`): one run per cell in the sweep's group, and an aggregate run of the group with the
sweep's table and report; online, also a workspace comparing the cells.

The cell's run is the process's current run (reinit="finish_previous", not "create_new": transformers'
WandbCallback logs into `wandb.run`), finished at the cell's end whatever happens, so that the cells of a
multirun never merge into one run. Unless WANDB_SILENT is set, W&B writes its lines to the run's own logs
(<run dir>/wandb/) and none to the console.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lorabench.core.config import WandbConfig, WandbMode
from lorabench.core.results import CellResult, Status
from lorabench.measure.tracking import JOB_TYPE, RunInfo, numbers, shared_config, table, train_keys, trainer_logs


def settings():
    import wandb

    # W&B's own variable decides where set; else no `wandb:` lines on the console.
    return wandb.Settings() if "WANDB_SILENT" in os.environ else wandb.Settings(silent=True)


class Run:
    tool = "W&B"

    def __init__(self, cfg: WandbConfig, info: RunInfo):
        import wandb

        self.cfg, self.info = cfg, info
        tags = [f"{k}={v}" for k, v in info.tags.items()]
        self.run = wandb.init(project=cfg.project, entity=cfg.entity, group=info.group, name=info.name,
                              job_type=info.job_type, tags=tags, config=info.config, dir=str(info.run_dir),
                              mode=cfg.mode.value, reinit="finish_previous", settings=settings())
        # WandbCallback's own axis, declared here too for steps logged from steps.jsonl
        self.run.define_metric("train/global_step")
        self.run.define_metric("train/*", step_metric="train/global_step")

    def callbacks(self) -> list:
        from transformers.integrations import WandbCallback

        return [WandbCallback()]  # logs into wandb.run: this cell's run

    def log_steps(self, records: list[dict]) -> None:
        for rec in records:
            self.run.log({**train_keys(trainer_logs(rec)), "train/global_step": rec["step"]})

    def finish(self, result: CellResult) -> None:
        self.dir = self.run.dir  # (<run dir>/wandb/offline-run-*/files)
        try:
            self.run.summary.update({"status": result.status.value, "error": result.error,
                                     **numbers(result.metrics)})
            self.run.tags = (*self.run.tags, f"status={result.status.value}")
        finally:  # finished whatever happens: the next cell of a multirun must not log into this run
            self.run.finish(exit_code=0 if result.status in (Status.ok, Status.skipped) else 1)

    def where(self) -> str:
        run_dir = Path(self.dir).parent
        if self.cfg.mode is WandbMode.offline:
            return f"W&B: offline run {self.info.name} in {run_dir} (upload: wandb sync {run_dir})"
        where = f"{self.cfg.entity or 'your entity'}/{self.cfg.project}"
        return f"W&B: run {self.info.name} in {where}, group {self.info.group}"


def artifact_name(text: str) -> str:
    return re.sub(r"[^\w.-]", "-", text)


def publish_sweep(cfg: WandbConfig, sweep_dir: Path, report) -> str:
    """An aggregate run in the sweep's group: its config (what every cell shares, the swept keys), the results
    table, and the report's files as an artifact; online, also a workspace of the group."""
    import wandb

    group = sweep_dir.name
    results, keys = (report.results, report.axes) if report is not None else ([], [])
    config = {"sweep_dir": str(sweep_dir), "cells": len(results), "swept": keys, **shared_config(results)}
    with wandb.init(project=cfg.project, entity=cfg.entity, group=group, name=f"{group}/aggregate",
                    job_type="aggregate", config=config, dir=str(sweep_dir), mode=cfg.mode.value,
                    reinit="finish_previous", settings=settings()) as run:
        if report is not None:
            columns, rows = table(results, keys)
            run.log({"sweep/results": wandb.Table(columns=columns, data=rows)})
            files = wandb.Artifact(f"report-{artifact_name(group)}", type="sweep-report",
                                   description=f"lorabench report of sweep {group}")
            for f in report.files:
                if f.is_file():
                    files.add_file(str(f), name=str(f.relative_to(sweep_dir)))
            run.log_artifact(files)
        run.summary.update({"cells": len(results), **{f"cells_{s}": sum(r.status.value == s for r in results)
                                                      for s in {r.status.value for r in results}}})
        entity, run_dir = run.entity, Path(run.dir).parent
    if cfg.mode is WandbMode.online:
        build_workspace(entity, cfg.project, group, keys).save()
        return (f"W&B: group {group} in {entity}/{cfg.project}: {len(results)} cell runs, the aggregate run and "
                "a workspace")
    return (f"W&B: group {group}, {len(results)} cell runs and the aggregate run, offline (upload: "
            f"wandb sync {sweep_dir}/*/wandb/offline-run-* {run_dir})")


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
