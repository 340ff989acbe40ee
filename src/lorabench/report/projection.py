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
tokens and samples per step are the source's.

A GPU's achieved rates, in this order: its own `bench.py suite=hardware` figures where conf/gpu has
them (`measured:`, one figure, copied from that run's metrics.json, or read from the run dir it names);
else the rates others published (conf/gpu `achieved_gemm_tflops`, `achieved_copy_gbs`: low / expected /
high), put on the source's measured scale (the source's rate at the cell's GEMM shape over its own
published best-shape rate; its elementwise over its copy rate); else a physical model: the sustained
clock a board's power limit allows (power ~ f^3, so the clock share goes as the cube root of the watts
per SM against the source's; low at the base clock, high at no extra limit) and the share of the
datasheet bandwidth its memory type reaches (MEMORY_SHARE). Every projected figure is a range, slowest
rates to fastest, with the target's validated error beside it (conf/gpu `validated_error_pct`).
Memory: a cell fits a target when its measured peak reserved memory plus margin_gib(target) (CUDA
context, which differs by card, and an allocator allowance) is within the target's memory.
Several GPUs (a DDP or FSDP cell on one node, train.nproc = N): projected onto N GPUs of each target, each
rank's step as above (FLOPs and tokens per rank: the cell's totals over N), at N GPUs' price, fitting where
its largest rank's peak fits one target GPU. The interconnect is assumed to be of the same kind as the
source's (NVLink to NVLink, PCIe to PCIe): the collectives (DDP's all-reduce of the adapters' gradients,
FSDP's all-gathers of each layer's weights and reduce-scatters) keep the share of the step they had, inside
the parts they overlapped or waited in, and are not scaled by any link figure. A faster GPU on the same
links therefore comes out optimistic for a communication-bound FSDP cell. Cells over several nodes (the
network between them) are left out.

What the model leaves out: a different host CPU (unless measured), kernels that differ between
architectures (FlashAttention versions, cuBLAS heuristics at one shape), a power limit that also
slows memory-bound kernels, and how a whole run's figure (warmup, evaluation, saving) differs from
a timed window. A measured figure is never replaced by a projection; docs/projection_sources.md
cites every published rate.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from omegaconf import OmegaConf

from lorabench.core.config import CONF_DIR
from lorabench.core.results import REPO, RESULT_FILE, CellResult, atomic_write_text, load_cells, read_result
from lorabench.report.analysis import md_table, money

# Memory outside torch's pool, which the measured peak (torch's reserved) does not hold: the CUDA
# context, about 0.5 GiB on an H100 (nvidia-smi's used minus torch's reserved), of which the local-memory
# reservation scales with the card (1 KiB default stack x the most resident threads per SM x SMs:
# 132 x 2048 x 1 KiB = 0.26 GiB on an H100), the rest (driver, lazily loaded kernels) about 0.24 GiB.
# cuBLAS's workspace comes from torch's pool (inside the peak). A different GPU's kernels can
# fragment the pool differently: ALLOCATOR_GIB more. An option without SMs keeps MARGIN_GIB.
CONTEXT_BASE_GIB = 0.5 - 132 * 2048 / 2**20
STACK_KIB = 1.0
ALLOCATOR_GIB = 0.5
MARGIN_GIB = 1.0
# Share of the datasheet bandwidth a device copy reaches, low / expected / high, by memory type, where
# nothing was measured or published: GDDR6 from the A10's and the L4's published copies (0.78 of the
# datasheet as one tool reads them, 0.86 corrected for its bias, 0.895 the share an H100's HBM3 reaches;
# docs/projection_sources.md); HBM: the source GPU's measured share (low: 0.9 of it).
MEMORY_SHARE = {"GDDR6": (0.78, 0.86, 0.895)}
HBM_LOW = 0.9
# The largest share of its datasheet bf16 rate any NVIDIA card reaches in stas00/ml-engineering's MAMF
# table (A100 SXM, 271.2 / 312): the clock model's high end where it is above the source's share.
BEST_SHARE = 0.869
STEP_KEYS = ("time/window_s", "count/timed_steps", "count/tokens_nonpad", "count/samples")  # a measured step
NEEDED = ("memory_gib", "peak_bf16_tflops", "memory_bandwidth_gbs")
COLUMNS = ("cell", "source", "target", "measured", "step_time_s", "tokens_per_s", "tokens_per_s_low",
           "tokens_per_s_high", "samples_per_s", "samples_per_s_low", "samples_per_s_high", "fits",
           "peak_reserved_gib", "target_memory_gib", "margin_gib", "usd_per_1m_tokens", "usd_per_1m_tokens_low",
           "usd_per_1m_tokens_high", "usd_per_1m_tokens_spot", "hours", "hours_low", "hours_high", "usd",
           "usd_spot", "expected_error", "basis", "gpus")
