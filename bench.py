"""Benchmark suites beside training. For now one suite: the sweep report.

    python bench.py sweep_dir=outputs/sweeps/2026-11-22_10-00-00   # results.md + results.csv

It reads whatever cells have a metrics.json, so it works on a sweep that is still running or was
killed part-way (cells without a result are listed as incomplete).
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    from lorabench.bench import run_suite

    run_suite(cfg)


if __name__ == "__main__":
    main()
