"""The sweep report: every cell's metrics.json -> results.csv, results.md, plots/*.png, report.html.

Written at the end of every multirun (Hydra callback) and on demand with
`python bench.py suite=report sweep_dir=<dir>`, which also works on a sweep still running or
killed part-way: cells without a readable metrics.json are listed as incomplete.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections import defaultdict
from pathlib import Path
from statistics import median

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from lorabench.config import ReportConfig  # noqa: E402
from lorabench.profile import CATEGORIES  # noqa: E402
from lorabench.results import COLUMNS, flatten, load_results, markdown_table, row, write_csv  # noqa: E402

IGNORED_KEYS = ("data.cache_dir", "logger.", "model.path")  # never a knob worth a line
STATUS_COLOR = {"ok": "#4c72b0", "oom": "#c44e52", "failed": "#8c8c8c", "skipped": "#e8a0a2"}
CATEGORY_COLOR = {"matmul": "#4c72b0", "dequant": "#dd8452", "attention": "#55a868", "elementwise": "#8172b3",
                  "loss": "#c44e52", "optimizer": "#937860", "data": "#da8bc3", "idle": "#cccccc"}


def swept_keys(results: list[dict]) -> list[str]:
    """Config keys whose value differs between cells: the sweep's axes."""
    flats = [flatten(r.get("config", {})) for r in results]
    keys = sorted(set().union(*flats)) if flats else []
    return [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1 and not k.startswith(IGNORED_KEYS)]


def label(result: dict, keys: list[str]) -> str:
    """A short name for a cell: its values of the swept keys (else the override string)."""
    flat = flatten(result.get("config", {}))
    if keys:
        return ",".join(f"{k.split('.')[-1]}={flat.get(k)}" for k in keys)
    return result.get("cell", "?")


def knob_effects(results: list[dict], keys: list[str]) -> list[dict]:
    """For each swept key, the pairs of ok cells that differ in that key alone: the median change of
    non-pad tokens/s (as a ratio) and of peak reserved memory (GiB) from one value to the other."""
    ok = [r for r in results if r.get("status") == "ok" and "perf/tokens_per_s" in r.get("metrics", {})]
    flats = [flatten(r["config"]) for r in ok]

    def order(v):  # numbers ascending, anything else by its text
        return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, repr(v))

    effects = defaultdict(list)
    for i in range(len(ok)):
        for j in range(i + 1, len(ok)):
            diff = [k for k in keys if flats[i].get(k) != flats[j].get(k)]
            # One knob: one key, or several keys of one group changed together (lora=r8: r and alpha).
            if not diff or len({k.split(".")[0] for k in diff}) != 1:
                continue
            k = diff[0] if len(diff) == 1 else diff[0].split(".")[0]

            def value(f, k=k, diff=diff):
                return f.get(k) if len(diff) == 1 else ",".join(f"{d.split('.', 1)[1]}={f.get(d)}" for d in diff)

            lo, hi = (i, j) if order(value(flats[i])) <= order(value(flats[j])) else (j, i)
            ma, mb = ok[lo]["metrics"], ok[hi]["metrics"]
            tok = mb["perf/tokens_per_s"] / ma["perf/tokens_per_s"]
            mem = mb.get("mem/peak_reserved_gib", math.nan) - ma.get("mem/peak_reserved_gib", math.nan)
            effects[(k, value(flats[lo]), value(flats[hi]))].append((tok, mem))
    out = []
    for (k, va, vb), pairs in effects.items():
        tok = median(p[0] for p in pairs)
        mems = [p[1] for p in pairs if not math.isnan(p[1])]
        out.append({"key": k, "from": va, "to": vb, "pairs": len(pairs), "tokens_ratio": tok,
                    "mem_delta_gib": median(mems) if mems else None})
    return sorted(out, key=lambda e: -abs(math.log(e["tokens_ratio"])))


def sentence(e: dict) -> str:
    change = (e["tokens_ratio"] - 1) * 100
    mem = "" if e["mem_delta_gib"] is None else f", peak reserved memory {e['mem_delta_gib']:+.2f} GiB"
    return (f"{e['key']} {e['from']} -> {e['to']}: non-pad tokens/s {change:+.1f}%{mem} "
            f"(median of {e['pairs']} pair{'s' if e['pairs'] > 1 else ''} of cells differing only in it).")


