"""A run dir (or a sweep's cell dir) is bound to the config that made its result, and used by one
run at a time.

Binding: the first run in a dir writes fingerprint.json, its resolved config flattened (a.b.c: value)
without the keys that do not change what a cell measures (IGNORED). A later run into the same dir
compares its own: the same, it resumes or reports the finished result; different, it stops before
anything is built, naming the dir and the first differing keys. sweep.overwrite=true moves the old
run's files aside into <dir>/replaced-<UTC time>/ (never deleted) and starts afresh. A dir from
before fingerprints is bound to the config in its metrics.json. An earlier run that failed before
its first step (a bad value) measured nothing: it is moved aside without being asked.

Lock: an flock on <dir>/.lock for the run's life, so a second run into the dir stops at once. The
kernel drops an flock when the process that holds it dies, however it dies (SIGKILL, OOM killer):
the file left behind by a killed run never blocks the next. (flock over NFS is as good as the NFS
server's lock support; a cell's dir on a local or Lustre volume is.)

Also here: `describe`, an exception as one line that names the file and the free space when a write
failed for want of room (disk full, a quota, the file-size limit).

This module imports nothing of lorabench but lorabench.results.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

from lorabench.results import RESULT_FILE, atomic_write_json, flatten

log = logging.getLogger(__name__)

BINDING_FILE = "fingerprint.json"
LOCK_FILE = ".lock"
# What a cell measures does not depend on these, so a re-run may change them and still resume or
# report the finished result: where it reports (logger.*), the sweep report's options (report.*), how
# a multirun treats its cells and an earlier result (sweep.*: keep_going, overwrite; train.force,
# train.resume), where tokenised data is cached (data.cache_dir: the same tokens either way) and how
# long a step may run on after SIGTERM (train.sigterm_grace_s). hydra.* never reaches a cell's config.
IGNORED = ("logger", "report", "sweep", "train.force", "train.resume", "train.sigterm_grace_s", "data.cache_dir")


def ignored(key: str) -> bool:
    """A dotted config key that a cell's result does not depend on (IGNORED, or one below it)."""
    return any(key == i or key.startswith(i + ".") for i in IGNORED)


# Files of the run now under way that stay when an old run is moved aside at the cell's start: Hydra
# has written them for this run already.
OWN_FILES = (".hydra", "train.log", LOCK_FILE)
SHOWN_DIFFERENCES = 3  # keys named in the one line; the rest counted
# Free space below which a failure is said to be the disk's, whatever the exception (torch.save's
# "PytorchStreamWriter failed" names no errno): less than one checkpoint of a tiny model.
LOW_FREE_BYTES = 16 * 2**20
DISK_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS)

_held: dict[Path, int] = {}  # lock file -> its open descriptor, for the locks this process holds


class RunDirError(Exception):
    """The dir is in use by another run, or holds a run of another config: one line, exit code 2."""


def fingerprint(config: dict) -> dict:
    """The keys that decide what a cell measures and their values, flat and as JSON reads them back."""
    flat = {k: v for k, v in flatten(config).items() if not ignored(k)}
    return json.loads(json.dumps(flat, sort_keys=True, default=str))  # tuples become lists, as read back


def bound_config(d: Path) -> dict | None:
    """The fingerprint this dir is bound to: its fingerprint.json, or an older dir's metrics.json config."""
    for name, pick in ((BINDING_FILE, lambda x: x["config"]), (RESULT_FILE, lambda x: fingerprint(x["config"]))):
        try:
            return pick(json.loads((Path(d) / name).read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def differences(old: dict, new: dict) -> str:
    """'batch: 2 -> 8, seq_len: 64 -> 96 (and 2 more)': the first differing keys, in key order."""
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k, "(unset)") != new.get(k, "(unset)"))
    shown = ", ".join(f"{k}: {old.get(k, '(unset)')} -> {new.get(k, '(unset)')}" for k in keys[:SHOWN_DIFFERENCES])
    return shown + (f" (and {len(keys) - SHOWN_DIFFERENCES} more)" if len(keys) > SHOWN_DIFFERENCES else "")