Range = tuple[float, float, float]  # low, expected, high


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
    """One conf/gpu option's figures: the datasheet's, what `bench.py suite=hardware` measured on it,
    what others published, and what the physical model needs."""

    name: str
    match: tuple[str, ...]
    memory_gib: float
    peak_tflops: float  # dense bf16, datasheet
    bandwidth_gbs: float  # device memory, datasheet
    price: float | None
    spot: float | None
    gemm: dict = field(default_factory=dict)  # rows -> TFLOP/s over one step's GEMMs; {} = not measured
    copy_gbs: float | None = None
    elementwise_gbs: float | None = None
    launch_us: float | None = None
    source: str = "datasheet"
    published_gemm: Range | None = None  # best-shape bf16 TFLOP/s others measured: low, expected, high
    published_copy: Range | None = None  # device copy GB/s others measured
    sms: int | None = None
    threads_per_sm: int | None = None
    boost_mhz: float | None = None
    base_mhz: float | None = None
    power_w: float | None = None
    memory_type: str | None = None
    validated_error_pct: tuple[float, float] | None = None  # median, largest |error| of its validation

    def matmul_tflops(self, rows: float, like: "Gpu") -> float:
        """The bf16 rate achieved at this GEMM shape (expected): measured here, or projected from `like`."""
        return self.matmul_range(rows, like)[1]

    def matmul_range(self, rows: float, like: "Gpu") -> Range:
        """Low / expected / high bf16 rate at this GEMM shape: measured here (one figure), or this GPU's
        best-shape rate (published, else the clock model) times the share of its own best-shape rate
        that `like` (a measured GPU) reaches at this shape."""
        if self.gemm:
            v = interp(self.gemm, rows)
            return v, v, v
        if not like.gemm:
            return self.peak_tflops, self.peak_tflops, self.peak_tflops
        shape = interp(like.gemm, rows) / like.best_gemm()
        return tuple(x * shape for x in self.best_gemm_range(like)[0])

    def best_gemm(self) -> float:
        """The best-shape bf16 rate on the scale others publish: the published figure, else the best
        this GPU's own hardware run measured at a LoRA step's shapes."""
        return self.published_gemm[1] if self.published_gemm else max(self.gemm.values())

    def best_gemm_range(self, like: "Gpu") -> tuple[Range, str]:
        """This GPU's best-shape bf16 rate: published, or the clock model from `like`'s share of its peak."""
        if self.published_gemm:
            return self.published_gemm, "published GEMM rates"
        share = like.best_gemm() / like.peak_tflops
        if not (self.power_w and self.sms and like.power_w and like.sms and self.base_mhz and self.boost_mhz):
            v = self.peak_tflops * share
            return (v, v, v), f"datasheet at {like.name}'s share"
        return clock_model(self, like, share), "clock model"

    def achieved_gbs(self, like: "Gpu") -> float:
        return self.bandwidth_range(like)[1]

    def bandwidth_range(self, like: "Gpu") -> Range:
        """Low / expected / high elementwise bandwidth (GB/s): measured here, or this GPU's copy rate
        (published, else its memory type's share of the datasheet) times `like`'s elementwise / copy."""
        if self.elementwise_gbs:
            return self.elementwise_gbs, self.elementwise_gbs, self.elementwise_gbs
        if not (like.elementwise_gbs and like.copy_gbs):
            v = self.bandwidth_gbs * (like.elementwise_gbs / like.bandwidth_gbs if like.elementwise_gbs else 1.0)
            return v, v, v
        return tuple(c * like.elementwise_gbs / like.copy_gbs for c in self.copy_range(like)[0])

    def copy_range(self, like: "Gpu") -> tuple[Range, str]:
        if self.published_copy:
            return self.published_copy, "published copy rates"
        if self.memory_type in MEMORY_SHARE:
            return tuple(self.bandwidth_gbs * x for x in MEMORY_SHARE[self.memory_type]), f"{self.memory_type} share"
        share = like.copy_gbs / like.bandwidth_gbs  # HBM (or unknown): the source's measured share
        return (self.bandwidth_gbs * share * HBM_LOW, self.bandwidth_gbs * share, self.bandwidth_gbs * share), \
            f"{like.name}'s HBM share"


