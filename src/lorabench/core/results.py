"""A cell's result and where it lives: the typed CellResult, its status and exit code, the run
context the entrypoint hands down, and the result files (written atomically, read back).

A cell's run dir holds .hydra/ (composed config and overrides), train.log, steps.jsonl (one line
per optimizer step), metrics.json (the CellResult: status, metrics, resolved config, environment)
and, for a failed cell, error.txt with the traceback.

This module is the bottom of lorabench's imports: it imports nothing of lorabench.
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import platform
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[3]
LIBS = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "hydra-core", "omegaconf",
        "mistral-common", "nvidia-ml-py", "wandb", "liger-kernel", "triton", "unsloth", "unsloth_zoo")
RESULT_FILE = "metrics.json"
CONFIG_FILE = "cell_config.yaml"  # in a cell dir run by lorabench.run.distributed: its resolved config, for each rank
SEARCH_SWEEPER = "lorabench_search.BudgetSearch"  # hydra.sweeper._target_ of a search (+experiment=tune)
CELLS_FILE = "cells.json"  # in a sweep dir: every cell's overrides, written by the preflight
# An out-of-memory error's first words where the model's build ran out (its weights, adapters and upcasts, before the
# training loop): no batch or layout of a search holds less (lorabench.sweep.sweeper.at_load)
OOM_AT_BUILD = "while the model was built: "


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
    search: bool = False  # a search's multirun (+experiment=tune, max_context): it picks each next cell as it goes

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
        search = str(hc.sweeper.get("_target_", "")).endswith(SEARCH_SWEEPER)
        return cls(Path(hc.runtime.output_dir), cell_name(overrides, read_cells(sweep_dir), hc.job.override_dirname),
                   hc.job.num, sweep_dir, choices, search)


def read_cells(sweep_dir: Path) -> list[list[str]]:
    try:
        return json.loads((Path(sweep_dir) / CELLS_FILE).read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return []


def search_last_job(sweep_dir: Path) -> int | None:
    """The job number of a search's last cell, once the search launches the cell that spends its cap on the
    command's last outer cell (cells.json's "last_job"); None before, and in a sweep of a list."""
    try:
        return json.loads((Path(sweep_dir) / CELLS_FILE).read_text()).get("last_job")
    except (OSError, ValueError, AttributeError):
        return None


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


DISK_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS)


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


def cannot_write(path: Path, e: OSError) -> str:
    """Why the directory `path` cannot be made or written, and what to do, as the end of one line."""
    path = Path(path)
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None or e.errno in (errno.ENOTDIR, errno.EEXIST):
        what = f"{blocker} is a file, not a directory" if blocker is not None else e.strerror
        return f"cannot write there ({what}); choose another directory"
    if e.errno == errno.EROFS:
        return "cannot write there (read-only file system); choose a directory on a writable one"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"cannot write there ({e.strerror}); choose a directory you can write to"
    if e.errno in DISK_ERRNOS:
        return f"cannot write there ({e.strerror}; {free_space(path)}); free some space or choose another directory"
    return f"cannot write there ({e.strerror or e}); choose another directory"


def strict(record: dict) -> dict:
    """`record` as strict JSON takes it: a NaN or infinite value (a diverged loss, its gradient norm) becomes
    null, and the line says which and why ("status": "nonfinite", "nonfinite": {"loss": "nan"}); Python's
    bare NaN is not JSON, and parsers other than Python's (jq, JavaScript, Go) refuse the line."""
    bad = {k: repr(v) for k, v in record.items() if isinstance(v, float) and not math.isfinite(v)}
    if not bad:
        return record
    return {**{k: None if k in bad else v for k, v in record.items()}, "status": "nonfinite", "nonfinite": bad}


def unstrict(record: dict) -> dict:
    """A line written by `strict`, its NaN and infinite values back as Python's floats (for sums and plots)."""
    record.update({k: float(v) for k, v in (record.get("nonfinite") or {}).items()})
    return record


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