def bottleneck_table(results: list[dict], keys: list[str]) -> str:
    """Where each profiled cell's step time goes (train.profile_steps > 0): % per category."""
    rows = [r for r in results if "prof/step_ms" in r.get("metrics", {})]
    if not rows:
        return ""
    # The profiler slows a step down (host-side bookkeeping per kernel launch): its overhead against
    # the timed steps' median says how much of "idle" the profiling itself added.
    lines = ["| cell | profiled step ms | timed step p50 ms | " + " | ".join(f"{c} %" for c in CATEGORIES) + " | top |",
             "|" + "---|" * (len(CATEGORIES) + 4)]
    for r in rows:
        m = r["metrics"]
        p50 = m.get("perf/step_time_p50_s")
        lines.append(f"| {label(r, keys)} | {m['prof/step_ms']:.1f} | {'-' if p50 is None else f'{1e3 * p50:.1f}'} | "
                     + " | ".join(f"{100 * m[f'prof/{c}_frac']:.1f}" for c in CATEGORIES) + f" | {m['prof/top']} |")
    return "\n".join(lines)


def scaling_table(results: list[dict], keys: list[str]) -> str:
    """Multi-GPU cells against the 1-process cell with the same configuration otherwise: global
    non-pad tokens/s, per GPU, and the scaling efficiency tok/s(N) / (N x tok/s(1))."""
    if "train.nproc" not in keys:
        return ""
    ok = [r for r in results if r.get("status") == "ok" and "perf/tokens_per_s" in r.get("metrics", {})]

    def rest(r):
        return {k: v for k, v in flatten(r["config"]).items() if k != "train.nproc"}

    lines = ["| cell | GPUs | tok/s non-pad | per GPU | efficiency vs 1 | peak resv GiB (largest rank) |",
             "|---|---|---|---|---|---|"]
    for r in ok:
        n = r["config"]["train"]["nproc"]
        one = next((o for o in ok if o["config"]["train"]["nproc"] == 1 and rest(o) == rest(r)), None)
        tok = r["metrics"]["perf/tokens_per_s"]
        eff = f"{100 * tok / (n * one['metrics']['perf/tokens_per_s']):.1f}%" if one else "no 1-GPU cell"
        mem = r["metrics"].get("mem/peak_reserved_gib")
        lines.append(f"| {label(r, keys)} | {n} | {tok:,.0f} | {tok / n:,.0f} | {eff} | "
                     f"{'-' if mem is None else f'{mem:.2f}'} |")
    return "\n".join(lines)


# What the backend comparison varies within one group of comparable cells.
BACKEND_AXES = ("backend.", "batch", "train.checkpoint_fraction")


def _group(r: dict, axes=BACKEND_AXES) -> tuple:
    """The cell's configuration without the given axes (and without what never matters)."""
    return tuple(sorted((k, str(v)) for k, v in flatten(r["config"]).items()
                        if not k.startswith(tuple(axes)) and not k.startswith(IGNORED_KEYS)))


