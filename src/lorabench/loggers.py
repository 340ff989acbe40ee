"""Metric loggers for the `logger` group: a do-nothing default and one W&B run per cell.

The run dir's own files (steps.jsonl, metrics.json) are always written; a logger only mirrors them.
"""

from __future__ import annotations

from lorabench.config import LoggerConfig, LoggerKind


class NullLogger:
    def log_step(self, record: dict) -> None:
        pass

    def finish(self, result: dict) -> None:
        pass


class WandbLogger:
    """One W&B run per cell, grouped by sweep, always finished (also when the cell fails), so that
    cells of a multirun never merge into one run."""

    def __init__(self, cfg: LoggerConfig, name: str, group: str, config: dict, run_dir: str):
        import wandb

        self.run = wandb.init(project=cfg.project, entity=cfg.entity, group=group, name=name,
                              job_type="train-cell", config=config, dir=run_dir, mode=cfg.mode.value,
                              reinit="create_new")
        self.run.define_metric("step")
        self.run.define_metric("train/*", step_metric="step")

    def log_step(self, record: dict) -> None:
        self.run.log({"step": record["step"], "train/loss": record.get("loss"),
                      "train/lr": record.get("lr"), "train/step_time_s": record["time_s"],
                      "train/tokens_nonpad": record["tokens_nonpad"]})

    def finish(self, result: dict) -> None:
        self.run.summary.update({"status": result["status"], "error": result.get("error"),
                                 **result.get("metrics", {})})
        self.run.finish(exit_code=0 if result["status"] == "ok" else 1)


def build_logger(cfg: LoggerConfig, name: str, group: str, config: dict, run_dir: str):
    if cfg.kind is LoggerKind.wandb:
        return WandbLogger(cfg, name, group, config, run_dir)
    return NullLogger()
