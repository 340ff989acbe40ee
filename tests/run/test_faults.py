"""Faults a hostile user (or a bad day) injects, one test each: signals and kill -9 to every process of a
multi-process cell, a resume on changed data or code, a checkpoint cut short or damaged, output paths that
cannot be written, a full disk, damaged sweep records, backends and checkpoints this machine cannot run,
a Ctrl-C in the middle of tokenisation, duplicate sweep values, a NaN loss. Each asserts what a script or a
person reads: the exit code, the one line, and the files left (nothing half-written, nothing deleted).

The multi-process cases (torchrun ranks on the CPU, gloo) take a minute or more each: marked slow (make
test-slow, CI). The two-GPU case runs with CUDA (pytest -m gpu). The rest build no model, or a tiny one in a
second or two."""

import errno
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from conftest import FAST, REPO, Forked, compose_cfg, read_steps, run_cli, run_in_process

from lorabench.core.results import CELLS_FILE, CellResult, RunContext, Status, write_result
from lorabench.run import cell, checkpoints, rundir
from lorabench.run.checkpoints import SET_ASIDE


def losses(run_dir):
    return [s["loss"] for s in read_steps(run_dir)]


def alive(procs) -> list:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


# ---------------------------------------------------------------------------- multi-process cells
# 8 steps of 2 ranks at batch 2, a checkpoint every 2 steps; the tiny default data with LoRA dropout on (each
# rank's RNG state is in the checkpoint and must come back). FSDP as tests/run/test_fsdp.py runs it.
DDP = ["train.device=cpu", "train.nproc=2", "seq_len=64", "data.max_samples=64", "batch=2", "train.max_steps=8",
       "train.untimed_steps=2", "train.save_steps=2"]
FSDP = ["train.device=cpu", "train.nproc=2", "train.parallel=fsdp", "data=synthetic", "data.max_samples=64",
        "seq_len=64", "lora.dropout=0", "batch=2", "train.max_steps=8", "train.untimed_steps=2",
        "train.save_steps=2"]
MODES = {"ddp": DDP, "fsdp": FSDP}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each mode's losses without an interruption, run once for the cases below (lazily, per mode)."""
    done = {}

    def losses_of(mode):
        if mode not in done:
            run_dir = tmp_path_factory.mktemp(mode)
            r = run_in_process(MODES[mode], run_dir)
            assert r.ok, r.error
            done[mode] = losses(run_dir)
        return done[mode]
    return losses_of


def victim(parent: psutil.Process, target: str) -> psutil.Process:
    """The process of a running multi-process cell to hit: the launcher, torchrun, or rank 1."""
    if target == "launcher":
        return parent
    tree = parent.children(recursive=True)
    if target == "torchrun":
        return next(p for p in tree if "torch.distributed.run" in " ".join(p.cmdline()))
    return next(p for p in tree if "lorabench.run.worker" in p.cmdline() and p.environ().get("RANK") == "1")


def hit_after(run_dir: Path, cmd: list[str], steps: int, target: str, sig: int):
    """train.py `cmd` in a process of its own, `sig` sent to `target` once `steps` steps are recorded; returns
    (exit code, stderr, every process of the cell as it was)."""
    proc = Forked([str(REPO / "train.py"), *cmd, f"hydra.run.dir={run_dir}"])
    parent, tree, deadline = psutil.Process(proc.pid), [], time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        f = run_dir / "steps.jsonl"
        if f.exists() and len(f.read_text().splitlines()) >= steps:
            tree = [parent, *parent.children(recursive=True)]
            victim(parent, target).send_signal(sig)
            break
        time.sleep(0.02)
    code = proc.wait(timeout=300)
    return code, proc.output()[1], tree


CASES = [("ddp", "launcher", signal.SIGTERM, 4), ("ddp", "launcher", signal.SIGINT, 4),
         ("ddp", "rank", signal.SIGTERM, 4), ("ddp", "launcher", signal.SIGKILL, -9),
         ("ddp", "torchrun", signal.SIGKILL, 4), ("ddp", "rank", signal.SIGKILL, 4),
         ("fsdp", "launcher", signal.SIGTERM, 4), ("fsdp", "rank", signal.SIGKILL, 4)]


