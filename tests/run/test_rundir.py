"""A result file always describes the run that made it (lorabench.run.rundir): a run dir bound to its
config, one run per dir at a time, a full disk named in one line with nothing half-written, and the
values checkable before building checked then. Most cases run cell.run with a stand-in `measure`
(no model: milliseconds); a few run train.py or bench.py as a user would.

Each case asserts the exit code, the one line, and that nothing half-written is left."""

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import FAST, REPO, Forked, compose_cfg, run_cli, run_in_process
from omegaconf import OmegaConf

from lorabench.core.results import CellInterrupted, RunContext, Status, load_results, read_result
from lorabench.measure.meter import JsonLines
from lorabench.run import cell, rundir

TINY = ["seq_len=64", "data.max_samples=64"]


def fake_measure(calls: list, raises: BaseException | None = None):
    """A cell's `measure` that builds nothing: records the call, writes one step record, then
    returns a metric or raises `raises`."""
    def measure(c, ctx, result, logger):
        calls.append(c)
        (ctx.run_dir / "steps.jsonl").write_text(json.dumps({"step": 1, "samples": c.batch}) + "\n")
        if raises is not None:
            raise raises
        return {"perf/tokens_per_s": 1.0}
    return measure


def run_fake(run_dir, overrides=(), raises=None):
    calls = []
    r = cell.run(compose_cfg([*TINY, *overrides]), RunContext(run_dir=Path(run_dir)), fake_measure(calls, raises))
    return r, calls


def no_half_files(d: Path):
    """No temporary file of an atomic write left, every JSON file whole, every JSONL line whole."""
    assert not list(Path(d).rglob(".*.tmp")), list(Path(d).rglob(".*.tmp"))
    for f in Path(d).rglob("*.json"):
        json.loads(f.read_text())
    for f in Path(d).rglob("*.jsonl"):
        text = f.read_text()
        assert text == "" or text.endswith("\n"), f
        [json.loads(line) for line in text.splitlines()]


# ---------------------------------------------------------------------------- binding

def test_the_same_config_again_reports_the_finished_result_without_running(tmp_path, capfd):
    first, calls = run_fake(tmp_path)
    again, calls2 = run_fake(tmp_path)
    assert first.ok and again.ok and calls2 == [] and "from an earlier run" in capfd.readouterr().err
    assert json.loads((tmp_path / "fingerprint.json").read_text())["config"]["seq_len"] == 64
    no_half_files(tmp_path)


@pytest.mark.parametrize("change,words", [
    (["seq_len=96"], ["seq_len: 64 -> 96"]),
    (["batch=8"], ["batch: 4 -> 8"]),
    (["lora.r=4"], ["lora.r: 16 -> 4"]),
    (["lora.r=4", "batch=8", "seq_len=96", "optimizer.lr=1e-3"], ["batch: 4 -> 8", "(and 1 more)"]),
], ids=["seq_len", "batch", "lora.r", "four-keys"])
def test_another_config_in_a_finished_dir_stops_before_anything_runs(tmp_path, capfd, change, words):
    run_fake(tmp_path)
    before = (tmp_path / "metrics.json").read_text()
    r, calls = run_fake(tmp_path, change)
    err = capfd.readouterr().err
    assert r.status is Status.failed and r.exit_code == 2 and calls == []
    for w in [f"hydra.run.dir={tmp_path} holds a run of another config", "sweep.overwrite=true", *words]:
        assert w in r.error and w in err, (w, r.error)
    assert (tmp_path / "metrics.json").read_text() == before and "Traceback" not in err  # the old result stands
    no_half_files(tmp_path)


