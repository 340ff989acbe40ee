"""What a sweep's results say: the answer it opens with (headline: the fastest cell, the cheapest that fits,
what each knob did), then as tables: cell names, the results frame (results.csv), knob effects against the
noise (repeats, or the cells' own steps) and the work each cell did, spread over repeats, slow steps, backends
on equal work, fit, scaling, loss agreement, projection, energy.

Numbers come from the cells' own result files; nothing here measures. plots.py draws from the same
functions and report.py lays them out on the page.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean, median, stdev

import pandas as pd

from lorabench.core.config import ReportConfig
from lorabench.core.results import CellResult, Status, flatten, unstrict
from lorabench.measure.metrics import CATEGORIES, percentile

# Config groups: a group whose option differs between cells is one axis, named by the option
# (backend=fast), not by the keys the option sets. Old results without Hydra's choices fall back to
# the group's own name key.
GROUP_NAME_KEY = {"model": "model.name", "precision": "precision.name", "backend": "backend.name",
                  "optimizer": "optimizer.name", "data": "data.kind", "gpu": "gpu.name", "lora": None}
# Keys a group's option sets outside its own package: backend=fast sets data.packing.
SET_BY_OPTION = {"backend": ("data.packing",)}
IGNORED_KEYS = ("data.cache_dir", "logger.", "model.path", "report.", "search.", "sweep.", "train.force",
                "train.resume")
# results.csv's config columns: what a user sweeps, under plain names.
CONFIG_COLUMNS = {"model": "model.name", "precision": "precision.name", "seq_len": "seq_len", "batch": "batch",
                  "lora_r": "lora.r", "lora_alpha": "lora.alpha", "lora_dropout": "lora.dropout",
                  "lora_targets": "lora.target_modules", "optimizer": "optimizer.name", "lr": "optimizer.lr",
                  "backend": "backend.name", "packing": "data.packing", "gradient_checkpointing":
                  "train.gradient_checkpointing", "checkpoint_fraction": "train.checkpoint_fraction",
                  "offload_fraction": "train.offload_fraction", "gpu": "gpu.name", "data": "data.kind", "seed": "train.seed", "nproc": "train.nproc",
                  "parallel": "train.parallel"}
TOK = "perf/tokens_per_s"
SHAPE_ORDER = ["seq_len", "batch"]


def ok_cells(results: list[CellResult]) -> list[CellResult]:
    """The cells that measured throughput: the only ones a ratio or an effect may use."""
    return [r for r in results if r.ok and TOK in r.metrics]


# ---------------------------------------------------------------------------- names

def axes(results: list[CellResult]) -> list[str]:
    """What tells the cells apart: groups whose option differs (named by the group), then the other
    config keys whose value differs. Report and sweep options never count."""
    flats = [flatten(r.config) for r in results]
    keys = sorted(set().union(*flats)) if flats else []
    varying = [k for k in keys if len({repr(f.get(k)) for f in flats}) > 1 and not k.startswith(IGNORED_KEYS)]
    out = []
    for group in GROUP_NAME_KEY:
        if len({choice(r, group) for r in results}) > 1:
            out.append(group)
            # A key that only follows the group's option (backend=fast sets data.packing) says nothing
            # more; one swept within an option (backend.upcast_fp32=true,false) still tells cells apart.
            varying = [k for k in varying if not (k.startswith(group + ".") or k in SET_BY_OPTION.get(group, ()))
                       or _varies_within(results, flats, group, k)]
    # the shape first, as a person reads a grid: seq_len x batch
    return out + sorted(varying, key=lambda k: (k not in SHAPE_ORDER, SHAPE_ORDER.index(k) if k in SHAPE_ORDER else 0, k))


def _varies_within(results: list[CellResult], flats: list[dict], group: str, key: str) -> bool:
    seen: dict = {}
    for r, f in zip(results, flats):
        seen.setdefault(choice(r, group), set()).add(repr(f.get(key)))
    return any(len(values) > 1 for values in seen.values())


def choice(r: CellResult, group: str):
    """The option of a config group this cell used (backend=fast), or None when unknown."""
    if r.choices and group in r.choices:
        return r.choices[group]
    key = GROUP_NAME_KEY.get(group)
    return flatten(r.config).get(key) if key else None


def value(r: CellResult, axis: str):
    return choice(r, axis) if axis in GROUP_NAME_KEY else flatten(r.config).get(axis)


def short_names(axes_: list[str]) -> dict[str, str]:
    """Each axis by its last dotted part where that is unambiguous (checkpoint_fraction)."""
    last = [a.split(".")[-1] for a in axes_]
    return {a: (s if last.count(s) == 1 else a) for a, s in zip(axes_, last)}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(map(str, v)) + "]"
    return str(v)


def label(r: CellResult, axes_: list[str]) -> str:
    """A cell's name in tables and plots: its values of the axes, e.g. "backend=fast,batch=16"."""
    if not axes_:
        return r.cell
    names = short_names(axes_)
    return ",".join(f"{names[a]}={_fmt(value(r, a))}" for a in axes_)


# ---------------------------------------------------------------------------- formats

