"""Processes that die with the process that started them, so a multi-process cell leaves no orphan.

A DDP or FSDP cell is three generations: the Hydra process (its lock on the run dir, its result), torchrun,
and the ranks. A kill -9 of the Hydra process ends it alone: torchrun and the ranks went on training as
orphans, the lock died with their parent, and the same command started a second job in the same dir. Here
each child asks the kernel (Linux's PR_SET_PDEATHSIG) for SIGKILL when its parent ends, however it ends:

    python -m lorabench.run.tether <parent pid> <command...>    # torchrun, tethered to the Hydra process
    lorabench.run.worker calls die_with_parent() first thing       # each rank, tethered to torchrun

The tether execs the command in its own process, so torchrun keeps the pid (and the inherited lock
descriptor, lorabench.run.distributed) the tether had. This module imports nothing of lorabench.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "LORABENCH_PARENT_PID"  # the pid a rank's parent (torchrun) had when it started the rank
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """SIGKILL to this process when its parent ends; at once if `parent` has ended already (the request
    below would then watch the process that adopted this one). Nothing on a system without prctl."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # (a kernel that refuses it: the launcher's own signal forwarding still applies)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def command(cmd: list[str]) -> list[str]:
    """`cmd` run through the tether, tied to this process."""
    return [sys.executable, "-m", "lorabench.run.tether", str(os.getpid()), *cmd]


if __name__ == "__main__":
    die_with_parent(int(sys.argv[1]))
    os.environ[PARENT_ENV] = str(os.getpid())  # what the command's own children (the ranks) tie themselves to
    os.execv(sys.argv[2], sys.argv[2:])