def test_keys_that_do_not_change_the_measurement_keep_the_binding(tmp_path):
    """logger, report, sweep, train.force/resume, the SIGTERM grace and the data cache: the dir's
    result stands (train.force=true runs the cell again in the same dir)."""
    run_fake(tmp_path)
    r, calls = run_fake(tmp_path, ["report.dataset_samples=5", "sweep.keep_going=true", "train.sigterm_grace_s=3",
                                   "train.resume=false", "data.cache_dir=/tmp/elsewhere"])
    assert r.ok and calls == []
    r, calls = run_fake(tmp_path, ["train.force=true"])
    assert r.ok and len(calls) == 1
    assert set(rundir.IGNORED) >= {"logger", "train.force", "train.resume"}
    assert not any(k.startswith(("logger.", "report.", "sweep.")) for k in rundir.fingerprint(r.config))


def test_overwrite_moves_the_old_run_aside_and_never_deletes_it(tmp_path):
    run_fake(tmp_path)
    old = (tmp_path / "metrics.json").read_text()
    r, calls = run_fake(tmp_path, ["seq_len=96", "sweep.overwrite=true"])
    assert r.ok and len(calls) == 1 and read_result(tmp_path / "metrics.json").config["seq_len"] == 96
    [aside] = tmp_path.glob("replaced-*")
    assert (aside / "metrics.json").read_text() == old and (aside / "steps.jsonl").exists()
    assert json.loads((tmp_path / "fingerprint.json").read_text())["config"]["seq_len"] == 96
    no_half_files(tmp_path)


def test_an_interrupted_run_is_not_resumed_under_another_config(tmp_path):
    """The issue's case: a batch=2 run stopped at step 15 and a batch=8 re-run would mix 2- and
    8-sample steps in one steps.jsonl and one timed window."""
    r, _ = run_fake(tmp_path, ["batch=2"], raises=CellInterrupted("SIGTERM: stopped after step 1"))
    assert r.status is Status.interrupted
    r, calls = run_fake(tmp_path, ["batch=8"])
    assert r.exit_code == 2 and calls == [] and "batch: 2 -> 8" in r.error
    assert [json.loads(x)["samples"] for x in (tmp_path / "steps.jsonl").read_text().splitlines()] == [2]


def test_a_dir_from_before_fingerprints_is_bound_to_its_metrics_json(tmp_path):
    run_fake(tmp_path)
    (tmp_path / "fingerprint.json").unlink()
    r, calls = run_fake(tmp_path, ["seq_len=96"])
    assert r.exit_code == 2 and calls == [] and "seq_len: 64 -> 96" in r.error


def test_a_run_that_failed_before_its_first_step_is_moved_aside_by_itself(tmp_path):
    """seq_len=-5 fails at its checks and measures nothing: the corrected command runs in the same dir."""
    bad = run_in_process(["seq_len=-5"], tmp_path)
    assert bad.status is Status.failed
    r, calls = run_fake(tmp_path, ["seq_len=96"])
    assert r.ok and len(calls) == 1
    [aside] = tmp_path.glob("replaced-*")
    assert read_result(aside / "metrics.json").error == bad.error


