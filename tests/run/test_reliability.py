"""A cell survives the machine dying: kill -9, SIGTERM or a submitit preemption, then the same
command resumes from the last checkpoint and trains exactly as an uninterrupted run; a finished
cell is not run again; in a sweep, cells that fail (OOM, divergence, bad data) fail alone."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, Forked, read_result, read_steps, run_in_process

# Dropout on (the tiny default): the RNG states in the checkpoint are part of what must come back.
# 16 steps: the latest stop (after step 12, test_sigterm_in_a_step...) leaves 4 to run after it.
STEPS = 16
COMMON = [f"train.max_steps={STEPS}", "train.untimed_steps=2", "data.max_samples=64", "seq_len=64"]


class Exit(int):
    """A child's exit code, with the end of its stderr (`err`) for a failed assertion's message."""

    def __new__(cls, code: int, err: str):
        self = super().__new__(cls, code)
        self.err = err[-3000:]
        return self


def start_and_stop(run_dir, extra, after_steps, sig) -> Exit:
    """train.py in a subprocess, sent `sig` once steps.jsonl holds `after_steps` lines."""
    proc = Forked([str(REPO / "train.py"), *COMMON, *extra, f"hydra.run.dir={run_dir}"])  # its own process
    steps = run_dir / "steps.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if steps.exists() and len(steps.read_text().splitlines()) >= after_steps:
            os.kill(proc.pid, sig)
            break
        time.sleep(0.01)
    proc.wait(timeout=120)
    return Exit(proc.returncode, proc.output()[1])


def losses(run_dir):
    return [s["loss"] for s in read_steps(run_dir)]


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    """The losses of the uninterrupted run."""
    run_dir = tmp_path_factory.mktemp("reference")
    reference = run_in_process(COMMON, run_dir)
    assert reference.status.value == "ok", reference.error
    return losses(run_dir)


# backend.flat_optimizer: the adapters live in the optimizer's flat tensor; checkpoints save and load them
@pytest.mark.parametrize("flat", [[], pytest.param(["backend.flat_optimizer=true"], marks=pytest.mark.slow)],
                         ids=["", "flat_optimizer"])  # flat_optimizer in make test-slow
def test_kill_then_rerun_resumes_exactly(tmp_path, expected, flat):
    assert len(expected) == STEPS

    # kill -9 with a checkpoint every 3 steps: the re-run resumes from the newest complete one
    killed = tmp_path / "killed"
    code = start_and_stop(killed, ["train.save_steps=3", *flat], 8, signal.SIGKILL)
    assert code == -signal.SIGKILL, code.err
    assert not (killed / "metrics.json").exists()
    run_in_process([*COMMON, "train.save_steps=3", *flat], killed)  # the same cell again (in this process: faster)
    r = read_result(killed)
    assert r["status"] == "ok" and r["resumed_from_step"] >= 6 and r["resumed_from_step"] % 3 == 0
    assert [s["step"] for s in read_steps(killed)] == list(range(1, STEPS + 1))
    assert losses(killed) == expected  # bit for bit, on CPU


def test_a_rerun_after_a_kill_before_any_checkpoint_starts_one_fresh_history(tmp_path, expected):
    """What kill -9 leaves before the first checkpoint: steps.jsonl with some steps, no result, no
    checkpoint. The same command again trains from step 1 and the file holds that run alone."""
    run_dir = tmp_path / "killed_early"
    run_dir.mkdir()
    (run_dir / "steps.jsonl").write_text("".join(json.dumps({"step": n, "loss": 9.0}) + "\n" for n in (1, 2, 3)))
    r = run_in_process(COMMON, run_dir)
    assert r.ok and r.resumed_from_step is None
    assert [s["step"] for s in read_steps(run_dir)] == list(range(1, STEPS + 1)) and losses(run_dir) == expected


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_sigterm_then_rerun_resumes_exactly_and_a_finished_cell_is_not_rerun(tmp_path, expected, capsys):
    # SIGTERM without periodic checkpoints: one is written at the end of the current step
    termed = tmp_path / "termed"
    code = start_and_stop(termed, [], 5, signal.SIGTERM)
    assert code == 4, code.err  # interrupted (README: exit codes)
    r = read_result(termed)
    assert r["status"] == "interrupted" and "resume" in r["error"]
    stopped_at = len(read_steps(termed))
    assert (termed / "checkpoints" / f"checkpoint-{stopped_at}" / "trainer_state.json").exists()
    run_in_process(COMMON, termed)
    r = read_result(termed)
    assert r["status"] == "ok" and r["resumed_from_step"] == stopped_at
    assert losses(termed) == expected
    m = r["metrics"]  # timing: warmup again after the resume, every step of both processes counted once
    assert m["count/timed_steps"] == (stopped_at - 2) + (STEPS - stopped_at - 2)

    # the same command once more: the finished cell is not run again
    before = (termed / "steps.jsonl").read_text()
    capsys.readouterr()
    run_in_process(COMMON, termed)
    assert "from an earlier run" in capsys.readouterr().err and (termed / "steps.jsonl").read_text() == before
    assert json.loads((termed / "metrics.json").read_text())["metrics"] == m


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_sigterm_in_a_step_that_outlives_the_grace_period_stops_it_and_the_rerun_resumes(tmp_path, expected):
    """train.sigterm_grace_s=0: the step under way is stopped at once (a step that takes minutes would
    be stopped this way after the grace period), no checkpoint is written for it, and the re-run resumes
    from the newest periodic one and trains exactly as the uninterrupted run."""
    run_dir = tmp_path / "stopped"
    t0 = time.time()
    code = start_and_stop(run_dir, ["train.save_steps=5", "train.sigterm_grace_s=0"], 12, signal.SIGTERM)
    assert code == 4, code.err  # stopped inside the collator it once came out as a ValueError
    r = read_result(run_dir)
    assert r["status"] == "interrupted" and "had not ended 0 s after the signal" in r["error"], r["error"]
    assert "newest checkpoint: checkpoint-10" in r["error"] and time.time() - t0 < 60
    assert not (run_dir / "checkpoints" / f"checkpoint-{len(read_steps(run_dir))}").exists() or \
        len(read_steps(run_dir)) % 5 == 0
    run_in_process([*COMMON, "train.save_steps=5"], run_dir)
    r = read_result(run_dir)
    assert r["status"] == "ok" and r["resumed_from_step"] == 10 and losses(run_dir) == expected


def signal_when(proc, steps, after_steps, sig):
    """Sends `sig` to proc once the steps file holds `after_steps` lines; proc's exit code."""
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if steps.exists() and len(steps.read_text().splitlines()) >= after_steps:
            os.kill(proc.pid, sig)
            break
        time.sleep(0.01)
    return proc.wait(timeout=180)


