"""Which GPU should I pay for: measured cells projected onto GPUs they did not run on.

The model, in a paragraph. A measured training step of t seconds is split into four parts, each
of which scales with a different figure of the hardware:
  compute  the matrix products and attention: scaled by the bf16 matmul rate achieved at the
           cell's GEMM shape (rows = batch x seq_len), source rate / target rate;
  memory   the memory-bound kernels (norms, activations, casts, residual adds, 4-bit dequantisation,
           loss, optimizer): scaled by the achieved bandwidth of an activation-sized elementwise op;
  data     host-to-device copies and waiting on the DataLoader: unchanged;
  host     the rest of the step, when the device sat idle waiting for Python and kernel launches: it
           does not shrink with a faster GPU; when both machines' launch floors are measured
           (`hw/launch_us`) it scales with their ratio, else it stays as measured.
The split comes from the cell's own profile (`train.profile_steps`: kernel times by category, the
host part being the measured step minus the device's work), or, without a profile, from the cell's
FLOP count (model FLOPs plus the recomputation of checkpointed layers) at the source's achieved
rate, the rest of the step taken as memory-bound. The target's step is the sum of the scaled parts;
tokens and samples per step are the source's. A GPU's achieved figures are its own `bench.py
suite=hardware` run when conf/gpu names one (`measured:`), otherwise its datasheet figure times the
fraction of the datasheet the measured source GPU reaches (at that GEMM shape). Memory: the cell
fits a target when its measured peak reserved memory plus MARGIN_GIB is within the target's memory.

Several GPUs (a DDP or FSDP cell on one node, train.nproc = N): projected onto N GPUs of each target, each
rank's step as above (FLOPs and tokens per rank: the cell's totals over N), at N GPUs' price, fitting where
its largest rank's peak fits one target GPU. The interconnect is assumed to be of the same kind as the
source's (NVLink to NVLink, PCIe to PCIe): the collectives (DDP's all-reduce of the adapters' gradients,
FSDP's all-gathers of each layer's weights and reduce-scatters) keep the share of the step they had, inside
the parts they overlapped or waited in, and are not scaled by any link figure. A faster GPU on the same
links therefore comes out optimistic for a communication-bound FSDP cell. Cells over several nodes (the
network between them) are left out.

What the model leaves out: the power and clock limits that hold a small card below its datasheet
rate (the fraction measured on the source is assumed), a different host CPU (unless measured), a
different kernel choice per architecture (FlashAttention, cuBLAS heuristics), and memory that
differs between GPUs. Every projected figure carries its basis; a measured one is never replaced.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from lorabench.analysis import md_table, money
from lorabench.config import CONF_DIR
from lorabench.results import REPO, RESULT_FILE, CellResult, atomic_write_text, load_cells, read_result

# CUDA context and library workspaces live outside torch's pool (about 0.5 GiB on an H100:
# nvidia-smi's used memory minus torch's reserved), and a different GPU's kernels and allocator
# history fragment the pool differently: 0.5 GiB more.
MARGIN_GIB = 1.0
STEP_KEYS = ("time/window_s", "count/timed_steps", "count/tokens_nonpad", "count/samples")  # a measured step
NEEDED = ("memory_gib", "peak_bf16_tflops", "memory_bandwidth_gbs")
COLUMNS = ("cell", "source", "target", "measured", "step_time_s", "tokens_per_s", "samples_per_s", "fits",
           "peak_reserved_gib", "target_memory_gib", "usd_per_1m_tokens", "usd_per_1m_tokens_spot", "hours",
           "usd", "usd_spot", "basis", "gpus")


def interp(table: dict[int, float], rows: float) -> float:
    """A measured figure by rows, linear in log(rows) between the measured points, flat outside them."""
    xs = sorted(table)
    if rows <= xs[0] or rows >= xs[-1]:
        return table[xs[0] if rows <= xs[0] else xs[-1]]
    lo = max(x for x in xs if x <= rows)
    hi = min(x for x in xs if x >= rows)
    if lo == hi:
        return table[lo]
    w = (math.log(rows) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return table[lo] * (1 - w) + table[hi] * w


@dataclass(frozen=True)
class Gpu:
    """One conf/gpu option's figures: the datasheet's, and what `bench.py suite=hardware` measured."""

    name: str
    match: tuple[str, ...]
    memory_gib: float
    peak_tflops: float  # dense bf16, datasheet
    bandwidth_gbs: float  # device memory, datasheet
    price: float | None
    spot: float | None
    gemm: dict = field(default_factory=dict)  # rows -> TFLOP/s over one step's GEMMs; {} = not measured
    elementwise_gbs: float | None = None
    launch_us: float | None = None
    source: str = "datasheet"

    def matmul_tflops(self, rows: float, like: "Gpu") -> float:
        """The bf16 rate achieved at this GEMM shape: measured here, or this GPU's datasheet peak at
        the fraction of its own peak that `like` (a measured GPU) reaches at that shape."""
        if self.gemm:
            return interp(self.gemm, rows)
        if like.gemm:
            return self.peak_tflops * interp(like.gemm, rows) / like.peak_tflops
        return self.peak_tflops

    def achieved_gbs(self, like: "Gpu") -> float:
        if self.elementwise_gbs:
            return self.elementwise_gbs
        if like.elementwise_gbs:
            return self.bandwidth_gbs * like.elementwise_gbs / like.bandwidth_gbs
        return self.bandwidth_gbs


def read_hardware(path: Path) -> dict:
    """The figures a projection needs from a `bench.py suite=hardware` run dir (or its metrics.json)."""
    path = path / RESULT_FILE if path.is_dir() else path
    m = read_result(path).metrics
    gemm = {int(k[len("hw/gemm_t"):-len("_tflops")]): v for k, v in m.items()
            if k.startswith("hw/gemm_t") and k.endswith("_tflops")}
    if not gemm:
        raise ValueError(f"{path} has no hw/gemm_t<rows>_tflops: run `python bench.py suite=hardware "
                         "model=mistral-7b-v0.3` with this version of lorabench")
    return {"gemm": gemm, "elementwise_gbs": m.get("hw/elementwise_gbs"), "launch_us": m.get("hw/launch_us")}


@functools.lru_cache(maxsize=None)  # project, validate and the report ask for the same options: read each once
def gpu_option(name: str) -> Gpu:
    """A conf/gpu option as projection figures; one without them is refused by name."""
    path = CONF_DIR / "gpu" / f"{name}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in (CONF_DIR / "gpu").glob("*.yaml") if p.stem != "auto")
        raise ValueError(f"no GPU option {name!r} in conf/gpu; options: {options}")
    o = OmegaConf.to_container(OmegaConf.load(path))
    missing = [k for k in NEEDED if o.get(k) is None]
    if missing:
        raise ValueError(f"gpu option {name!r} has no {', '.join(missing)}: it cannot be projected onto "
                         f"(add the figures to conf/gpu/{name}.yaml)")
    measured = {}
    if o.get("measured"):
        measured = read_hardware(REPO / o["measured"])
        measured["source"] = f"measured: {o['measured']}"
    return Gpu(name=name, match=tuple(o.get("match", [])), memory_gib=o["memory_gib"],
               peak_tflops=o["peak_bf16_tflops"], bandwidth_gbs=o["memory_bandwidth_gbs"],
               price=o.get("price_per_hour"), spot=o.get("spot_price_per_hour"),
               **{"source": "datasheet", **measured})


def projectable() -> list[str]:
    """Every conf/gpu option with the figures a projection needs."""
    names = []
    for p in sorted((CONF_DIR / "gpu").glob("*.yaml")):
        o = OmegaConf.load(p)
        if all(o.get(k) is not None for k in NEEDED):
            names.append(p.stem)
    return names


def source_gpu(r: CellResult, gpus: list[Gpu]) -> Gpu | None:
    """The GPU a cell ran on (its device's name against the options' match patterns)."""
    device = (r.gpu or {}).get("device_name") or ""
    return next((g for g in gpus if any(re.search(p, device) for p in g.match)), None)


@dataclass(frozen=True)
class Step:
    """A measured cell's mean timed step, split into the parts that scale differently (seconds)."""

    seconds: float
    compute: float
    memory: float
    data: float
    host: float
    rows: int  # GEMM rows per micro-batch: batch x seq_len
    tokens: float  # non-pad tokens per step
    samples: float
    peak_gib: float | None
    basis: str