def backend_table(results: list[dict], keys: list[str]) -> str:
    """Per group of otherwise equal cells (e.g. per GPU memory budget): each backend's fastest cell
    against the reference, hf at its smallest batch with every layer checkpointed (the seed's recipe).
    tok/s is the timed window's (every timed step); "at p50" = mean non-pad tokens per step over the
    median step time, which a one-off slow step (a kernel built mid-run) does not move."""
    if not any(k.startswith("backend.") for k in keys):
        return ""
    ok = [r for r in results if r.get("status") == "ok" and "perf/tokens_per_s" in r.get("metrics", {})]
    lines = ["| group | backend | best cell: batch, ckpt fraction | tok/s non-pad | at p50 | MFU % | peak resv GiB "
             "| x hf seed cell | x at p50 |", "|---|---|---|---|---|---|---|---|---|"]
    groups = {}
    for r in ok:
        groups.setdefault(_group(r), []).append(r)
    for n, cells in enumerate(groups.values(), 1):
        ref = min((r for r in cells if r["config"]["backend"]["name"] == "hf"
                   and r["config"]["train"]["checkpoint_fraction"] == 1),
                  key=lambda r: r["config"]["batch"], default=None)
        gpu = cells[0]["config"]["gpu"]["name"]
        for name in dict.fromkeys(r["config"]["backend"]["name"] for r in cells):
            best = max((r for r in cells if r["config"]["backend"]["name"] == name),
                       key=lambda r: r["metrics"]["perf/tokens_per_s"])
            m = best["metrics"]
            tok, p50 = (m["perf/tokens_per_s"], p50_tokens_per_s(m))
            ratio = f"{tok / ref['metrics']['perf/tokens_per_s']:.2f}" if ref else "no hf reference"
            ratio50 = f"{p50 / p50_tokens_per_s(ref['metrics']):.2f}" if ref else "-"
            lines.append(f"| {n} (gpu={gpu}) | {name} | {best['config']['batch']}, "
                         f"{best['config']['train']['checkpoint_fraction']:g} | {tok:,.0f} | {p50:,.0f} | "
                         f"{_num(m.get('perf/mfu_pct'), '.1f')} | {_num(m.get('mem/peak_reserved_gib'), '.2f')} | "
                         f"{ratio} | {ratio50} |")
        if ref:
            lines.append(f"| {n} (gpu={gpu}) | reference | hf, batch {ref['config']['batch']}, every layer | "
                         f"{ref['metrics']['perf/tokens_per_s']:,.0f} | {p50_tokens_per_s(ref['metrics']):,.0f} | "
                         f"{_num(ref['metrics'].get('perf/mfu_pct'), '.1f')} | "
                         f"{_num(ref['metrics'].get('mem/peak_reserved_gib'), '.2f')} | 1.00 | 1.00 |")
    return "\n".join(lines)