def money(v) -> str:
    """USD with three significant digits below $1 (a cell's $0.00042 is not "$0.000")."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if v == 0:
        return "$0"
    return f"${v:,.0f}" if v >= 100 else f"${v:.2f}" if v >= 1 else f"${v:#.3g}"


def num(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the results table

def energy(m: dict, cfg: ReportConfig) -> dict:
    """J per 1K non-pad tokens and kWh for cfg.dataset_samples, from NVML's energy counter over the
    timed window (gpu/energy_j), which counts the same steps as the token and sample counts."""
    e, tokens, samples = m.get("gpu/energy_j"), m.get("count/tokens_nonpad"), m.get("count/samples")
    if not (e and tokens and samples):
        return {}
    return {"energy/j_per_1k_tokens": 1e3 * e / tokens, "energy/kwh_for_dataset": e / samples * cfg.dataset_samples / 3.6e6}


# (header, metric key, format) of the cells table; status and loss are built apart.
COLUMNS = [
    ("tok/s non-pad", TOK, "{:,.0f}"),
    ("tok/s total", "perf/total_tokens_per_s", "{:,.0f}"),
    ("samples/s", "perf/samples_per_s", "{:.2f}"),
    ("step p50 s", "perf/step_time_p50_s", "{:.3f}"),
    ("MFU %", "perf/mfu_pct", "{:.1f}"),
    ("peak alloc GiB", "mem/peak_allocated_gib", "{:.2f}"),
    ("peak resv GiB", "mem/peak_reserved_gib", "{:.2f}"),
    ("$/1k samples", "cost/usd_per_1k_samples", money),
    ("$/1M tok", "cost/usd_per_1m_tokens", money),
    ("J/1K tok", "energy/j_per_1k_tokens", "{:,.0f}"),
]


# Cells that evaluated held-out data (quality.eval_every) get these too: their last eval loss, and the seconds and $
# to the target (lorabench.report.quality resolves a relative one; "not reached" where no evaluation reached it).
QUALITY_COLUMNS = [
    ("eval loss", "quality/eval_loss_final", "{:.4f}"),
    ("s to target", "quality/time_to_target_s", "{:,.1f}"),
    ("$ to target", "quality/usd_to_target", money),
]


def cells_table(results: list[CellResult], axes_: list[str] | None = None, cfg: ReportConfig | None = None,
                quality: dict[int, dict] | None = None) -> str:
    """One row per cell; a cell that did not end ok shows its status and a note number, and the whole
    reason stands in the numbered notes under the table (never cut). quality: per job number, the quality/ metrics
    the report resolved (a relative target's), over the cell's own."""
    cfg, axes_ = cfg or ReportConfig(), axes(results) if axes_ is None else axes_
    columns = COLUMNS + (QUALITY_COLUMNS if any("quality/eval_loss_final" in r.metrics for r in results) else [])
    headers = ["cell", "status", *[h for h, _, _ in columns], "loss first->last"]
    rows, notes = [], []
    for r in results:
        m = {**r.metrics, **energy(r.metrics, cfg), **(quality or {}).get(r.job_num, {})}
        status = r.status.value
        if r.error:
            notes.append(f"[{len(notes) + 1}] {label(r, axes_)}: {r.status.value}: {r.error}")
            status += f" [{len(notes)}]"
        cells = [(fmt(m[k]) if callable(fmt) else fmt.format(m[k])) if m.get(k) is not None else
                 "not reached" if k.endswith("to_target") and m.get("quality/reached") == 0 else "-"
                 for _, k, fmt in columns]
        a, b = m.get("train/loss_first"), m.get("train/loss_final")
        rows.append([label(r, axes_), status, *cells, f"{a:.2f}->{b:.2f}" if a is not None and b is not None else "-"])
    return md_table(headers, rows) + ("\n\n" + "\n".join(notes) if notes else "")


def summary_text(results: list[CellResult]) -> str:
    """What a finished cell prints: its table row (the whole error under it); a bench cell, which has
    no tokens/s, prints its metrics one a line."""
    if all("train" in r.config for r in results) or not all(r.ok for r in results):
        return cells_table(results, [])
    return "\n".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}"
                     for r in results for k, v in r.metrics.items() if v is not None)


def metrics_table(results: list[CellResult]) -> str:
    """Bench cells (no tokens/s): every metric they recorded, a column per cell."""
    keys = [k for k in dict.fromkeys(k for r in results for k in r.metrics)
            if not k.startswith("host/") and any(r.metrics.get(k) is not None for r in results)]
    fmt = lambda v: "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
    return md_table(["metric", *[f"{r.cell} ({r.status.value})" for r in results]],
                    [[k, *[fmt(r.metrics.get(k)) for r in results]] for k in keys])


def frame(results: list[CellResult], cfg: ReportConfig, missing: list = (),
          quality: dict[int, dict] | None = None) -> pd.DataFrame:
    """results.csv: one row per cell: its name, status and whole error, a column per config key a
    user sweeps, then every metric (energy derived from NVML's counter; the quality/ ones to a target the report
    resolved, `quality`, over the cell's own). A cell without a result has its row too
    (lorabench.run.rundir.MissingCell): its state (corrupt, running, killed, not started) as status, its reason,
    and its name and config from the sweep's record."""
    def config_columns(config: dict) -> dict:
        flat = flatten(config)
        return {col: (",".join(map(str, v)) if isinstance(v := flat.get(key), tuple) else v)
                for col, key in CONFIG_COLUMNS.items()}

    rows = [{"job_num": r.job_num, "cell": r.cell, "status": r.status.value, "error": r.error,
             **config_columns(r.config), **r.metrics, **energy(r.metrics, cfg), **(quality or {}).get(r.job_num, {})}
            for r in results]
    rows += [{"job_num": m.job_num, "cell": m.cell, "status": m.state, "error": m.reason, **config_columns(m.config)}
             for m in missing]
    df = pd.DataFrame(rows)
    # An integer setting stays an integer where a row lacks it (pandas would make seq_len 128.0).
    for col in CONFIG_COLUMNS:
        if col in df and df[col].notna().any() and all(isinstance(v, int) and not isinstance(v, bool)
                                                       for v in df[col].dropna()):
            df[col] = df[col].astype("Int64")
    return df.sort_values("job_num", kind="stable") if missing else df


# ---------------------------------------------------------------------------- effects and spread

def repeats(results: list[CellResult], axes_: list[str]) -> dict[tuple, list[CellResult]]:
    """Ok cells grouped by every axis but train.seed: the repeats of one configuration."""
    others = [a for a in axes_ if a != "train.seed"]
    out = defaultdict(list)
    for r in ok_cells(results):
        out[tuple(repr(value(r, a)) for a in others)].append(r)
    return out


def spread(cells: list[CellResult]) -> dict | None:
    """Mean, sample standard deviation and relative range ((max - min) / mean) of non-pad tokens/s
    over a configuration's repeats; None for a single cell."""
    tok = [r.metrics[TOK] for r in cells]
    if len(tok) < 2:
        return None
    m = mean(tok)
    return {"n": len(tok), "mean": m, "std": stdev(tok), "range": (max(tok) - min(tok)) / m}


def spread_table(results: list[CellResult], axes_: list[str]) -> str:
    if "train.seed" not in axes_:
        return ""
    others = [a for a in axes_ if a != "train.seed"]
    rows = []
    for cells in repeats(results, axes_).values():
        if s := spread(cells):
            rows.append([label(cells[0], others) if others else "all cells", s["n"], f"{s['mean']:,.0f}",
                         f"{s['std']:,.0f}", f"{100 * s['range']:.1f}%"])
    return md_table(["configuration", "repeats", "tok/s non-pad mean", "std", "range (max-min)/mean"], rows)


# ---------------------------------------------------------------------------- noise and equal work

# Without repeats (train.seed), the noise floor comes from the cells' own steps. A cell's step-to-step spread
# as a standard deviation is the interquartile range of its steps' rates over 1.349 (a normal distribution's
# IQR in standard deviations): the few slow steps (a garbage collection, another process) do not inflate it as
# they would a plain standard deviation. Two cells' difference spreads by the root sum of squares of theirs,
# and a change under NOISE_SIGMAS of that (95% of a normal spread) is within noise. It is not divided by
# sqrt(steps): on a shared host the noise comes in spells longer than a step (another process holds the cores
# for seconds), which move a whole window; one CPU grid run twice on one machine gave batch 4 -> 8 +33%, then
# -61%. Where cells did the same work (same_work), the same computation ran more than once: their gap measures
# that run-to-run noise directly, and the wider of the two floors counts.
IQR_PER_SIGMA = 1.349
NOISE_SIGMAS = 2.0
MIN_STEPS = 4  # timed steps a cell needs for quartiles
# A cell's work: what its timed steps computed, as token counts.
WORK = ("count/timed_steps", "count/samples", "count/tokens_nonpad", "count/tokens_total")
MEM = "mem/peak_reserved_gib"


def step_spread(r: CellResult) -> float | None:
    """The relative interquartile range of a cell's timed steps' rates (non-pad tokens over the step's time):
    how far one step's speed strays from another's on this machine. Rates, not times: a step's time also
    follows its rows' lengths, which is work, not noise. None under MIN_STEPS timed steps in steps.jsonl."""
    rates = [s["tokens_nonpad"] / s["time_s"] for s in read_steps(r)
             if s.get("timed") and s.get("time_s") and "tokens_nonpad" in s]
    if len(rates) < MIN_STEPS:
        return None
    return (percentile(rates, 75) - percentile(rates, 25)) / percentile(rates, 50)


def noise_floor(a: float | None, b: float | None) -> float | None:
    """The relative change in tok/s that two cells with these step spreads show by chance alone."""
    return None if a is None or b is None else NOISE_SIGMAS * math.hypot(a, b) / IQR_PER_SIGMA


def shapes_rows(axis: str) -> bool:
    """Whether a key reaches a step only through the rows it makes (seq_len, batch, the data's options): two
    cells that differ in it and did the same token counts trained on the same rows."""
    return axis in ("seq_len", "batch", "data") or axis.startswith("data.")


def same_work(x: CellResult, y: CellResult, axes_: list[str]) -> bool:
    """x and y differ only in keys that shape the rows and did the same token counts: the same computation ran
    twice (seq_len above every sample's length, say), and the gap between their tok/s is the machine's."""
    differ = [a for a in axes_ if a != "train.seed" and repr(value(x, a)) != repr(value(y, a))]
    work = [x.metrics.get(k) for k in WORK]
    return all(map(shapes_rows, differ)) and work[2] is not None and work == [y.metrics.get(k) for k in WORK]


def twin_spread(results: list[CellResult], axes_: list[str]) -> float | None:
    """The widest relative range ((max - min) / mean) of non-pad tok/s among ok cells that did the same work
    (same_work): the machine's run-to-run noise over this sweep, as repeated cells would show it. None without
    such cells."""
    groups = defaultdict(list)
    for r in ok_cells(results):
        if r.metrics.get("count/tokens_nonpad") is not None:
            groups[(tuple(repr(value(r, a)) for a in axes_ if not shapes_rows(a)),
                    tuple(r.metrics.get(k) for k in WORK))].append(r)
    return max((s["range"] for cells in groups.values() if (s := spread(cells))), default=None)


def noise_without_repeats(floor: float | None, twins: float | None) -> tuple[float | None, str]:
    """The wider of the step-time floor and the spread of cells that did the same work, and which it is."""
    return max([(floor, "steps"), (twins, "twins")], key=lambda x: -1 if x[0] is None else x[0])


def work_words(r: CellResult) -> str:
    m = r.metrics
    return f"{m['count/tokens_nonpad']:,} non-pad tokens in {m['count/timed_steps']:,} timed steps"


# ---------------------------------------------------------------------------- knob effects

@dataclass
class Effect:
    """What changing one swept key did, over the pairs of ok cells that differ in it alone, from the value
    swept first to the other (train.seed, when swept, is repetition, not a knob)."""
    key: str
    from_: str
    to: str
    pairs: int  # pairs of cells measured (those that did the same work left out)
    tokens_ratio: float | None  # median ratio of non-pad tok/s, to over from_; None: every pair did the same work
    mem_delta_gib: float | None  # median change of peak reserved memory
    noise: float | None  # the relative change noise alone makes; None where nothing measures it
    # what measured the noise: "repeats", the spread of repeated cells; "steps", the cells' step times
    # (noise_floor); "twins", the spread of cells that did the same work (twin_spread)
    noise_from: str = "repeats"
    same_work: int = 0  # pairs that did the same work: no effect to measure
    work: str = ""  # that work, in words
    adjacent: bool = True  # from_ and to are neighbours in the sweep's order of the key's values

    @property
    def within_noise(self) -> bool:
        return self.tokens_ratio is not None and self.noise is not None and abs(self.tokens_ratio - 1) <= self.noise


def knob_effects(results: list[CellResult], axes_: list[str]) -> list[Effect]:
    """For each axis, the pairs of ok cells that differ in that axis alone: the median ratio of non-pad tokens/s
    and change of peak reserved memory (GiB), from the value swept first to the other (the order of the sweep),
    against the noise: the spread of repeated cells where there are repeats, else the wider of the cells' own
    step times' floor and the spread of cells that did the same work.
    A pair that did the same work (same_work) measures the machine, not the key: it is left out of the ratio.
    Measured effects first, the largest first; then those within noise; then those with no effect to measure."""
    knobs = [a for a in axes_ if a != "train.seed"]
    ok = ok_cells(results)
    order = {a: list(dict.fromkeys(repr(value(r, a)) for r in results)) for a in knobs}
    repeated = {key: s["range"] for key, cells in repeats(results, axes_).items() if (s := spread(cells))}
    steps, twins = {id(r): step_spread(r) for r in ok}, twin_spread(results, axes_)
    found = defaultdict(list)
    for i, x in enumerate(ok):
        for y in ok[i + 1:]:
            diff = [a for a in axes_ if repr(value(x, a)) != repr(value(y, a))]
            if len(diff) != 1 or diff[0] == "train.seed":
                continue
            a = diff[0]
            lo, hi = sorted((x, y), key=lambda r: order[a].index(repr(value(r, a))))
            found[(a, repr(value(lo, a)), repr(value(hi, a)))].append((lo, hi))
    out = []
    for (a, va, vb), pairs in found.items():
        measured = [(lo, hi) for lo, hi in pairs if not same_work(lo, hi, axes_)]
        mems = [hi.metrics.get(MEM, math.nan) - lo.metrics.get(MEM, math.nan) for lo, hi in measured]
        mems = [d for d in mems if not math.isnan(d)]
        configs = [tuple(repr(value(r, k)) for k in knobs) for p in measured for r in p]
        ranges = [repeated[c] for c in configs if c in repeated]
        floors = [f for lo, hi in measured if (f := noise_floor(steps[id(lo)], steps[id(hi)])) is not None]
        first, last = pairs[0]
        noise = (max(ranges), "repeats") if ranges else \
            noise_without_repeats(median(floors) if floors else None, twins)
        out.append(Effect(short_names(knobs)[a], _fmt(value(first, a)), _fmt(value(last, a)), len(measured),
                          median(hi.metrics[TOK] / lo.metrics[TOK] for lo, hi in measured) if measured else None,
                          median(mems) if mems else None, *noise, len(pairs) - len(measured),
                          "" if measured else work_words(first), abs(order[a].index(va) - order[a].index(vb)) == 1))
    return sorted(out, key=lambda e: (e.tokens_ratio is None, e.within_noise,
                                      -abs(math.log(e.tokens_ratio)) if e.tokens_ratio else 0))


def sentence(e: Effect) -> str:
    head = f"{e.key} {e.from_} -> {e.to}"
    if e.tokens_ratio is None:
        each = "the same " if e.same_work == 1 else \
            f"each of its {e.same_work} pairs of cells did the same token counts, e.g. "
        return f"{head}: same work ({each}{e.work}): no effect to measure."
    change = (e.tokens_ratio - 1) * 100
    mem = "" if e.mem_delta_gib is None else f", peak reserved memory {e.mem_delta_gib:+.2f} GiB"
    text = (f"{head}: non-pad tokens/s {change:+.1f}%{mem} "
            f"(median of {e.pairs} pair{'s' if e.pairs > 1 else ''} of cells differing only in it).")
    if e.same_work:
        text += f" Left out: {e.same_work} pair{'s' * (e.same_work > 1)} of cells that did the same work."
    if e.noise is None:
        return text + " Noise not measured: no repeats (train.seed), and too few timed steps in steps.jsonl."
    if e.noise_from == "repeats":
        return text + (f" Within noise: repeated cells spread {100 * e.noise:.1f}%." if e.within_noise else "")
    floor = (f"the ±{100 * e.noise:.1f}% noise floor of its cells' step times" if e.noise_from == "steps" else
             f"the {100 * e.noise:.1f}% by which cells that did the same work differ in this sweep")
    return text + (f" Within noise: under {floor} (no repeats, train.seed, to measure it)." if e.within_noise
                   else f" Over {floor}.")


# ---------------------------------------------------------------------------- special tables

def bottleneck_table(results: list[CellResult], axes_: list[str]) -> str:
    """Where each profiled cell's step time goes (train.profile_steps > 0): % per category. The
    profiler slows a step down; its step against the timed steps' median says by how much."""
    rows = [r for r in results if "prof/step_ms" in r.metrics]
    return md_table(["cell", "profiled step ms", "timed step p50 ms", *[f"{c} %" for c in CATEGORIES], "top"],
                    [[label(r, axes_), f"{r.metrics['prof/step_ms']:.1f}",
                      num(r.metrics.get("perf/step_time_p50_s") and 1e3 * r.metrics["perf/step_time_p50_s"], ".1f"),
                      *[f"{100 * r.metrics[f'prof/{c}_frac']:.1f}" for c in CATEGORIES], r.metrics["prof/top"]]
                     for r in rows]) if rows else ""


# What a multi-GPU cell changes against its 1-GPU twin: the number of processes and how they share the model.
SCALE_KEYS = ("train.nproc", "train.parallel")


def scaling_table(results: list[CellResult], axes_: list[str]) -> str:
    """Multi-GPU cells, DDP or FSDP (the mode column), against the 1-process cell with the same
    configuration otherwise (either mode: one process is one process): global non-pad tokens/s, per GPU,
    the scaling efficiency tok/s(N) / (N x tok/s(1)), the largest rank's peak memory and the weights it
    holds, and $/1M non-pad tokens at N GPUs' price."""
    if not set(SCALE_KEYS) & set(axes_):
        return ""
    ok = ok_cells(results)

    def rest(r):
        return {k: v for k, v in flatten(r.config).items() if k not in SCALE_KEYS}

    rows = []
    for r in ok:
        n = r.metrics.get("dist/world_size", r.config["train"]["nproc"])
        mode = r.config["train"].get("parallel", "ddp") if n > 1 else "1 process"  # (results before fsdp: ddp)
        one = next((o for o in ok if o.config["train"]["nproc"] == 1 and rest(o) == rest(r)), None)
        tok = r.metrics[TOK]
        eff = f"{100 * tok / (n * one.metrics[TOK]):.1f}%" if one else "no 1-GPU cell"
        rows.append([label(r, axes_), n, mode, f"{tok:,.0f}", f"{tok / n:,.0f}", eff,
                     num(r.metrics.get("mem/peak_reserved_gib"), ".2f"), num(r.metrics.get("mem/weights_gib"), ".2f"),
                     money(r.metrics.get("cost/usd_per_1m_tokens"))])
    return md_table(["cell", "GPUs", "mode", "tok/s non-pad", "per GPU", "efficiency vs 1",
                     "peak resv GiB (largest rank)", "weights GiB per rank", "$/1M tok (N GPUs)"], rows)


def rows_kind(r: CellResult) -> str:
    """What a cell's rows hold: "packed" samples, "fixed-length" synthetic rows, or "padded" samples."""
    c = r.config
    if c["data"]["kind"] == "synthetic":
        return "fixed-length"
    # backend.pack: how results written before 2026-11-25 said that backend=fast packed
    return "packed" if c["data"].get("packing") or c.get("backend", {}).get("pack") else "padded"


def p50_tokens_per_s(m: dict) -> float:
    """Mean non-pad tokens per step over the median step time: a one-off slow step does not move it."""
    return m["count/tokens_nonpad"] / m["count/timed_steps"] / m["perf/step_time_p50_s"]


# What the backend comparison varies within one group of comparable cells: the layout a search (or a
# grid) chooses, and LoRA dropout 0 (search.allow_dropout_zero: a labelled row of its own).
BACKEND_AXES = ("backend.", "batch", "train.gradient_checkpointing", "train.checkpoint_fraction",
                "train.offload_fraction", "data.packing", "lora.dropout")


def _group(r: CellResult, axes=BACKEND_AXES) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in flatten(r.config).items()
                        if not k.startswith(tuple(axes)) and not k.startswith(IGNORED_KEYS)))


def group_labels(keys: list[tuple]) -> dict[tuple, list[str]]:
    """What tells each group of cells (_group's keys) from the others, as the overrides name it: "model=qwen2.5-7b"
    (not its shape's keys), "gpu=a10", "seq_len=1024"; [] for every group where there is one."""
    ds = [dict(k) for k in keys]
    differ = sorted(n for n in {n for d in ds for n in d} if len({d.get(n) for d in ds}) > 1)

    def part(d: dict, n: str) -> str:
        head = n.split(".")[0]
        return f"{head}={d.get(head + '.name')}" if head in ("model", "gpu") else f"{n}={d.get(n)}"

    return {key: list(dict.fromkeys(part(d, n) for n in differ)) for key, d in zip(keys, ds)}


def layout_name(r: CellResult) -> str:
    """A cell's batch and layout, as the search names them: "b24 ckpt 0.5 offload 0.25",
    "b16 unsloth checkpointing offloaded"."""
    t, b = r.config.get("train", {}), r.config["backend"]
    frac, on = t.get("checkpoint_fraction", 1.0), t.get("gradient_checkpointing", True)  # (older results: no key)
    if b["name"] == "unsloth":
        how = "off" if not on else "offloaded" if b.get("unsloth_offload", True) else "on"
        return f"b{r.config['batch']} unsloth checkpointing {how}" + (f" {frac:g}" if on and frac != 1 else "")
    ckpt = frac if on else 0
    tile = b.get("tiled_mlp", 0)
    return (f"b{r.config['batch']} ckpt {ckpt:g} offload {t.get('offload_fraction', 0):g}"
            + (" +inputs to host" if on and t.get("offload_checkpoints") else "") + (f" +mlp tile {tile}" if tile else ""))


def without_varlen(r: CellResult) -> bool:
    """An Unsloth cell that ran without a varlen attention kernel: with no route for packed rows but a dense mask
    (its packed rows padded instead), or with its packed rows through one SDPA call per sample: not Unsloth at its
    best."""
    model = r.model or {}
    kernel = model.get("unsloth_varlen_kernel")
    return r.config["backend"]["name"] == "unsloth" and (
        kernel == "none" or kernel == "sdpa per sample" and bool(model.get("unsloth_packing")))


def backend_name(r: CellResult) -> str:
    """A cell's backend as the report names it: "Unsloth without its varlen kernel" where it had no route for packed
    rows, "Unsloth packing through SDPA per sample (no varlen kernel)" where it packed through that one."""
    if not without_varlen(r):
        return r.config["backend"]["name"]
    if r.model.get("unsloth_varlen_kernel") == "none":
        return "Unsloth without its varlen kernel"
    return "Unsloth packing through SDPA per sample (no varlen kernel)"


def _dropout(r: CellResult) -> float:
    return r.config.get("lora", {}).get("dropout", 0.0)


def hf_best(cells: list[CellResult], rows: str | None, dropout: float) -> CellResult | None:
    """hf's fastest cell on the given rows at the recipe's LoRA dropout: the plain HF recipe's best."""
    return max((r for r in cells if r.config["backend"]["name"] == "hf" and _dropout(r) == dropout
                and (rows is None or rows_kind(r) == rows)), key=lambda r: r.metrics[TOK], default=None)


def how_found(best: CellResult, own: list[CellResult], searched: dict) -> str:
    """Whether a backend's best came out of a search (lorabench.sweep.search) or is the fastest of the cells
    a grid happened to run (then never called best)."""
    s = searched.get(best.job_num)
    if s is None:
        return f"unsearched: fastest of {len(own)} cell{'s' * (len(own) > 1)} run"
    if any(t.job == best.job_num for t in s.dropout_zero):
        return f"searched: the best layout again with lora.dropout=0 ({len(s.dropout_zero)} cells)"
    n = sum(t.job is not None for t in s.trials)
    return f"searched: {n} cells measured, {len(s.trials) - n} skipped" + \
        (" (cut short: the sweep stopped)" if s.cut_short else "")


def backend_table(results: list[CellResult], axes_: list[str], searches=()) -> str:
    """Per group of otherwise equal cells (a GPU memory budget, a seq_len): each backend's best cell,
    its layout named, against hf's best on the same rows (both packed, or both fixed-length: equal work,
    the kernels and layouts alone) and, where the backend packs and hf did not, against hf's best on
    padded rows (the data change mixed in; labelled so). A best that no search found, and a ratio to
    such an hf cell, say "unsearched". LoRA dropout 0 rows (search.allow_dropout_zero) are labelled."""
    if "backend" not in axes_:
        return ""
    searched = {t.job: s for s in searches for t in s.trials + s.dropout_zero if t.job is not None}
    groups = defaultdict(list)
    for r in ok_cells(results):
        groups[_group(r)].append(r)
    rows, labels = [], group_labels(list(groups))
    for key, cells in groups.items():
        plain = max(map(_dropout, cells))  # the recipe's dropout; a lower one is the opt-in extra row
        label = ", ".join(labels[key]) or f"gpu={cells[0].config['gpu']['name']}"
        for name, dropout in dict.fromkeys((r.config["backend"]["name"], _dropout(r)) for r in cells):
            own = [r for r in cells if r.config["backend"]["name"] == name and _dropout(r) == dropout]
            best = max(own, key=lambda r: r.metrics[TOK])
            m, kind = best.metrics, rows_kind(best)
            rows.append([label, backend_name(best) + ("" if dropout == plain else
                                                      f", lora.dropout={dropout:g} (recipe change)"),
                         kind, layout_name(best), how_found(best, own, searched), f"{m[TOK]:,.0f}",
                         f"{p50_tokens_per_s(m):,.0f}", num(m.get("perf/mfu_pct"), ".1f"),
                         num(m.get("mem/peak_reserved_gib"), ".2f"), money(m.get("cost/usd_per_1m_tokens")),
                         _ratio(best, hf_best(cells, kind, plain), searched, "no hf cell on these rows"),
                         _ratio(best, hf_best(cells, "padded", plain), searched, "-") if kind != "padded" else "-"])
    if not rows:
        return ""
    ref = "best" if searches else "fastest cell run"
    return md_table(["group", "backend", "rows", f"{ref}: batch, layout", "how found", "tok/s non-pad", "at p50",
                     "MFU %", "peak resv GiB", "$/1M tok", f"x hf's {ref}, same rows (at p50)",
                     f"x hf's {ref} on padded rows (data change mixed in)"], rows)


def _ratio(r: CellResult, ref: CellResult | None, searched: dict, none: str) -> str:
    if ref is None:
        return none
    m, h = r.metrics, ref.metrics
    text = f"{m[TOK] / h[TOK]:.2f} ({p50_tokens_per_s(m) / p50_tokens_per_s(h):.2f})"
    return text + ("" if ref.job_num in searched else f" vs hf {layout_name(ref)} (unsearched)")


def answer(results: list[CellResult], searches) -> str:
    """The report's first lines, per group of searched cells (a budget, a seq_len): the fastest backend's
    best layout and its ratio to the plain HF recipe's best (hf's searched best at the recipe's dropout), then
    to each other backend's searched best."""
    by_job = {r.job_num: r for r in ok_cells(results)}
    groups = defaultdict(list)
    for s in searches:
        for t in ([s.best] if s.best else []) + [t for t in s.dropout_zero if t.status == "ok"]:
            if t.job in by_job:
                groups[_group(by_job[t.job])].append((s, by_job[t.job]))
    lines, labels = [], group_labels(list(groups))
    for key, items in groups.items():
        plain = max(_dropout(r) for _, r in items)
        s, best = max(((s, r) for s, r in items if _dropout(r) == plain), key=lambda x: x[1].metrics[TOK])
        hf = max((r for _, r in items if r.config["backend"]["name"] == "hf" and _dropout(r) == plain),
                 key=lambda r: r.metrics[TOK], default=None)
        budget = s.budget_gib or best.metrics.get("mem/budget_gib")
        gpu = best.config["gpu"]["name"]
        other = [p for p in labels[key] if not p.startswith(("gpu=", "seq_len="))]  # (those two are named anyway)
        where = (f"On {(best.gpu or {}).get('device_name') or gpu} (gpu={gpu}) within "
                 f"{f'{budget:g} GiB' if budget else 'its whole memory'} at seq {best.config['seq_len']}"
                 + (f", {', '.join(other)}" if other else ""))
        text = (f"{where}: fastest is {backend_name(best)} {layout_name(best)} at "
                f"{best.metrics[TOK]:,.0f} non-pad tok/s")
        if hf is best:
            text += ", the plain HF recipe's own best"
        elif hf is not None:
            text += (f", {best.metrics[TOK] / hf.metrics[TOK]:.2f}x the plain HF recipe's best (hf {layout_name(hf)}, "
                     f"{hf.metrics[TOK]:,.0f} tok/s)")
        elif any(s.backend == "hf" and s.best is None for s in searches):
            text += "; no cell of hf's search ran, so no ratio to the plain HF recipe (why: below)"
        else:
            # (a sweep cut short may not have reached hf's search: the same command resumes it)
            text += "; no hf search among these cells for the ratio (add backend=hf, or resume a sweep cut short)"
        text += _over_others(best, [(s, r) for s, r in items if _dropout(r) == plain and r is not best
                                    and r.config["backend"]["name"] != "hf"])
        zero = [r for _, r in items if _dropout(r) != plain]
        if zero:
            z = max(zero, key=lambda r: r.metrics[TOK])
            text += (f". With lora.dropout={_dropout(z):g} (a change to the recipe): {z.config['backend']['name']} "
                     f"{layout_name(z)} at {z.metrics[TOK]:,.0f} tok/s"
                     + (f", {z.metrics[TOK] / hf.metrics[TOK]:.2f}x" if hf is not None else ""))
        lines.append(text + ".")
    # a search with no cell that ran (all out of memory, failed, or cut short before one finished) is named, not
    # left out: its backend would otherwise be missing from the comparison without a word
    lines += [f"{s.name}: no cell of its search ran: {s.why}." for s in searches if s.best is None]
    return "\n\n".join(lines)


def _over_others(best: CellResult, others: list) -> str:
    """The winner against each other backend's searched best beside it (hf's is the answer's own ratio), fastest
    first; from a search the sweep cut short, its fastest cell so far (not called best); Unsloth without its varlen
    kernel called so (not its best)."""
    def whose(s, r) -> str:
        if without_varlen(r):
            return backend_name(r)
        return f"{r.config['backend']['name']}'s {'fastest cell so far' if s.cut_short else 'best'}"

    return "".join(f"; {best.metrics[TOK] / r.metrics[TOK]:.2f}x {whose(s, r)} ({layout_name(r)}, "
                   f"{r.metrics[TOK]:,.0f} tok/s{'; its search cut short' * bool(s.cut_short)})"
                   for s, r in sorted(others, key=lambda x: -x[1].metrics[TOK]))


# ---------------------------------------------------------------------------- the answer

UNTOLD_NAMED = 3  # cells named in the fastest's line as not told apart from it; the rest are counted


@dataclass
class Answer:
    """A sweep's opening lines, before any table: the fastest cell, the cheapest that fits, and what each swept
    knob did between neighbouring values; for a +experiment=tune sweep, its searches' answer (answer) instead."""
    axes: list[str]
    ok: int  # cells that ran to their end
    fastest: CellResult | None = None  # the most non-pad tok/s among them
    runner_up: CellResult | None = None  # the next, for the margin
    untold: list[tuple[CellResult, str]] = field(default_factory=list)  # cells not told apart from the fastest, why
    cheapest: CellResult | None = None  # the lowest $ per 1M non-pad tokens among them (None: no price)
    budget: str = ""  # the memory budget the cheapest fits within, in words ("": its device's own memory)
    effects: list[Effect] = field(default_factory=list)  # the knob effects stated here
    tune: str = ""
    # cells that evaluated held-out data: the cheapest (and fastest) to the target eval loss, and each configuration
    # faster per token but slower to the target (lorabench.report.quality.answer_lines)
    quality: list[str] = field(default_factory=list)

    def text(self) -> str:
        if self.tune:
            return "\n\n".join([self.tune, *self.quality])
        if self.fastest is None:
            return "- No cell ran to its end: nothing to compare (the cells table says why each stopped)."
        return "\n".join([self.fastest_line(), self.cheapest_line(), *self.quality,
                          *(f"- {sentence(e)}" for e in self.effects)])

    def markdown(self) -> str:
        return f"Answer:\n\n{self.text()}"

    def fastest_line(self) -> str:
        f, name = self.fastest, lambda r: label(r, self.axes)
        line = f"- Fastest: {name(f)} at {f.metrics[TOK]:,.0f} non-pad tok/s"
        if self.runner_up is None:
            return line + " (the only cell that ran)."
        if not self.untold:
            r = self.runner_up
            return line + f", {f.metrics[TOK] / r.metrics[TOK]:.2f}x the next ({name(r)}, {r.metrics[TOK]:,.0f})."
        line += "; not told apart from " + ", ".join(f"{name(r)} ({r.metrics[TOK]:,.0f}, {why})"
                                                     for r, why in self.untold[:UNTOLD_NAMED])
        if len(self.untold) > UNTOLD_NAMED:
            line += f" and {len(self.untold) - UNTOLD_NAMED} more"
        if len(self.untold) == self.ok - 1 and any(why == "within noise" for _, why in self.untold):
            line += (": no cell of this sweep stands out (repeat the cells with train.seed=0,1,2, or run them on a "
                     "quiet machine)")
        return line + "."

    def cheapest_line(self) -> str:
        c = self.cheapest
        if c is None:
            return "- Cheapest: no price for these cells' device (gpu.price_per_hour), so no cost to compare."
        where = f" within {self.budget}" if self.budget else ""
        usd = money(c.metrics["cost/usd_per_1m_tokens"])
        if c is self.fastest:
            return f"- Cheapest that fits{where}: the fastest, at {usd} per 1M non-pad tokens."
        return (f"- Cheapest that fits{where}: {label(c, self.axes)} at {usd} per 1M non-pad tokens "
                f"({c.metrics[TOK]:,.0f} tok/s at {money(c.metrics.get('cost/usd_per_hour'))}/h).")


def headline(results: list[CellResult], axes_: list[str], effects: list[Effect], searches=(),
             to_target: list[str] = ()) -> Answer:
    """What a sweep opens with (Answer), from its ok cells and its knob effects (knob_effects); where cells evaluated
    held-out data, the cheapest to the target eval loss too (`to_target`: lorabench.report.quality.answer_lines)."""
    to_target = list(to_target)
    ok = sorted(ok_cells(results), key=lambda r: -r.metrics[TOK])
    tune = "\n\n".join(t for t in (answer(results, [s for s in searches if s.target != "max_context"]),
                                    context_answer(results, [s for s in searches if s.target == "max_context"])) if t)
    if tune or not ok:
        return Answer(axes_, len(ok), tune=tune, quality=to_target if tune else [])
    fastest, spread_, twins = ok[0], step_spread(ok[0]), twin_spread(results, axes_)
    untold = []
    for r in ok[1:]:
        floor, _ = noise_without_repeats(noise_floor(spread_, step_spread(r)), twins)
        if [a for a in axes_ if repr(value(r, a)) != repr(value(fastest, a))] == ["train.seed"]:
            untold.append((r, "a repeat"))
        elif same_work(fastest, r, axes_):
            untold.append((r, "the same work"))
        elif floor is not None and abs(r.metrics[TOK] / fastest.metrics[TOK] - 1) <= floor:
            untold.append((r, "within noise"))
    untold.sort(key=lambda x: x[1] == "within noise")  # the same computation first: the plainest case
    priced = [r for r in ok if r.metrics.get("cost/usd_per_1m_tokens") is not None]
    cheapest = min(priced, key=lambda r: r.metrics["cost/usd_per_1m_tokens"], default=None)
    # an emulated GPU (gpu=a10 on a larger one) holds its cells to its memory: "fits" means within that
    budget = cheapest and ((cheapest.gpu or {}).get("budget_gib") or cheapest.metrics.get("mem/budget_gib"))
    where = f"{budget:g} GiB (gpu={choice(cheapest, 'gpu')})" if budget else ""
    return Answer(axes_, len(ok), fastest, ok[1] if len(ok) > 1 else None, untold, cheapest, where,
                  [e for e in effects if e.adjacent], quality=to_target)


def search_table(searches) -> str:
    """Every cell each search tried (search.json), in order: measured ones with their job number (cell
    dir), skipped ones with the reason; then each search's best and why it won."""
    rows = [[s.name, "-" if t.job is None else t.job, t.name(), t.status, num(t.tok_s, ",.0f"), num(t.peak_gib, ".2f"),
             t.reason[:160]] for s in searches for t in s.trials + s.dropout_zero]
    if not rows:
        return ""
    whys = "\n".join(f"{s.name}: best {s.best.name() if s.best else 'none'}: {s.why}." for s in searches)
    return md_table(["search", "cell", "batch, layout", "status", "tok/s non-pad", "peak resv GiB",
                     "reason (skipped) or error"], rows) + "\n\n" + whys


# ---------------------------------------------------------------------------- the longest context
# What tells one max-context search's cells from another's beyond the backend's layout: the probe's seq_len and
# the layout's own keys are the search's, not the group's.
CONTEXT_AXES = BACKEND_AXES + ("seq_len", "train.offload_checkpoints")


def ceilings(results: list[CellResult], searches) -> dict[tuple, list[tuple]]:
    """Per group of comparable max-context searches (a budget, a model): (search, the cell at its ceiling or None),
    the longest ceiling first."""
    by_job, groups = {r.job_num: r for r in ok_cells(results)}, defaultdict(list)
    for s in searches:
        r = by_job.get(s.ceiling.job) if s.ceiling and s.ceiling.job is not None else None
        if r is not None:
            groups[_group(r, CONTEXT_AXES)].append((s, r))
    return {k: sorted(v, key=lambda x: -x[0].ceiling.longest_ok) for k, v in groups.items()}


def _bracket(s) -> str:
    c = s.ceiling
    up = f"{c.shortest_oom:,} ran out of memory" if c.shortest_oom else f"the longest asked ({c.limit:,})"
    return f"{s.ceiling.layout}; {up}" + ("; its search cut short" if s.cut_short else "")


def context_answer(results: list[CellResult], searches) -> str:
    """A max-context sweep's first lines, per group: the longest context, its backend, layout and tokens/s there,
    and how many times each other backend's ceiling it is; then each search in which nothing fitted."""
    lines, groups = [], ceilings(results, searches)
    labels = group_labels(list(groups))
    for key, items in groups.items():
        (top, best), others = items[0], items[1:]
        budget = top.budget_gib or best.metrics.get("mem/budget_gib")
        gpu = best.config["gpu"]["name"]
        other = [p for p in labels[key] if not p.startswith("gpu=")]
        text = (f"On {(best.gpu or {}).get('device_name') or gpu} (gpu={gpu}) within "
                f"{f'{budget:g} GiB' if budget else 'its whole memory'}, model={best.config['model']['name']}"
                + (f", {', '.join(other)}" if other else "") + f", at batch 1: the longest context is "
                f"{backend_name(best)}'s, {top.ceiling.longest_ok:,} tokens ({_bracket(top)}), at "
                f"{best.metrics[TOK]:,.0f} non-pad tok/s there")
        text += "".join(f"; {top.ceiling.longest_ok / s.ceiling.longest_ok:.2f}x {backend_name(r)} "
                        f"({s.ceiling.longest_ok:,} tokens: {_bracket(s)}; {r.metrics[TOK]:,.0f} tok/s)"
                        for s, r in others)
        lines.append(text + ".")
    lines += [f"{s.name}: no length fitted: {s.why.rstrip('.')}." for s in searches
              if not (s.ceiling and s.ceiling.longest_ok)]
    return "\n\n".join(lines)


def ceiling_table(results: list[CellResult], searches) -> str:
    """Each backend's ceiling: the longest seq_len that trained and the shortest that ran out of memory, tokens/s
    there, its ratio to hf's ceiling, the measured peak beside the memory model's, and how the search ended."""
    rows = []
    for key, items in ceilings(results, searches).items():
        hf = next((s.ceiling.longest_ok for s, r in items if r.config["backend"]["name"] == "hf"), None)
        for s, r in items:
            c = s.ceiling
            rows.append([s.name, backend_name(r), c.layout, f"{c.longest_ok:,}", num(c.shortest_oom, ",d"),
                         f"{r.metrics[TOK]:,.0f}", f"{c.longest_ok / hf:.2f}" if hf else "-",
                         num(r.metrics.get("mem/peak_reserved_gib"), ".2f"), num(c.memory.get("device"), ".2f"),
                         c.stop])
    if not rows:
        return ""
    return md_table(["search", "backend", "layout", "longest that trained", "shortest out of memory",
                     "tok/s non-pad there", "x hf's ceiling", "peak resv GiB", "model GiB", "how the search ended"],
                    rows)


MEMORY_PARTS = (("weights", "weights"), ("lora", "LoRA + grads + optimizer"), ("kept", "activations kept"),
                ("inputs", "recomputed inputs on GPU"), ("working", "layer in its backward"),
                ("logits", "loss logits"), ("mask", "attention mask"), ("slack", "allocator slack"))


def ceiling_memory_table(results: list[CellResult], searches) -> str:
    """Where the memory goes at each ceiling: the memory model's GiB by part (lorabench.sweep.memory) beside the
    measured peak, and what waits in host memory."""
    rows = [[s.name, num(r.metrics.get("mem/peak_reserved_gib"), ".2f"), num(s.ceiling.memory.get("device"), ".2f"),
             *[num(s.ceiling.memory.get(k), ".2f") for k, _ in MEMORY_PARTS], num(s.ceiling.memory.get("host"), ".2f")]
            for items in ceilings(results, searches).values() for s, r in items if s.ceiling.memory]
    if not rows:
        return ""
    return md_table(["search", "measured peak resv", "model: on the GPU", *[h for _, h in MEMORY_PARTS],
                     "offloaded to host"], rows)


def read_steps(r: CellResult) -> list[dict]:
    """The cell's steps.jsonl records ([] where it has none), a value written as null for being NaN or
    infinite read back as that float (lorabench.core.results.strict)."""
    try:
        return [unstrict(json.loads(line)) for line in (Path(r.dir or r.run_dir) / "steps.jsonl").read_text().splitlines()]
    except (OSError, json.JSONDecodeError):
        return []


def read_losses(r: CellResult) -> dict[int, float]:
    return {s["step"]: s["loss"] for s in read_steps(r) if "loss" in s and "step" in s}


SLOW = 1.5  # a timed step this many times its cell's median step is listed in the report
SLOW_FILE = "slow_steps.md"  # in the sweep dir: the whole table; results.md has one line of it


@dataclass
class SlowSteps:
    """The timed steps slower than SLOW x their cell's median step: the window's tokens/s counts them, the
    median does not. Each with what Python's garbage collector took in it (records from before it was
    measured: -), the first suspect."""
    rows: list[list]  # (cell, step, seconds, x the median step, full collections in it)
    timed: int  # timed steps read, over every ok cell
    cells: int  # ok cells with timed steps
    slow_cells: int  # of those, the cells with a slow step

    def line(self) -> str:
        """The whole count in one line ("" where no step was slow): the table would drown the answer."""
        if not self.rows:
            return ""
        return (f"Slow steps: {len(self.rows):,} of {self.timed:,} timed steps took over {SLOW:g}x their cell's "
                f"median step, in {self.slow_cells} of {self.cells} cells (the window's tok/s counts them, "
                f"'at p50' does not): every one in {SLOW_FILE}.")

    def table(self) -> str:
        return md_table(["cell", "step", "s", "x the median step", "full garbage collections in it (time)"],
                        self.rows) if self.rows else ""


def slow_steps(results: list[CellResult], axes_: list[str]) -> SlowSteps:
    rows, timed, cells, slow_cells = [], 0, 0, 0
    for r in ok_cells(results):
        steps = [s for s in read_steps(r) if s.get("timed")]
        p50 = r.metrics.get("perf/step_time_p50_s")
        slow = [s for s in steps if p50 and s["time_s"] > SLOW * p50]
        for s in slow:
            gc = f"{s['gc_full']} ({s['gc_ms']:.0f} ms)" if "gc_full" in s else "-"
            rows.append([label(r, axes_), s["step"], f"{s['time_s']:.3f}", f"{s['time_s'] / p50:.2f}", gc])
        timed, cells, slow_cells = timed + len(steps), cells + bool(steps), slow_cells + bool(slow)
    return SlowSteps(rows, timed, cells, slow_cells)


def slow_steps_table(results: list[CellResult], axes_: list[str]) -> str:
    return slow_steps(results, axes_).table()


def _same_batches(axis: str) -> bool:
    # what a cell may change and still train on the same batches: the backend and its options (but
    # backend.pack, which made other rows in results written before 2026-11-25), and which layers are
    # recomputed or offloaded
    return axis in ("backend", "train.checkpoint_fraction", "train.offload_fraction") or (
        axis.startswith("backend.") and axis != "backend.pack")


def loss_curves(results: list[CellResult], axes_: list[str]) -> tuple | None:
    """When only the backend, its options and the recomputed or offloaded layers vary, the cells
    trained on the same batches: ((reference cell, its curve), [(cell, curve)...]), the reference
    being the first hf cell (or the first cell); None otherwise."""
    if "backend" not in axes_ or not all(map(_same_batches, axes_)):
        return None
    curves = [(r, c) for r in results if r.ok and (c := read_losses(r))]
    if len(curves) < 2:
        return None
    return next(((r, c) for r, c in curves if r.config["backend"]["name"] == "hf"), curves[0]), curves


def loss_match_table(axes_: list[str], found: tuple | None) -> str:
    """Each cell's per-step loss against the reference's at every common step: the largest and the
    mean absolute difference, and the mean relative one."""
    if found is None:
        return ""
    (ref, ref_c), curves = found
    rows = []
    for r, c in curves:
        if r is ref:
            continue
        common = sorted(set(c) & set(ref_c))
        d = [abs(c[s] - ref_c[s]) for s in common]
        rel = [abs(c[s] - ref_c[s]) / abs(ref_c[s]) for s in common]
        rows.append([label(r, axes_), len(common), f"{max(d):.4f}", f"{sum(d) / len(d):.4f}",
                     f"{100 * sum(rel) / len(rel):.2f}%", f"{c[common[-1]]:.4f} (ref {ref_c[common[-1]]:.4f})"])
    return f"Against {label(ref, axes_)}:\n\n" + md_table(
        ["cell", "steps compared", "max abs diff", "mean abs diff", "mean rel diff", "last loss"], rows)


def fit_grid(results: list[CellResult], axes_: list[str]) -> dict | None:
    """When a sweep varies seq_len or batch and nothing else: {(seq_len, batch): result}."""
    if not axes_ or not set(axes_) <= {"seq_len", "batch"}:
        return None
    return {(r.config["seq_len"], r.config["batch"]): r for r in results}


def fit_table(grid: dict) -> str:
    """Largest batch that ran per seq_len, with its peak memory and throughput."""
    rows = []
    for seq in sorted({s for s, _ in grid}):
        row_ = sorted((b, r) for (s, b), r in grid.items() if s == seq)
        fits = [(b, r) for b, r in row_ if r.ok]
        over = [b for b, r in row_ if r.status in (Status.oom, Status.skipped)]
        if fits:
            b, r = fits[-1]
            rows.append([seq, b, num(r.metrics.get("mem/peak_reserved_gib"), ".2f"), f"{r.metrics[TOK]:,.0f}",
                         min(over) if over else "none tried"])
        else:
            rows.append([seq, "none", "-", "-", min(over) if over else "-"])
    return md_table(["seq_len", "largest batch that fits", "peak resv GiB", "tok/s non-pad", "first batch that does not"],
                    rows)


def projection(r: CellResult, cfg: ReportConfig) -> dict | None:
    """Time, cost and energy to train on cfg.dataset_samples samples at this cell's measured rate."""
    m = r.metrics
    if not r.ok or not m.get("perf/samples_per_s"):
        return None
    hours = cfg.dataset_samples / m["perf/samples_per_s"] / 3600
    tokens = cfg.dataset_samples * m["count/tokens_nonpad"] / m["count/samples"]
    out = {"hours": hours, "tokens": tokens, "usd": hours * m["cost/usd_per_hour"] if "cost/usd_per_hour" in m else None,
           "kwh": energy(m, cfg).get("energy/kwh_for_dataset")}
    if cfg.reference_usd_per_1m_tokens is not None:
        out["reference_usd"] = tokens / 1e6 * cfg.reference_usd_per_1m_tokens
    return out


def projection_table(results: list[CellResult], axes_: list[str], cfg: ReportConfig) -> str:
    rows = [[label(r, axes_), f"{p['hours']:.2f}", f"{p['tokens'] / 1e6:.2f}", money(p["usd"]),
             num(p["kwh"], ".2f"), money(p.get("reference_usd"))] for r in results if (p := projection(r, cfg))]
    return md_table(["cell", "hours", "M non-pad tokens", "GPU cost", "kWh (GPU)", cfg.reference_name], rows) if rows else ""


def baseline(results: list[CellResult], cfg: ReportConfig) -> CellResult | None:
    ok = ok_cells(results)
    if cfg.baseline is None:
        return ok[0] if ok else None
    for r in ok:
        if str(r.job_num) == str(cfg.baseline) or r.cell == cfg.baseline:
            return r
    raise ValueError(f"report.baseline={cfg.baseline!r} names no finished cell; give a job number or one of "
                     f"{[r.cell for r in ok]}")


def constants(results: list[CellResult]) -> str:
    """What every cell shares, for titles: model, precision, GPU (or emulated budget), data."""
    if not results:
        return ""
    parts = []
    for group, fmt in (("model", "{}"), ("precision", "{}"), ("gpu", "GPU {}"), ("data", "data {}")):
        vals = {str(choice(r, group)) for r in results}
        if len(vals) == 1:
            parts.append(fmt.format(vals.pop()))
    devices = {(r.gpu or {}).get("device_name") for r in results} - {None}
    if len(devices) == 1:
        parts.append(f"on {devices.pop()}")
    budgets = {(r.gpu or {}).get("budget_gib") for r in results} - {None}
    if len(budgets) == 1:
        parts.append(f"budget {budgets.pop():g} GiB")
    seqs = {r.config.get("seq_len") for r in results}
    if len(seqs) == 1:
        parts.append(f"seq {seqs.pop()}")
    return ", ".join(parts)