def clock_model(g: Gpu, like: Gpu, share: float) -> Range:
    """A best-shape bf16 rate where nobody measured one: the datasheet (at the boost clock) times the
    share of its datasheet the measured GPU reaches, times the clock the board's power limit allows
    against the measured GPU's. Dynamic power ~ f x V^2 with V rising with f, so ~ f^3: the sustained
    clock share goes as the cube root of the watts per SM (A10 150 / 72 = 2.1 against an H100's
    700 / 132 = 5.3: (2.1 / 5.3)^(1/3) = 0.73), at most 1. Low: held at the base clock; high: no
    extra limit at the best share any card reaches (BEST_SHARE, or the measured GPU's if higher)."""
    clock = min(1.0, (g.power_w / g.sms / (like.power_w / like.sms)) ** (1 / 3))
    mid = g.peak_tflops * share * clock
    return min(g.peak_tflops * share * g.base_mhz / g.boost_mhz, mid), mid, g.peak_tflops * max(share, BEST_SHARE)


def margin_gib(g: Gpu) -> float:
    """Memory a cell needs on this GPU beyond its measured peak reserved (GiB): CUDA context and
    allocator allowance (CONTEXT_BASE_GIB, STACK_KIB, ALLOCATOR_GIB): A10 0.24 + 72 x 1536 x 1 KiB
    (0.11) + 0.5 = 0.85; H100 0.24 + 0.26 + 0.5 = 1.0."""
    if not (g.sms and g.threads_per_sm):
        return MARGIN_GIB
    return CONTEXT_BASE_GIB + g.sms * g.threads_per_sm * STACK_KIB / 2**20 + ALLOCATOR_GIB


def expected_error(g: Gpu) -> str:
    """What the validation says of projections onto this GPU, printed beside each projected figure."""
    if g.validated_error_pct:
        return f"median {g.validated_error_pct[0]:.0f}%, worst {g.validated_error_pct[1]:.0f}% (validated)"
    return "not validated: the range only"


def read_hardware(path: Path) -> dict:
    """The figures a projection needs from a `bench.py suite=hardware` run dir (or its metrics.json), as
    conf/gpu's `measured` holds them (lorabench.core.config.MeasuredGpu)."""
    path = path / RESULT_FILE if path.is_dir() else path
    m = read_result(path).metrics
    gemm = {int(k[len("hw/gemm_t"):-len("_tflops")]): v for k, v in m.items()
            if k.startswith("hw/gemm_t") and k.endswith("_tflops")}
    if not gemm:
        raise ValueError(f"{path} has no hw/gemm_t<rows>_tflops: run `python bench.py suite=hardware "
                         "model=mistral-7b-v0.3` with this version of lorabench")
    return {"gemm_tflops": gemm, **{k: m.get(f"hw/{k}") for k in ("device_copy_gbs", "elementwise_gbs", "launch_us")}}