def _num(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def p50_tokens_per_s(m: dict) -> float:
    return m["count/tokens_nonpad"] / m["count/timed_steps"] / m["perf/step_time_p50_s"]


def read_losses(r: dict) -> dict[int, float]:
    try:
        return {s["step"]: s["loss"] for s in map(json.loads, (Path(r["dir"]) / "steps.jsonl").read_text().splitlines())
                if "loss" in s}
    except (OSError, KeyError, json.JSONDecodeError):
        return {}


def loss_curves(results: list[dict], keys: list[str]) -> tuple | None:
    """When only the backend (and the checkpointed fraction, and the backend's own options) vary, the
    cells trained on the same batches: ((reference cell, its curve), [(cell, curve)...]), the reference
    being the first backend=hf cell (or the first cell); None otherwise."""
    backend_keys = [k for k in keys if k.startswith("backend.")]
    if not backend_keys or set(keys) - set(backend_keys) - {"train.checkpoint_fraction"}:
        return None
    curves = [(r, read_losses(r)) for r in results if r.get("status") == "ok"]
    curves = [(r, c) for r, c in curves if c]
    if len(curves) < 2:
        return None
    return next(((r, c) for r, c in curves if r["config"]["backend"]["name"] == "hf"), curves[0]), curves


def loss_match_table(keys: list[str], found: tuple | None) -> str:
    """Do the loss curves agree? Each cell's per-step loss against the reference's (loss_curves) at
    every common step: the largest and the mean absolute difference, and the mean relative one."""
    if found is None:
        return ""
    (ref, ref_c), curves = found
    lines = [f"Against {label(ref, keys)}:", "",
             "| cell | steps compared | max abs diff | mean abs diff | mean rel diff | last loss |",
             "|---|---|---|---|---|---|"]
    for r, c in curves:
        if r is ref:
            continue
        common = sorted(set(c) & set(ref_c))
        d = [abs(c[s] - ref_c[s]) for s in common]
        rel = [abs(c[s] - ref_c[s]) / abs(ref_c[s]) for s in common]
        lines.append(f"| {label(r, keys)} | {len(common)} | {max(d):.4f} | {sum(d) / len(d):.4f} | "
                     f"{100 * sum(rel) / len(rel):.2f}% | {c[common[-1]]:.4f} (ref {ref_c[common[-1]]:.4f}) |")
    return "\n".join(lines)


def fit_grid(results: list[dict], keys: list[str]) -> dict | None:
    """When a sweep varies seq_len or batch and nothing else: {(seq_len, batch): result}."""
    if not keys or not set(keys) <= {"seq_len", "batch"}:
        return None
    return {(r["config"]["seq_len"], r["config"]["batch"]): r for r in results}


def fit_table(grid: dict) -> str:
    """Largest batch that ran per seq_len, with its peak memory and throughput."""
    lines = ["| seq_len | largest batch that fits | peak resv GiB | tok/s non-pad | first batch that does not |",
             "|---|---|---|---|---|"]
    for seq in sorted({s for s, _ in grid}):
        row_ = sorted((b, r) for (s, b), r in grid.items() if s == seq)
        fits = [(b, r) for b, r in row_ if r.get("status") == "ok"]
        over = [b for b, r in row_ if r.get("status") in ("oom", "skipped")]
        if fits:
            b, r = fits[-1]
            m = r["metrics"]
            mem = m.get("mem/peak_reserved_gib")
            lines.append(f"| {seq} | {b} | {'-' if mem is None else f'{mem:.2f}'} | {m['perf/tokens_per_s']:,.0f} | "
                         f"{min(over) if over else 'none tried'} |")
        else:
            lines.append(f"| {seq} | none | - | - | {min(over) if over else '-'} |")
    return "\n".join(lines)


def projection(r: dict, cfg: ReportConfig) -> dict | None:
    """Time and cost to train on cfg.dataset_samples samples at this cell's measured rate."""
    m = r.get("metrics", {})
    if r.get("status") != "ok" or not m.get("perf/samples_per_s"):
        return None
    hours = cfg.dataset_samples / m["perf/samples_per_s"] / 3600
    tokens = cfg.dataset_samples * m["count/tokens_nonpad"] / m["count/samples"]
    out = {"hours": hours, "tokens": tokens, "usd": hours * m["cost/usd_per_hour"] if "cost/usd_per_hour" in m else None}
    if cfg.reference_usd_per_1m_tokens is not None:
        out["reference_usd"] = tokens / 1e6 * cfg.reference_usd_per_1m_tokens
    return out


# ---------------------------------------------------------------------------- plots

def _bars(ax, names, values, colors, fmt="{:,.0f}"):
    y = range(len(names))
    ax.barh(list(y), [0 if v is None else v for v in values], color=colors)
    ax.set_yticks(list(y), names, fontsize=8)
    ax.invert_yaxis()
    for i, v in enumerate(values):
        ax.text(0 if v is None else v, i, " -" if v is None else " " + fmt.format(v), va="center", fontsize=7)
    finite = [v for v in values if v is not None and math.isfinite(v)]
    lo, hi = min(finite + [0]), max(finite + [0])
    ax.set_xlim(lo - 0.2 * (hi - lo) if lo < 0 else 0, hi + 0.2 * (hi - lo) or 1)  # room for the labels


def make_plots(results: list[dict], keys: list[str], effects: list[dict], cfg: ReportConfig,
               out_dir: Path, curves: tuple | None = None) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [label(r, keys) for r in results]
    colors = [STATUS_COLOR.get(r.get("status"), "#8c8c8c") for r in results]
    m = [r.get("metrics", {}) for r in results]
    height = 1.2 + 0.35 * len(results)
    plots = {}

    def save(fig, name, title):
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        plots[name] = path

    if not any("perf/tokens_per_s" in x for x in m):
        return plots  # bench cells: their numbers are in the tables
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, height))
    _bars(a, names, [x.get("perf/tokens_per_s") for x in m], colors)
    a.set_xlabel("non-pad tokens/s")
    _bars(b, names, [x.get("perf/samples_per_s") for x in m], colors, "{:.2f}")
    b.set_xlabel("samples/s" + (" (not comparable across seq_len)" if any(k == "seq_len" for k in keys) else ""))
    save(fig, "throughput", "Throughput per cell (grey: failed, red: out of memory)")

    if curves is not None:  # cells trained on the same batches (loss_curves): their curves overlay
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
        (_, ref), cells = curves
        for r, c in cells:
            steps = sorted(set(c) & set(ref))
            a.plot(steps, [c[s] for s in steps], lw=1, label=label(r, keys))
            b.plot(steps, [c[s] - ref[s] for s in steps], lw=1)
        a.set_xlabel("optimizer step")
        a.set_ylabel("training loss")
        a.legend(fontsize=7)
        b.axhline(0, color="k", lw=0.8)
        b.set_xlabel("optimizer step")
        b.set_ylabel("loss - reference cell's loss")
        save(fig, "loss", "Loss curves on the same batches")

    base = baseline(results, cfg)
    if base is not None:
        ref = base["metrics"]["perf/tokens_per_s"]
        fig, ax = plt.subplots(figsize=(7, height))
        _bars(ax, names, [x["perf/tokens_per_s"] / ref if "perf/tokens_per_s" in x else None for x in m], colors,
              "{:.2f}x")
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel(f"non-pad tokens/s relative to {label(base, keys)}")
        save(fig, "speedup", "Speedup against the baseline cell")

    if any("mem/peak_reserved_gib" in x for x in m):
        fig, ax = plt.subplots(figsize=(7, height))
        _bars(ax, names, [x.get("mem/peak_reserved_gib") for x in m], colors, "{:.1f} GiB")
        caps = {x.get("mem/budget_gib") or x.get("mem/device_total_gib") for x in m} - {None}
        for cap in caps:
            ax.axvline(cap, color="#c44e52", ls="--", lw=1)
            ax.text(cap, -0.6, f" capacity {cap:.1f} GiB", color="#c44e52", fontsize=7)
        ax.set_xlim(0, 1.2 * max([*caps, *[x.get("mem/peak_reserved_gib") or 0 for x in m]]))
        ax.set_xlabel("peak reserved GiB (PyTorch caching allocator)")
        save(fig, "memory", "Peak memory against the GPU's capacity")

    if any("cost/usd_per_1k_samples" in x for x in m):
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, height))
        _bars(a, names, [x.get("cost/usd_per_1k_samples") for x in m], colors, "${:.3f}")
        a.set_xlabel("USD per 1K samples")
        _bars(b, names, [x.get("cost/usd_per_1m_tokens") for x in m], colors, "${:.3f}")
        b.set_xlabel("USD per 1M non-pad tokens")
        save(fig, "cost", "Cost per cell at its GPU's hourly price")

    proj = [projection(r, cfg) for r in results]
    if any(p and p["usd"] is not None for p in proj):
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, height))
        _bars(a, names, [p["hours"] if p else None for p in proj], colors, "{:.2f} h")
        a.set_xlabel(f"hours for {cfg.dataset_samples:,} samples")
        _bars(b, names, [p["usd"] if p else None for p in proj], colors, "${:.2f}")
        if cfg.reference_usd_per_1m_tokens is not None:
            refs = [p["reference_usd"] if p else None for p in proj]
            b.barh([i + 0.3 for i in range(len(refs))], [r or 0 for r in refs], height=0.3, color="#dd8452",
                   label=f"{cfg.reference_name}: ${cfg.reference_usd_per_1m_tokens}/1M tokens, same tokens")
            for i, r in enumerate(refs):
                if r is not None:
                    b.text(r, i + 0.3, f" ${r:.2f}", va="center", fontsize=7, color="#dd8452")
            top = max([r for r in refs if r] + [p["usd"] for p in proj if p and p["usd"]])
            b.set_xlim(0, top * 1.25)
            b.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18 - 0.4 / len(proj)))
        b.set_xlabel(f"USD for {cfg.dataset_samples:,} samples")
        save(fig, "projection", f"Time and cost projected for {cfg.dataset_samples:,} samples")

    prof = [(n, x) for n, x in zip(names, m) if "prof/step_ms" in x]
    if prof:
        fig, ax = plt.subplots(figsize=(11, 1.6 + 0.35 * len(prof)))
        left = [0.0] * len(prof)
        for c in CATEGORIES:
            share = [100 * x[f"prof/{c}_frac"] for _, x in prof]
            ax.barh(range(len(prof)), share, left=left, color=CATEGORY_COLOR[c], label=c)
            for i, (v, l0) in enumerate(zip(share, left)):
                if v >= 6:  # label the slices wide enough to hold one
                    ax.text(l0 + v / 2, i, f"{v:.0f}", ha="center", va="center", fontsize=7)
            left = [a + b for a, b in zip(left, share)]
        ax.set_yticks(range(len(prof)), [f"{n} ({x['prof/step_ms']:.0f} ms)" for n, x in prof], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 100)
        ax.set_xlabel("% of the profiled step time (torch.profiler; device work, then device idle)")
        ax.legend(ncol=len(CATEGORIES), fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        save(fig, "bottleneck", "Where the step time goes")

    grid = fit_grid(results, keys)
    if grid:
        seqs, batches = sorted({s for s, _ in grid}), sorted({b for _, b in grid})
        fig, ax = plt.subplots(figsize=(1.5 + 1.1 * len(batches), 1.2 + 0.6 * len(seqs)))
        for i, seq in enumerate(seqs):
            for j, b in enumerate(batches):
                r = grid.get((seq, b))
                status = r.get("status") if r else None
                mem = (r or {}).get("metrics", {}).get("mem/peak_reserved_gib")
                text = {"ok": f"{mem:.1f} GiB" if mem is not None else "fits", "oom": "OOM",
                        "skipped": "OOM\n(implied)", "failed": "failed", None: "-"}.get(status, status)
                color = {"ok": "#b8d8be", "oom": "#f2b8ba", "skipped": "#f8dcdd"}.get(status, "#eeeeee")
                ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=color, edgecolor="white"))
                ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=8)
        ax.set_xlim(0, len(batches))
        ax.set_ylim(len(seqs), 0)
        ax.set_xticks([j + 0.5 for j in range(len(batches))], batches)
        ax.set_yticks([i + 0.5 for i in range(len(seqs))], seqs)
        ax.set_xlabel("batch")
        ax.set_ylabel("seq_len")
        cap = {x.get("mem/budget_gib") or x.get("mem/device_total_gib") for x in m} - {None}
        save(fig, "fit", "What fits" + (f" in {max(cap):.0f} GiB" if cap else "") + " (peak reserved memory)")

    if effects:
        names_e = [f"{e['key']}: {e['from']} -> {e['to']}" for e in effects]
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 1.2 + 0.4 * len(effects)))
        tok = [(e["tokens_ratio"] - 1) * 100 for e in effects]
        _bars(a, names_e, tok, ["#55a868" if t >= 0 else "#c44e52" for t in tok], "{:+.1f}%")
        a.axvline(0, color="k", lw=0.8)
        a.set_xlabel("change in non-pad tokens/s")
        mem = [e["mem_delta_gib"] for e in effects]
        _bars(b, names_e, mem, ["#8172b3"] * len(effects), "{:+.2f} GiB")
        b.axvline(0, color="k", lw=0.8)
        b.set_xlabel("change in peak reserved memory")
        save(fig, "knobs", "Which knob moved throughput and memory (cells differing in one key)")
    return plots


