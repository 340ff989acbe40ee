"""TensorBoard (`logger=tensorboard`): event files in each cell's run dir (<run dir>/tensorboard), and the sweep's
in <sweep dir>/tensorboard: `tensorboard --logdir <sweep dir>` shows every cell of the sweep as one run.

Each step comes from transformers' TensorBoardCallback (train/loss, train/grad_norm, train/tokens_per_s ...),
writing through the cell's own writer. At the cell's end: its status (a text), its final metrics as scalars and
its config with the headline metrics in the HParams dashboard, one row per cell. The sweep's dir holds the
results table (a text) and the report's plots (images).
"""

from __future__ import annotations

from pathlib import Path

from lorabench.core.config import TensorBoardConfig
from lorabench.core.results import CellResult, flatten
from lorabench.measure.tracking import HEADLINE, RunInfo, numbers, read_steps, status_line, train_keys, trainer_logs

DIR = "tensorboard"


def writer(log_dir: Path):
    from torch.utils.tensorboard import SummaryWriter  # (needs the tensorboard package)

    return SummaryWriter(log_dir=str(log_dir))


def hparam_value(v):
    return v if isinstance(v, (int, float, str, bool)) else str(v)


class Run:
    tool = "TensorBoard"

    def __init__(self, cfg: TensorBoardConfig, info: RunInfo):
        self.info, self.dir = info, info.run_dir / DIR
        self.writer = writer(self.dir)
        self.writer.add_text("cell", f"{info.name} ({info.job_type}), run dir {info.run_dir}")

    def callbacks(self) -> list:
        from transformers.integrations import TensorBoardCallback

        # (it closes the writer when training ends; the writer opens a new event file in the dir at its next write)
        return [TensorBoardCallback(tb_writer=self.writer)]

    def log_steps(self, records: list[dict]) -> None:
        for rec in records:
            for k, v in train_keys(trainer_logs(rec)).items():
                self.writer.add_scalar(k, v, rec["step"])

    def finish(self, result: CellResult) -> None:
        from torch.utils.tensorboard.summary import hparams

        step = ([0] + [s["step"] for s in read_steps(self.info.run_dir / "steps.jsonl")])[-1]  # the last step's
        try:
            self.writer.add_text("status", status_line(result), step)
            final = numbers(result.metrics)
            for k, v in final.items():
                self.writer.add_scalar(k, v, step)
            # The HParams dashboard: this cell's config and headline metrics (the scalars above), one row per cell
            config = {k: hparam_value(v) for k, v in flatten(result.config).items() if v is not None}
            config["status"] = result.status.value
            for summary in hparams(config, {k: final[k] for k in HEADLINE if k in final}):
                self.writer._get_file_writer().add_summary(summary)  # (as SummaryWriter.add_hparams, in this run)
        finally:
            self.writer.close()

    def where(self) -> str:
        return f"TensorBoard: {self.dir} (tensorboard --logdir {self.dir.parent})"


def publish_sweep(cfg: TensorBoardConfig, sweep_dir: Path, report) -> str:
    """<sweep dir>/tensorboard: the results table as a text, each plot of the report as an image."""
    import numpy as np
    from PIL import Image

    w = writer(sweep_dir / DIR)
    try:
        if report is None:
            w.add_text("results", "the report could not be written: see the sweep's console and its cells' dirs")
        else:
            w.add_text("results", report.markdown)
            for f in report.files:
                if f.suffix == ".png" and f.is_file():
                    w.add_image(f"plots/{f.stem}", np.asarray(Image.open(f).convert("RGB")), dataformats="HWC")
    finally:
        w.close()
    n = len(report.results) if report is not None else 0
    return f"TensorBoard: {n} cells and the sweep's table in {sweep_dir} (tensorboard --logdir {sweep_dir})"