# SIGINT (Ctrl-C) in make test-slow: the same path as SIGTERM but for the signal
@pytest.mark.parametrize("sig", [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_cell_2_of_3_stops_the_sweep_after_it(tmp_path, sig):
    """Ctrl-C behaves as SIGTERM: the step under way ends, a checkpoint is written, the cell is
    interrupted, no further cell starts, and the sweep writes its report and its closing line (exit
    code 4: interrupted); no KeyboardInterrupt traceback on the console."""
    sweep = tmp_path / "sweep"
    proc = Forked([str(REPO / "train.py"), "-m", "train.seed=0,1,2", "train.max_steps=10",
                   *COMMON[1:], f"hydra.sweep.dir={sweep}"])
    assert signal_when(proc, sweep / "1" / "steps.jsonl", 3, sig) == 4
    assert read_result(sweep / "0")["status"] == "ok"
    r = read_result(sweep / "1")
    assert r["status"] == "interrupted" and r["error"].startswith(f"{sig.name}: stopped after step")
    assert (sweep / "1" / "checkpoints" / f"checkpoint-{len(read_steps(sweep / '1'))}").is_dir()
    assert not (sweep / "2").exists()  # cell 3 did not start
    out, err = proc.output()
    assert err.strip().splitlines()[-1] == \
        "cells: 3 = 1 ok, 1 interrupted, 1 not started; not measured: 1 (train.seed=1): interrupted"
    assert (sweep / "results.md").exists() and "Traceback" not in out + err and "KeyboardInterrupt" not in out + err


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_a_sweep_past_its_deadline_starts_no_cell_and_the_same_command_without_it_runs_the_rest(tmp_path):
    """sweep.deadline_s: after the first cell, the next, which would end past the deadline (1 ms),
    does not. Report and closing line written, exit code 4, nothing of the cells left behind; the same
    command resumes (sweep.* changes no cell's config): the finished cell is read back, the others run."""
    from conftest import run_cli

    sweep = tmp_path / "sweep"
    args = ["-m", "train.seed=0,1", "train.max_steps=3", "train.untimed_steps=1", "data.max_samples=16",
            "seq_len=32", f"hydra.sweep.dir={sweep}"]
    cut = run_cli("train.py", args + ["sweep.deadline_s=0.001"], check=False)
    assert cut.returncode == 4, cut.stderr[-2000:]
    said = cut.stdout + cut.stderr
    assert "sweep.deadline_s=0.001: " in said and "a cell like the last one takes" in said
    assert cut.stderr.strip().splitlines()[-1] == "cells: 2 = 1 ok, 1 not started"
    assert read_result(sweep / "0")["status"] == "ok" and not (sweep / "1").exists()
    assert (sweep / "results.md").exists()
    rest = run_cli("train.py", args)
    assert rest.stderr.count("result (from an earlier run)") == 1
    assert rest.stderr.strip().splitlines()[-1] == "cells: 2 = 2 ok"


def test_the_deadline_keeps_a_next_cell_from_starting_and_lets_a_sweep_s_last_cell_end_it_as_usual(tmp_path):
    """sweep.deadline_s is checked after each cell: past it, a next cell of the command's list does not start; after
    the list's last cell there is none to keep back, so the sweep ends as a whole one (its exit code, not 4). A
    search picks its next cell as it goes: after any of its cells the deadline holds."""
    from omegaconf import OmegaConf

    from lorabench.core.results import CELLS_FILE, RunContext
    from lorabench.sweep.callbacks import EndSweep

    (tmp_path / CELLS_FILE).write_text(json.dumps({"cells": [["train.seed=0"], ["train.seed=1"]]}))
    cfg = OmegaConf.create({"sweep": {"deadline_s": 0.001}, "backend": {"name": "fast"}})
    first, last = (RunContext(tmp_path / str(i), f"train.seed={i}", i, tmp_path) for i in (0, 1))
    assert EndSweep.out_of_time(cfg, first).startswith("sweep.deadline_s=0.001: ")
    assert EndSweep.out_of_time(cfg, last) is None
    searched = RunContext(tmp_path / "1", "batch=8", 1, tmp_path, search=True)
    assert EndSweep.out_of_time(cfg, searched).startswith("sweep.deadline_s=0.001: ")
    # the cell that spends the search's cap, of the command's last outer cell (the sweeper names it): none follows
    (tmp_path / CELLS_FILE).write_text(json.dumps({"cells": [["batch=4"], ["batch=8"]], "last_job": 1}))
    assert EndSweep.out_of_time(cfg, searched) is None
    assert EndSweep.out_of_time(cfg, RunContext(tmp_path / "0", "batch=4", 0, tmp_path, search=True))


def test_a_cell_that_cannot_fit_in_host_memory_is_refused_before_anything_is_built(tmp_path):
    """The issue's cell: 512 x 4096 tokens of logits over 32768 words is 512 GiB in fp32. It is
    recorded oom (exit code 3) with its need and what the host has, in a second, with no step run."""
    t0 = time.time()
    r = run_in_process(["data=synthetic", "seq_len=4096", "batch=512", "data.max_samples=512"], tmp_path)
    assert r.status.value == "oom" and r.exit_code == 3 and time.time() - t0 < 10
    assert "host memory: this cell needs at least 532.0 GiB" in r.error and "available on this host" in r.error
    assert "lower batch (now 512) or seq_len (now 4096)" in r.error and not (tmp_path / "steps.jsonl").exists()


@pytest.mark.slow  # ~14 s on 2 cores, the longest of make test but one: make test-slow and CI run it
def test_the_watchdog_records_a_cell_that_crosses_its_host_memory_limit(tmp_path):
    """A limit 2.6 GiB above what this process holds: the cell passes the estimate (a lower bound: 2.1
    GiB, its logits and their gradient), grows past the limit while it trains (it would hold about 3.2
    GiB more), and is stopped and recorded oom with both figures, long before the host is short."""
    import psutil

    limit = round(psutil.Process().memory_info().rss / 2**30 + 2.6, 2)  # as the message prints it
    r = run_in_process(["data=synthetic", "seq_len=512", "batch=16", "data.max_samples=64", "train.max_steps=6",
                        f"train.host_memory_limit_gib={limit}"], tmp_path)
    assert r.status.value == "oom", (r.status, r.error)
    assert r.error.startswith("host memory: the cell's processes held") and f"the limit of {limit:.2f} GiB" in r.error


@pytest.mark.slow  # a fresh interpreter running 12 cells: make test-all, CI
def test_failures_are_isolated_in_a_12_cell_sweep(tmp_path):
    """12 cells (tests/conf/case/): nine that work, one out of memory, one whose loss diverges, one
    with unreadable data. The nine finish, the three are recorded with their reasons, and the
    sweep report lists them. The OOM is real: the sweep runs under an 8 GiB address-space limit
    (RLIMIT_AS), so the 6 GiB logits are refused by the allocator at once, without the host's
    OOM killer ever being involved (or, on a host with less than 12.3 GiB available, by the check
    before the cell allocates)."""
    import resource

    bad = tmp_path / "bad.jsonl"
    # valid JSON with no usable conversation: it passes the preflight (the file is there) and fails its cell
    bad.write_text('{"text": "a fine line"}\n{"messages": [{"role": "user", "content": "hello?"}]}\n')
    sweep = tmp_path / "sweep"

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))

    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "-m", f"hydra.searchpath=[file://{REPO / 'tests' / 'conf'}]",
         "+case=" + ",".join(sorted(p.stem for p in (REPO / "tests" / "conf" / "case").glob("*.yaml"))),
         "train.max_steps=3", "train.untimed_steps=1", "data.max_samples=64", f"hydra.sweep.dir={sweep}"],
        cwd=REPO, capture_output=True, text=True, timeout=600, preexec_fn=limit_memory,
        env={**os.environ, "LORABENCH_TEST_BAD_JSONL": str(bad), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-3000:]  # failed cells: the multirun is not a clean measurement
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("cells: 12 = ") and "9 ok" in last and "1 oom" in last and "2 failed" in last, last
    assert "(+case=bad_data): failed" in last and "(+case=diverge): failed" in last
    assert "cell 12 of 12: +case=oom; 11 done, about" in proc.stdout  # progress, with an estimate of the rest
    results = {r["cell"].split(",")[0].removeprefix("+case="): r for r in map(read_result, sweep.glob("[0-9]*"))}
    assert len(results) == 12
    assert sorted(k for k, r in results.items() if r["status"] == "ok") == [f"ok{i}" for i in range(1, 10)]
    # The allocator refuses the logits where the host has the estimate's 12.3 GiB available; a smaller
    # host (a 2-core CI runner has 7 GiB) refuses the cell before it allocates (checks.check_host_memory):
    # the same status, the reason from the check.
    oom = results["oom"]["error"]
    refused = "[enforce fail" if "can't allocate memory" in oom else "this cell needs at least"
    assert results["oom"]["status"] == "oom" and oom.startswith(f"host memory: {refused}"), oom
    assert results["diverge"]["status"] == "failed" and "loss is nan" in results["diverge"]["error"]
    assert results["bad_data"]["status"] == "failed" and f"{bad}:2: conversation has no assistant turn" in \
        results["bad_data"]["error"]
    assert "Traceback" in (sweep / results["bad_data"]["run_dir"].split("/")[-1] / "error.txt").read_text()
    md, page = (sweep / "results.md").read_text(), (sweep / "report.html").read_text()
    assert md.count("| ok |") == 9 and md.count("| oom [") == 1 and md.count("| failed [") == 2
    assert md.count(": oom: host memory") == 1  # the whole reason in the note under the table
    for reason in (f"host memory: {refused}", "FloatingPointError: loss is nan", f"{bad}:2"):
        assert reason in page, reason  # the report's table gives each reason in full


