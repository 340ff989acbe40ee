"""A cell's result and where it lives: the typed CellResult, its status and exit code, the run
context the entrypoint hands down, and the result files (written atomically, read back).

A cell's run dir holds .hydra/ (composed config and overrides), train.log, steps.jsonl (one line
per optimizer step), metrics.json (the CellResult: status, metrics, resolved config, environment)
and, for a failed cell, error.txt with the traceback.

This module is the bottom of lorabench's imports: it imports nothing of lorabench.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
LIBS = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "hydra-core", "omegaconf",
        "mistral-common", "nvidia-ml-py", "wandb", "liger-kernel", "triton", "unsloth", "unsloth_zoo")
RESULT_FILE = "metrics.json"
CONFIG_FILE = "cell_config.yaml"  # in a cell dir run by lorabench.distributed: its resolved config, for each rank
CELLS_FILE = "cells.json"  # in a sweep dir: every cell's overrides, written by the preflight


class Status(str, Enum):
    ok = "ok"
    oom = "oom"  # out of device (or host) memory: a measurement, not a fault
    skipped = "skipped"  # not run by design (implied OOM, a backend not installed)
    failed = "failed"  # bad value, bad data, an exception
    interrupted = "interrupted"  # SIGTERM or Ctrl-C before the end; the same command resumes
    running = "running"  # only while the cell runs, or in the file of a cell killed outright


# Process exit codes (README, "Exit codes"). Hydra's own composition errors exit 1.
EXIT_CODES = {Status.ok: 0, Status.failed: 2, Status.oom: 3, Status.interrupted: 4, Status.skipped: 5,
              Status.running: 2}
# A multirun is a measurement: ok, oom and skipped cells are all answers. A failed, interrupted or
# unfinished cell is not.
MEASURED = (Status.ok, Status.oom, Status.skipped)


class CellSkipped(Exception):
    """Raised by a cell that need not run; its result gets status "skipped" and this reason."""


class CellInterrupted(Exception):
    """Raised by a cell stopped on purpose before its end (SIGTERM); status "interrupted"."""


@dataclass
class RunContext:
    """What the entrypoint (train.py, bench.py) knows from Hydra's runtime and the library needs."""

    run_dir: Path
    name: str = "defaults"  # the cell's name: the overrides that set it apart (see cell_name)
    job_num: int = 0
    sweep_dir: Optional[Path] = None  # set in a multirun
    choices: dict = field(default_factory=dict)  # the option of each config group: {"backend": "fast"}

    @property
    def multirun(self) -> bool:
        return self.sweep_dir is not None

    @property
    def group(self) -> str:
        """The W&B group: the sweep's dir name, or the run's."""
        return (self.sweep_dir or self.run_dir).name

    @classmethod
    def from_hydra(cls, hc) -> "RunContext":
        """From Hydra's runtime config (HydraConfig.get(), read by the entrypoint)."""
        from hydra.types import RunMode

        overrides = list(hc.overrides.task)
        choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/") and v is not None}
        if hc.mode != RunMode.MULTIRUN:
            return cls(Path(hc.runtime.output_dir), hc.job.override_dirname or "defaults", 0, None, choices)
        # Absolute, as Hydra makes output_dir: a cell's dir is then found inside it (by_name/ links).
        sweep_dir = Path(hc.sweep.dir).absolute()
        return cls(Path(hc.runtime.output_dir), cell_name(overrides, read_cells(sweep_dir), hc.job.override_dirname),
                   hc.job.num, sweep_dir, choices)


def read_cells(sweep_dir: Path) -> list[list[str]]:
    try:
        return json.loads((Path(sweep_dir) / CELLS_FILE).read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return []


def cell_name(overrides: list[str], cells: list[list[str]], fallback: str = "") -> str:
    """A cell's short name: its overrides of the keys whose value differs between the sweep's
    cells, e.g. "backend=fast,batch=16" (a key set alike in every cell says nothing about this one)."""
    def as_dict(cell):
        return dict(o.split("=", 1) for o in cell if "=" in o)

    mine, every = as_dict(overrides), [as_dict(c) for c in cells]
    varying = {k for k in mine if len({c.get(k) for c in every}) > 1}
    return ",".join(f"{k}={v}" for k, v in sorted(mine.items()) if k in varying) or fallback or "defaults"


@dataclass
class CellResult:
    """One cell's outcome, from the envelope (cell.run) to metrics.json, the loggers and the report."""

    status: Status
    cell: str  # the cell's name (RunContext.name)
    job_num: int = 0
    run_dir: str = ""  # where it ran
    config: dict = field(default_factory=dict)  # the resolved config
    choices: Optional[dict] = None  # the option of each config group (RunContext.choices)
    metrics: dict = field(default_factory=dict)  # namespaced keys with units: perf/tokens_per_s ...
    error: Optional[str] = None  # the whole reason, never cut
    device: Optional[str] = None
    gpu: Optional[dict] = None  # the spec that prices it: name, prices, peak; emulated budget
    model: Optional[dict] = None  # where the weights came from, load time, parameter counts
    dist: Optional[dict] = None  # DDP / multi-node layout
    resumed_from_step: Optional[int] = None
    total_s: Optional[float] = None  # wall time of the whole cell: data, model, training
    env: Optional[dict] = None  # versions, host, GPU, git
    rank: Optional[dict] = None  # a DDP rank's own records for its launcher (rank<r>.json only)
    dir: Optional[str] = None  # where its files lie now (set when read back; not written)

    @property
    def ok(self) -> bool:
        return self.status is Status.ok

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status.value
        d["time/total_s"] = d.pop("total_s")
        for k in ("rank", "dir", "dist", "resumed_from_step", "choices"):
            if d[k] is None:
                d.pop(k)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CellResult":
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in known}
        kw["config"] = _plain_enums(d.get("config", {}))
        kw["status"] = Status(d.get("status", "running"))
        kw.setdefault("cell", "?")
        kw["total_s"] = d.get("time/total_s")
        return cls(**kw)