@pytest.mark.slow  # 2-rank cells, an interrupted one and its resume (and once per mode the uninterrupted one)
@pytest.mark.parametrize("mode,target,sig,code", CASES,
                         ids=[f"{m}-{t}-{signal.Signals(s).name}" for m, t, s, _ in CASES])
def test_a_multi_process_cell_resumes_after_any_process_is_stopped_or_killed(tmp_path, uninterrupted, mode,
                                                                              target, sig, code):
    """SIGTERM or SIGINT (stop after the step, with a checkpoint) or kill -9 of the launcher, torchrun or one
    rank after 4 of 8 steps: the cell ends interrupted (exit 4; -9 for the launcher's own kill -9), no process
    of it lives on (a kill -9 of the launcher leaves no orphan training in its dir), the lock is free, and the
    same command resumes and ends with the uninterrupted run's losses, bit for bit."""
    run_dir = tmp_path / "cell"
    got, err, tree = hit_after(run_dir, MODES[mode], 4, target, sig)
    assert got == code, err[-3000:]
    if code == 4:
        assert "run the same command again to resume" in err, err[-3000:]
    time.sleep(0.5)  # (a SIGKILL from the kernel to the tethered children takes no longer)
    assert tree and not alive(tree), [p.cmdline() for p in alive(tree)]
    r = run_in_process(MODES[mode], run_dir)  # the same command; its lock would refuse a live holder
    # a signal: the checkpoint of the step under way (4 or later); a kill: the newest whole one (2, 4 or 6)
    assert r.ok and r.resumed_from_step >= (4 if code == 4 and sig != signal.SIGKILL else 2), r.error
    assert [s["step"] for s in read_steps(run_dir)] == list(range(1, 9))
    assert losses(run_dir) == uninterrupted(mode)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("target,sig", [("launcher", signal.SIGTERM), ("rank", signal.SIGKILL)])
def test_a_two_gpu_cell_resumes_after_a_signal_with_the_uninterrupted_losses(tmp_path, target, sig):
    """As above on two GPUs (NCCL): the stop request's all-reduce, the checkpoint's barrier and the optimizer's
    load onto each rank's GPU."""
    cmd = [c.replace("train.device=cpu", "train.device=cuda") for c in DDP]
    ref = run_in_process(cmd, tmp_path / "ref")
    assert ref.ok, ref.error
    code, err, tree = hit_after(tmp_path / "cell", cmd, 4, target, sig)
    assert code == 4, err[-3000:]
    time.sleep(0.5)
    assert not alive(tree)
    r = run_in_process(cmd, tmp_path / "cell")
    assert r.ok and r.resumed_from_step >= 2, r.error
    assert losses(tmp_path / "cell") == pytest.approx(losses(tmp_path / "ref"), rel=1e-6)


def test_a_checkpoint_saved_on_indexed_cpu_devices_loads():
    """accelerate names a CPU rank's device cpu:<rank>; the Trainer loads the optimizer state there
    (torch.load knew the location "cpu" only: every multi-process CPU resume failed)."""
    import io

    import lorabench.core.devices  # noqa: F401  (teaches torch.load that location)

    buf = io.BytesIO()
    torch.save({"exp_avg": torch.ones(3)}, buf)
    buf.seek(0)
    assert torch.load(buf, map_location=torch.device("cpu", 1), weights_only=True)["exp_avg"].sum() == 3