def world_size(r: CellResult) -> int:
    """The GPUs a cell ran on: train.nproc x train.nnodes (its ranks)."""
    t = r.config.get("train", {})
    return r.metrics.get("dist/world_size", t.get("nproc", 1) * t.get("nnodes", 1))


def step_parts(r: CellResult, src: Gpu) -> Step:
    """The cell's mean timed step; for a multi-GPU cell, as one rank's (its FLOPs are the cell's over N;
    tokens and samples stay the cell's, all ranks')."""
    m, c = r.metrics, r.config
    steps, n = m["count/timed_steps"], world_size(r)
    t = m["time/window_s"] / steps
    common = dict(seconds=t, rows=c["batch"] * c["seq_len"], tokens=m["count/tokens_nonpad"] / steps,
                  samples=m["count/samples"] / steps, peak_gib=m.get("mem/peak_reserved_gib"))
    if "prof/step_ms" in m:
        ms = lambda *cats: sum(m[f"prof/{k}_ms"] for k in cats) / 1e3  # noqa: E731
        compute, memory = ms("matmul", "attention"), ms("dequant", "elementwise", "loss", "optimizer")
        data = ms("data")
        busy = compute + memory + data
        # Kernel times are the profile's; the host part is what the timed step has beyond them.
        # (A profiled step's own host time is inflated by the profiler; its kernels are not.)
        k = min(1.0, t / busy)
        return Step(compute=compute * k, memory=memory * k, data=data * k, host=max(0.0, t - busy),
                    basis=f"profile of {m['prof/steps']} steps", **common)
    # No profile: the FLOP count at the source's achieved rate; everything else memory-bound.
    flops = m["perf/model_tflops"] * 1e12 * t
    tr = c.get("train", {})
    if tr.get("gradient_checkpointing"):  # checkpointed layers run their forward twice
        # (the active weights: an MoE layer recomputes only the experts its tokens run through)
        flops += 2 * m.get("params/active_matmul", m["params/base_matmul"]) * common["tokens"] \
            * tr.get("checkpoint_fraction", 1.0)
    flops /= n  # one rank's share: each runs its own batch at the same time
    compute = min(t, flops / (src.matmul_tflops(common["rows"], src) * 1e12))
    return Step(compute=compute, memory=t - compute, data=0.0, host=0.0,
                basis="FLOP count (no profile; the rest taken as memory-bound)", **common)


@dataclass(frozen=True)
class Row:
    cell: str
    source: str
    target: str
    measured: bool
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    fits: bool
    peak_reserved_gib: float | None
    target_memory_gib: float
    usd_per_1m_tokens: float | None
    usd_per_1m_tokens_spot: float | None
    hours: float
    usd: float | None
    usd_spot: float | None
    basis: str
    gpus: int = 1  # GPUs of the target: the cell's train.nproc

    @property
    def on(self) -> str:
        """The target in words: "a10", or "4 x a10" for a multi-GPU cell."""
        return self.target if self.gpus == 1 else f"{self.gpus} x {self.target}"


def project_step(s: Step, src: Gpu, tgt: Gpu) -> tuple[float, str]:
    """The target's step time (s) and what it was scaled by."""
    if tgt.name == src.name:
        return s.seconds, f"measured on {src.name}"
    rs, rt = src.matmul_tflops(s.rows, src), tgt.matmul_tflops(s.rows, src)
    bs, bt = src.achieved_gbs(src), tgt.achieved_gbs(src)
    host = src.launch_us and tgt.launch_us and tgt.launch_us / src.launch_us
    t = s.compute * rs / rt + s.memory * bs / bt + s.data + s.host * (host or 1.0)
    how = (f"projected from {src.name}, {s.basis}: compute x {rs:.0f}/{rt:.0f} TFLOP/s at {s.rows} rows, "
           f"memory-bound x {bs:.0f}/{bt:.0f} GB/s, host " + (f"x {host:.2f} (launch floors)" if host else "as measured")
           + f"; target figures: {tgt.source}")
    return t, how


def project(results: list[CellResult], targets: list[Gpu], dataset_samples: int) -> tuple[list[Row], list[str]]:
    """Every ok cell of one node (1 GPU, or N under DDP or FSDP: onto N of each target) onto every target:
    rows, and a note for each cell left out."""
    gpus = [gpu_option(n) for n in projectable()]
    rows, notes = [], []
    for r in results:
        if not r.ok or not all(k in r.metrics for k in STEP_KEYS):
            continue
        src = source_gpu(r, gpus)
        if src is None:
            notes.append(f"{r.cell}: ran on {(r.gpu or {}).get('device_name', r.device)}, which no conf/gpu option "
                         "with figures matches: not projected")
            continue
        if r.config.get("train", {}).get("nnodes", 1) > 1:
            notes.append(f"{r.cell}: several nodes: not projected (the network between nodes is not modelled)")
            continue
        s, n = step_parts(r, src), world_size(r)
        for tgt in targets:
            t, basis = project_step(s, src, tgt)
            if n > 1:
                basis += f"; {n} GPUs, interconnect assumed of the source's kind (collectives not scaled)"
            hours = dataset_samples * t / s.samples / 3600
            per_1m = lambda price: None if price is None else n * price / 3600 * t / s.tokens * 1e6  # noqa: E731
            for_all = lambda price: None if price is None else n * price * hours  # noqa: E731
            rows.append(Row(
                cell=r.cell, source=src.name, target=tgt.name, measured=tgt.name == src.name, step_time_s=t,
                tokens_per_s=s.tokens / t, samples_per_s=s.samples / t,
                fits=s.peak_gib is None or s.peak_gib + MARGIN_GIB <= tgt.memory_gib,
                peak_reserved_gib=s.peak_gib, target_memory_gib=tgt.memory_gib,
                usd_per_1m_tokens=per_1m(tgt.price), usd_per_1m_tokens_spot=per_1m(tgt.spot),
                hours=hours, usd=for_all(tgt.price), usd_spot=for_all(tgt.spot), basis=basis, gpus=n))
    return rows, notes


def cheapest(rows: list[Row], spot: bool = False) -> Row | None:
    key = "usd_per_1m_tokens_spot" if spot else "usd_per_1m_tokens"
    fitting = [r for r in rows if r.fits and getattr(r, key) is not None]
    return min(fitting, key=lambda r: getattr(r, key), default=None)


def write_csv(records: list, path: Path) -> None:
    """Rows (projection Rows or validation dicts) as CSV, one column per field, written atomically."""
    dicts = [asdict(r) if not isinstance(r, dict) else r for r in records]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(dicts[0]) if dicts else list(COLUMNS))
    w.writeheader()
    w.writerows(dicts)
    atomic_write_text(path, buf.getvalue())


def matrix_table(rows: list[Row]) -> str:
    """One row per cell: $/1M non-pad tokens on each target (on demand; 'no fit' where it does not fit;
    * measured, the others projected), and the cheapest target that fits, on demand and spot."""
    cells = list(dict.fromkeys(r.cell for r in rows))
    targets = list(dict.fromkeys(r.target for r in rows))
    out = []
    for c in cells:
        mine = [r for r in rows if r.cell == c]
        by = {r.target: r for r in mine}
        cells_ = [("no fit" if not by[t].fits else money(by[t].usd_per_1m_tokens) + ("*" if by[t].measured else ""))
                  if t in by else "-" for t in targets]
        best, best_spot = cheapest(mine), cheapest(mine, spot=True)
        out.append([c, *cells_, f"{best.on} {money(best.usd_per_1m_tokens)}" if best else "-",
                    f"{best_spot.on} {money(best_spot.usd_per_1m_tokens_spot)}" if best_spot else "-"])
    return md_table(["cell", *targets, "cheapest (on demand)", "cheapest (spot)"], out)


def summary(rows: list[Row], notes: list[str], dataset_samples: int) -> str:
    """The projection's markdown: the $/1M matrix, the overall cheapest, the bases, the notes."""
    if not rows:
        return "\n".join(notes)
    best, spot = cheapest(rows), cheapest(rows, spot=True)
    lines = [matrix_table(rows), "",
             "USD per 1M non-pad tokens; * measured on that GPU, every other figure projected "
             "(lorabench.projection; projection.csv gives each one's basis).",
             f"Overall cheapest on demand: {best.cell} on {best.on}, {money(best.usd_per_1m_tokens)} per 1M tokens, "
             f"{best.hours:.2f} h and {money(best.usd)} for {dataset_samples:,} samples." if best else None,
             f"Overall cheapest on spot: {spot.cell} on {spot.on}, {money(spot.usd_per_1m_tokens_spot)} per 1M "
             f"tokens, {money(spot.usd_spot)} for {dataset_samples:,} samples." if spot else None]
    sources = {r.source for r in rows}
    targets = {r.target: r.basis.split("target figures: ")[-1] for r in rows if not r.measured}
    lines += [f"Projected from {', '.join(sorted(sources))}; target figures: "
              + "; ".join(f"{t}: {s}" for t, s in targets.items())]
    return "\n".join(x for x in lines + notes if x is not None)


# ---------------------------------------------------------------------------- validation

def measured_points(path: Path, gpus: list[Gpu]) -> list[dict]:
    """Measured cells to check projections against: a sweep or run dir (its cells' GPU and tokens/s),
    or a CSV with columns cell, target, samples_per_s or tokens_per_s, and source."""
    if path.suffix == ".csv":
        with open(path) as f:
            return [{"cell": row["cell"], "target": row["target"], "source": row.get("source", str(path)),
                     **{k: float(row[k]) for k in ("samples_per_s", "tokens_per_s") if row.get(k)}}
                    for row in csv.DictReader(f)]
    out = []
    for r in load_cells(path):
        g = source_gpu(r, gpus)
        if r.ok and g is not None and "perf/tokens_per_s" in r.metrics:
            out.append({"cell": r.cell, "target": g.name, "tokens_per_s": r.metrics["perf/tokens_per_s"],
                        "samples_per_s": r.metrics["perf/samples_per_s"], "source": str(path)})
    return out


def validate(rows: list[Row], points: list[dict], results: list[CellResult]) -> list[dict]:
    """Each measured point against its projection: error = predicted / measured - 1, in tokens/s where
    measured, else samples/s; beside it a single ratio of datasheet peaks applied to the whole
    measured step (the naive projection), for comparison."""
    by = {(r.cell, r.target): r for r in rows if not r.measured}
    measured_here = {r.cell: r.metrics for r in results if r.ok}
    peak = {n: gpu_option(n).peak_tflops for n in {r.target for r in rows} | {r.source for r in rows}}
    out = []
    for p in points:
        r = by.get((p["cell"], p["target"]))
        if r is None:
            continue
        unit = "tokens_per_s" if "tokens_per_s" in p else "samples_per_s"
        predicted = getattr(r, unit)
        naive = measured_here[p["cell"]][f"perf/{unit}"] * peak[p["target"]] / peak[r.source]
        out.append({"cell": p["cell"], "source": r.source, "target": p["target"], "unit": unit,
                    "measured": p[unit], "predicted": predicted, "error": predicted / p[unit] - 1,
                    "peak_ratio_predicted": naive, "peak_ratio_error": naive / p[unit] - 1,
                    "measured_in": p["source"]})
    return out


def validation_table(checks: list[dict]) -> str:
    if not checks:
        return ""
    rows = [[c["cell"], f"{c['source']} -> {c['target']}", c["unit"].replace("_per_s", "/s"),
             f"{c['measured']:,.2f}" if c["measured"] < 100 else f"{c['measured']:,.0f}",
             f"{c['predicted']:,.2f}" if c["predicted"] < 100 else f"{c['predicted']:,.0f}",
             f"{100 * c['error']:+.1f}%", f"{100 * c['peak_ratio_error']:+.1f}%"] for c in checks]
    lines = [md_table(["cell", "projection", "unit", "measured", "predicted", "error", "peak-ratio error"], rows), ""]
    for pair in dict.fromkeys((c["source"], c["target"]) for c in checks):
        errs = sorted(abs(c["error"]) for c in checks if (c["source"], c["target"]) == pair)
        lines.append(f"{pair[0]} -> {pair[1]}: median |error| {100 * median(errs):.1f}%, "
                     f"largest {100 * errs[-1]:.1f}% over {len(errs)} cells.")
    return "\n".join(lines)


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2