def test_a_single_run_of_another_config_stops_before_hydra_writes_its_files(tmp_path):
    """train.py with another seq_len into a finished dir: exit 2, one line, and .hydra/ still says
    what made the result (Hydra writes it after the preflight)."""
    run_fake(tmp_path)
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- seq_len=64\n")
    proc = run_cli("train.py", [*TINY, "seq_len=96", f"hydra.run.dir={tmp_path}"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"hydra.run.dir={tmp_path} holds a run of another config (seq_len: 64 -> 96)" in proc.stderr
    assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == "- seq_len=64\n"


def test_differences_name_the_first_keys_and_count_the_rest():
    old, new = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}, {"a": 1, "b": 9, "c": 8, "d": 7, "e": 6, "f": 0}
    assert rundir.differences(old, new) == "b: 2 -> 9, c: 3 -> 8, d: 4 -> 7 (and 2 more)"


# ---------------------------------------------------------------------------- the lock

HOLDER = textwrap.dedent("""
    import sys, time
    from lorabench.run import rundir
    rundir.lock(sys.argv[1])
    print("held", flush=True)
    time.sleep(60)
""")


def hold_lock(d: Path) -> subprocess.Popen:
    """Another process holding the dir's lock (as a running cell would)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(d)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_run_into_a_dir_in_use_stops_at_once_and_touches_nothing(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    holder = hold_lock(tmp_path)
    try:
        r, calls = run_fake(tmp_path)
        assert r.status is Status.failed and r.exit_code == 2 and calls == []
        assert f"{tmp_path} is in use by another run (pid {holder.pid}" in r.error
        assert not (tmp_path / "metrics.json").exists() and not (tmp_path / "steps.jsonl").exists()
        proc = run_cli("train.py", [*TINY, f"hydra.run.dir={tmp_path}"], check=False)  # as a user would
        assert proc.returncode == 2 and f"is in use by another run (pid {holder.pid}" in proc.stderr
        assert "Traceback" not in proc.stderr and not (tmp_path / ".hydra").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_run_never_blocks(tmp_path):
    holder = hold_lock(tmp_path)
    holder.send_signal(signal.SIGKILL)  # the kernel drops its flock; the lock file stays
    holder.wait()
    assert (tmp_path / ".lock").exists()
    r, calls = run_fake(tmp_path)
    assert r.ok and len(calls) == 1


def test_the_lock_is_held_for_the_cell_and_given_back_after_it(tmp_path):
    seen = []

    def measure(c, ctx, result, logger):  # another process tries the dir while the cell runs
        code = "import sys; from lorabench.run import rundir; rundir.lock(sys.argv[1])"
        out = subprocess.run([sys.executable, "-c", code, str(ctx.run_dir)], capture_output=True, text=True)
        seen.append(out)
        return {}

    r = cell.run(compose_cfg(TINY), RunContext(run_dir=tmp_path), measure)
    assert r.ok and seen[0].returncode != 0 and "is in use by another run" in seen[0].stderr
    holder = hold_lock(tmp_path)  # after the cell: free again
    holder.kill()
    holder.wait()


# ---------------------------------------------------------------------------- a full disk

def test_steps_jsonl_lines_are_whole_under_a_file_size_limit(tmp_path):
    """RLIMIT_FSIZE with SIGXFSZ ignored (in a forked child): a write past the limit is cut short,
    then fails with EFBIG, as on a full disk. The file keeps whole lines only."""
    path, report = tmp_path / "steps.jsonl", tmp_path / "report"
    pid = os.fork()
    if pid == 0:  # the child: only os-level work, then _exit
        code = 1
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))  # soft: raised again below
            f = JsonLines(path)
            for n in range(100):
                try:
                    f.append({"step": n, "pad": "x" * 37})
                except OSError as e:
                    os.close(f.fd)
                    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
                    report.write_text(f"{n} {errno.errorcode[e.errno]} {e.filename}")
                    code = 0
                    break
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    n, code, name = report.read_text().split()
    text = path.read_text()
    line = len(json.dumps({"step": 10, "pad": "x" * 37})) + 1  # 50 bytes a line from step 10 on
    assert code == "EFBIG" and name == str(path) and text.endswith("\n")
    assert [json.loads(x)["step"] for x in text.splitlines()] == list(range(int(n)))
    assert len(text) <= 1000 < len(text) + line


def test_a_short_write_is_cut_back_to_the_last_whole_line(tmp_path, monkeypatch):
    f = JsonLines(tmp_path / "steps.jsonl")
    f.append({"step": 1})
    real = os.write
    writes = []

    def short(fd, data):  # the disk takes 5 bytes, then is full
        writes.append(data)
        if len(writes) == 1:
            return real(fd, data[:5])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", short)
    with pytest.raises(OSError) as e:
        f.append({"step": 2})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "steps.jsonl")
    assert (tmp_path / "steps.jsonl").read_text() == '{"step": 1}\n'


def test_a_disk_full_cell_ends_failed_in_one_line_naming_the_file_and_the_free_space(tmp_path, capfd):
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "steps.jsonl"))
    r, _ = run_fake(tmp_path, raises=full)
    err = capfd.readouterr().err
    assert r.status is Status.failed and r.exit_code == 2
    assert r.error.startswith(f"cannot write {tmp_path / 'steps.jsonl'}: No space left on device; ")
    assert "MiB free there" in r.error and "\n" not in r.error and "Traceback" not in err
    assert "OSError" in (tmp_path / "error.txt").read_text()
    assert read_result(tmp_path / "metrics.json").error == r.error
    no_half_files(tmp_path)


def test_an_error_txt_that_cannot_be_written_is_named_not_half_written(tmp_path, monkeypatch, capfd, caplog):
    real = Path.write_text

    def full(self, *a, **k):
        if self.name == "error.txt":
            real(self, "half")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    r, _ = run_fake(tmp_path, raises=RuntimeError("boom"))
    err = capfd.readouterr().err
    assert r.error == "RuntimeError: boom" and not (tmp_path / "error.txt").exists()
    assert f"no traceback kept: cannot write {tmp_path / 'error.txt'}: No space left" in caplog.text
    assert "Traceback" not in err
    assert read_result(tmp_path / "metrics.json").status is Status.failed


def test_a_result_that_cannot_be_written_fails_the_cell_and_leaves_no_half_file(tmp_path, monkeypatch, capfd):
    import lorabench.core.results as results

    real = os.fsync

    def full(fd):  # the result's bytes do not reach the disk (the dir's fingerprint did, at the start)
        if (tmp_path / "fingerprint.json").exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(results.os, "fsync", full)
    r, _ = run_fake(tmp_path)
    monkeypatch.setattr(results.os, "fsync", real)
    err = capfd.readouterr().err
    assert r.status is Status.failed and r.exit_code == 2 and "Traceback" not in err
    assert r.error.startswith(f"cannot write {tmp_path / 'metrics.json'}: No space left on device")
    assert "(the cell: ok)" in r.error
    assert not (tmp_path / "metrics.json").exists()
    no_half_files(tmp_path)


def limit_file_size(max_bytes: int = 8192) -> None:
    """In a child process: writes past max_bytes fail with EFBIG (SIGXFSZ ignored), as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, resource.RLIM_INFINITY))