def test_a_tethered_child_dies_with_its_parent(tmp_path):
    """What keeps torchrun from outliving a launcher killed with -9: the child gets SIGKILL when its parent ends."""
    script = ("import subprocess, sys, time; from lorabench.run import tether; "
              "p = subprocess.Popen(tether.command(['/bin/sleep', '60'])); print(p.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    child = psutil.Process(int(parent.stdout.readline()))
    deadline = time.time() + 10
    while child.name() != "sleep" and time.time() < deadline:  # the tether execs the command in its own process
        time.sleep(0.01)
    assert child.name() == "sleep"
    parent.kill()
    parent.wait()
    child.wait(timeout=5)  # psutil.TimeoutExpired if it outlived its parent
    assert not child.is_running()


def test_a_child_given_the_lock_holds_it_until_it_ends(tmp_path):
    """torchrun inherits the run dir's lock: a launcher killed with -9 frees the dir only once its children
    are gone too; and a lock whose holders are gone never blocks."""
    script = ("import subprocess, sys, time; from lorabench.run import rundir; rundir.lock(sys.argv[1]); "
              "p = subprocess.Popen(['/bin/sleep', '60'], pass_fds=rundir.held_fds()); print(p.pid, flush=True); "
              "time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    child = psutil.Process(int(parent.stdout.readline()))
    parent.kill()
    parent.wait()
    with pytest.raises(rundir.RunDirError, match="in use by another run"):
        rundir.lock(tmp_path)
    child.kill()
    child.wait(timeout=5)
    rundir.lock(tmp_path)  # (held by this process now: given back for the other tests)
    rundir.unlock(tmp_path)


def test_a_rank_that_dies_without_a_result_is_named_with_its_signal(tmp_path):
    """torchrun's failure summary tells how a rank without rank<r>.json ended: a kill is an interruption
    (exit 4, the same command resumes), a crash a failure; the error is one line."""
    from lorabench.run.distributed import explain, no_result, rank_exits

    log = tmp_path / "ranks.log"
    log.write_text("Root Cause (first observed failure):\n[0]:\n  time      : now\n  host      : h\n"
                   "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 42)\n")
    exits = rank_exits(log)
    assert exits == {1: -9}
    peer = CellResult(Status.failed, "rank 0", error="RuntimeError: [gloo] Connection closed by peer [127.0.0.1]")
    e = explain([(0, peer), (1, no_result(1, exits[1], 1))], 2, tmp_path, log, 1)
    assert type(e).__name__ == "CellInterrupted" and "\n" not in str(e)
    assert str(e) == "rank 1 of 2: ended without a result: killed by SIGKILL; run the same command again to resume"
    own = CellResult(Status.failed, "rank 0", error="ValueError: a rank's own error")
    e = explain([(0, own), (1, no_result(1, -9, 1))], 2, tmp_path, log, 1)
    assert isinstance(e, RuntimeError) and str(e).startswith("rank 0 of 2: ValueError") and "ranks.log" in str(e)


# ---------------------------------------------------------------------------- checkpoints
# Checkpoint folders made by hand: the files the Trainer writes, and lorabench's marker.

def fake_checkpoint(ckpt_dir: Path, step: int, fp: dict, marked: bool = True) -> Path:
    d = ckpt_dir / f"checkpoint-{step}"
    d.mkdir(parents=True)
    from safetensors.torch import save_file

    save_file({"lora_A": torch.zeros(4, 4)}, str(d / "adapter_model.safetensors"))
    torch.save({"state": {}}, d / "optimizer.pt")
    (d / "trainer_state.json").write_text("{}")
    if marked:
        checkpoints.write_marker(d, fp)
    return d


FP = {"data": {"kind": "jsonl", "tokens_sha256": "a" * 64}, "config": {"batch": 2, "seq_len": 64},
      "code": {"lorabench": "0.1.0", "git": "1" * 40}}


def test_a_checkpoint_cut_short_is_set_aside_and_the_one_before_used(tmp_path):
    ckpts = tmp_path / "checkpoints"
    fake_checkpoint(ckpts, 2, FP)
    fake_checkpoint(ckpts, 4, FP, marked=False)  # killed after its files, before its marker
    assert checkpoints.prepare(ckpts, FP, resume=True) == ckpts / "checkpoint-2"
    [moved] = (tmp_path / SET_ASIDE).iterdir()
    assert moved.name.startswith("checkpoint-4-") and (moved / "optimizer.pt").exists()  # renamed, not deleted


def test_a_truncated_file_in_the_newest_checkpoint_is_named_and_set_aside(tmp_path, caplog):
    ckpts = tmp_path / "checkpoints"
    fake_checkpoint(ckpts, 2, FP)
    newest = fake_checkpoint(ckpts, 4, FP)
    f = newest / "adapter_model.safetensors"
    f.write_bytes(f.read_bytes()[:40])  # as a full disk or a copy cut short leaves it
    assert checkpoints.prepare(ckpts, FP, resume=True) == ckpts / "checkpoint-2"
    assert "checkpoint-4 adapter_model.safetensors is 40 bytes" in caplog.text and "set aside" in caplog.text
    assert not newest.exists() and len(list((tmp_path / SET_ASIDE).iterdir())) == 1


@pytest.mark.parametrize("key,change,words", [
    ("data", {"kind": "jsonl", "tokens_sha256": "b" * 64}, ["other data", "jsonl tokens aaaaaaaaaaaa -> jsonl tokens"]),
    ("config", {"batch": 4, "seq_len": 64}, ["other config", "batch: 2 -> 4"]),
    ("code", {"lorabench": "0.2.0", "git": "2" * 40}, ["other code", "lorabench 0.1.0 at 1111111111 -> lorabench 0.2.0"]),
])
def test_a_checkpoint_of_other_data_config_or_code_is_refused_in_one_line(tmp_path, key, change, words):
    ckpts = tmp_path / "checkpoints"
    fake_checkpoint(ckpts, 2, FP)
    with pytest.raises(checkpoints.CheckpointMismatch) as e:
        checkpoints.prepare(ckpts, {**FP, key: change}, resume=True)
    for w in [*words, "checkpoint-2", "train.resume=false"]:
        assert w in str(e.value), (w, str(e.value))
    assert "\n" not in str(e.value) and (ckpts / "checkpoint-2").exists()  # refused, nothing moved


def test_resume_false_sets_every_checkpoint_aside_and_starts_afresh(tmp_path):
    ckpts = tmp_path / "checkpoints"
    fake_checkpoint(ckpts, 2, FP)
    fake_checkpoint(ckpts, 4, {**FP, "data": {"kind": "jsonl", "tokens_sha256": "c" * 64}})
    assert checkpoints.prepare(ckpts, FP, resume=False) is None
    assert not list(ckpts.iterdir()) and len(list((tmp_path / SET_ASIDE).iterdir())) == 2


def test_checkpoints_from_before_markers_still_resume(tmp_path):
    ckpts = tmp_path / "checkpoints"
    fake_checkpoint(ckpts, 2, FP, marked=False)
    cut = fake_checkpoint(ckpts, 4, FP, marked=False)
    (cut / "trainer_state.json").unlink()  # the Trainer's rule then: no trainer_state.json, cut short
    assert checkpoints.prepare(ckpts, FP, resume=True) == ckpts / "checkpoint-2"


def interrupted_jsonl_cell(d: Path) -> list[str]:
    """A tiny cell on a JSONL file, as a kill after its checkpoint at step 2 leaves it (4 steps, a checkpoint
    every 2: the result and the newer checkpoint removed); its overrides."""
    data = d / "data.jsonl"
    data.write_text("".join(json.dumps({"text": f"sample {i} " * 5}) + "\n" for i in range(16)))
    overrides = ["data=jsonl", f"data.path={data}", "seq_len=32", "batch=2", "train.max_steps=4",
                 "train.untimed_steps=1", "train.save_steps=2"]
    r = run_in_process(overrides, d / "run")
    assert r.ok, r.error
    (d / "run" / "metrics.json").unlink()
    shutil.rmtree(d / "run" / "checkpoints" / "checkpoint-4")
    return overrides


@pytest.mark.slow  # three tiny cells of 4 steps (the checkpoints' logic: the unit tests above, in make test)
def test_a_resume_on_rewritten_data_is_refused_and_resume_false_starts_afresh(tmp_path):
    """The JSONL rewritten between the interruption and the same command: refused in one line naming the data
    (a merge would train steps 1-2 on one file and 3-4 on another, recorded as one ok cell); nothing is
    trained or moved. train.resume=false starts afresh, the old checkpoint set aside."""
    d, overrides = tmp_path, interrupted_jsonl_cell(tmp_path)
    (d / "data.jsonl").write_text("".join(json.dumps({"text": f"other {i} " * 9}) + "\n" for i in range(16)))
    r = run_in_process(overrides, d / "run")
    assert r.status is Status.failed and r.exit_code == 2 and r.model is None, r.error
    assert "checkpoint-2 was written by a run of other data" in r.error and "train.resume=false" in r.error
    assert "\n" not in r.error and (d / "run" / "checkpoints" / "checkpoint-2").exists()
    again = run_in_process([*overrides, "train.resume=false"], d / "run")
    assert again.ok and again.resumed_from_step is None, again.error
    assert [s["step"] for s in read_steps(d / "run")] == [1, 2, 3, 4]
    assert any(p.name.startswith("checkpoint-2-") for p in (d / "run" / SET_ASIDE).iterdir())


@pytest.mark.slow  # two tiny cells of 4 steps
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path):
    """The newest checkpoint's adapter file truncated after it was written: named and set aside, the cell
    resumes from the one before (here: none, so it starts afresh) instead of failing at every rerun."""
    d, overrides = tmp_path, interrupted_jsonl_cell(tmp_path)
    f = d / "run" / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    r = run_in_process(overrides, d / "run")
    assert r.ok and r.resumed_from_step is None, r.error
    [moved] = (d / "run" / SET_ASIDE).iterdir()
    assert (moved / "adapter_model.safetensors").stat().st_size == 100  # kept as it was found


# ---------------------------------------------------------------------------- paths and disks

@pytest.fixture
def read_only(tmp_path):
    """A tmpfs with a run dir and a sweep dir in it, then remounted read-only (root only)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=False).returncode:
        pytest.skip("no tmpfs mount here")
    (mnt / "run").mkdir()
    (mnt / "sweep").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def one_line_exit_2(proc, words):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_an_existing_run_dir_on_a_read_only_file_system_is_one_line(read_only):
    proc = run_cli("train.py", [*FAST, f"hydra.run.dir={read_only}/run"], check=False)
    one_line_exit_2(proc, [f"hydra.run.dir={read_only}/run: cannot write there (read-only file system)"])


def test_an_existing_sweep_dir_on_a_read_only_file_system_is_one_line(read_only):
    proc = run_cli("train.py", ["-m", "batch=2,3", *FAST, f"hydra.sweep.dir={read_only}/sweep"], check=False)
    one_line_exit_2(proc, [f"hydra.sweep.dir={read_only}/sweep: cannot write there (read-only file system)"])


@pytest.mark.parametrize("below", ["", "/sub"], ids=["the-dir", "a-parent"])
def test_a_run_dir_that_is_a_file_is_one_line(tmp_path, below):
    f = tmp_path / "a_file"
    f.write_text("x")
    proc = run_cli("train.py", [*FAST, f"hydra.run.dir={f}{below}"], check=False)
    one_line_exit_2(proc, [f"cannot write there ({f} is a file, not a directory)"])
    assert f.read_text() == "x"


def test_a_data_cache_dir_that_cannot_be_written_is_named_before_the_model(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    r = run_in_process([*FAST, f"data.cache_dir={f}"], tmp_path / "run")
    assert r.status is Status.failed and r.model is None, r.error
    assert r.error.endswith(f"data.cache_dir={f}: cannot write there ({f} is a file, not a directory); choose "
                            "another directory"), r.error


def test_a_result_that_cannot_be_written_is_not_claimed_on_the_console(tmp_path, monkeypatch, capfd):
    from lorabench.core import results

    def full(path, obj):
        if Path(path).name == "metrics.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, obj)

    real = results.atomic_write_json
    monkeypatch.setattr(results, "atomic_write_json", full)
    r = cell.run(compose_cfg(["seq_len=64"]), RunContext(run_dir=tmp_path), lambda c, ctx, res, log: {})
    last = capfd.readouterr().err.strip().splitlines()[-1]
    assert r.status is Status.failed and not (tmp_path / "metrics.json").exists()
    assert last == f"no result file: {tmp_path / 'metrics.json'} could not be written"


def test_a_plot_cut_by_a_full_disk_leaves_no_partial_png(tmp_path, monkeypatch):
    import matplotlib.figure

    from lorabench.report import plots

    def cut(fig, path, **kw):
        Path(path).write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)  # a PNG's start, no IEND
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", cut)
    fig, _ = plots._figure(2)
    with pytest.raises(OSError):
        plots._save(fig, tmp_path, "throughput", "a title", [])
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- bench.py and sweep records

def test_the_report_names_corrupt_killed_running_and_never_started_cells(tmp_path):
    """A sweep of 5 cells (cells.json) as kill -9 and a bad disk leave it: cell 0 ok, 1 a truncated
    metrics.json, 2 killed (no result, nobody holds its lock), 3 still running (its lock held), 4 never
    started. Each row carries its cell's name and config from the sweep's record."""
    from lorabench.report.page import write_report

    cells = [[f"batch={b}", "seq_len=128"] for b in (1, 2, 3, 4, 5)]
    (tmp_path / CELLS_FILE).write_text(json.dumps({"cells": cells}))
    for n in range(4):
        (tmp_path / str(n) / ".hydra").mkdir(parents=True)
    config = {"batch": 1, "seq_len": 128, "model": {"name": "tiny"}, "precision": {"name": "fp32"},
              "gpu": {"name": "cpu"}, "data": {"kind": "synthetic"}, "train": {"nproc": 1}}
    write_result(tmp_path / "0" / "metrics.json", CellResult(Status.ok, "batch=1", 0, config=config,
                                                             metrics={"perf/tokens_per_s": 10.0}))
    (tmp_path / "1" / "metrics.json").write_text('{"status": "ok", "metr')  # 22 bytes: a write cut short
    (tmp_path / "2" / ".lock").write_text("123\n")
    rundir.lock(tmp_path / "3")  # a run under way holds its dir's lock
    try:
        out = write_report(tmp_path)
    finally:
        rundir.unlock(tmp_path / "3")
    for line in ["cell 1 (batch=2): corrupt:", "1/metrics.json cannot be read (22 bytes): Unterminated string", "cell 2 (batch=3): killed",
                 f"cell 3 (batch=4): running: no result yet: its lock is held by pid {os.getpid()}",
                 "cell 4 (batch=5): not started"]:
        assert line in out.markdown, (line, out.markdown)
    import csv

    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [(r["job_num"], r["cell"], r["status"], r["seq_len"], r["batch"]) for r in rows] == [
        ("0", "batch=1", "ok", "128", "1"), ("1", "batch=2", "corrupt", "128", "2"),
        ("2", "batch=3", "killed", "128", "3"), ("3", "batch=4", "running", "128", "4"),
        ("4", "batch=5", "not started", "128", "5")]


def test_bench_py_exit_codes_are_train_py_s(tmp_path):
    """README's table: a bad value or dir is 2 for both scripts (a missing sweep_dir exited 1, the code of a
    bad command line)."""
    proc = run_cli("bench.py", [f"sweep_dir={tmp_path / 'no_such_sweep'}"], check=False)
    one_line_exit_2(proc, ["bench.py: sweep dir", "does not exist"])


def test_duplicate_sweep_values_are_refused_in_one_line(tmp_path):
    proc = run_cli("train.py", ["-m", "batch=4,4", *FAST, f"hydra.sweep.dir={tmp_path}"], check=False)
    one_line_exit_2(proc, ["preflight: cells 0 and 1 are the same cell (batch=4", "train.seed"])
    assert not list(tmp_path.glob("[0-9]*"))


# ---------------------------------------------------------------------------- what this machine cannot run

def test_a_vision_language_checkpoint_is_refused_in_one_line(tmp_path):
    """A LLaVA checkpoint passed the preflight and then failed in the loader with 3,019 characters listing every
    config class transformers has."""
    from omegaconf import OmegaConf
    from safetensors.torch import save_file

    from lorabench.run.checks import value_problems

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
        "text_config": {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32768}}))
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    found = value_problems(OmegaConf.to_object(compose_cfg([f"model.path={tmp_path}"])))
    assert len(found) == 1 and "model_type='llava'" in str(found[0]) and "\n" not in str(found[0])
    assert len(str(found[0])) < 300


def test_a_backend_this_machine_cannot_run_is_refused_before_the_data_is_built(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is here: backend=fast runs")
    from lorabench.builders import data

    built = []
    monkeypatch.setattr(data, "build_dataset", lambda *a, **k: built.append(a))
    for overrides in (["backend=fast"], ["backend=fast", "train.nproc=2", "train.device=cpu"]):
        r = run_in_process([*FAST, *overrides], tmp_path / str(len(overrides)))
        assert r.status is Status.failed and "CUDA GPU" in r.error and not built, r.error


def test_a_hub_dataset_with_the_hub_still_offline_names_both_switches(monkeypatch):
    from lorabench.run.checks import check_data_path

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # train.py's default, where the user set only the datasets' switch
    c = compose_cfg(["data=hf", "data.path=org/some-set"])
    from omegaconf import OmegaConf

    with pytest.raises(FileNotFoundError) as e:
        check_data_path(OmegaConf.to_object(c))
    assert str(e.value) == ("data.path='org/some-set': no such directory, and datasets are offline (HF_HUB_OFFLINE=1); "
                            "set HF_HUB_OFFLINE=0 and HF_DATASETS_OFFLINE=0 to download a hub dataset")


# ---------------------------------------------------------------------------- tokenisation and step records

def tokenise(tmp_path, monkeypatch, fail_after=None):
    from omegaconf import OmegaConf

    from lorabench.builders import data, modeling
    from lorabench.run.preemption import Stopped

    c = OmegaConf.to_object(compose_cfg(["seq_len=64", "data.max_samples=64", f"data.cache_dir={tmp_path}"]))
    if fail_after is not None:
        real, seen = data.tokenize_record, []

        def stopped_midway(*a, **k):
            seen.append(1)
            if len(seen) > fail_after:
                raise Stopped("SIGINT before training began: the cell stopped at once")
            return real(*a, **k)

        monkeypatch.setattr(data, "tokenize_record", stopped_midway)
    return data.build_dataset(c, modeling.build_tokenizer(c.model))


def test_a_stop_during_tokenisation_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM) mid-map: datasets removed its temporary file on KeyboardInterrupt alone, so a cell's
    stop left 8-13 MB of it in the cache for good."""
    from lorabench.run.preemption import Stopped

    with pytest.raises(Stopped):
        tokenise(tmp_path, monkeypatch, fail_after=10)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    tokenise(tmp_path, monkeypatch)  # then a whole cache: the tokens and their .json, nothing else
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".arrow", ".json"]


