"""Multi-process cells: torchrun ranks on the CPU (gloo) with the tiny model. The rank results add
up to one cell result, and DDP at batch B per rank trains exactly like one process at batch 2B."""

import json
import os

import pytest
from conftest import EPS32, compose_cfg, read_steps, run_in_process
from omegaconf import OmegaConf

from lorabench.report.page import write_report

# Fixed-length synthetic rows: every rank has the same tokens per step, so the mean of the ranks'
# mean losses is the mean loss of the doubled batch. LoRA dropout off: each rank would draw its own.
COMMON = ["train.device=cpu", "data=synthetic", "data.max_samples=64", "seq_len=64", "lora.dropout=0",
          "train.max_steps=6", "train.untimed_steps=2"]
# Ranks against one process, fp32 (the ranks are processes of their own: the float64 fixture cannot
# reach them). What differs is the order of sums: a step's loss and gradients are means over the
# batch's 4 x 64 = 256 tokens, taken as two halves of 128 and the all-reduce's mean of them; a sum of
# 256 terms in any blocked order rounds at most log2(256) + 1 = 9 times on a term's way to the result,
# and first order each step adds its own: 6 steps x 9 x eps32 = 6.4e-6 of the loss (7e-5 at 11; the
# losses seen differ by one fp32 step, 9.5e-7). Half the batch lost on a rank is off by ~1%.
DDP_LOSS = 6 * 9 * EPS32


@pytest.mark.slow  # torchrun and 2 ranks beside a 1-process cell: ~17 s, the longest of make test (make test-slow, CI)
def test_two_rank_cell_matches_one_process_at_the_doubled_batch(tmp_path):
    """Each step's loss within DDP_LOSS (fp32; what differs is the all-reduce's summation order):
    the ranks see the two halves of the 1-process batch (accelerate shards the same seeded sampler
    by batches), so the losses agree step by step, not just on average."""
    two = run_in_process([*COMMON, "batch=2", "train.nproc=2"], tmp_path / "0")
    one = run_in_process([*COMMON, "batch=4"], tmp_path / "1")
    assert two.status.value == one.status.value == "ok", (two.error, one.error)
    a, b = [s["loss"] for s in read_steps(tmp_path / "0")], [s["loss"] for s in read_steps(tmp_path / "1")]
    assert len(a) == len(b) == 6 and a == pytest.approx(b, rel=DDP_LOSS)
    m = two.metrics
    assert m["dist/world_size"] == 2 and two.dist["devices"] == ["cpu", "cpu"]
    # global counts: both ranks' samples, 2 x 2 per step over 4 timed steps
    assert m["count/samples"] == 16 == one.metrics["count/samples"]
    assert m["count/tokens_nonpad"] == 16 * 64
    assert m["cost/usd_per_hour"] == 2 * one.metrics["cost/usd_per_hour"]  # two processes' hours
    assert (tmp_path / "0" / "steps.rank1.jsonl").exists() and (tmp_path / "0" / "ranks.log").exists()
    # the sweep report's scaling table pairs the 2-process cell with its 1-process twin
    for i in (0, 1):
        (tmp_path / str(i) / ".hydra").mkdir()
    md = write_report(tmp_path).markdown
    assert "Scaling over GPUs" in md and "| 2 |" in md


def test_more_processes_than_gpus_is_refused_before_any_launch(tmp_path):
    import torch

    if torch.cuda.device_count() >= 64:
        pytest.skip("a node with 64 GPUs")
    r = run_in_process(["train.nproc=64", "train.device=auto", "train.max_steps=6", "train.untimed_steps=2"],
                       tmp_path)
    assert r.status.value == "failed" and "train.nproc=64" in r.error and "train.device=cpu" in r.error
    assert not (tmp_path / "ranks.log").exists()


