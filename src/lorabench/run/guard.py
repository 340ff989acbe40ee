"""What stops a training cell from outside its step, so that it is recorded instead of killed:

  host memory  a watchdog thread samples the resident memory of this process and its DataLoader
               workers (psutil) every 0.1 s; past the limit it stops the step, and the cell is
               recorded `oom` with both figures, before the kernel's OOM killer ends the process
               and leaves no result. Which processes are this one's children is looked up again
               every 2 s only: psutil finds them by reading every process of the machine (Python
               holding the GIL between those reads). py-spy found the thread busy 7-9% of the time at
               every poll in a host-bound GPU cell, though no throughput changed with it measurably
               (docs/results.md, the host section);
  a signal     (SIGTERM, Ctrl-C: lorabench.run.preemption) the current step may finish and write a
               checkpoint; a step that has not ended `grace_s` seconds after the signal is stopped
               here, so a cell whose steps take minutes still ends within seconds, recorded `interrupted`.

Both stop the step the same way: the watchdog (or the signal's timer) names an exception and sends
SIGUSR1 to the main thread, whose handler raises it there at the next Python instruction (between
two operators), only while the guarded region runs; after it, a late signal does nothing. That
instruction may lie inside a library's `except Exception: raise ValueError(...)` (the tokenizer's
padding in the collator turns any error into "Unable to create tensor"): whatever leaves the region
after the guard raised is replaced by what the guard raised, so the cell is recorded for its cause.
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading

import psutil

log = logging.getLogger(__name__)
GIB = 2**30


class HostMemoryExceeded(MemoryError):
    """The cell's process crossed its host-memory limit, or cannot fit in what the host has."""


def rss_bytes(proc: psutil.Process, children: list[psutil.Process] | None = None) -> int:
    """Resident memory of this process and its children (DataLoader workers, compile workers);
    `children` as listed earlier, else looked up now."""
    total = proc.memory_info().rss
    for child in proc.children(recursive=True) if children is None else children:
        try:
            total += child.memory_info().rss
        except psutil.Error:  # it has ended
            pass
    return total


def default_limit_gib(fraction: float = 0.9) -> float:
    """What this process holds now plus `fraction` of what the host has available: the rest is left
    to the system and the other processes on the machine."""
    return (rss_bytes(psutil.Process()) + fraction * psutil.virtual_memory().available) / GIB


class Guard:
    """Context manager around the training loop: the host-memory watchdog, and `stop(exc)` for any
    thread to end the loop with `exc`. In a thread other than the main one (where no signal handler
    can be installed) it only samples memory."""

    def __init__(self, limit_gib: float | None, interval_s: float = 0.1, relist_s: float = 2.0):
        self.limit_gib = limit_gib if limit_gib is not None else default_limit_gib()
        self.interval_s = interval_s
        self.relist_every = max(1, round(relist_s / interval_s))  # polls between two lookups of the children
        self.peak_gib = 0.0
        self._proc = psutil.Process()
        self._pending: BaseException | None = None
        self.raised: BaseException | None = None  # what stop() raised in the main thread, once raised
        self._armed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous = None
        self._main = threading.current_thread() is threading.main_thread()

    def __enter__(self) -> "Guard":
        self.raised = None
        if self._main:
            self._previous = signal.signal(signal.SIGUSR1, self._raise)
            self._armed = True
        self._thread = threading.Thread(target=self._watch, daemon=True, name="lorabench-host-memory")
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._armed = False  # a signal that arrives from now on raises nothing
        self._stop.set()
        self._thread.join()
        if self._main:
            signal.signal(signal.SIGUSR1, self._previous)
        if exc is not None and self.raised is not None and exc is not self.raised:
            raise self.raised from exc  # a library caught ours and raised its own: the cause is ours

    def stop(self, exc: BaseException) -> None:
        """End the guarded loop with `exc`, raised in the main thread (callable from any thread)."""
        if self._armed and self._pending is None:
            self._pending = exc
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)

    def _raise(self, signum, frame) -> None:
        if self._armed and self._pending is not None:
            exc, self._pending = self._pending, None
            self.raised = exc
            raise exc

    def _watch(self) -> None:
        children: list[psutil.Process] = []
        for poll in itertools.count():
            if self._stop.wait(self.interval_s):
                return
            try:
                if poll % self.relist_every == 0:
                    children = self._proc.children(recursive=True)
                gib = rss_bytes(self._proc, children) / GIB
            except psutil.Error:
                continue
            self.peak_gib = max(self.peak_gib, gib)
            if gib > self.limit_gib:
                log.error("host memory: %.2f GiB resident, over the limit of %.2f GiB: stopping the cell",
                          gib, self.limit_gib)
                self.stop(HostMemoryExceeded(
                    f"host memory: the cell's processes held {gib:.2f} GiB, over the limit of {self.limit_gib:.2f} GiB "
                    "(train.host_memory_limit_gib; unset: this process's memory at the start plus 90% of what the "
                    "host had available); lower batch or seq_len"))
                return