class FileSizeLimited(Forked):
    def _child(self, cwd, env):
        limit_file_size()
        super()._child(cwd, env)


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_train_py_under_a_file_size_limit_fails_in_one_line_with_whole_files(tmp_path):
    """The whole path as a user meets it: steps.jsonl outgrows the limit mid-run (8 KiB: 35 steps
    of ~230 bytes; metrics.json, ~6 KB, still fits). Exit 2, one line, no traceback on the console,
    the traceback in error.txt, steps.jsonl whole lines."""
    import torch

    run = tmp_path / "run"
    argv = [str(REPO / "train.py"), "train.max_steps=60", "train.untimed_steps=2", "data.max_samples=16",
            "seq_len=32", "batch=2", f"hydra.run.dir={run}"]
    if torch.get_num_threads() > 1:  # a fork would hang (conftest.Forked): a new interpreter
        proc = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                              preexec_fn=limit_file_size, timeout=300)
        code, err = proc.returncode, proc.stderr
    else:
        child = FileSizeLimited(argv, REPO, {"PYTHONUNBUFFERED": "1"})
        code, err = child.wait(300), child.output()[1]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    r = read_result(run / "metrics.json")
    assert r.error.startswith(f"cannot write {run / 'steps.jsonl'}: File too large (the process's file-size limit")
    assert r.error in err and r.metrics["count/steps_done"] >= 20 and "Traceback" in (run / "error.txt").read_text()
    no_half_files(run)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a tmpfs needs root")
