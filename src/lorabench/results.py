"""Result files: written atomically, read back into tables.

A cell's run dir holds .hydra/ (composed config and overrides), train.log, steps.jsonl (one line
per optimizer step), metrics.json (the result: status, metrics, resolved config, environment) and,
for a failed cell, error.txt with the traceback.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

from hydra.experimental.callback import Callback

REPO = Path(__file__).resolve().parents[2]
LIBS = ("torch", "transformers", "peft", "accelerate", "bitsandbytes", "hydra-core", "omegaconf",
        "mistral-common", "nvidia-ml-py", "wandb", "liger-kernel", "triton", "unsloth", "unsloth_zoo")


def atomic_write_text(path: Path, text: str) -> None:
    """Write then rename: a reader never sees a half-written file, even if this process dies."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str))


def git_sha() -> dict:
    # A copy of the tree made elsewhere (a container, a remote GPU box) may carry no .git or a
    # stale one: the launcher that made the copy knows the commit and passes it on, and wins.
    if os.environ.get("LORABENCH_GIT_SHA"):
        return {"sha": os.environ["LORABENCH_GIT_SHA"], "dirty": None, "source": "LORABENCH_GIT_SHA"}

    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        sha = git("rev-parse", "--verify", "--quiet", "HEAD")
        if sha:
            return {"sha": sha, "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"sha": None, "dirty": None}


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


# Columns of the summary table: (header, metrics key or top-level key, format)
COLUMNS = [
    ("cell", "cell", "{}"),
    ("status", "status", "{}"),
    ("tok/s non-pad", "perf/tokens_per_s", "{:,.0f}"),
    ("tok/s total", "perf/total_tokens_per_s", "{:,.0f}"),
    ("samples/s", "perf/samples_per_s", "{:.2f}"),
    ("step p50 s", "perf/step_time_p50_s", "{:.3f}"),
    ("MFU %", "perf/mfu_pct", "{:.1f}"),
    ("peak alloc GiB", "mem/peak_allocated_gib", "{:.2f}"),
    ("peak resv GiB", "mem/peak_reserved_gib", "{:.2f}"),
    ("$/1k samples", "cost/usd_per_1k_samples", "{:.4f}"),
    ("$/1M tok", "cost/usd_per_1m_tokens", "{:.3f}"),
    ("loss first->last", "loss", "{}"),
]


def row(result: dict, max_error: int | None = 80) -> dict:
    m = result.get("metrics", {})
    out = {}
    for header, key, fmt in COLUMNS:
        if key == "loss":
            a, b = m.get("train/loss_first"), m.get("train/loss_final")
            v = f"{a:.2f}->{b:.2f}" if a is not None and b is not None else None
        else:
            v = result.get(key, m.get(key))
            v = fmt.format(v) if v is not None else None
        out[header] = v if v is not None else "-"
    if result.get("status") not in ("ok", None):
        out["status"] = f"{result['status']}: {str(result.get('error', ''))[:max_error]}"
    return out


def summary_text(result: dict) -> str:
    """What a finished cell prints: the table row of a training cell, else its metrics one a line."""
    if "train" in result.get("config", {}) or result.get("status") != "ok":
        return markdown_table([result])
    return "\n".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}"
                     for k, v in result["metrics"].items() if v is not None)


def markdown_table(results: list[dict]) -> str:
    """Training cells: the COLUMNS above. Bench cells (no tokens/s): every metric they recorded."""
    if not any("train" in r.get("config", {}) for r in results):
        return metrics_table(results)
    rows = [row(r) for r in results]
    headers = [h for h, _, _ in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r[h] for h in headers) + " |" for r in rows]
    return "\n".join(lines)


def metrics_table(results: list[dict]) -> str:
    keys = [k for k in dict.fromkeys(k for r in results for k in r.get("metrics", {}))
            if not k.startswith("host/") and any(r.get("metrics", {}).get(k) is not None for r in results)]
    fmt = lambda v: "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = ["| metric | " + " | ".join(f"{r.get('cell')} ({r.get('status')})" for r in results) + " |",
             "|" + "---|" * (len(results) + 1)]
    lines += ["| " + k + " | " + " | ".join(fmt(r.get("metrics", {}).get(k)) for r in results) + " |" for k in keys]
    return "\n".join(lines)


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


def load_results(sweep_dir: Path) -> tuple[list[dict], list[Path]]:
    """Every cell's metrics.json below sweep_dir, and the cell dirs without a readable one (still
    running, killed before the result was written, or a file damaged by hand)."""
    results, incomplete = [], []
    for cell in sorted((p for p in Path(sweep_dir).iterdir() if (p / ".hydra").is_dir()),
                       key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name)):
        try:
            results.append(json.loads((cell / "metrics.json").read_text()))
            results[-1]["dir"] = str(cell)  # where it lies now (run_dir is where it ran)
        except (OSError, json.JSONDecodeError):
            incomplete.append(cell)
    return results, incomplete


def write_csv(results: list[dict], path: Path) -> None:
    """One row per cell: its status and error, then every metric (the union of keys over cells)."""
    flat = [{"job_num": r.get("job_num"), "cell": r.get("cell"), "status": r.get("status"), "error": r.get("error"),
             **r.get("metrics", {})} for r in results]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(flat)


class SweepSummary(Callback):
    """Hydra callback: after a multirun, the sweep report over every cell (failed ones included),
    and with logger=wandb an aggregate W&B run (plus, online, a comparison workspace)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        from omegaconf import OmegaConf

        from lorabench.config import LoggerKind, ReportConfig
        from lorabench.loggers import publish_aggregate
        from lorabench.report import write_report

        sweep_dir = Path(config.hydra.sweep.dir)
        report_cfg = OmegaConf.to_object(config.report) if "report" in config else ReportConfig()
        out = write_report(sweep_dir, report_cfg)
        print(f"\nSweep {sweep_dir}:\n{out['markdown']}\n\nReport: {sweep_dir / 'report.html'}")
        if "logger" in config and LoggerKind(config.logger.kind) is LoggerKind.wandb:
            publish_aggregate(config.logger, sweep_dir.name, out["results"], out["keys"], str(sweep_dir))
