"""lorabench.run.preemption's handler and the one status wrapper (lorabench.run.cell.record), at unit level:
what a signal does in and out of a training step, and that an exception gives the same status in a
cell and in a DDP rank. The subprocess tests (a real SIGINT or SIGTERM) are in test_reliability.py."""

import os
import signal
import threading
import time

import pytest
from conftest import FAST, compose_cfg
from omegaconf import OmegaConf

from lorabench.core.results import CellResult, Status, read_result
from lorabench.run import cell
from lorabench.run.guard import Guard, HostMemoryExceeded
from lorabench.run.preemption import Preemption, StepAborted, Stopped


class FakeGuard:
    def __init__(self):
        self.stopped = None

    def stop(self, exc):
        self.stopped = exc


def test_a_signal_in_a_step_asks_for_a_checkpoint_and_a_second_ctrl_c_stops_at_once():
    p, guard = Preemption(), FakeGuard()
    with p.cell():
        with p.training(guard, grace_s=600):
            p._on_signal(signal.SIGINT, None)  # the first: the step may end
            assert p.requested and p.signal_name == "SIGINT" and p.should_stop()
            p._on_signal(signal.SIGTERM, None)  # another SIGTERM changes nothing
            with pytest.raises(Stopped, match="SIGINT again: stopped at once"):
                p._on_signal(signal.SIGINT, None)
        assert guard.stopped is None  # the timer was cancelled when the step ended


def test_a_step_that_outlives_the_grace_period_is_stopped_through_the_guard():
    p, guard = Preemption(), FakeGuard()
    with p.cell(), p.training(guard, grace_s=0.05):
        p._on_signal(signal.SIGTERM, None)
        assert guard.stopped is None  # the step has its grace period
        p._timer.join(5)
        assert isinstance(guard.stopped, StepAborted)
        raise guard.stopped  # as the guard raises it in the main thread
    assert p.aborted
    assert "had not ended 0.05 s after the signal" in p.stopped_message(3, None, "checkpoints")


def test_without_a_grace_period_the_step_is_stopped_in_the_signal_handler():
    """train.sigterm_grace_s=0: the guard is told at once, not by a timer thread that a short step could outrun."""
    p, guard = Preemption(), FakeGuard()
    with p.cell(), p.training(guard, grace_s=0):
        p._on_signal(signal.SIGTERM, None)
        assert isinstance(guard.stopped, StepAborted) and p._timer is None
        raise guard.stopped
    assert p.aborted and "had not ended 0 s after the signal" in p.stopped_message(3, None, "checkpoints")


def pad_as_the_tokenizer_does(wait_s: float = 5.0):
    """transformers' BatchEncoding.convert_to_tensors: any error while it builds the tensors comes out as
    its own ValueError. The guard's exception may be raised at any instruction, this one's too."""
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:  # the guard's SIGUSR1 is handled between two of these
            time.sleep(0.001)
    except Exception as e:
        raise ValueError("Unable to create tensor, you should probably activate truncation and/or padding") from e


def test_a_step_stopped_inside_a_library_that_rewraps_errors_is_still_recorded_as_stopped():
    """With no grace period the signal stops the step at whatever instruction runs, here inside code that
    turns every Exception into a ValueError: the loop still ends with StepAborted (the cell `interrupted`,
    exit 4), never with the library's error (`failed`, exit 2)."""
    p, guard = Preemption(), Guard(limit_gib=1e6)
    with p.cell(), p.training(guard, grace_s=0), guard:
        p._on_signal(signal.SIGTERM, None)  # the handler asks the guard: SIGUSR1 to this (the main) thread
        pad_as_the_tokenizer_does()
    assert p.aborted and isinstance(guard.raised, StepAborted)


def test_a_step_whose_stop_a_library_swallowed_ends_without_a_checkpoint():
    """The guard's exception lands wherever the main thread is, here in code that catches every Exception
    and goes on: the step then ends past its grace period, and its end stops the loop (StepAborted)
    instead of writing a checkpoint the grace period no longer covers."""
    p, guard = Preemption(), Guard(limit_gib=1e6)
    with p.cell(), p.training(guard, grace_s=0), guard:
        try:  # the signal comes while the main thread runs the library's code
            p._on_signal(signal.SIGTERM, None)
            pad_as_the_tokenizer_does()
        except Exception:  # noqa: BLE001, S110  (what the test stands for: a library that swallows and goes on)
            pass  # swallowed: the step goes on to its end
        p.should_stop()  # the step's end (StopOnSignal): True would save a checkpoint and end the loop normally
    assert p.aborted and "had not ended 0 s after the signal" in p.stopped_message(3, None, "checkpoints")


def test_host_memory_over_the_limit_inside_a_library_that_rewraps_errors_is_recorded_as_such():
    guard = Guard(limit_gib=1e6)
    with pytest.raises(HostMemoryExceeded) as caught, guard:
        threading.Timer(0.05, guard.stop, args=(HostMemoryExceeded("host memory: over"),)).start()
        pad_as_the_tokenizer_does()
    assert isinstance(caught.value.__cause__, ValueError)  # the library's error kept as its cause


def test_a_signal_outside_the_step_stops_the_cell_and_between_cells_only_the_sweep():
    p = Preemption()
    with p.cell(keep=True):
        with pytest.raises(Stopped, match="SIGTERM before training began"):
            p._on_signal(signal.SIGTERM, None)  # during the model load, say
    p._on_signal(signal.SIGINT, None)  # between two cells: nothing raised, the flag stays
    assert p.requested and p.signal_name == "SIGTERM"
    p._restore()


def test_the_handlers_are_installed_for_a_cell_and_put_back_after_a_single_run():
    p, before = Preemption(), signal.getsignal(signal.SIGINT)
    with p.cell():
        assert signal.getsignal(signal.SIGINT) == p._on_signal == signal.getsignal(signal.SIGTERM)
        p.signal_name = "SIGTERM"
    assert signal.getsignal(signal.SIGINT) is before and not p.requested  # forgotten after a single run


@pytest.mark.parametrize("exc,status", [
    (MemoryError(), Status.oom),
    (MemoryError("host memory: over the limit"), Status.oom),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory: you tried"),
     Status.oom),
    (Stopped("SIGINT before training began"), Status.interrupted),
    (KeyboardInterrupt(), Status.interrupted),
    (ValueError("bad"), Status.failed),
], ids=["memoryerror", "host-limit", "cpu-allocator", "stopped", "keyboardinterrupt", "valueerror"])
def test_one_exception_gives_one_status_in_a_cell_and_in_a_rank(tmp_path, monkeypatch, exc, status):
    """cell.record for a cell, and lorabench.run.worker (a DDP rank, which calls it) for the same exception."""
    def boom(*args, **kwargs):
        raise exc

    result = CellResult(status=Status.running, cell="c")
    cell.record(result, tmp_path / "error.txt", boom)
    assert result.status is status, result.error

    import lorabench.run.loop
    from lorabench.core.results import CONFIG_FILE
    from lorabench.run.worker import worker

    c = OmegaConf.to_object(compose_cfg(FAST))
    (tmp_path / CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.structured(c)))
    monkeypatch.setattr(lorabench.run.loop, "measure", boom)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit):
        worker(tmp_path)
    rank = read_result(tmp_path / "rank0.json")
    assert rank.status is status, rank.error
    assert os.path.exists(tmp_path / "error.rank0.txt") == (status is Status.failed)
