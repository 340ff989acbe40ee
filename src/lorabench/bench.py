"""bench.py's suites. The report suite tabulates a sweep dir's cells (also a partial sweep)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from lorabench.results import write_sweep_summary

SUITES = ("report",)


def run_suite(cfg: DictConfig) -> None:
    if cfg.suite not in SUITES:
        raise ValueError(f"suite={cfg.suite!r} is not a bench suite; choose one of {list(SUITES)}")
    sweep_dir = Path(cfg.sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep_dir={cfg.sweep_dir!r} is not a directory")
    md = write_sweep_summary(sweep_dir)
    print(f"{sweep_dir / 'results.md'}:\n{md}")