def measured_figures(name: str, measured: dict | None) -> dict:
    """A conf/gpu option's `measured` as Gpu fields: its figures, or those of the run dir it names
    (FileNotFoundError where that dir is not there); {} where nothing was measured."""
    if not measured:
        return {}
    where = f"conf/gpu/{name}.yaml"
    if not measured.get("gemm_tflops") and measured.get("run"):
        where = measured["run"]
        if not Path(where).exists():
            raise FileNotFoundError(f"conf/gpu/{name}.yaml's measured.run={where} is not there (a `bench.py "
                                    "suite=hardware` run dir, or its metrics.json)")
        measured = read_hardware(Path(where))
    return {"gemm": {int(k): v for k, v in measured.get("gemm_tflops", {}).items()},
            "copy_gbs": measured.get("device_copy_gbs"), "elementwise_gbs": measured.get("elementwise_gbs"),
            "launch_us": measured.get("launch_us"), "source": f"measured: {where}"}


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
    measured = measured_figures(name, o.get("measured"))
    rng = lambda k: tuple(o[k]) if o.get(k) else None  # noqa: E731
    return Gpu(name=name, match=tuple(o.get("match", [])), memory_gib=o["memory_gib"],
               peak_tflops=o["peak_bf16_tflops"], bandwidth_gbs=o["memory_bandwidth_gbs"],
               price=o.get("price_per_hour"), spot=o.get("spot_price_per_hour"),
               published_gemm=rng("achieved_gemm_tflops"), published_copy=rng("achieved_copy_gbs"),
               sms=o.get("sms"), threads_per_sm=o.get("threads_per_sm"), boost_mhz=o.get("boost_clock_mhz"),
               base_mhz=o.get("base_clock_mhz"), power_w=o.get("power_w"), memory_type=o.get("memory_type"),
               validated_error_pct=rng("validated_error_pct"), **{"source": "datasheet", **measured})


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
    tokens_per_s_low: float
    tokens_per_s_high: float
    samples_per_s: float
    samples_per_s_low: float
    samples_per_s_high: float
    fits: bool
    peak_reserved_gib: float | None
    target_memory_gib: float
    margin_gib: float
    usd_per_1m_tokens: float | None
    usd_per_1m_tokens_low: float | None  # at the fastest rates
    usd_per_1m_tokens_high: float | None
    usd_per_1m_tokens_spot: float | None
    hours: float
    hours_low: float
    hours_high: float
    usd: float | None
    usd_spot: float | None
    expected_error: str
    basis: str
    gpus: int = 1  # GPUs of the target: the cell's train.nproc

    @property
    def on(self) -> str:
        """The target in words: "a10", or "4 x a10" for a multi-GPU cell."""
        return self.target if self.gpus == 1 else f"{self.gpus} x {self.target}"


@dataclass(frozen=True)
class Projected:
    """A step projected onto a target: seconds at the slowest, expected and fastest rates, and how."""

    slow: float
    expected: float
    fast: float
    basis: str


def project_step(s: Step, src: Gpu, tgt: Gpu) -> Projected:
    """The target's step time (s) at its low, expected and high rates, and what it was scaled by."""
    if tgt.name == src.name:
        return Projected(s.seconds, s.seconds, s.seconds, f"measured on {src.name}")
    rs, bs = src.matmul_tflops(s.rows, src), src.achieved_gbs(src)
    rt, bt = tgt.matmul_range(s.rows, src), tgt.bandwidth_range(src)
    host = src.launch_us and tgt.launch_us and tgt.launch_us / src.launch_us
    t = [s.compute * rs / r + s.memory * bs / b + s.data + s.host * (host or 1.0) for r, b in zip(rt, bt)]
    figures = tgt.source if tgt.gemm else (f"{tgt.best_gemm_range(src)[1]}, {tgt.copy_range(src)[1]} "
                                           "(conf/gpu, docs/projection_sources.md)")
    how = (f"projected from {src.name}, {s.basis}: compute x {rs:.0f}/{rt[1]:.0f} ({rt[0]:.0f}-{rt[2]:.0f}) TFLOP/s "
           f"at {s.rows} rows, memory-bound x {bs:.0f}/{bt[1]:.0f} ({bt[0]:.0f}-{bt[2]:.0f}) GB/s, host "
           + (f"x {host:.2f} (launch floors)" if host else "as measured") + f"; target figures: {figures}")
    return Projected(t[0], t[1], t[2], how)


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
        rows += [row(r.cell, s, src, tgt, dataset_samples, n) for tgt in targets]
    return rows, notes


def row(cell: str, s: Step, src: Gpu, tgt: Gpu, dataset_samples: int, n: int = 1) -> Row:
    """One cell on one target; n > 1: a cell of n GPUs onto n of the target's, at n GPUs' price."""
    p = project_step(s, src, tgt)
    if n > 1:
        p = replace(p, basis=p.basis + f"; {n} GPUs, interconnect assumed of the source's kind "
                                "(collectives not scaled)")
    hours = lambda t: dataset_samples * t / s.samples / 3600  # noqa: E731
    per_1m = lambda price, t: None if price is None else n * price / 3600 * t / s.tokens * 1e6  # noqa: E731
    margin = margin_gib(tgt)
    measured = tgt.name == src.name
    return Row(
        cell=cell, source=src.name, target=tgt.name, measured=measured, step_time_s=p.expected,
        tokens_per_s=s.tokens / p.expected, tokens_per_s_low=s.tokens / p.slow, tokens_per_s_high=s.tokens / p.fast,
        samples_per_s=s.samples / p.expected, samples_per_s_low=s.samples / p.slow,
        samples_per_s_high=s.samples / p.fast,
        fits=s.peak_gib is None or s.peak_gib + margin <= tgt.memory_gib,
        peak_reserved_gib=s.peak_gib, target_memory_gib=tgt.memory_gib, margin_gib=margin,
        usd_per_1m_tokens=per_1m(tgt.price, p.expected), usd_per_1m_tokens_low=per_1m(tgt.price, p.fast),
        usd_per_1m_tokens_high=per_1m(tgt.price, p.slow), usd_per_1m_tokens_spot=per_1m(tgt.spot, p.expected),
        hours=hours(p.expected), hours_low=hours(p.fast), hours_high=hours(p.slow),
        usd=None if tgt.price is None else n * tgt.price * hours(p.expected),
        usd_spot=None if tgt.spot is None else n * tgt.spot * hours(p.expected),
        expected_error="measured" if measured else expected_error(tgt), basis=p.basis, gpus=n)


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


def short_error(rows: list[Row], target: str) -> str:
    """A target's expected error for a column header: the validated median, or that it has none."""
    errs = {r.expected_error for r in rows if r.target == target}
    if errs == {"measured"}:
        return "measured"
    g = gpu_option(target)
    return f"~{g.validated_error_pct[0]:.0f}% median error" if g.validated_error_pct else "not validated"


def money_range(r: Row) -> str:
    """$/1M tokens on demand: measured (*), or projected expected with the fast-slow range (none where
    the target's rates are its own measurement)."""
    if r.measured:
        return money(r.usd_per_1m_tokens) + "*"
    if r.usd_per_1m_tokens_low == r.usd_per_1m_tokens_high:
        return money(r.usd_per_1m_tokens)
    return f"{money(r.usd_per_1m_tokens)} ({money(r.usd_per_1m_tokens_low)}-{money(r.usd_per_1m_tokens_high)})"


