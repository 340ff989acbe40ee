"""The Docker image, without a Docker engine: hadolint on docker/Dockerfile, and what the image
must hold (offline environment, non-root user, tokens only as build secrets, a lean context)."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def hadolint(path):
    return subprocess.run([HADOLINT, "--failure-threshold", "info", str(path)], capture_output=True, text=True)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install -e '.[dev]' installs it)")
def test_hadolint_passes_and_would_catch_a_bad_dockerfile(tmp_path):
    proc = hadolint(DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install -y curl\n")
    assert hadolint(bad).returncode != 0


def test_image_runs_offline_as_non_root_and_keeps_tokens_out_of_layers():
    text = DOCKERFILE.read_text()
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    names = [s.split()[2] if " AS " in s.splitlines()[0] else None for s in stages]
    assert names == ["deps", "runtime", "with-model"]
    runtime, with_model = stages[1], stages[2]
    for var in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "HF_DATASETS_OFFLINE=1", "WANDB_MODE=offline"):
        assert var in runtime
    assert re.findall(r"^USER (\S+)", runtime, flags=re.M)[-1] == "1000:1000"
    assert re.findall(r"^USER (\S+)", with_model, flags=re.M)[-1] == "1000:1000"
    # The HF token: a BuildKit secret mount, never an ARG or ENV (those stay in the image's history).
    assert "--mount=type=secret,id=hf_token" in with_model
    assert not re.search(r"^(ARG|ENV)\s+.*TOKEN", text, flags=re.M | re.I)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "outputs", "wandb"} <= set(ignored)
