"""lorabench's SLURM path on a real one-node cluster (launchers/slurm-local.sh up): a 4-cell sweep as
SLURM jobs that sacct lists, a cell requeued while it trains (the multirun waits, the job comes back,
resumes from its checkpoint and ends with the uninterrupted run's losses), a cell that fails."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, read_result, read_steps, run_in_process

UP = shutil.which("scontrol") is not None and subprocess.run(["scontrol", "ping"], capture_output=True).returncode == 0
# slow: multi-process sweeps through a real cluster (20-35 s each); make test-slow and CI run them.
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not UP, reason="no SLURM cluster: start one with `sudo launchers/slurm-local.sh up` "
                                                "(.ci/run does)")]
# The local partition: one CPU and 3 GB per job, so the cluster's two CPUs run two cells at a time.
SLURM = ["hydra/launcher=slurm", "hydra.launcher.partition=cpu", "hydra.launcher.gpus_per_node=0",
         "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=3"]


def multirun(args, sweep, **kw):
    return subprocess.Popen([sys.executable, str(REPO / "train.py"), "-m", *SLURM, *args, f"hydra.sweep.dir={sweep}"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def sacct(sweep) -> dict[str, str]:
    """State of each SLURM job of this sweep (submitit's job dirs are named by job id)."""
    ids = {p.name.split("_")[0] for p in (sweep / ".submitit").iterdir() if p.name[0].isdigit()}
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(ids)], capture_output=True,
                         text=True).stdout
    return dict(line.split("|") for line in out.split())


def first_error(run_dir: Path) -> str:
    try:
        return json.loads((run_dir / "metrics.json").read_text()).get("error") or ""
    except (OSError, ValueError):
        return ""


def test_a_sweep_runs_as_slurm_jobs_and_reports_like_a_local_one(tmp_path):
    sweep = tmp_path / "sweep"
    proc = multirun(["seq_len=64,96", "batch=2,4", "train.max_steps=8"], sweep)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert err.strip().splitlines()[-1] == "cells: 4 = 4 ok"
    results = [read_result(sweep / str(n)) for n in range(4)]
    assert {(r["config"]["seq_len"], r["config"]["batch"]) for r in results} == {(64, 2), (64, 4), (96, 2), (96, 4)}
    assert all(r["status"] == "ok" and os.environ.get("SLURM_JOB_ID") is None for r in results)
    states = sacct(sweep)
    assert len(states) == 4 and set(states.values()) == {"COMPLETED"}, states  # one SLURM job per cell
    assert (sweep / "report.html").exists() and (sweep / "results.md").read_text().count("| ok |") == 4


def test_a_requeued_cell_resumes_and_the_multirun_reports_its_final_run(tmp_path):
    """`scontrol requeue` while the cell trains: the cell saves a checkpoint at the end of its step and
    its process ends without a result, so the multirun waits; SLURM starts the job again (its start
    is held by SLURM's BeginTime for requeued jobs: released here with scontrol update), it resumes
    in the same run dir and ends ok with the uninterrupted run's losses, and the report holds that row."""
    common = ["seq_len=64", "data.max_samples=64", "train.max_steps=60", "train.untimed_steps=2",
              "train.save_steps=10"]
    reference = run_in_process(common, tmp_path / "reference")
    assert reference.ok
    sweep = tmp_path / "sweep"
    proc = multirun(common, sweep)
    steps, deadline = sweep / "0" / "steps.jsonl", time.time() + 120
    while not (steps.exists() and len(steps.read_text().splitlines()) >= 15):
        assert time.time() < deadline and proc.poll() is None, "the cell did not start training"
        time.sleep(0.05)
    job = next(p.name for p in (sweep / ".submitit").iterdir() if p.name[0].isdigit())
    job = subprocess.run(["squeue", "-h", "-o", "%i", "-n", "train"], capture_output=True, text=True).stdout.split()[0] \
        if "_" in job else job
    subprocess.run(["scontrol", "requeue", job], check=True)
    # the first run's record: interrupted, requeued; the multirun is still waiting
    deadline = time.time() + 60
    while "requeued" not in first_error(sweep / "0"):
        assert time.time() < deadline, "no record of the requeue"
        time.sleep(0.2)
    assert proc.poll() is None
    # SLURM holds a requeued job back (BeginTime, about two minutes) once its first run has ended
    while subprocess.run(["squeue", "-h", "-j", job, "-o", "%T,%r"], capture_output=True,
                         text=True).stdout.strip() != "PENDING,BeginTime":
        assert time.time() < deadline + 60, "the requeued job did not come back to the queue"
        time.sleep(0.2)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    r = read_result(sweep / "0")
    assert r["status"] == "ok" and r["resumed_from_step"] >= 15  # the checkpoint written at SIGTERM
    assert [s["loss"] for s in read_steps(sweep / "0")] == [s["loss"] for s in read_steps(tmp_path / "reference")]
    assert err.strip().splitlines()[-1] == "cells: 1 = 1 ok" and "| ok |" in (sweep / "results.md").read_text()


def test_a_cell_that_fails_under_slurm_is_recorded_with_its_reason(tmp_path):
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    # valid JSON with no usable conversation: it passes the preflight (the file is there) and fails its cell
    bad.write_text('{"text": "a fine line"}\n{"messages": [{"role": "user", "content": "hello?"}]}\n')
    good.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                                                     {"role": "assistant", "content": str(2 * i)}]}) + "\n"
                            for i in range(32)))
    sweep = tmp_path / "sweep"
    proc = multirun(["data=jsonl", f"data.path={bad},{good}", "train.max_steps=4", "data.max_samples=null"], sweep)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last == f"cells: 2 = 1 failed, 1 ok; not measured: 0 (data.path={bad}): failed", last
    failed = read_result(sweep / "0")
    assert failed["status"] == "failed" and "no assistant turn" in failed["error"] and str(bad) in failed["error"]
    assert read_result(sweep / "1")["status"] == "ok"
    assert (sweep / "0" / "error.txt").exists()
