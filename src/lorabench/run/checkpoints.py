"""A cell's checkpoints: which one a re-run resumes from, and whether it may.

The HF Trainer writes checkpoint-<step>/ in place, file by file (the adapters, the optimizer and scheduler,
each rank's RNG state, trainer_state.json), and every rank writes its own part: a kill part-way leaves a
folder that looks like the others. Here, once every rank has written its part (a barrier), rank 0 writes
MARKER into the folder, last and atomically: each file's size, and the fingerprint of what shaped the
training: the data's tokens, the resolved config (without the keys lorabench.run.rundir ignores) and the
code (lorabench's version and git commit). A folder without it was cut short.

At a re-run, before anything trains (`prepare`: the cell's one process, or a multi-process cell's launcher
before it starts the ranks):
  - the newest checkpoint whose files are all there at the sizes its marker lists is the one to resume from;
    newer ones, cut short or damaged since (a truncated file, a safetensors header that does not parse), are
    named on the log and set aside, into checkpoints.set-aside/ (renamed, never deleted);
  - its fingerprint must be this run's: where the data, config or code differ, the cell stops (failed, exit
    code 2) in one line naming what changed, since resuming would splice two different runs into one
    history; train.resume=false starts afresh, the old checkpoints set aside.
Checkpoints from before markers (none in the folder has one) are taken as the Trainer left them: complete
once trainer_state.json is there, with no fingerprint to compare.
"""

from __future__ import annotations

import json
import logging
import os
import time
import zipfile
from pathlib import Path

import lorabench
from lorabench.core.results import atomic_write_json, git_sha
from lorabench.run import rundir

log = logging.getLogger(__name__)

MARKER = "lorabench-checkpoint.json"
SET_ASIDE = "checkpoints.set-aside"


class CheckpointMismatch(ValueError):
    """The checkpoint to resume from was written by a run of other data, config or code."""


def fingerprint(config: dict, data: dict) -> dict:
    """What must be the same for a checkpoint to be resumed: data identity, resolved config, code."""
    return {"data": data, "config": rundir.fingerprint(config),
            "code": {"lorabench": lorabench.__version__, "git": git_sha().get("sha")}}


