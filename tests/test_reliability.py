"""A cell survives the machine dying: kill -9 or SIGTERM, then the same command resumes from the
last checkpoint and trains exactly as an uninterrupted run; a finished cell is not run again."""

import json
import os
import signal
import subprocess
import sys
import time

from conftest import REPO, read_result, read_steps, run_cli, run_in_process

# Dropout on (the tiny default): the RNG states in the checkpoint are part of what must come back.
COMMON = ["train.max_steps=30", "train.timing_warmup_steps=2", "data.max_samples=64", "seq_len=64"]


def start_and_stop(run_dir, extra, after_steps, sig):
    """train.py in a subprocess, sent `sig` once steps.jsonl holds `after_steps` lines."""
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *COMMON, *extra, f"hydra.run.dir={run_dir}"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    steps = run_dir / "steps.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if steps.exists() and len(steps.read_text().splitlines()) >= after_steps:
            os.kill(proc.pid, sig)
            break
        time.sleep(0.01)
    proc.wait(timeout=120)
    return proc.returncode


def losses(run_dir):
    return [s["loss"] for s in read_steps(run_dir)]


def test_kill_and_sigterm_then_rerun_resume_exactly(tmp_path):
    reference = run_in_process(COMMON, tmp_path / "ref")
    assert reference["status"] == "ok", reference.get("error")
    expected = losses(tmp_path / "ref")
    assert len(expected) == 30

    # kill -9 with a checkpoint every 3 steps: the re-run resumes from the newest complete one
    killed = tmp_path / "killed"
    assert start_and_stop(killed, ["train.save_steps=3"], 8, signal.SIGKILL) == -signal.SIGKILL
    assert not (killed / "metrics.json").exists()
    run_cli("train.py", [*COMMON, "train.save_steps=3", f"hydra.run.dir={killed}"])
    r = read_result(killed)
    assert r["status"] == "ok" and r["resumed_from_step"] >= 6 and r["resumed_from_step"] % 3 == 0
    assert [s["step"] for s in read_steps(killed)] == list(range(1, 31))
    assert losses(killed) == expected  # bit for bit, on CPU

    # SIGTERM without periodic checkpoints: one is written at the end of the current step
    termed = tmp_path / "termed"
    assert start_and_stop(termed, [], 5, signal.SIGTERM) == 0
    r = read_result(termed)
    assert r["status"] == "interrupted" and "resume" in r["error"]
    stopped_at = len(read_steps(termed))
    assert (termed / "checkpoints" / f"checkpoint-{stopped_at}" / "trainer_state.json").exists()
    run_cli("train.py", [*COMMON, f"hydra.run.dir={termed}"])
    r = read_result(termed)
    assert r["status"] == "ok" and r["resumed_from_step"] == stopped_at
    assert losses(termed) == expected
    m = r["metrics"]  # timing: warmup again after the resume, every step of both processes counted once
    assert m["count/timed_steps"] == (stopped_at - 2) + (30 - stopped_at - 2)

    # the same command once more: the finished cell is not run again
    before = (termed / "steps.jsonl").read_text()
    proc = run_cli("train.py", [*COMMON, f"hydra.run.dir={termed}"])
    assert "from an earlier run" in proc.stderr and (termed / "steps.jsonl").read_text() == before
    assert json.loads((termed / "metrics.json").read_text())["metrics"] == m