def lock(d: Path, name: str = LOCK_FILE) -> None:
    """Hold <d>/<name> for this process's life (or until `unlock`); RunDirError if another holds it."""
    path = (Path(d) / name).absolute()
    if path in _held:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirError(f"{d} is in use by another run (pid {holder}, which holds {path}); wait for it to end "
                          "or choose another dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # who holds it, for the message above (the lock is the flock)
    _held[path] = fd


def unlock(d: Path, name: str = LOCK_FILE) -> None:
    fd = _held.pop((Path(d) / name).absolute(), None)
    if fd is not None:
        os.close(fd)  # closing the descriptor drops the flock


def measured_nothing(d: Path) -> bool:
    """An earlier run that failed before its first step: no step record, no checkpoint, status failed."""
    try:
        failed = json.loads((d / RESULT_FILE).read_text()).get("status") == "failed"
    except (OSError, ValueError, AttributeError):
        return False
    steps = d / "steps.jsonl"
    return failed and not (steps.exists() and steps.stat().st_size) and not (d / "checkpoints").exists()


def move_aside(d: Path, keep: tuple[str, ...] = (LOCK_FILE,)) -> Path:
    """Every file of the old run into <d>/replaced-<UTC time>/, but `keep` and earlier replaced-* dirs."""
    dest = d / time.strftime("replaced-%Y%m%dT%H%M%SZ", time.gmtime())
    while dest.exists():  # two moves within one second
        dest = dest.with_name(dest.name + "_")
    dest.mkdir()
    for p in d.iterdir():
        if p != dest and p.name not in keep and not p.name.startswith("replaced-"):
            p.rename(dest / p.name)
    return dest


def check_binding(d: Path, config: dict, overwrite: bool, key: str, keep: tuple[str, ...]) -> dict:
    """The new fingerprint, once `d` holds no run of another config (moving one aside where allowed);
    RunDirError naming the dir and the first differing keys otherwise."""
    new, old = fingerprint(config), bound_config(d)
    if old is None or old == new:
        return new
    if overwrite or measured_nothing(d):
        moved = move_aside(d, keep)
        log.warning("%s held a run of another config (%s): moved aside to %s", d, differences(old, new), moved)
        return new
    raise RunDirError(f"{key}={d} holds a run of another config ({differences(old, new)}); run the same config "
                      "to resume or report it, choose another dir, or sweep.overwrite=true to move the old run "
                      "aside")


def enter(d: Path, config: dict, overwrite: bool = False, node: int = 0, key: str = "hydra.run.dir",
          keep: tuple[str, ...] = OWN_FILES) -> None:
    """At a cell's start: hold the dir's lock, then check (and, on node 0, write) its binding.
    A multi-node cell's nodes share one dir: each holds a lock of its own, node 0 writes."""
    # A log line that cannot be written (a full disk) must not print logging's traceback on the
    # console: the cell's own failure names the disk.
    logging.raiseExceptions = False
    lock(d, LOCK_FILE if node == 0 else f"{LOCK_FILE}-node{node}")
    new = check_binding(Path(d), config, overwrite, key, keep)
    if node == 0 and not (Path(d) / BINDING_FILE).exists():
        atomic_write_json(Path(d) / BINDING_FILE, {"config": new, "ignored": list(IGNORED)})


def leave(d: Path, node: int = 0) -> None:
    unlock(d, LOCK_FILE if node == 0 else f"{LOCK_FILE}-node{node}")


def free_space(path: Path) -> str:
    """'1.2 MiB free on /mnt/x' for the nearest existing dir of `path`."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError:
        return "free space unknown"
    return f"{free / 2**20:.1f} MiB free there"


def describe(e: BaseException, where: Path | None = None) -> str:
    """An exception as one line; a failed write names its file, the reason and the free space."""
    if isinstance(e, RunDirError):
        return str(e)
    name = getattr(e, "filename", None) or where
    if name is not None:  # an atomic write's temporary name (results.atomic_write_text): the file it stands for
        name = Path(name).with_name(re.sub(r"^\.(.+)\.[^.]+\.tmp$", r"\1", Path(name).name))
    if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
        limit = " (the process's file-size limit, ulimit -f)" if e.errno == errno.EFBIG else ""
        return f"cannot write {name}: {e.strerror}{limit}; {free_space(Path(name or '.'))}"
    text = f"{type(e).__name__}: {e}"
    if where is not None and _low_on_space(where):
        text += f" ({where}: {free_space(where)})"
    return text


def _low_on_space(where: Path) -> bool:
    try:
        return shutil.disk_usage(where).free < LOW_FREE_BYTES
    except OSError:
        return False