def matrix_table(rows: list[Row]) -> str:
    """One row per cell: $/1M non-pad tokens on each target (on demand; expected and its range; 'no fit'
    where it does not fit; * measured), each target's expected error in its header, and the cheapest
    target that fits, on demand and spot."""
    cells = list(dict.fromkeys(r.cell for r in rows))
    targets = list(dict.fromkeys(r.target for r in rows))
    out = []
    for c in cells:
        mine = [r for r in rows if r.cell == c]
        by = {r.target: r for r in mine}
        cells_ = [("no fit" if not by[t].fits else money_range(by[t])) if t in by else "-" for t in targets]
        best, best_spot = cheapest(mine), cheapest(mine, spot=True)
        out.append([c, *cells_, f"{best.on} {money(best.usd_per_1m_tokens)}" if best else "-",
                    f"{best_spot.on} {money(best_spot.usd_per_1m_tokens_spot)}" if best_spot else "-"])
    heads = [f"{t} ({short_error(rows, t)})" for t in targets]
    return md_table(["cell", *heads, "cheapest (on demand)", "cheapest (spot)"], out)


def summary(rows: list[Row], notes: list[str], dataset_samples: int) -> str:
    """The projection's markdown: the $/1M matrix, the overall cheapest, the bases, the notes."""
    if not rows:
        return "\n".join(notes)
    best, spot = cheapest(rows), cheapest(rows, spot=True)
    rng = lambda r: "" if r.measured else (  # noqa: E731
        f" ({r.hours_low:.2f}-{r.hours_high:.2f} h; {r.expected_error})")
    lines = [matrix_table(rows), "",
             "USD per 1M non-pad tokens: * measured on that GPU; every other figure projected, expected "
             "(range from the slowest to the fastest rates of the target's sources), its validated error in "
             "the column's header (lorabench.report.projection; projection.csv gives each one's basis).",
             f"Overall cheapest on demand: {best.cell} on {best.on}, {money(best.usd_per_1m_tokens)} per 1M tokens, "
             f"{best.hours:.2f} h{rng(best)} and {money(best.usd)} for {dataset_samples:,} samples." if best else None,
             f"Overall cheapest on spot: {spot.cell} on {spot.on}, {money(spot.usd_per_1m_tokens_spot)} per 1M "
             f"tokens, {money(spot.usd_spot)} for {dataset_samples:,} samples." if spot else None]
    sources = {r.source for r in rows}
    targets = {r.target: r.basis.split("target figures: ")[-1] for r in rows if not r.measured}
    lines += [f"Projected from {', '.join(sorted(sources))}; target figures: "
              + "; ".join(f"{t}: {s}" for t, s in targets.items())]
    margins = {r.target: r.margin_gib for r in rows}
    lines += ["Fits: measured peak reserved plus a margin per GPU (CUDA context and allocator; GiB): "
              + ", ".join(f"{t} {m:.2f}" for t, m in margins.items()) + "."]
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
    measured, else samples/s, with the projection's range; beside it a single ratio of datasheet peaks
    applied to the whole measured step (the naive projection), for comparison."""
    by = {(r.cell, r.target): r for r in rows if not r.measured}
    measured_here = {r.cell: r.metrics for r in results if r.ok}
    peak = {n: gpu_option(n).peak_tflops for n in {r.target for r in rows} | {r.source for r in rows}}
    out = []
    for p in points:
        r = by.get((p["cell"], p["target"]))
        if r is None:
            continue
        unit = "tokens_per_s" if "tokens_per_s" in p else "samples_per_s"
        predicted, low, high = getattr(r, unit), getattr(r, f"{unit}_low"), getattr(r, f"{unit}_high")
        naive = measured_here[p["cell"]][f"perf/{unit}"] * peak[p["target"]] / peak[r.source]
        out.append({"cell": p["cell"], "source": r.source, "target": p["target"], "unit": unit,
                    "measured": p[unit], "predicted": predicted, "predicted_low": low, "predicted_high": high,
                    "error": predicted / p[unit] - 1, "in_range": None if low == high else low <= p[unit] <= high,
                    "peak_ratio_predicted": naive, "peak_ratio_error": naive / p[unit] - 1,
                    "measured_in": p["source"]})
    return out


def errors(checks: list[dict]) -> dict[tuple[str, str], tuple[float, float, int]]:
    """Median and largest |error| (fractions) and the count, per (source, target) pair."""
    out = {}
    for pair in dict.fromkeys((c["source"], c["target"]) for c in checks):
        errs = sorted(abs(c["error"]) for c in checks if (c["source"], c["target"]) == pair)
        out[pair] = (median(errs), errs[-1], len(errs))
    return out


def validation_table(checks: list[dict]) -> str:
    if not checks:
        return ""
    fmt = lambda x: f"{x:,.2f}" if x < 100 else f"{x:,.0f}"  # noqa: E731
    rows = [[c["cell"], f"{c['source']} -> {c['target']}", c["unit"].replace("_per_s", "/s"), fmt(c["measured"]),
             fmt(c["predicted"]) + ("" if c["predicted_low"] == c["predicted_high"]
                                    else f" ({fmt(c['predicted_low'])}-{fmt(c['predicted_high'])})"),
             f"{100 * c['error']:+.1f}%", {True: "yes", False: "no", None: "-"}[c["in_range"]],
             f"{100 * c['peak_ratio_error']:+.1f}%"] for c in checks]
    lines = [md_table(["cell", "projection", "unit", "measured", "predicted (range)", "error", "in range",
                       "peak-ratio error"], rows), ""]
    for (src, tgt), (med, worst, n) in errors(checks).items():
        lines.append(f"{src} -> {tgt}: median |error| {100 * med:.1f}%, largest {100 * worst:.1f}% over {n} cells.")
    return "\n".join(lines)


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2


def validation_markdown(runs: list[tuple[Path, list[Path]]]) -> str:
    """docs/projection.md's validation section: for each (measured run dir, [run dirs or CSVs measured on
    other GPUs]) the projection onto every GPU measured there, checked against those measurements; then
    the errors per (source, target) over all parts; then the clock model against the published rates."""
    gpus = [gpu_option(n) for n in projectable()]
    out, every = [], []
    for path, measured in runs:
        results = load_cells(path)
        points = [p for m in measured for p in measured_points(m, gpus)]
        rows, _ = project(results, [gpu_option(n) for n in sorted({p["target"] for p in points})], 1)
        checks = validate(rows, points, results)
        every += checks
        out += [f"From `{path.relative_to(REPO)}`:", "", validation_table(checks), ""]
    lines = [f"{src} -> {tgt}: median |error| {100 * med:.1f}%, largest {100 * worst:.1f}% over {n} cells"
             for (src, tgt), (med, worst, n) in errors(every).items()]
    # A target checked from several source GPUs: its cells pooled, the figure conf/gpu states for it.
    pooled = errors([{**c, "source": "every source"} for c in every])
    per_target = [f"{tgt}: median |error| {100 * med:.1f}%, largest {100 * worst:.1f}% over {n} cells"
                  for (_, tgt), (med, worst, n) in pooled.items()
                  if len({c["source"] for c in every if c["target"] == tgt}) > 1]
    return "\n".join(out + ["All parts together:", "", *[f"- {x}" for x in lines], "",
                            "Per target checked from several source GPUs, every source's cells pooled:", "",
                            *[f"- {x}" for x in per_target], "", clock_model_check(gpus)])


def clock_model_check(gpus: list[Gpu]) -> str:
    """The physical model's best-shape rate for each GPU with published rates, had none been published
    (from the H100's published share of its datasheet), against the published expected figure."""
    h100 = gpu_option("h100")
    share = h100.best_gemm() / h100.peak_tflops
    rows = []
    for g in gpus:
        if not g.published_gemm or g.gemm:
            continue
        low, mid, high = clock_model(g, h100, share)
        rows.append([g.name, f"{g.power_w / g.sms:.1f}", f"{low:.0f} / {mid:.0f} / {high:.0f}",
                     f"{g.published_gemm[1]:.1f}", f"{100 * (mid / g.published_gemm[1] - 1):+.0f}%",
                     "yes" if low <= g.published_gemm[1] <= high else "no"])
    return md_table(["GPU", "W per SM", "clock model low / expected / high TFLOP/s", "published (expected)",
                     "model error", "published within the model's range"], rows)