def baseline(results: list[dict], cfg: ReportConfig) -> dict | None:
    ok = [r for r in results if r.get("status") == "ok" and "perf/tokens_per_s" in r.get("metrics", {})]
    if cfg.baseline is None:
        return ok[0] if ok else None
    for r in ok:
        if str(r.get("job_num")) == str(cfg.baseline) or r.get("cell") == cfg.baseline:
            return r
    raise ValueError(f"report.baseline={cfg.baseline!r} names no finished cell; give a job number or one of "
                     f"{[r.get('cell') for r in ok]}")


# ---------------------------------------------------------------------------- the files

def write_report(sweep_dir: Path, cfg: ReportConfig | None = None) -> dict:
    """Every file of the report; returns {"markdown", "files", "results", "keys"}."""
    cfg = cfg or ReportConfig()
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep dir {str(sweep_dir)!r} does not exist")
    results, incomplete = load_results(sweep_dir)
    if not results and not incomplete:
        raise FileNotFoundError(f"{sweep_dir} holds no cells (no sub-directory with a .hydra folder): is it the "
                                "dir of a multirun (outputs/sweeps/<time>)?")
    results.sort(key=lambda r: r.get("job_num", 0))
    keys = swept_keys(results)
    notes = []
    if incomplete:
        notes.append("No result (incomplete): " + ", ".join(p.name for p in incomplete))
    if len({r.get("config", {}).get("seq_len") for r in results}) > 1:
        notes.append("Cells differ in seq_len: samples/s is not comparable across them; compare non-pad tokens/s.")
    effects = knob_effects(results, keys)
    md = markdown_table(results)
    if notes:
        md += "\n\n" + "\n\n".join(notes)
    if effects:
        md += "\n\nKnob effects:\n" + "\n".join(f"- {sentence(e)}" for e in effects)
    extra = {}
    if bottlenecks := bottleneck_table(results, keys):
        extra["Where the step time goes (% of a profiled step)"] = bottlenecks
    if grid := fit_grid(results, keys):
        extra["What fits (largest batch per seq_len)"] = fit_table(grid)
    if scaling := scaling_table(results, keys):
        extra["Scaling over GPUs (DDP)"] = scaling
    if backends := backend_table(results, keys):
        extra["Backends: each one's fastest cell against the seed's recipe (hf)"] = backends
    curves = loss_curves(results, keys)  # each cell's steps.jsonl, read once for the table and the plot
    if losses := loss_match_table(keys, curves):
        extra["Loss curves against the reference cell (same data, same order)"] = losses
    for title, table in extra.items():
        md += f"\n\n{title}:\n\n{table}"
    (sweep_dir / "results.md").write_text(md + "\n")
    write_csv(results, sweep_dir / "results.csv")
    plots = make_plots(results, keys, effects, cfg, sweep_dir / "plots", curves) if results else {}
    page = sweep_dir / "report.html"
    page.write_text(render_html(sweep_dir, results, keys, notes, effects, plots, cfg, extra))
    files = [sweep_dir / "results.md", sweep_dir / "results.csv", page, *plots.values()]
    return {"markdown": md, "files": files, "results": results, "keys": keys}


def _md_to_html(table: str) -> str:
    rows = [line.strip("|").split(" | ") for line in table.splitlines() if not line.startswith("|---")]
    cells = lambda r, tag: "".join(f"<{tag}>{html.escape(c.strip())}</{tag}>" for c in r)  # noqa: E731
    return f"<table><tr>{cells(rows[0], 'th')}</tr>" + "".join(f"<tr>{cells(r, 'td')}</tr>" for r in rows[1:]) + "</table>"


def render_html(sweep_dir, results, keys, notes, effects, plots, cfg, extra) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h, _, _ in COLUMNS)
    body = ""
    for r in results:
        cells = row(r, max_error=None)
        cells["cell"] = label(r, keys)  # the swept values; every override is in the tooltip
        cls = r.get("status", "")
        tds = "".join(f"<td>{html.escape(str(cells[h]))}</td>" for h, _, _ in COLUMNS[1:])
        body += (f"<tr class='{html.escape(cls)}'><td title='{html.escape(str(r.get('cell')))}'>"
                 f"{html.escape(cells['cell'])}</td>{tds}</tr>")
    proj_rows = ""
    for r in results:
        p = projection(r, cfg)
        if p:
            ref = f"${p['reference_usd']:.2f}" if "reference_usd" in p else "-"
            usd = f"${p['usd']:.2f}" if p["usd"] is not None else "-"
            proj_rows += (f"<tr><td>{html.escape(label(r, keys))}</td><td>{p['hours']:.2f}</td>"
                          f"<td>{p['tokens'] / 1e6:.2f}</td><td>{usd}</td><td>{ref}</td></tr>")
    imgs = "".join(f"<h3>{name}</h3><img alt='{name}' src='data:image/png;base64,"
                   f"{base64.b64encode(path.read_bytes()).decode()}'>" for name, path in plots.items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>lorabench: {html.escape(sweep_dir.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}td:nth-child(-n+2){{text-align:left}}
tr.oom td,tr.skipped td{{background:#fbe3e4}}tr.failed td{{background:#eee}}img{{max-width:100%}}</style></head><body>
<h1>Sweep {html.escape(str(sweep_dir))}</h1>
<p>{len(results)} cells; swept: {html.escape(", ".join(keys) or "nothing (one configuration)")}.
Non-pad tokens/s counts real tokens only, over the timed steps (warmup excluded).</p>
{"".join(f"<p><b>{html.escape(n)}</b></p>" for n in notes)}
<table><tr>{head}</tr>{body}</table>
<h2>Knob effects</h2><ul>{"".join(f"<li>{html.escape(sentence(e))}</li>" for e in effects) or "<li>no two cells differ in one key only</li>"}</ul>
{"".join(f"<h2>{html.escape(t)}</h2>{_md_to_html(tab)}" for t, tab in extra.items())}
<h2>Projection for {cfg.dataset_samples:,} samples</h2>
<table><tr><th>cell</th><th>hours</th><th>M non-pad tokens</th><th>GPU cost</th><th>{html.escape(cfg.reference_name)}</th></tr>{proj_rows}</table>
<h2>Plots</h2>{imgs}
</body></html>"""