# Result files written before configs were saved with enum_to_str hold "Precision.nf4" for "nf4".
_ENUM_TEXT = re.compile(r"^(?:Precision|DataKind|OptimizerName|Backend|Schedule|Overlong|Padding|Device|Pricing|"
                        r"LoggerKind|WandbMode|Suite)\.(\w+)$")


def _plain_enums(v):
    if isinstance(v, dict):
        return {k: _plain_enums(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain_enums(x) for x in v]
    m = _ENUM_TEXT.match(v) if isinstance(v, str) else None
    return m.group(1) if m else v


def atomic_write_text(path: Path, text: str) -> None:
    """Write then rename: a reader never sees a half-written file, even if this process dies. The
    file is readable by the group and others (0644 under the usual umask), like any file written."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it 0600
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str))


def write_result(path: Path, result: CellResult) -> None:
    atomic_write_json(path, result.to_dict())


def read_result(path: Path) -> CellResult:
    """A result file read back; ValueError naming the file when it is not a lorabench result (valid
    JSON of another shape: a list, a status no lorabench writes, a field of the wrong type)."""
    d = json.loads(Path(path).read_text())
    try:
        if not isinstance(d, dict) or not isinstance(d.get("config", {}), dict) \
                or not isinstance(d.get("metrics", {}), dict):
            raise TypeError("not an object with a config and metrics")
        return CellResult.from_dict(d)
    except (TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path} is not a lorabench result file ({e})") from None


def git_sha() -> dict:
    # A copy of the tree made elsewhere (a container, a remote GPU box) may carry no .git or a
    # stale one: the launcher that made the copy knows the commit and passes it on, and wins.
    if os.environ.get("LORABENCH_GIT_SHA"):
        return {"sha": os.environ["LORABENCH_GIT_SHA"], "dirty": None, "source": "LORABENCH_GIT_SHA"}
    return dict(_git_head())


@functools.lru_cache(maxsize=1)  # one process runs one commit: a multirun's cells need not ask git each
def _git_head() -> tuple:
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        sha = git("rev-parse", "--verify", "--quiet", "HEAD")
        if sha:
            return (("sha", sha), ("dirty", bool(git("status", "--porcelain"))))
    except (OSError, subprocess.SubprocessError):
        pass
    return (("sha", None), ("dirty", None))


def env_info(device=None) -> dict:
    import torch

    versions = {}
    for lib in LIBS:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    info = {"python": platform.python_version(), "platform": platform.platform(), "host": platform.node(),
            "cpu_count": os.cpu_count(), "versions": versions, "git": git_sha(),
            "cuda": torch.version.cuda, "device": str(device) if device is not None else None}
    if device is not None and device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu_name=props.name, gpu_count=torch.cuda.device_count(),
                    gpu_memory_gib=props.total_memory / 2**30, gpu_capability=f"{props.major}.{props.minor}")
    return info


def flatten(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists become tuples (hashable, comparable)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = tuple(v) if isinstance(v, list) else v
    return out


def cell_dirs(sweep_dir: Path) -> list[Path]:
    """The cell dirs of a sweep (those with Hydra's .hydra folder), numbered ones in job order."""
    return sorted((p for p in Path(sweep_dir).iterdir() if (p / ".hydra").is_dir()),
                  key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))


def load_cells(path: Path) -> list[CellResult]:
    """The readable results of a sweep dir, or the result of one run dir."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{str(path)!r} is not a directory")
    if (path / RESULT_FILE).is_file():
        return [read_result(path / RESULT_FILE)]
    return load_results(path)[0]


def load_results(sweep_dir: Path) -> tuple[list[CellResult], list[Path]]:
    """Every cell's result below sweep_dir, and the cell dirs without a readable one (still
    running, killed before the result was written, or a file damaged by hand)."""
    results, incomplete = [], []
    for cell in cell_dirs(sweep_dir):
        try:
            r = read_result(cell / RESULT_FILE)
        except (OSError, ValueError, TypeError):
            incomplete.append(cell)
            continue
        r.dir = str(cell)  # where it lies now (run_dir is where it ran)
        results.append(r)
    return results, incomplete
