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

This module imports nothing of lorabench but lorabench.core.results.
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
from dataclasses import dataclass, field
from pathlib import Path

from lorabench.core.results import (
    DISK_ERRNOS,
    RESULT_FILE,
    CellResult,
    atomic_write_json,
    cannot_write,
    cell_name,
    flatten,
    free_space,
    load_results,
    read_cells,
    read_result,
)

__all__ = ["cannot_write", "free_space"]  # (with the rest: the one-line reasons a path cannot be written)

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


def held_fds() -> tuple[int, ...]:
    """The descriptors of the locks this process holds: a child given them (subprocess's pass_fds) holds the
    locks with it, so they outlive this process until the child ends too (a kill -9 of a DDP cell's launcher:
    lorabench.run.tether ends its children as well)."""
    return tuple(_held.values())


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


# ---------------------------------------------------------------------------- a sweep's cells without a result

@dataclass
class MissingCell:
    """A cell of a sweep without a readable result, as its report lists it: named and configured from the
    sweep's own record (cells.json), never from the number of its dir."""

    job_num: int
    cell: str  # its name (lorabench.core.results.cell_name)
    state: str  # corrupt | running | killed | not started
    reason: str  # one line
    overrides: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)  # what is known of its config: its dir's, else its overrides


def missing_cells(sweep_dir: Path, results: list[CellResult] | None = None,
                  incomplete: list[Path] | None = None) -> list[MissingCell]:
    """Every cell of cells.json (and every cell dir) without a readable result, in job order: its result
    file damaged (corrupt), its lock held (running), neither (killed, or stopped by the machine's end), or
    no dir at all (not started: the sweep stopped, or was killed, before it)."""
    sweep_dir = Path(sweep_dir)
    if results is None or incomplete is None:
        results, incomplete = load_results(sweep_dir)
    cells, done = read_cells(sweep_dir), {r.job_num for r in results}
    out = []
    for d in incomplete:
        num = int(d.name) if d.name.isdigit() else -1
        overrides = cells[num] if 0 <= num < len(cells) else _hydra_overrides(d)
        state, reason = _state(d)
        out.append(MissingCell(num, cell_name(overrides, cells, d.name), state, reason, overrides,
                               _dir_config(d) or _override_config(overrides)))
    seen = done | {m.job_num for m in out}
    for num, overrides in enumerate(cells):
        if num not in seen and not (sweep_dir / str(num) / ".hydra").is_dir():
            out.append(MissingCell(num, cell_name(overrides, cells, str(num)), "not started",
                                   "the sweep ended before this cell started", overrides, _override_config(overrides)))
    return sorted(out, key=lambda m: m.job_num)


def _state(d: Path) -> tuple[str, str]:
    f = d / RESULT_FILE
    if f.exists():
        try:
            read_result(f)
        except (OSError, ValueError, TypeError) as e:
            size = f.stat().st_size
            return "corrupt", f"{f} cannot be read ({size:,} bytes): {str(e).splitlines()[0]}"
    held = lock_held(d / LOCK_FILE)
    if held:
        return "running", f"no result yet: its lock is held by pid {held}"
    if held is None:
        return "killed", "no result: killed, or still running (this system shows no locks to tell which)"
    return "killed", "no result and nothing holds its lock: the run was killed (or its machine stopped)"


def lock_held(path: Path) -> int | bool | None:
    """The pid holding the flock on `path` (a run's lock), False when none holds it, None when this system
    cannot tell (no /proc/locks). Read-only: the lock itself is never tried, so a run starting at this moment
    is not refused because of a report."""
    try:
        st = path.stat()
    except OSError:
        return False
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in table.splitlines():
        m = re.search(r"FLOCK\s+\S+\s+WRITE\s+(\d+)\s+([0-9a-f]+):([0-9a-f]+):(\d+)", line)
        if m and "->" not in line and int(m.group(4)) == st.st_ino \
                and (int(m.group(2), 16), int(m.group(3), 16)) == (os.major(st.st_dev), os.minor(st.st_dev)):
            return int(m.group(1))
    return False


def _hydra_overrides(d: Path) -> list[str]:
    import yaml

    try:
        return [str(o) for o in yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text()) or []]
    except (OSError, ValueError, TypeError, yaml.YAMLError):
        return []


def _dir_config(d: Path) -> dict:
    """The config Hydra composed for a cell that started (its .hydra/config.yaml), resolved where it can be."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.load(d / ".hydra" / "config.yaml")
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException):
        return {}
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException:  # an interpolation of Hydra's runtime: the values as written
        return OmegaConf.to_container(cfg, resolve=False)


def _override_config(overrides: list[str]) -> dict:
    """A nested dict of `key=value` overrides, each value read as YAML reads it (batch=8 -> 8)."""
    import yaml

    out: dict = {}
    for o in overrides:
        key, sep, value = o.lstrip("+~").partition("=")
        if not sep or "/" in key:  # a group choice (model=tiny) names an option, not a value
            continue
        try:
            v = yaml.safe_load(value)
        except yaml.YAMLError:
            v = value
        node = out
        *parents, last = key.split(".")
        for k in parents:
            node = node.setdefault(k, {}) if isinstance(node.get(k, {}), dict) else {}
        node[last] = v
    return out
