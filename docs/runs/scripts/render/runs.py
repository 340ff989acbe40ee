"""Reading the committed run dirs under docs/runs: a cell, a search's best cells, the command a sweep ran, the GPU
and software it ran on. Every figure the pages print comes through here, from the files the runs wrote."""
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from lorabench.core.results import CellResult, load_searches, read_result
from lorabench.report.analysis import layout_name, md_table  # noqa: F401  (md_table: the sections' one table form)

RUNS = Path(__file__).resolve().parents[2]  # docs/runs
DOCS = RUNS.parent
REPO = DOCS.parent


def cell(path: str) -> CellResult:
    """One cell below docs/runs: a cell dir, or a one-cell sweep (its cell in 0/)."""
    d = RUNS / path
    d = d / "0" if (d / "0").is_dir() else d
    r = read_result(d / "metrics.json")
    r.dir = str(d)
    return r


def tok(r: CellResult) -> float:
    """The headline: non-pad tokens per second over the timed steps."""
    return r.metrics["perf/tokens_per_s"]


@dataclass
class Best:
    """A backend's best of one search: its fastest ok cell, and how the search went."""

    backend: str
    cell: CellResult
    measured: int  # cells the search ran
    skipped: int  # cells it ruled out without a model load (a smaller one ran out of memory, say)
    cut_short: str  # why the search stopped before it was done ("" where it finished)

    @property
    def layout(self) -> str:
        return layout_name(self.cell)


def bests(sweep: str) -> dict[str, Best]:
    """{backend: its best} of an `+experiment=tune` sweep, from its search.json and its numbered cell dirs."""
    out = {}
    for s in load_searches(RUNS / sweep):
        if s.best is not None:
            r = read_result(RUNS / sweep / str(s.best.job) / "metrics.json")
            measured = sum(t.job is not None for t in s.trials)
            out[s.backend] = Best(s.backend, r, measured, len(s.trials) - measured, s.cut_short)
    return out


def asked(error: str | None) -> str | None:
    """What an out-of-memory error says the allocation asked for ("1.75 GiB"), or None."""
    m = re.search(r"Tried to allocate ([\d.]+ [GM]iB)", error or "")
    return m.group(1) if m else None


def failed(sweep: str) -> str:
    """Why every cell of a sweep that measured none failed: its first cell's error line, or the OOMs' peaks."""
    results = [json.loads(p.read_text()) for p in sorted((RUNS / sweep).glob("*/metrics.json"))]
    if not results:
        return "not run"
    if all(r["status"] == "oom" for r in results):
        peaks = ", ".join(f"{r['metrics']['mem/peak_reserved_gib']:.1f}" for r in results)
        more = sorted({a for r in results if (a := asked(r.get("error")))})
        n = len(results)
        return (f"every cell ran out of memory ({n} cell{'s' if n > 1 else ''}, peak reserved {peaks} GiB"
                + (f"; asking for {' or '.join(more)} more)" if more else ")"))
    error = results[0]["error"]
    return re.sub(r"^RuntimeError: rank 0 of 1: |\s*\(torchrun exit code.*$", "", error)


def command(sweep: str, script: str = "train.py") -> str:
    """The command a sweep ran, from Hydra's record of its overrides (multirun.yaml)."""
    task = yaml.safe_load((RUNS / sweep / "multirun.yaml").read_text())["hydra"]["overrides"]["task"]
    return f"python {script} -m " + " ".join(task)


def gpu(r: CellResult) -> str:
    """The GPU a cell ran on, as the driver names it ("NVIDIA H200"), "4 x" where it ran on several."""
    n = r.metrics.get("dist/world_size", 1)
    return (f"{n} x " if n > 1 else "") + r.env["gpu_name"]


def short_gpu(r: CellResult) -> str:
    return gpu(r).replace("NVIDIA ", "").replace(" 80GB HBM3", "")


def commit(r: CellResult) -> str:
    return r.env["git"]["sha"][:7]


def software(r: CellResult) -> str:
    """The versions that set a cell's speed, from its environment record."""
    v = r.env["versions"]
    names = ("torch", "transformers", "peft", "bitsandbytes", "liger-kernel", "triton", "unsloth")
    return ", ".join(f"{k} {v[k]}" for k in names if v.get(k))


def link(path: str) -> str:
    """A markdown link to a path below docs/runs, written from docs/ (where results.md is)."""
    return f"[runs/{path}](runs/{path})"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def spread(xs: list[float]) -> str:
    """Several rounds' ratios as "lowest-highest (median m)", or the one ratio."""
    if len(xs) == 1:
        return ratio(xs[0])
    return f"{min(xs):.2f}-{max(xs):.2f}x (median {statistics.median(xs):.2f}x)"