def is_sweep_dir(path: Path) -> bool:
    """Whether `path` is the dir of a sweep lorabench ran: it holds the preflight's cells.json, or the
    multirun.yaml Hydra wrote for train.py or bench.py (its help names the app: lorabench, lorabench-bench),
    or every cell in it ran there (its result's run_dir: a Kubernetes sweep's pods run one cell each into
    it, without a preflight). A copy of cells run elsewhere is none of these."""
    path = Path(path)
    try:
        if isinstance(json.loads((path / CELLS_FILE).read_text()).get("cells"), list):
            return True
    except (OSError, ValueError, AttributeError):
        pass
    try:
        if re.search(r"^\s+app_name: lorabench\b", (path / "multirun.yaml").read_text(), re.M):
            return True
    except OSError:
        pass
    here = os.path.realpath(path)
    ran = [r.run_dir and os.path.dirname(os.path.realpath(r.run_dir)) for r in load_results(path)[0]]
    return bool(ran) and all(d == here for d in ran)


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


# ---------------------------------------------------------------------------- search.json
# +experiment=tune's record of each search (written by lorabench.sweep.search, read by the report).
SEARCH_FILE = "search.json"


@dataclass
class Trial:
    """One cell the search considered: measured (job set) or skipped without a model load (reason)."""

    layout: str
    batch: Optional[int]
    status: str
    tok_s: Optional[float] = None
    peak_gib: Optional[float] = None
    job: Optional[int] = None
    reason: str = ""
    tok_s_p50: Optional[float] = None
    seq_len: Optional[int] = None  # a max-context search's probe: the row's length (its batch is 1)

    def name(self) -> str:
        if self.seq_len:
            return f"seq {self.seq_len:,} {self.layout}"
        return f"b{self.batch} {self.layout}" if self.batch else self.layout


@dataclass
class Ceiling:
    """A max-context search's answer for one backend (lorabench.sweep.context): the longest seq_len that trained at
    batch 1 within the budget and the shortest that ran out of memory, within the search's resolution."""

    layout: str
    longest_ok: Optional[int]  # tokens a row; None: nothing fitted
    shortest_oom: Optional[int]  # None: no length asked ran out of memory
    limit: int  # the longest asked: search.max_seq_len or the model's window, the shorter
    resolution: int  # tokens: how close the two had to come
    stop: str  # why the search ended
    tok_s: Optional[float] = None  # non-pad tokens/s at longest_ok
    peak_gib: Optional[float] = None  # measured there (mem/peak_reserved_gib)
    job: Optional[int] = None  # its cell
    # the memory model at longest_ok, GiB by part (lorabench.sweep.memory.Breakdown.as_dict), and its refit
    # (the measured peaks' scale of its per-token part)
    memory: dict = field(default_factory=dict)
    refit: Optional[float] = None


@dataclass
class SearchRecord:
    """One outer cell's search, as search.json holds it and the report reads it."""

    name: str  # the outer cell, by the overrides that set it apart (backend=fast)
    outer: list[str]
    backend: str
    budget_gib: Optional[float]
    seq_len: int
    max_cells: int
    trials: list[Trial]
    best: Optional[Trial]
    why: str
    stops: dict
    dropout_zero: list[Trial] = field(default_factory=list)
    cut_short: str = ""  # (Outcome.cut_short) the best is of the cells measured before the sweep stopped
    target: str = "throughput"  # or "max_context" (search.target)
    ceiling: Optional[Ceiling] = None  # target max_context: the longest context found

    @classmethod
    def from_dict(cls, d: dict) -> "SearchRecord":
        trial = lambda t: Trial(**t) if t else None  # noqa: E731
        ceiling = Ceiling(**d["ceiling"]) if d.get("ceiling") else None
        return cls(**{**d, "trials": [trial(t) for t in d["trials"]], "best": trial(d.get("best")),
                      "dropout_zero": [trial(t) for t in d.get("dropout_zero", [])], "ceiling": ceiling})


def write_searches(sweep_dir: Path, records: list[SearchRecord]) -> None:
    atomic_write_json(Path(sweep_dir) / SEARCH_FILE, {"searches": [asdict(r) for r in records]})


def load_searches(sweep_dir: Path) -> list[SearchRecord]:
    """The searches of a sweep dir (none for a plain sweep, or a search.json that cannot be read)."""
    import json

    try:
        return [SearchRecord.from_dict(d) for d in json.loads((Path(sweep_dir) / SEARCH_FILE).read_text())["searches"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []
