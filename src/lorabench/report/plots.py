"""The sweep report's figures, one function per figure, each from lorabench.report.analysis's numbers.

Legible from 2 to 60+ cells: cells are horizontal bars named on the y axis (0.3 in a row), values
to the right of each bar inside the axes, a legend for status colours; a cell that did not end ok
gets a hatched stub with its status in words; titles name what every cell shares (model,
precision, GPU or emulated budget, data). Every figure is laid out by matplotlib's constrained
layout, so no label is clipped.
"""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path
from statistics import mean

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from lorabench.core.config import ReportConfig  # noqa: E402
from lorabench.core.results import CellResult, Status  # noqa: E402
from lorabench.measure.metrics import CATEGORIES  # noqa: E402
from lorabench.report.analysis import (  # noqa: E402
    TOK,
    baseline,
    constants,
    energy,
    knob_effects,
    label,
    money,
    ok_cells,
    projection,
    short_names,
    value,
)

STATUS_COLOR = {"ok": "#4c72b0", "oom": "#c44e52", "failed": "#8c8c8c", "skipped": "#e8a0a2",
                "interrupted": "#dd8452", "running": "#cccccc"}
CATEGORY_COLOR = {"matmul": "#4c72b0", "dequant": "#dd8452", "attention": "#55a868", "elementwise": "#8172b3",
                  "loss": "#c44e52", "optimizer": "#937860", "data": "#da8bc3", "idle": "#cccccc"}
ROW_IN = 0.3  # inches per bar


def _figure(rows: int, width: float = 9.0, panels: int = 1, names: list[str] = ()):
    """A figure of `panels` side by side, tall enough for `rows` bars and wide enough that the
    longest cell name (8 pt, about 0.07 in a character) leaves each panel 4.5 in of plot."""
    longest = max((len(n) for n in names), default=0)
    width = max(width, 4.5 * panels + 0.07 * longest)
    fig, axs = plt.subplots(1, panels, figsize=(width, 1.4 + ROW_IN * max(rows, 2)), layout="constrained",
                            squeeze=False)
    return fig, list(axs[0])


def xlabel(ax, text: str) -> None:
    ax.set_xlabel(textwrap.fill(text, 70), fontsize=9)


def _save(fig, out_dir: Path, name: str, title: str, results: list[CellResult]) -> Path:
    shared = constants(results)
    fig.suptitle(title + (f"\n{shared}" if shared else ""), fontsize=10)
    path = out_dir / f"{name}.png"
    # Whole or not at all, as every report file: a full disk cut a PNG short (no IEND) where it was written in place.
    tmp = out_dir / f".{name}.{os.getpid()}.png.tmp"
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path


def hbars(ax, results: list[CellResult], names: list[str], values: list, fmt) -> None:
    """One bar per cell; a cell without a value (not ok) gets a hatched stub and its status."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    hi = max(finite + [0]) or 1.0
    lo = min(finite + [0])
    for i, (r, v) in enumerate(zip(results, values)):
        color = STATUS_COLOR.get(r.status.value, "#8c8c8c")
        if v is None:
            ax.barh(i, 0.04 * hi, color="white", edgecolor=color, hatch="///")
            ax.text(0.05 * hi, i, f" {r.status.value.upper() if r.status is Status.oom else r.status.value}",
                    va="center", fontsize=7, color=color)
        else:
            ax.barh(i, v, color=color)
            ax.text(max(v, 0), i, " " + fmt(v), va="center", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.set_xlim(lo * 1.3 if lo < 0 else 0, hi * 1.3)  # room for the value labels inside the axes


def status_legend(ax, results: list[CellResult]) -> None:
    seen = list(dict.fromkeys(r.status.value for r in results))
    ax.legend(handles=[Patch(facecolor=STATUS_COLOR.get(s, "#8c8c8c"), label=s) for s in seen], fontsize=7,
              loc="best", title="status", title_fontsize=7)


def throughput(results, axes_, cfg, out_dir) -> Path:
    names = [label(r, axes_) for r in results]
    fig, [ax] = _figure(len(results), names=names)
    hbars(ax, results, names, [r.metrics.get(TOK) for r in results], lambda v: f"{v:,.0f}")
    xlabel(ax, "non-pad tokens/s (real tokens over the timed steps, warmup excluded)")
    status_legend(ax, results)
    return _save(fig, out_dir, "throughput", "Throughput per cell", results)


def speedup(results, axes_, cfg, out_dir) -> Path | None:
    base = baseline(results, cfg)
    if base is None:
        return None
    ref = base.metrics[TOK]
    names = [label(r, axes_) for r in results]
    fig, [ax] = _figure(len(results), names=names)
    hbars(ax, results, names,
          [r.metrics[TOK] / ref if TOK in r.metrics and r.ok else None for r in results], lambda v: f"{v:.2f}x")
    ax.axvline(1.0, color="k", lw=0.8)
    xlabel(ax, f"non-pad tokens/s relative to {label(base, axes_)}")
    return _save(fig, out_dir, "speedup", "Speedup against the baseline cell", results)


def memory(results, axes_, cfg, out_dir) -> Path | None:
    m = [r.metrics for r in results]
    if not any("mem/peak_reserved_gib" in x for x in m):
        return None
    names = [label(r, axes_) for r in results]
    fig, [ax] = _figure(len(results), names=names)
    hbars(ax, results, names,
          [x.get("mem/peak_reserved_gib") if r.ok else None for r, x in zip(results, m)], lambda v: f"{v:.1f} GiB")
    caps = sorted({x.get("mem/budget_gib") or x.get("mem/device_total_gib") for x in m} - {None})
    for cap in caps:
        ax.axvline(cap, color="#c44e52", ls="--", lw=1, label=f"capacity {cap:.1f} GiB")
    ax.set_xlim(0, 1.3 * max([*caps, *[x.get("mem/peak_reserved_gib") or 0 for x in m]]))
    xlabel(ax, "peak reserved GiB (PyTorch caching allocator)")
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, out_dir, "memory", "Peak memory against the GPU's capacity", results)


def cost(results, axes_, cfg, out_dir) -> Path | None:
    if not any("cost/usd_per_1m_tokens" in r.metrics for r in results):
        return None
    names = [label(r, axes_) for r in results]
    fig, [ax] = _figure(len(results), names=names)
    hbars(ax, results, names,
          [r.metrics.get("cost/usd_per_1m_tokens") if r.ok else None for r in results], money)
    xlabel(ax, "USD per 1M non-pad tokens, at the GPU's hourly price")
    return _save(fig, out_dir, "cost", "Cost per cell", results)


def cost_vs_throughput(results, axes_, cfg, out_dir) -> Path | None:
    """Each ok cell a point; the Pareto front (no other cell both cheaper per token and faster) drawn."""
    pts = [(r.metrics[TOK], r.metrics["cost/usd_per_1m_tokens"], r) for r in ok_cells(results)
           if "cost/usd_per_1m_tokens" in r.metrics]
    if len(pts) < 2:
        return None
    front = sorted((p for p in pts if not any(q[0] >= p[0] and q[1] <= p[1] and q[:2] != p[:2] for q in pts)),
                   key=lambda p: p[0])
    fig, [ax] = _figure(12, width=8)
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, color="#4c72b0", label="cell")
    ax.plot([p[0] for p in front], [p[1] for p in front], "-o", color="#c44e52", ms=5, label="Pareto front")
    for p in front:  # name only the front's cells: 60 names on a scatter overlap
        ax.annotate(label(p[2], axes_), (p[0], p[1]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    xlabel(ax, "non-pad tokens/s")
    ax.set_ylabel("USD per 1M non-pad tokens")
    ax.legend(fontsize=7)
    return _save(fig, out_dir, "cost_vs_throughput", "Cost against throughput", results)


def projection_plot(results, axes_, cfg: ReportConfig, out_dir) -> Path | None:
    proj = [projection(r, cfg) for r in results]
    if not any(p and p["usd"] is not None for p in proj):
        return None
    names = [label(r, axes_) for r in results]
    fig, (a, b) = _figure(len(results), width=12, panels=2, names=names)
    hbars(a, results, names, [p["hours"] if p else None for p in proj], lambda v: f"{v:.2f} h")
    xlabel(a, f"hours for {cfg.dataset_samples:,} samples")
    hbars(b, results, names, [p["usd"] if p else None for p in proj], money)
    b.set_yticks(range(len(names)), [""] * len(names))
    xlabel(b, f"USD for {cfg.dataset_samples:,} samples"
                 + (f" ({cfg.reference_name}: {money(proj[0]['reference_usd'])} for the same tokens)"
                    if proj[0] and "reference_usd" in proj[0] else ""))
    return _save(fig, out_dir, "projection", f"Time and cost projected for {cfg.dataset_samples:,} samples", results)


def energy_plot(results, axes_, cfg, out_dir) -> Path | None:
    vals = [energy(r.metrics, cfg).get("energy/j_per_1k_tokens") if r.ok else None for r in results]
    if not any(vals):
        return None
    names = [label(r, axes_) for r in results]
    fig, [ax] = _figure(len(results), names=names)
    hbars(ax, results, names, vals, lambda v: f"{v:,.0f} J")
    xlabel(ax, "GPU energy per 1K non-pad tokens (NVML counter over the timed steps)")
    return _save(fig, out_dir, "energy", "Energy per token", results)


def bottleneck(results, axes_, cfg, out_dir) -> Path | None:
    prof = [r for r in results if "prof/step_ms" in r.metrics]
    if not prof:
        return None
    fig, [ax] = _figure(len(prof), width=11, names=[label(r, axes_) + " (000 ms)" for r in prof])
    left = [0.0] * len(prof)
    for c in CATEGORIES:
        share = [100 * r.metrics[f"prof/{c}_frac"] for r in prof]
        ax.barh(range(len(prof)), share, left=left, color=CATEGORY_COLOR[c], label=c)
        for i, (v, l0) in enumerate(zip(share, left)):
            if v >= 6:  # label the slices wide enough to hold one
                ax.text(l0 + v / 2, i, f"{v:.0f}", ha="center", va="center", fontsize=7)
        left = [x + y for x, y in zip(left, share)]
    ax.set_yticks(range(len(prof)), [f"{label(r, axes_)} ({r.metrics['prof/step_ms']:.0f} ms)" for r in prof],
                  fontsize=8)
    ax.set_ylim(len(prof) - 0.5, -0.5)
    ax.set_xlim(0, 100)
    xlabel(ax, "% of the profiled step time (torch.profiler; device work, then device idle)")
    ax.legend(ncol=4, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), frameon=False)
    return _save(fig, out_dir, "bottleneck", "Where the step time goes", results)


def heatmaps(results, axes_, cfg, out_dir) -> Path | None:
    """A 2-D sweep (seq_len x batch, backend x checkpoint fraction ...) as two heatmaps, non-pad
    tokens/s and peak memory, one row of them per GPU option when the sweep also varies the GPU.
    Repeated cells (train.seed) are one square: the mean of the repeats that ended ok."""
    grid_axes = [a for a in axes_ if a not in ("gpu", "train.seed")]
    if len(grid_axes) != 2:
        return None
    ya, xa = grid_axes
    facets = list(dict.fromkeys(value(r, "gpu") for r in results)) if "gpu" in axes_ else [None]
    ys = list(dict.fromkeys(value(r, ya) for r in results))
    xs = list(dict.fromkeys(value(r, xa) for r in results))
    names = short_names(axes_)
    fig, axs = plt.subplots(len(facets), 2, figsize=(4 + 1.6 * len(xs), 1.3 + (0.45 * len(ys) + 0.9) * len(facets)),
                            layout="constrained", squeeze=False)
    for row, facet in zip(axs, facets):
        cells = {}
        for r in results:
            if facet is None or value(r, "gpu") == facet:
                cells.setdefault((repr(value(r, ya)), repr(value(r, xa))), []).append(r)
        for ax, key, fmt, what in ((row[0], TOK, "{:,.0f}", "non-pad tok/s"),
                                   (row[1], "mem/peak_reserved_gib", "{:.1f}", "peak resv GiB")):
            heat_panel(ax, [[cells.get((repr(y), repr(x)), []) for x in xs] for y in ys], key, fmt)
            ax.set_xticks(range(len(xs)), [str(x) for x in xs], fontsize=8)
            ax.set_yticks(range(len(ys)), [str(y) for y in ys], fontsize=8)
            xlabel(ax, names[xa])
            ax.set_ylabel(names[ya])
            ax.set_title(what + (f", gpu={facet}" if facet is not None else ""), fontsize=9)
    return _save(fig, out_dir, "heatmap", f"{names[ya]} x {names[xa]}", results)


def heat_panel(ax, grid: list[list[list[CellResult]]], key: str, fmt: str) -> None:
    """One heatmap: each square the mean of its ok cells' `key`, or the status of its cells in words."""
    means = [[mean(vals) if (vals := [r.metrics[key] for r in cell if r.ok and key in r.metrics]) else None
              for cell in line] for line in grid]
    image = ax.imshow([[math.nan if v is None else v for v in line] for line in means],
                      cmap="viridis" if key == TOK else "magma_r", aspect="auto")
    for i, line in enumerate(grid):
        for j, cell in enumerate(line):
            v = means[i][j]
            text = fmt.format(v) if v is not None else (cell[0].status.value if cell else "-")
            r, g, b, _ = image.cmap(image.norm(v)) if v is not None else (1, 1, 1, 1)
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5  # the square's luminance: light text on dark only
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color="w" if dark else "k")


def knobs(results, axes_, cfg, out_dir) -> Path | None:
    # a change between cells that did the same work has no effect to draw (analysis.same_work)
    effects = [e for e in knob_effects(results, axes_) if e.tokens_ratio is not None]
    if not effects:
        return None
    names = [f"{e.key}: {e.from_} -> {e.to}" for e in effects]
    fig, (a, b) = _figure(len(effects), width=12, panels=2, names=names)
    stub = [CellResult(Status.ok, n) for n in names]
    tok = [(e.tokens_ratio - 1) * 100 for e in effects]
    hbars(a, stub, names, tok, lambda v: f"{v:+.1f}%")
    for i, e in enumerate(effects):
        a.patches[i].set_color("#55a868" if tok[i] >= 0 else "#c44e52")
        if e.noise is not None:  # the noise floor, either side of zero
            a.fill_betweenx([i - 0.4, i + 0.4], -100 * e.noise, 100 * e.noise, color="#999999", alpha=0.3)
    a.axvline(0, color="k", lw=0.8)
    xlabel(a, "change in non-pad tokens/s (grey: noise, the spread of repeated cells or else of the cells' steps)")
    hbars(b, stub, names, [e.mem_delta_gib for e in effects], lambda v: f"{v:+.2f} GiB")
    b.set_yticks(range(len(names)), [""] * len(names))
    b.axvline(0, color="k", lw=0.8)
    xlabel(b, "change in peak reserved memory")
    return _save(fig, out_dir, "knobs", "Which knob moved throughput and memory (cells differing in one key)", results)


def loss(results, axes_, cfg, out_dir, curves) -> Path | None:
    if curves is None:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    (_, ref), cells = curves
    for r, c in cells:
        steps = sorted(set(c) & set(ref))
        a.plot(steps, [c[s] for s in steps], lw=1, label=label(r, axes_))
        b.plot(steps, [c[s] - ref[s] for s in steps], lw=1)
    xlabel(a, "optimizer step")
    a.set_ylabel("training loss")
    a.legend(fontsize=7)
    b.axhline(0, color="k", lw=0.8)
    xlabel(b, "optimizer step")
    b.set_ylabel("loss - reference cell's loss")
    return _save(fig, out_dir, "loss", "Loss curves on the same batches", results)


def quality_curves(results, axes_, cfg, out_dir) -> Path | None:
    """Eval loss against wall time (training steps and evaluations) and against $, one line per cell that evaluated
    held-out data, one colour per configuration (its repeats share it; past 20 configurations the line style changes
    too), the target dashed and where each cell first reached it marked; the legend under the panels, in columns."""
    from lorabench.report import quality as rq  # (it reads analysis's names)

    tt = rq.to_target(results)
    if not tt:
        return None
    groups = rq.repeat_groups(tt, axes_)
    priced = all(e.usd is not None for c in tt for e in c.evals)
    ncol = min(4, len(groups))
    fig, axs = plt.subplots(1, 2 if priced else 1, squeeze=False, layout="constrained",
                            figsize=(12, 4.5 + 0.22 * math.ceil(len(groups) / ncol)))
    panels = [(axs[0][0], lambda e: e.time_s, "seconds (training steps + evaluations)")]
    if priced:
        panels.append((axs[0][1], lambda e: e.usd, "USD at the GPU's hourly price"))
    colors = plt.get_cmap("tab20")
    for i, g in enumerate(groups):
        style = dict(color=colors(i % 20), ls=("-", "--", ":", "-.")[i // 20 % 4], lw=1.1, alpha=0.85)
        for j, c in enumerate(g.cells):
            for ax, x, _ in panels:
                ax.plot([x(e) for e in c.evals], [e.eval_loss for e in c.evals], label=g.name if j == 0 else None,
                        **style)
                if c.reached and c.reached.at:
                    ax.plot([x(c.reached.at)], [c.reached.at.eval_loss], "o", ms=4, color=style["color"])
    for ax, _, what in panels:
        for t in sorted({c.target for c in tt if c.target is not None}):
            ax.axhline(t, color="k", ls="--", lw=0.8)
        xlabel(ax, what)
        ax.set_ylabel("eval loss (held-out tokens)")
        if ax is panels[-1][0] and len(panels) > 1:
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: money(v)))
    handles, labels = panels[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize=7, frameon=False)
    return _save(fig, out_dir, "quality", "Eval loss against time and cost (dashed: the target; dots: first reached)",
                 results)


def fit(results, axes_, cfg, out_dir, grid) -> Path | None:
    if not grid:
        return None
    seqs, batches = sorted({s for s, _ in grid}), sorted({b for _, b in grid})
    fig, ax = plt.subplots(figsize=(2 + 1.1 * len(batches), 1.6 + 0.6 * len(seqs)), layout="constrained")
    for i, seq in enumerate(seqs):
        for j, b in enumerate(batches):
            r = grid.get((seq, b))
            status = r.status.value if r else None
            mem = r.metrics.get("mem/peak_reserved_gib") if r else None
            text = {"ok": f"{mem:.1f} GiB" if mem is not None else "fits", "oom": "OOM",
                    "skipped": "OOM\n(implied)", "failed": "failed", None: "-"}.get(status, status)
            color = {"ok": "#b8d8be", "oom": "#f2b8ba", "skipped": "#f8dcdd"}.get(status, "#eeeeee")
            ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=color, edgecolor="white"))
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=8)
    ax.set_xlim(0, len(batches))
    ax.set_ylim(len(seqs), 0)
    ax.set_xticks([j + 0.5 for j in range(len(batches))], batches)
    ax.set_yticks([i + 0.5 for i in range(len(seqs))], seqs)
    xlabel(ax, "batch")
    ax.set_ylabel("seq_len")
    return _save(fig, out_dir, "fit", "What fits (peak reserved memory)", results)


def make_plots(results: list[CellResult], axes_: list[str], cfg: ReportConfig, out_dir: Path, curves=None,
               grid=None) -> dict[str, Path]:
    """Every figure that the sweep has data for (axes_: analysis.axes of these results): {name: path}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not any(TOK in r.metrics for r in results):
        return {}  # bench cells: their numbers are in the tables
    paths = [f(results, axes_, cfg, out_dir) for f in (throughput, heatmaps, speedup, memory, cost,
                                                       cost_vs_throughput, projection_plot, energy_plot,
                                                       bottleneck, knobs)]
    paths += [quality_curves(results, axes_, cfg, out_dir), loss(results, axes_, cfg, out_dir, curves),
              fit(results, axes_, cfg, out_dir, grid)]
    return {p.stem: p for p in paths if p is not None}


def gpu_projection(rows, out_dir: Path, dataset_samples: int) -> Path:
    """USD per 1M non-pad tokens against hours for `dataset_samples` samples, one colour per GPU: every
    cell that fits as a small point (filled where measured on that GPU, hollow where projected, with
    its low-high range as bars), each
    GPU's cheapest cell large and named in the legend (names on the points would overlap where two
    GPUs come close, as an H100 and an H200 do). Log axes: an A10 and an H200 differ by 10x in both."""
    targets = list(dict.fromkeys(r.target for r in rows))
    colors = plt.get_cmap("tab10")
    fig, [ax] = _figure(14, width=9)
    for i, t in enumerate(targets):
        mine = [r for r in rows if r.target == t and r.fits and r.usd_per_1m_tokens is not None]
        if not mine:
            continue
        for measured in (True, False):
            pts = [r for r in mine if r.measured is measured]
            ax.scatter([r.hours for r in pts], [r.usd_per_1m_tokens for r in pts], s=14, alpha=0.6,
                       facecolors=colors(i) if measured else "none", edgecolors=colors(i))
            if not measured and pts:  # a projected figure's range, slowest to fastest rates, both axes
                ax.errorbar([r.hours for r in pts], [r.usd_per_1m_tokens for r in pts],
                            xerr=[[r.hours - r.hours_low for r in pts], [r.hours_high - r.hours for r in pts]],
                            yerr=[[r.usd_per_1m_tokens - r.usd_per_1m_tokens_low for r in pts],
                                  [r.usd_per_1m_tokens_high - r.usd_per_1m_tokens for r in pts]],
                            fmt="none", ecolor=colors(i), alpha=0.35, lw=0.7)
        best = min(mine, key=lambda r: r.usd_per_1m_tokens)
        n_out = sum(1 for r in rows if r.target == t and not r.fits)
        ax.scatter([best.hours], [best.usd_per_1m_tokens], s=70, color=colors(i),
                   label=f"{t}: best {money(best.usd_per_1m_tokens)}/1M tok" + (f"; {n_out} cells do not fit" if n_out else ""))
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis, fmt in ((ax.xaxis, lambda v, _: f"{v:g} h"), (ax.yaxis, lambda v, _: money(v))):
        axis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # 1-2-5 steps: labelled ticks even within a decade
        axis.set_major_formatter(FuncFormatter(fmt))
        axis.set_minor_formatter(NullFormatter())
    ax.tick_params(which="both", labelsize=7)
    xlabel(ax, f"hours for {dataset_samples:,} samples (filled: measured on that GPU; hollow: projected, "
               "bars its range)")
    ax.set_ylabel("USD per 1M non-pad tokens (on demand)")
    ax.legend(fontsize=7, loc="best")
    return _save(fig, out_dir, "gpu_projection", "Cost against time on each GPU (projected; lorabench.report.projection)", [])
