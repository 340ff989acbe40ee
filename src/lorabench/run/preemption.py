"""What a signal to stop does to a cell and to a sweep: SIGTERM (a spot reclaim, a SLURM preemption
or requeue, a Kubernetes eviction), SIGINT (Ctrl-C) and, in a submitit job (hydra/launcher=slurm or
local), its time-limit signal (SUBMITIT_PREEMPT_SIGNAL, USR2). All of them alike:

  in a training step   the step ends, a checkpoint is written and the loop stops; the cell is
                       recorded `interrupted` (exit code 4) and the same command resumes from the
                       checkpoint. A step that has not ended train.sigterm_grace_s after the signal
                       is stopped where it is (through lorabench.run.guard), without a new checkpoint: a
                       cell whose steps take minutes still ends before the scheduler's kill.
  elsewhere in a cell  (data, model load) the cell stops at once, recorded `interrupted`.
  a second Ctrl-C      stops the cell at once, in a step too (no checkpoint for that step).
  in a sweep           no further cell starts: the sweep writes its report and its closing line
                       and ends (lorabench.run.cell.end_sweep).

Hand-over to the launcher, after the loop stopped: in a submitit job whose time limit came,
submitit's own handler checkpoints the Hydra job and requeues it; a SIGTERM because SLURM requeued
the job ends the process without a result (JobRequeued), so that the multirun waits for the job's
next run instead of reporting this one.

One handler per process (HANDLER), installed for the length of a cell (lorabench.run.cell.record) and,
in a multirun, kept between cells. The Trainer sees it through lorabench.run.loop.StopOnSignal. This
module imports no training library: a DDP rank imports it before Unsloth patches transformers.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import threading
from contextlib import contextmanager
from typing import Iterator

log = logging.getLogger(__name__)


class StepAborted(Exception):
    """A step stopped before its end: the signal's grace period (train.sigterm_grace_s) ran out."""


class Stopped(BaseException):
    """A cell stopped by a signal outside its training steps (data, model load), or by a second
    Ctrl-C. Raised at once in the main thread; a BaseException, as KeyboardInterrupt is, so that no
    library's `except Exception` swallows it."""


class JobRequeued(SystemExit):
    """This SLURM job runs again (scontrol requeue, a requeueing preemption, submitit's time-limit
    requeue): the process ends here without handing a result to its launcher, so the multirun that
    launched it keeps waiting for the job's next run, which resumes from the checkpoint just written."""

    def __init__(self, message: str, code=4):
        super().__init__(code)  # 4: an interrupted cell (README: exit codes); submitit's own where it exits
        self.message = message

    def __str__(self) -> str:
        return self.message


