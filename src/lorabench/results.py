"""Result files: written atomically, read back into tables.

A cell's run dir holds .hydra/ (composed config and overrides), train.log, steps.jsonl (one line
per optimizer step), metrics.json (the result: status, metrics, resolved config, environment) and,
for a failed cell, error.txt with the traceback.
"""

from __future__ import annotations

import csv
import io
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
        "mistral-common", "nvidia-ml-py", "wandb")


def atomic_write_json(path: Path, obj) -> None:
    """Write then rename: a reader never sees a half-written file, even if this process dies."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def git_sha() -> dict:
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        sha = git("rev-parse", "--verify", "--quiet", "HEAD")
        if sha:
            return {"sha": sha, "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        pass
    # A copy of the tree without .git (a container, a remote GPU box): the launcher may pass it on.
    return {"sha": os.environ.get("LORABENCH_GIT_SHA"), "dirty": None}


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


def row(result: dict) -> dict:
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
        out["status"] = f"{result['status']}: {str(result.get('error', ''))[:60]}"
    return out


def markdown_table(results: list[dict]) -> str:
    rows = [row(r) for r in results]
    headers = [h for h, _, _ in COLUMNS]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r[h] for h in headers) + " |" for r in rows]
    return "\n".join(lines)


def load_results(sweep_dir: Path) -> tuple[list[dict], list[Path]]:
    """Every cell's metrics.json below sweep_dir, and the cell dirs that have none (still running,
    or killed before the result was written)."""
    results, missing = [], []
    for cell in sorted(p for p in Path(sweep_dir).iterdir() if (p / ".hydra").is_dir()):
        f = cell / "metrics.json"
        if f.is_file():
            results.append(json.loads(f.read_text()))
        else:
            missing.append(cell)
    return results, missing


def write_sweep_summary(sweep_dir: Path) -> str:
    """results.md and results.csv in the sweep dir; returns the markdown."""
    sweep_dir = Path(sweep_dir)
    results, missing = load_results(sweep_dir)
    results.sort(key=lambda r: r.get("job_num", 0))
    md = markdown_table(results)
    if missing:
        md += "\n\nNo result (incomplete): " + ", ".join(p.name for p in missing)
    seq_lens = {r.get("config", {}).get("seq_len") for r in results}
    if len(seq_lens) > 1:
        md += ("\n\nCells differ in seq_len: samples/s is not comparable across them; compare non-pad "
               "tokens/s.")
    (sweep_dir / "results.md").write_text(md + "\n")
    flat = [{"cell": r.get("cell"), "status": r.get("status"), "error": r.get("error"), **r.get("metrics", {})}
            for r in results]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    w.writerows(flat)
    (sweep_dir / "results.csv").write_text(buf.getvalue())
    return md


class SweepSummary(Callback):
    """Hydra callback: after a multirun, tabulate every cell of the sweep (failed ones included)."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        md = write_sweep_summary(sweep_dir)
        print(f"\nSweep {sweep_dir} ({sweep_dir / 'results.md'}):\n{md}")