def test_slurm_launcher_composes_with_one_gpu_per_cell():
    from conftest import compose_cfg

    cfg = compose_cfg(["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher") and launcher.partition == "gpu"
    assert launcher.gpus_per_node == 1 and launcher.tasks_per_node == 1 and launcher.max_num_timeout == 3


@pytest.mark.slow  # two node processes, each starting torchrun and its rank: make test-all, CI
def test_two_node_cell_matches_one_process_at_the_doubled_batch(tmp_path):
    """Two "nodes" on this machine (two train.py processes, one CPU rank each, static rendezvous at
    127.0.0.1) in one shared run dir, as a Kubernetes Indexed Job or a 2-node SLURM job would run
    them: node 0 writes the result for both ranks, node 1 only node1.json; same losses as 1 process
    at batch 4 within DDP_LOSS."""
    import socket
    import sys

    from conftest import REPO, Forked, read_result

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, str(REPO / "train.py"), *COMMON, "batch=2", "train.nnodes=2",
           f"hydra.run.dir={tmp_path / 'two'}"]
    procs = [Forked(cmd[1:], env={"LORABENCH_NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1",
                                  "MASTER_PORT": str(port)})  # two processes of their own, as two nodes
             for node in (0, 1)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.output()[1][-3000:]
    one = run_in_process([*COMMON, "batch=4"], tmp_path / "one")
    two = read_result(tmp_path / "two")
    assert two["status"] == "ok", two.get("error")
    assert two["dist"]["nnodes"] == 2 and two["metrics"]["dist/world_size"] == 2
    assert two["metrics"]["count/samples"] == one.metrics["count/samples"]
    a, b = [s["loss"] for s in read_steps(tmp_path / "two")], [s["loss"] for s in read_steps(tmp_path / "one")]
    assert len(a) == len(b) == 6 and a == pytest.approx(b, rel=DDP_LOSS)
    node1 = json.loads((tmp_path / "two" / "node1.json").read_text())
    assert node1["status"] == "ok" and node1["dist"]["node"] == 1 and "perf/tokens_per_s" not in node1["metrics"]


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_one_process_launch_runs_the_worker_without_torchrun(tmp_path, monkeypatch):
    """The launcher's one-process mode (a backend=unsloth cell's own process): `python -m
    lorabench.run.worker <run dir>` as rank 0, no torchrun. The child is run here, in this process
    (what it would execute: worker.worker), and trains as the cell does in process."""
    import subprocess
    from pathlib import Path

    from conftest import compose_cfg
    from omegaconf import OmegaConf

    from lorabench.core.results import CellResult, Status
    from lorabench.run import distributed, worker

    commands, real_popen = [], subprocess.Popen

    def child(cmd, env=None, **kw):
        if "lorabench.run.worker" not in cmd:  # (subprocess is one module: git's calls pass through)
            return real_popen(cmd, env=env, **kw)
        commands.append(cmd)
        monkeypatch.setenv("RANK", env["RANK"])
        worker.worker(Path(cmd[-1]))
        return real_popen(["true"])  # a finished child with exit code 0, for the launcher to wait on

    monkeypatch.setattr(distributed.subprocess, "Popen", child)
    cfg = [*COMMON, "batch=2"]
    (tmp_path / "0").mkdir()
    result = CellResult(Status.running, "cell")
    metrics = distributed.launch(OmegaConf.to_object(compose_cfg(cfg)), tmp_path / "0", result)
    assert len(commands) == 1 and commands[0][1:] == ["-m", "lorabench.run.worker", str(tmp_path / "0")]
    assert metrics["dist/world_size"] == 1 and result.dist["devices"] == ["cpu"]
    one = run_in_process(cfg, tmp_path / "1")
    a, b = [s["loss"] for s in read_steps(tmp_path / "0")], [s["loss"] for s in read_steps(tmp_path / "1")]
    assert len(a) == 6 and a == b  # the same arithmetic in the same process: the same bits
    assert metrics["count/tokens_nonpad"] == one.metrics["count/tokens_nonpad"]


def test_a_rank_s_oom_keeps_its_peak_and_the_device_size_in_the_cell_s_record(tmp_path, monkeypatch):
    """A one-process cell (backend=unsloth's) whose rank ran out of memory: the launcher raises the OOM and the
    cell's record keeps what the rank measured, its peak and the device's size, which a search under gpu=auto
    reads as its budget (search.Measured.device_gib) instead of walking down one OOM at a time."""
    import subprocess

    import pytest
    import torch
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    from lorabench.core.results import CellResult, Status, write_result
    from lorabench.run import distributed

    run_dir = tmp_path / "0"
    run_dir.mkdir()
    rank = {"mem/peak_reserved_gib": 138.8, "mem/device_total_gib": 139.8, "mem/num_alloc_retries": 2}
    real_popen = subprocess.Popen

    def child(cmd, env=None, **kw):  # the rank: an OOM record, exit code 1
        if "lorabench.run.worker" not in cmd:  # (git's calls pass through)
            return real_popen(cmd, env=env, **kw)
        write_result(run_dir / "rank0.json", CellResult(Status.oom, "cell", error="CUDA out of memory", metrics=rank))
        return real_popen(["false"])

    monkeypatch.setattr(distributed.subprocess, "Popen", child)
    result = CellResult(Status.running, "cell")
    with pytest.raises(torch.OutOfMemoryError, match="rank 0 of 1: CUDA out of memory"):
        distributed.launch(OmegaConf.to_object(compose_cfg([*COMMON, "batch=2"])), run_dir, result)
    assert result.metrics == {"mem/peak_reserved_gib": 138.8, "mem/device_total_gib": 139.8}


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_an_unsloth_rank_imports_unsloth_before_what_it_patches(tmp_path):
    """Unsloth patches transformers, peft and trl as they are imported, and warns that it "may run slower" when
    transformers came first. lorabench.run.worker, the process of an Unsloth cell, imports unsloth before any of
    them: a stand-in unsloth package records what was imported when it was (the cell then fails: it is no Unsloth)."""
    import subprocess
    import sys

    from lorabench.core.results import CONFIG_FILE

    fake = tmp_path / "site" / "unsloth"
    fake.mkdir(parents=True)
    mark = tmp_path / "imported_before_unsloth.txt"
    (fake / "__init__.py").write_text(
        "import sys\nopen(%r, 'w').write(','.join(m for m in ('transformers', 'peft', 'trl') if m in sys.modules))\n"
        % str(mark))
    run_dir = tmp_path / "cell"
    run_dir.mkdir()
    c = OmegaConf.to_object(compose_cfg(["backend=unsloth", f"data.cache_dir={tmp_path / 'cache'}"]))
    (run_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.structured(c)))
    env = {**os.environ, "RANK": "0", "PYTHONPATH": os.pathsep.join([str(fake.parent), *sys.path])}
    subprocess.run([sys.executable, "-m", "lorabench.run.worker", str(run_dir)], env=env, capture_output=True, timeout=120)
    assert mark.read_text() == ""  # nothing Unsloth patches was imported before it


def test_the_cell_records_the_config_its_rank_ran():
    """A rank's record holds only what it changed of the config as it ran (Unsloth's packed rows unpacked where
    it has no varlen kernel, a part turned off): the cell's result keeps everything else and takes those."""
    from lorabench.core.results import CellResult, Status
    from lorabench.run.distributed import adopt

    result = CellResult(Status.running, "cell", config={"backend": {"name": "unsloth", "liger": []},
                                                        "data": {"kind": "jsonl", "packing": True}})
    rank0 = CellResult(Status.ok, "rank 0", config={"data": {"packing": False}}, model={"unsloth_packing": False},
                       device="cuda:0", resumed_from_step=4)
    adopt(result, rank0)
    assert result.config == {"backend": {"name": "unsloth", "liger": []}, "data": {"kind": "jsonl", "packing": False}}
    assert result.model == {"unsloth_packing": False} and result.device == "cuda:0" and result.resumed_from_step == 4
