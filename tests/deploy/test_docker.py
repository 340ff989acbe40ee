"""The Docker image's files, without building it: hadolint on docker/Dockerfile and the local base's,
and what the image must hold (offline environment, non-root user who owns /app and /data, tokens only
as build secrets, a lean context, one file for both bases). tests/deploy/test_image.py runs the built image."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
BASE_CPU = REPO / "docker" / "Dockerfile.base-cpu"
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def hadolint(path):
    return subprocess.run([HADOLINT, "--failure-threshold", "info", str(path)], capture_output=True, text=True)


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install -e '.[dev]' installs it)")
def test_hadolint_passes_and_would_catch_a_bad_dockerfile(tmp_path):
    for path in (DOCKERFILE, BASE_CPU):
        proc = hadolint(path)
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
    names = re.findall(r"^(?:ARG|ENV)\s+(\w+)", text, flags=re.M) + re.findall(r"^\s+(\w+)=", text, flags=re.M)
    assert "BASE" in names and "HF_HUB_OFFLINE" in names and not [n for n in names if "TOKEN" in n.upper()], names
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "outputs", "wandb"} <= set(ignored)


def test_one_dockerfile_for_both_bases():
    """The GPU base stays the default; the local base differs only in what it is (python + torch) and
    in EXTRAS (no Liger on a CPU torch). No step names either base."""
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE=pytorch/pytorch:2\.13\.0-cuda", text, flags=re.M)
    assert re.search(r"^ARG EXTRAS=fast,tokenizers$", text, flags=re.M)
    assert [line.split()[1] for line in re.findall(r"^FROM .*", text, flags=re.M)] == ["${BASE}", "${BASE}", "runtime"]
    assert "localhost/" not in text.split("ARG BASE")[1] and "debian" not in text.lower().split("arg base")[1]
    # The image's user owns its working directory and the data volume (a run dir is written there).
    assert re.search(r"install -d -o 1000 -g 1000 /app /data", text)
    base = BASE_CPU.read_text()
    assert base.splitlines().count("FROM scratch") == 1 and "ADD rootfs.tar /" in base
    script = (REPO / "docker" / "image.sh").read_text()
    assert "--build-arg EXTRAS=tokenizers" in script and "-f docker/Dockerfile " in script


def test_the_image_needs_nothing_of_docs():
    """The context leaves docs/ out, without exceptions, and the image copies none of it: the report's
    projection reads its GPUs' measured figures from conf/gpu (no `measured.run` dir to read at run time)."""
    from omegaconf import OmegaConf

    lines = (REPO / ".dockerignore").read_text().splitlines()
    assert "docs" in lines and not [line for line in lines if line.startswith("!")]
    assert "docs/" not in re.sub(r"#.*", "", DOCKERFILE.read_text())
    measured = [OmegaConf.load(p).get("measured") for p in sorted((REPO / "conf" / "gpu").glob("*.yaml"))]
    assert len([m for m in measured if m]) >= 2 and not [m for m in measured if m and m.get("run")]