def slurm_requeued() -> bool:
    """Whether SLURM has requeued this job since it started: `scontrol requeue` and a requeueing
    preemption raise the job's restart count at once, before its processes get SIGTERM; a plain
    scancel does not (seen on slurm-wlm 22.05, launchers/slurm-local.sh)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return False
    try:
        out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    m = re.search(r"\bRestarts=(\d+)", out)
    return bool(m) and int(m.group(1)) > int(os.environ.get("SLURM_RESTART_COUNT") or 0)


class Preemption:
    """The process's handler of the stop signals (see the module's docstring). `signal_name` is the
    first signal received, None before: once set, no further cell of this process starts."""

    def __init__(self):
        self.signal_name: str | None = None
        self.time_limit = False  # the signal was submitit's: its handler requeues the job
        self.aborted = False  # the grace period ran out and the step was stopped
        self._expired = False  # the grace period ran out (the stop asked of the guard)
        self._in_cell = False
        self._guard = None  # the running training loop's lorabench.run.guard.Guard
        self._child: subprocess.Popen | None = None  # a DDP cell's torchrun, while its ranks train
        self._grace_s = 0.0
        self._timer: threading.Timer | None = None
        self._previous: dict = {}
        self._submitit_signal = self._submitit_handler = None

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    @contextmanager
    def cell(self, keep: bool = False) -> Iterator[None]:
        """Around a cell's work: the handlers installed (main thread only: signals reach no other).
        keep (a multirun): they stay after it, so a signal between two cells stops the sweep too;
        otherwise the previous handlers come back and the request is forgotten."""
        installed = self._install()
        self._in_cell = True
        try:
            yield
        finally:
            self._in_cell = False
            if installed and not keep:
                self._restore()
                self.signal_name, self.time_limit = None, False

    @contextmanager
    def training(self, guard, grace_s: float) -> Iterator[None]:
        """Around the training loop: a signal then asks the step under way to end and write a
        checkpoint (should_stop), and `guard` stops the step if it has not ended `grace_s` after it."""
        self._guard, self._grace_s, self.aborted, self._expired = guard, grace_s, False, False
        try:
            yield
        except StepAborted:
            self.aborted = True
        finally:
            self._guard = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    @contextmanager
    def forwarding(self, child: subprocess.Popen) -> Iterator[None]:
        """While a DDP cell's ranks train in `child` (torchrun, lorabench.run.distributed): a signal is
        passed on to it (torchrun passes it to the ranks, each stops as a cell does) and the launcher
        waits for the ranks' results. torchrun runs in a session of its own, so Ctrl-C in the terminal,
        like a kill -INT of this process, reaches it once, from here."""
        self._child = child
        try:
            yield
        finally:
            self._child = None

    def should_stop(self) -> bool:
        """At a step's end: whether to save a checkpoint and stop (a signal came during the step).
        Raises StepAborted where the grace period ran out before the step ended: the guard's exception
        met a library's `except Exception` that went on (it lands wherever the main thread is), and a
        checkpoint now would be written past the grace period."""
        if self.requested and self._timer is not None:
            self._timer.cancel()  # the step ended in time: its checkpoint is written next
        if self._expired:
            raise StepAborted(f"{self.signal_name} grace period over")
        return self.requested

    def follow(self, why: str) -> None:
        """Stop as after a signal of this process's own: another process of the cell had one (the ranks of a
        DDP cell stop after the same step, lorabench.run.loop.StopOnSignal)."""
        if not self.requested:
            self.signal_name = why

    def stopped_message(self, step: int, newest, ckpt_dir) -> str:
        """What the loop did after the signal: the step it ended after and the checkpoint to resume from."""
        if self.aborted:
            return (f"the step after step {step} had not ended {self._grace_s:g} s after the signal "
                    f"(train.sigterm_grace_s) and was stopped; newest checkpoint: {newest.name if newest else 'none'}")
        return f"stopped after step {step} with a checkpoint in {ckpt_dir}"

    def hand_over(self, stopped: str) -> None:
        """After the loop stopped on a signal: in a SLURM job that runs again, end the process
        without a result (JobRequeued); otherwise return, and the cell is recorded interrupted."""
        if self.time_limit and callable(self._submitit_handler):  # it checkpoints the launcher's job, requeues, exits
            try:
                self._submitit_handler(self._submitit_signal, None)
            except SystemExit as e:  # its exit code tells submitit's local executor to start the job again
                raise JobRequeued(f"time limit: submitit requeued the job; {stopped}; its next run resumes",
                                  e.code) from None
            except Exception as e:  # not requeued (timed out too often): recorded interrupted
                log.warning("submitit did not requeue the job: %s", e)
        elif slurm_requeued():
            raise JobRequeued(f"SIGTERM: SLURM requeued job {os.environ['SLURM_JOB_ID']}; {stopped}; its next run "
                              "resumes")

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        again = self.requested
        if not again:
            self.signal_name = name
        self.time_limit |= signum == self._submitit_signal
        if not self._in_cell:  # between two cells of a sweep: the next one does not start
            log.warning("%s: no further cell starts", name)
            return
        if self._child is not None:  # torchrun, in a session of its own: it hears of Ctrl-C from here alone
            self._child.send_signal(signum)
            return
        if self._guard is None:
            stopped = f"{name} before training began: the cell stopped at once"
            self.hand_over(stopped)  # a job that runs again ends without a result, as after a step
            raise Stopped(stopped)
        if again:
            if signum == signal.SIGINT:  # Ctrl-C twice: now
                raise Stopped(f"{name} again: stopped at once, in the step after the last recorded one "
                              "(no checkpoint for it)")
            return
        log.warning("%s: saving a checkpoint at the end of this step (or stopping it in %g s), then stopping; "
                    "Ctrl-C again stops at once", name, self._grace_s)
        aborted = StepAborted(f"{name} grace period over")
        # No grace: stopped now, not once a timer thread next gets the interpreter, by which time a short step
        # may have ended and written its checkpoint after all.
        if self._grace_s <= 0:
            self._expire(self._guard, aborted)
            return
        self._timer = threading.Timer(self._grace_s, self._expire, args=(self._guard, aborted))
        self._timer.daemon = True
        self._timer.start()

    def _expire(self, guard, aborted: StepAborted) -> None:
        self._expired = True
        guard.stop(aborted)

    def _install(self) -> bool:
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return False
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        if os.environ.get("SUBMITIT_EXECUTOR"):
            self._submitit_signal = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
            self._submitit_handler = signal.signal(self._submitit_signal, self._on_signal)
            self._previous[self._submitit_signal] = self._submitit_handler
        return True

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


HANDLER = Preemption()