def test_a_run_dir_on_a_full_disk_is_named_before_hydra_writes(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)]).returncode:
        pytest.skip("no tmpfs mount here")
    try:
        filler = mnt / "filler"
        with open(filler, "wb") as f:  # fill it: the write stops with ENOSPC
            try:
                f.write(b"x" * 2**20)
            except OSError:
                pass
        proc = run_cli("train.py", [*TINY, f"hydra.run.dir={mnt}/run"], check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert f"hydra.run.dir={mnt}/run: cannot write there (No space left on device; 0.0 MiB free there)" \
            in proc.stderr
        assert sorted(p.name for p in (mnt / "run").iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)])


# ---------------------------------------------------------------------------- sweeps

def plant_cell(sweep_dir: Path, num: int, overrides: list[str]):
    """A finished cell of an earlier sweep: its dir, .hydra and fingerprint."""
    d = sweep_dir / str(num)
    (d / ".hydra").mkdir(parents=True)
    config = OmegaConf.to_container(compose_cfg([*FAST, *overrides]), resolve=True, enum_to_str=True)
    (d / "fingerprint.json").write_text(json.dumps({"config": rundir.fingerprint(config)}))
    return d


def test_a_sweep_into_the_dir_of_another_sweep_stops_in_preflight(tmp_path):
    plant_cell(tmp_path, 0, ["lora.r=8"])
    plant_cell(tmp_path, 1, ["lora.r=4"])
    proc = run_cli("train.py", ["-m", "batch=8,16", *FAST, f"hydra.sweep.dir={tmp_path}"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = next(x for x in proc.stderr.splitlines() if x.startswith("invalid cell 0 (batch=8,"))
    assert line.endswith(f": {tmp_path / '0'} holds a run of another config (batch: 4 -> 8, lora.r: 8 -> 16)")
    assert "sweep.overwrite=true moves the earlier runs aside" in proc.stderr
    assert not (tmp_path / "multirun.yaml").exists()


def test_cells_of_an_earlier_larger_sweep_stop_the_sweep(tmp_path):
    plant_cell(tmp_path, 2, ["batch=3"])
    proc = run_cli("train.py", ["-m", "batch=2,3", *FAST, f"hydra.sweep.dir={tmp_path}"], check=False)
    assert proc.returncode == 2
    assert f"{tmp_path / '2'} holds a cell of an earlier sweep that is not a cell of this one" in proc.stderr


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_sweep_overwrite_moves_the_earlier_sweep_aside_and_runs(tmp_path):
    plant_cell(tmp_path, 0, ["lora.r=8"])
    sweep = ["-m", "batch=2,3", "train.max_steps=2", "train.untimed_steps=0", "data.max_samples=8", "seq_len=32",
             f"hydra.sweep.dir={tmp_path}"]
    proc = run_cli("train.py", [*sweep, "sweep.overwrite=true"], check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "moved aside to" in proc.stderr and len(load_results(tmp_path)[0]) == 2
    [aside] = tmp_path.glob("replaced-*")
    assert (aside / "0" / "fingerprint.json").exists()
    assert sorted(p.name for p in (tmp_path / "by_name").iterdir()) == ["batch=2", "batch=3"]
    # the same sweep again (sweep.* keys do not bind): both cells reported as finished, nothing moved
    again = run_cli("train.py", sweep, check=False)
    assert again.returncode == 0 and again.stderr.count("from an earlier run") == 2, again.stderr[-2000:]
    assert len(list(tmp_path.glob("replaced-*"))) == 1


def test_by_name_links_with_a_relative_sweep_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hc = SimpleNamespace(overrides=SimpleNamespace(task=["batch=2"]), runtime=SimpleNamespace(
        choices={}, output_dir=str(tmp_path / "sweeps" / "0")), mode=__import__("hydra.types").types.RunMode.MULTIRUN,
        sweep=SimpleNamespace(dir="sweeps"), job=SimpleNamespace(override_dirname="batch=2", num=0),
        sweeper={"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"})
    ctx = RunContext.from_hydra(hc)
    assert ctx.sweep_dir == tmp_path / "sweeps"
    (tmp_path / "sweeps" / "0").mkdir(parents=True)
    cell.name_link(ctx)
    assert os.readlink(tmp_path / "sweeps" / "by_name" / "batch=2") == "../0"


def test_a_multirun_with_an_unknown_key_exits_1_as_the_readme_says(tmp_path):
    proc = run_cli("train.py", ["-m", "batch=2,3", "train.max_stp=5", f"hydra.sweep.dir={tmp_path}"], check=False)
    assert proc.returncode == 1 and "max_stp" in proc.stderr and "Traceback" not in proc.stderr
    readme = (REPO / "README.md").read_text()
    assert "| 1 | Hydra's own error: an unknown option, key or type on the command line | the same" in readme


def test_the_preflight_lists_every_problem_of_every_cell(tmp_path):
    proc = run_cli("train.py", ["-m", "batch=2,3", "lora.r=0", "optimizer.lr=nan", "train.seed=-1", *FAST,
                                f"hydra.sweep.dir={tmp_path}"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    for num, batch in ((0, 2), (1, 3)):
        for w in ("lora.r must be > 0, got 0", "optimizer.lr must be > 0, got nan"):
            assert any(x.startswith(f"invalid cell {num} (batch={batch},") and x.endswith(w) for x in lines), w
    assert "preflight: 4 problem(s) in 2 cells, none run" in proc.stderr


def test_cross_group_problems_are_all_listed_too(tmp_path):
    from lorabench.run.checks import value_problems

    found = value_problems(OmegaConf.to_object(compose_cfg(["train.seed=-1", "data.seed=-2", "model.path=",
                                                            "data.max_samples=3", "batch=8"])))
    text = " | ".join(map(str, found))
    for w in ("train.seed must be in [0, 2**32 - 1], got -1", "model.path='' is empty", "data.max_samples=3 is fewer"):
        assert w in text, (w, text)


# ---------------------------------------------------------------------------- checked before building

def fifo(tmp_path):
    p = tmp_path / "pipe.jsonl"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("overrides,words", [
    (["model.path="], ["model.path='' is empty", "model.path=null"]),
    (["data.max_samples=3", "batch=8"], ["data.max_samples=3 is fewer than one step's samples (batch=8)",
                                          "data.max_samples >= 8"]),
    (["train.seed=-1"], ["train.seed must be in [0, 2**32 - 1], got -1"]),
    (["data.seed=4294967296"], ["data.seed must be in [0, 2**32 - 1], got 4294967296"]),
    (["data=jsonl", "data.path=/dev/null"], ["data.path='/dev/null' is a character device", "regular file"]),
    (["data=jsonl", "data.path={fifo}"], ["pipe.jsonl' is a FIFO", "regular file"]),
    (["data=jsonl", "data.path={empty}"], ["empty.jsonl' is empty (0 bytes)"]),
    (["train.nproc=2"], ["train.nproc=2 but this node has 0 CUDA device(s); use train.nproc=1, or train.device=cpu"]),
    # (the tokenizer goes with the vocabulary: Mistral v3's with 32,768; with 10 there is none to encode chat data)
    (["model.vocab_size=10"], ["model.vocab_size=10) has no tokenizer offline", "use data=synthetic"]),
], ids=["empty-model-path", "max_samples-below-batch", "seed-negative", "data-seed-too-big", "dev-null", "fifo",
        "empty-jsonl", "nproc-on-cpu", "vocab-below-tokenizer"])
def test_values_fail_before_the_model_is_built(tmp_path, capfd, overrides, words):
    import torch

    if "train.nproc=2" in overrides and torch.cuda.is_available():
        pytest.skip("a CPU-only message")
    (tmp_path / "empty.jsonl").write_text("")
    subs = {"fifo": fifo(tmp_path), "empty": tmp_path / "empty.jsonl"}
    run = tmp_path / "run"
    r = run_in_process([*FAST[:2], *(o.format(**subs) for o in overrides)], run)
    err = capfd.readouterr().err
    assert r.status is Status.failed and r.exit_code == 2 and r.model is None, r.error
    for w in words:
        assert w in r.error, (w, r.error)
    assert "Traceback" not in err and r.error in err
    no_half_files(run)


# ---------------------------------------------------------------------------- bench.py

@pytest.mark.parametrize("overrides,words", [
    (["suite=inference", "inference.batches=[0]"], ["inference.batches must be a non-empty list of integers > 0",
                                                   "[0]"]),
    (["suite=hardware", "hardware.sizes=[-5]"], ["hardware.sizes must be a non-empty list of integers > 0", "[-5]"]),
    (["suite=hardware", "hardware.dtypes=[int3]"], ["hardware.dtypes=['int3']", "bf16"]),
    (["suite=consistency", "+consistency.relative.x=nan"], ["consistency.relative.x must be a finite", "nan"]),
    (["suite=inference", "seed=-3"], ["seed must be in [0, 2**32 - 1], got -3"]),
], ids=["batches", "sizes", "dtypes", "nan-tolerance", "seed"])
def test_bench_values_are_checked_before_a_suite_runs(overrides, words):
    from lorabench.run.checks import bench_problems

    found = bench_problems(OmegaConf.to_object(compose_cfg(overrides, config_name="bench")))
    assert len(found) == 1, found
    for w in words:
        assert w in str(found[0]), (w, found)


def test_bench_py_names_every_bad_suite_value_in_one_line(tmp_path):
    proc = run_cli("bench.py", ["suite=inference", "inference.repeats=0", "inference.new_tokens=-1",
                                f"hydra.run.dir={tmp_path}"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("bench.py: ")]
    assert "inference.new_tokens must be > 0, got -1" in line and "inference.repeats must be > 0, got 0" in line
    assert not (tmp_path / "metrics.json").exists()


def test_bench_report_of_a_result_of_the_wrong_shape_says_so(tmp_path):
    (tmp_path / "metrics.json").write_text("[1, 2, 3]")
    proc = run_cli("bench.py", ["suite=project", f"sweep_dir={tmp_path}"], check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert f"{tmp_path / 'metrics.json'} is not a lorabench result file" in proc.stderr
    with pytest.raises(ValueError, match="not a lorabench result file"):
        read_result(tmp_path / "metrics.json")


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_a_sweep_whose_report_cannot_be_written_exits_2_and_keeps_its_cells(tmp_path):
    """Every cell ok, the report unwritable (a folder stands where results.md goes): exit 2, one line
    naming why, and the cells' results kept (bench.py sweep_dir= writes the report once it can)."""
    (tmp_path / "results.md").mkdir()
    proc = run_cli("train.py", ["-m", "seq_len=32,48", *FAST, f"hydra.sweep.dir={tmp_path}"], check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.splitlines()
    assert [line for line in err if line.startswith(f"Sweep {tmp_path}: the report could not be written: ")]
    assert err[-1].startswith("cells: 2 = 2 ok")
    assert [read_result(tmp_path / n / "metrics.json").status for n in ("0", "1")] == [Status.ok, Status.ok]


def test_the_write_check_of_a_dir_that_several_nodes_share_passes_when_they_check_at_once(tmp_path, monkeypatch):
    """A multi-node cell's processes check one run dir at once: each writes and removes a probe of its own (with
    one name for all, a node that removed the probe between another's write and removal failed that one:
    "cannot write there (No such file or directory)"). Here the second node checks inside the first's check."""
    from lorabench.sweep import callbacks as sweep

    pids, real, nested = iter([1001, 1002]), Path.write_bytes, []
    monkeypatch.setattr(sweep.os, "getpid", lambda: next(pids))

    def write_bytes(self, data):
        n = real(self, data)
        if not nested:  # the other node's whole check, between this node's write and its removal
            nested.append(self.name)
            sweep.check_writable(tmp_path, "hydra.run.dir")
        return n
    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    sweep.check_writable(tmp_path, "hydra.run.dir")  # returns: no exit
    assert nested and list(tmp_path.iterdir()) == []
