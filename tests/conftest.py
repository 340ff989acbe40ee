import json
import os
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import lorabench.config  # noqa: F401  (registers the schemas)

REPO = Path(__file__).resolve().parents[1]
# Tests never reach a hub, in this process or in the train.py subprocesses.
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[var] = "1"
# Tokenised-data cache of the whole test session in a temp dir (subprocesses inherit it).
os.environ.setdefault("LORABENCH_CACHE", tempfile.mkdtemp(prefix="lorabench-cache-"))
# Under pytest-xdist (`make test` runs 2 workers on CI's 2 cores), one thread per worker and per
# subprocess it starts: two workers with two intra-op threads each only contend.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
CONF = REPO / "conf"
# A few steps are enough to exercise every part of a cell; the default task test runs the full default.
FAST = ["train.max_steps=6", "train.timing_warmup_steps=2", "data.max_samples=64"]


def compose_cfg(overrides=(), config_name="train", return_hydra_config=False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name=config_name, overrides=list(overrides),
                       return_hydra_config=return_hydra_config)


def run_in_process(overrides, run_dir, **ctx):
    """One cell through lorabench.train.run_cell in this process (no interpreter start-up), with the
    context the entrypoint would pass; returns its CellResult."""
    from lorabench.results import RunContext
    from lorabench.train import run_cell

    ctx = RunContext(run_dir=Path(run_dir), name=",".join(overrides) or "defaults", overrides=list(overrides), **ctx)
    return run_cell(compose_cfg(overrides), ctx)


def run_cli(script, args, cwd=REPO, check=True, env=None):
    """Run train.py / bench.py as a user would, in a subprocess."""
    proc = subprocess.run([sys.executable, str(REPO / script), *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} {args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def read_result(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def read_steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "steps.jsonl").read_text().splitlines()]


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