def config_of(c) -> dict:
    """A typed Config as the plain dict a fingerprint is taken of (the same in a cell's process and in its
    ranks, which read it back from the YAML the launcher wrote)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(c), enum_to_str=True)


def step_of(ckpt: Path) -> int:
    return int(ckpt.name.rsplit("-", 1)[-1])


def all_checkpoints(ckpt_dir: Path) -> list[Path]:
    """checkpoint-<step> folders, oldest step first."""
    if not ckpt_dir.is_dir():
        return []
    return sorted((p for p in ckpt_dir.glob("checkpoint-*") if p.is_dir() and p.name.rsplit("-", 1)[-1].isdigit()),
                  key=step_of)


def write_marker(ckpt: Path, fp: dict) -> None:
    """The checkpoint is whole: its files and their sizes, and the run's fingerprint (rank 0, after the others)."""
    files = {str(f.relative_to(ckpt)): f.stat().st_size for f in sorted(ckpt.rglob("*"))
             if f.is_file() and f.name != MARKER}
    atomic_write_json(ckpt / MARKER, {"step": step_of(ckpt), "files": files, "fingerprint": fp,
                                      "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def problem(ckpt: Path, legacy: bool = False) -> str | None:
    """Why `ckpt` cannot be resumed from (None: it can). legacy: a folder from before markers, where
    trainer_state.json (the Trainer's last file but one) stands for the marker."""
    if legacy:
        if not (ckpt / "trainer_state.json").is_file():
            return "cut short (no trainer_state.json)"
        files = {str(f.relative_to(ckpt)): None for f in ckpt.rglob("*") if f.is_file()}
    else:
        try:
            files = json.loads((ckpt / MARKER).read_text())["files"]
        except FileNotFoundError:
            return "cut short (no marker: the save did not finish)"
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"its marker {MARKER} cannot be read ({e})"
    for name, size in files.items():
        f = ckpt / name
        if not f.is_file():
            return f"{name} is missing"
        if size is not None and f.stat().st_size != size:
            return f"{name} is {f.stat().st_size:,} bytes, {size:,} when written"
        if why := unreadable(f):
            return f"{name} {why}"
    return None


def unreadable(f: Path) -> str | None:
    """A file whose structure does not parse: a safetensors header, or a torch.save zip's directory (at
    its end: a cut file has none). Cheap: neither reads the tensors."""
    from safetensors import SafetensorError, safe_open

    try:
        if f.suffix == ".safetensors":
            with safe_open(str(f), framework="pt"):
                pass
        elif f.suffix in (".pt", ".pth", ".bin") and not zipfile.is_zipfile(f):
            return "is not a whole torch.save file"
    except (SafetensorError, OSError) as e:
        return f"is not a readable safetensors file ({str(e).splitlines()[0]})"
    return None


def set_aside(ckpt: Path, why: str) -> Path:
    """Move a checkpoint out of the Trainer's way (its rotation deletes checkpoint-* folders), never deleting it."""
    dest_dir = ckpt.parent.parent / SET_ASIDE
    dest_dir.mkdir(exist_ok=True)
    dest = dest_dir / f"{ckpt.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    while dest.exists():
        dest = dest.with_name(dest.name + "_")
    ckpt.rename(dest)
    log.warning("%s %s: set aside to %s", ckpt, why, dest)
    return dest


def newest_complete(ckpt_dir: Path) -> Path | None:
    """The newest checkpoint a resume can start from (read only: what each rank of a cell looks up, once its
    launcher has set the others aside)."""
    found = all_checkpoints(ckpt_dir)
    legacy = not any((p / MARKER).exists() for p in found)
    return next((p for p in reversed(found) if problem(p, legacy) is None), None)


def prepare(ckpt_dir: Path, fp: dict, resume: bool) -> Path | None:
    """The checkpoint this run resumes from, once the newer unusable ones are set aside; with
    resume=False every checkpoint is set aside and None returned. CheckpointMismatch when the one to
    resume from was written by a run of other data, config or code."""
    found = all_checkpoints(ckpt_dir)
    if not resume:
        for ckpt in found:
            set_aside(ckpt, "train.resume=false: starting afresh")
        return None
    legacy = not any((p / MARKER).exists() for p in found)
    for ckpt in reversed(found):
        why = problem(ckpt, legacy)
        if why is None:
            check_fingerprint(ckpt, fp, legacy)
            return ckpt
        set_aside(ckpt, why)
    return None


def check_fingerprint(ckpt: Path, fp: dict, legacy: bool) -> None:
    if legacy:
        log.warning("%s was written before checkpoints kept their run's fingerprint: resuming without checking "
                    "that the data and code are the same", ckpt)
        return
    old = json.loads((ckpt / MARKER).read_text()).get("fingerprint", {})
    changed = {}
    if old.get("data") != fp["data"]:
        changed["data"] = f"{_short(old.get('data'))} -> {_short(fp['data'])}"
    if old.get("config") != fp["config"]:
        changed["config"] = rundir.differences(old.get("config") or {}, fp["config"])
    if old.get("code") != fp["code"]:
        changed["code"] = f"{_code(old.get('code'))} -> {_code(fp['code'])}"
    if changed:
        raise CheckpointMismatch(
            f"{ckpt} was written by a run of other {' and '.join(changed)} ("
            + "; ".join(f"{k}: {v}" for k, v in changed.items()) + "): resuming would splice two runs into one "
            "history; rerun with what it was written with, or train.resume=false to start afresh (the checkpoints "
            "are set aside, not deleted)")


def _short(data: dict | None) -> str:
    if not data:
        return "unknown"
    digest = data.get("tokens_sha256")
    return f"{data.get('kind')} tokens {digest[:12]}" if digest else ", ".join(f"{k}={v}" for k, v in data.items())


def _code(code: dict | None) -> str:
    code = code or {}
    sha = code.get("git")
    return f"lorabench {code.get('lorabench')}" + (f" at {sha[:10]}" if sha else "")


def find(ckpt_dir: Path, fp: dict, resume: bool) -> Path | None:
    """The checkpoint to resume from: in a cell's one process it is chosen here, unusable ones set aside and its
    fingerprint checked (prepare); each rank of a multi-process cell takes the one its launcher chose
    (lorabench.run.distributed)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return newest_complete(ckpt_dir) if resume else None
    return prepare(ckpt_dir, fp, resume)