@pytest.mark.slow  # submitit's job started twice, each a fresh interpreter: make test-all, CI
def test_a_preempted_submitit_job_is_requeued_and_resumes(tmp_path, expected):
    """hydra/launcher=local (submitit's local executor, the SLURM launcher's code path; the SLURM
    config itself is composed in test_distributed.py): the job's task is sent
    the preemption signal (USR2); submitit checkpoints the Hydra job, requeues it, and the re-run cell
    resumes from its newest checkpoint and finishes with the uninterrupted run's losses."""
    from pathlib import Path

    sweep = tmp_path / "sweep"
    # its own process, forked from this one (torch imported already); submitit starts the job's task
    proc = Forked([str(REPO / "train.py"), "-m", "hydra/launcher=local", *COMMON, "train.save_steps=3",
                   f"hydra.sweep.dir={sweep}"])
    steps, deadline, signalled = sweep / "0" / "steps.jsonl", time.time() + 180, False
    while time.time() < deadline and proc.poll() is None and not signalled:
        if steps.exists() and len(steps.read_text().splitlines()) >= 8:
            for pid_dir in Path("/proc").glob("[0-9]*"):  # the job's task: python -m submitit.core._submit
                try:
                    cmd = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                if "submitit.core._submit" in cmd and str(sweep) in cmd:
                    os.kill(int(pid_dir.name), signal.SIGUSR2)
                    signalled = True
        time.sleep(0.01)
    assert proc.wait(timeout=300) == 0 and signalled, proc.output()[1][-3000:]
    r = read_result(sweep / "0")
    assert r["status"] == "ok" and r["resumed_from_step"] >= 6 and r["resumed_from_step"] % 3 == 0
    assert losses(sweep / "0") == expected
    assert "| ok |" in (sweep / "results.md").read_text()  # the end-of-sweep report ran too
    assert any((sweep / ".submitit").iterdir())


def test_the_watchdog_counts_the_children_s_memory_and_lists_them_every_relist_s():
    """Its poll reads this process's and its children's resident memory; which processes are its children
    (psutil scans every process of the machine for it) is looked up every relist_s only."""
    import types

    from lorabench.run.guard import GIB, Guard

    class Proc:  # the two psutil.Process calls the watchdog makes, counted
        def __init__(self, gib, children=()):
            self.gib, self.kids, self.polls, self.listed = gib, list(children), 0, 0

        def memory_info(self):
            self.polls += 1
            return types.SimpleNamespace(rss=int(self.gib * GIB))

        def children(self, recursive=False):
            self.listed += 1
            return self.kids

    child = Proc(1.0)
    proc = Proc(2.0, [child])
    guard = Guard(limit_gib=100.0, interval_s=0.001, relist_s=0.01)  # children listed every 10th poll
    guard._proc = proc
    with guard:
        while proc.polls < 40:
            time.sleep(0.005)
    assert guard.peak_gib == pytest.approx(3.0)  # 2 + 1 GiB: the child's memory counted
    assert child.polls == proc.polls  # read at every poll
    assert proc.listed == (proc.polls - 1) // 10 + 1  # polls 0, 10, 20, ...: listed on the first and every 10th
