"""bench.py's suites. The report suite writes the sweep report of a sweep dir (also a partial one)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from lorabench.config import BenchConfig, Suite
from lorabench.report import write_report


def run_suite(cfg: DictConfig) -> None:
    c: BenchConfig = OmegaConf.to_object(cfg)
    if c.suite is Suite.report:
        out = write_report(c.sweep_dir, c.report)
        print(out["markdown"])
        print("\nfiles:\n" + "\n".join(f"  {f}" for f in out["files"]))