def test_what_a_killed_tokenisation_left_is_removed_at_the_next_start(tmp_path, monkeypatch):
    import socket

    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    stale = tmp_path / f".partial-{host}-{dead.pid}-abc123"  # as a kill -9 mid-map leaves it
    (stale / "tmpx1y2").parent.mkdir()
    (stale / "tmpx1y2").write_bytes(b"\0" * 1000)
    mine = tmp_path / f".partial-{host}-{os.getpid()}-def456"  # a live process's: another run tokenising now
    mine.mkdir()
    legacy, fresh = tmp_path / "tmpab12cd34", tmp_path / "tmpef56gh78"  # datasets' own, as earlier versions left
    legacy.write_bytes(b"\0" * 1000)
    os.utime(legacy, (time.time() - 7200, time.time() - 7200))  # untouched for two hours
    fresh.write_bytes(b"\0" * 1000)  # (a map writing now)
    tokenise(tmp_path, monkeypatch)
    assert not stale.exists() and not legacy.exists() and mine.exists() and fresh.exists()


def test_a_nan_loss_is_strict_json_with_a_status(tmp_path):
    from lorabench.measure.meter import JsonLines
    from lorabench.report.analysis import read_steps

    f = JsonLines(tmp_path / "steps.jsonl")
    f.append({"step": 1, "loss": 2.5, "grad_norm": 1.0})
    f.append({"step": 2, "loss": math.nan, "grad_norm": math.inf})
    f.close()

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    lines = [json.loads(line, parse_constant=refuse) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert lines[1] == {"step": 2, "loss": None, "grad_norm": None, "status": "nonfinite",
                        "nonfinite": {"loss": "nan", "grad_norm": "inf"}}
    back = read_steps(CellResult(Status.failed, "c", run_dir=str(tmp_path)))
    assert math.isnan(back[1]["loss"]) and back[1]["grad_norm"] == math.inf and back[0]["loss"] == 2.5
