"""Benchmark suites beside training. For now one suite: the sweep report.

    python bench.py sweep_dir=outputs/sweeps/2026-11-22_10-00-00   # results.md/.csv, plots/, report.html

It reads whatever cells have a metrics.json, so it works on a sweep that is still running or was
killed part-way (cells without a result are listed as incomplete).
"""

import sys

import hydra
from omegaconf import DictConfig

import lorabench.config  # noqa: F401  (registers the schemas in Hydra's ConfigStore)


@hydra.main(version_base="1.3", config_path="conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    from lorabench.bench import run_suite

    try:
        run_suite(cfg)
    except (FileNotFoundError, ValueError) as e:  # a wrong dir or option: say so, no traceback
        sys.exit(f"bench.py: {e}")


if __name__ == "__main__":
    main()
