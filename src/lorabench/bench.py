"""bench.py's suites: what the seed measured besides training, through the same builders.

    hardware     matmul TFLOP/s (bf16, fp16, tf32, fp32) over sizes; device memory bandwidth (a large
                 copy, bytes read + written); host<->device bandwidth, pinned and pageable. Each as a
                 fraction of the gpu option's datasheet figure. CUDA events around each repeat, warmup
                 first, fresh random data (never zeros), the median of the repeats.
    loading      time and memory to build (random init: quantisation and placement) or load
                 (model.path: reading real weights) the model at the cell's precision.
    inference    generate() with a fixed prompt and output length per batch size: tokens/s, time to
                 first token, per-token latency.
    consistency  the spread of result files from several nodes or GPUs against tolerances.
    report       the sweep report of a sweep dir.

hardware, loading and inference cells write metrics.json like training cells (cell.run), so they
reach W&B and the sweep report the same way.
"""

from __future__ import annotations

import glob
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from lorabench.builders import modeling
from lorabench.builders.data import plain_token_low
from lorabench.core.config import BenchConfig, HardwareConfig, ModelConfig, Suite
from lorabench.core.devices import setup_device, sync
from lorabench.core.results import EXIT_CODES, CellResult, RunContext, Status, is_sweep_dir, load_cells
from lorabench.measure.loggers import MetricLogger
from lorabench.measure.meter import NvmlSampler
from lorabench.models import Architecture
from lorabench.report.page import write_projection, write_report
from lorabench.run import cell
from lorabench.run.checks import bench_problems, check_model_path, check_precision
from lorabench.sweep.callbacks import END_SWEEP, one_row

log = logging.getLogger(__name__)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}


class Progress:
    """A long suite's items on the log, each as it starts: "[3/24] matmul fp32 2048 ... ETA 40 s".
    The estimate is the mean time of the items done so far times the items left (items differ in
    size, e.g. a matmul of 8192 costs 8^3 times one of 1024: a rough figure that firms up as it goes)."""

    def __init__(self, total: int):
        self.total, self.started, self.t0 = total, 0, time.perf_counter()

    def __call__(self, label: str) -> None:
        done, self.started = self.started, self.started + 1
        eta = ""
        if done:
            left_s = (time.perf_counter() - self.t0) / done * (self.total - done)  # this item and those after
            eta = f" ... ETA {left_s:.0f} s" if left_s < 120 else f" ... ETA {left_s / 60:.1f} min"
        log.info("[%d/%d] %s%s", self.started, self.total, label, eta)


class Timer:
    """Times a callable on `device`: CUDA events around each call on a GPU, perf_counter on a CPU.
    Warmup calls first (kernel selection, allocator), then the median of `repeats` calls, in seconds.
    For generate(), whose inputs must be fresh each call (the inference suite)."""

    def __init__(self, device: torch.device, warmup: int, repeats: int):
        self.device, self.warmup, self.repeats = device, warmup, repeats

    def __call__(self, fn, *args, setup=None, **kwargs) -> float:
        """fn(*args, **kwargs), or fn(*setup(), **kwargs) with fresh inputs from setup() each call."""
        times = []
        for i in range(self.warmup + self.repeats):
            call_args = setup() if setup else args
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn(*call_args, **kwargs)
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                fn(*call_args, **kwargs)
                elapsed = time.perf_counter() - t0
            if i >= self.warmup:
                times.append(elapsed)
        return statistics.median(times)


def median_s(fn, device: torch.device, h: HardwareConfig) -> float:
    """Seconds per call of fn(): on a GPU triton.testing.do_bench (CUDA events, the L2 cache flushed
    before every call, `warmup_ms` of warmup, then calls for `rep_ms`, the median); on a CPU
    torch.utils.benchmark's blocked_autorange for at least `rep_ms` (the median of its blocks)."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, warmup=h.warmup_ms, rep=h.rep_ms, return_mode="median") / 1e3
    from torch.utils import benchmark

    fn()  # warmup: allocator, first-call dispatch
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=h.rep_ms / 1e3).median


def fraction(measured: float, datasheet) -> float | None:
    return measured / datasheet if datasheet else None


def layer_gemms(m: ModelConfig) -> list[tuple[int, int, int]]:
    """(in features, out features, times per step) of every frozen base linear layer a LoRA step
    multiplies by: each decoder layer's projections (q, k, v, o, gate, up, down, or Phi-3's fused
    ones; an MoE layer's active experts), and the output head once (lorabench.models.Architecture)."""
    return modeling.architecture_of(m).gemm_shapes()


def gemm_rate(device: torch.device, h: HardwareConfig, m: ModelConfig, tokens: int, dtype) -> float:
    """TFLOP/s over one step's matrix products at `tokens` rows (batch x seq_len): each base
    layer's forward product [tokens, in] x [in, out] and its input-gradient product [tokens, out] x
    [out, in], weighted by how often a step runs it: total FLOPs over total time."""
    flops = seconds = 0.0
    for d_in, d_out, times in layer_gemms(m):
        w = torch.randn(d_out, d_in, device=device, dtype=dtype) / d_in**0.5
        x = torch.randn(tokens, d_in, device=device, dtype=dtype)
        g = torch.randn(tokens, d_out, device=device, dtype=dtype)
        fwd = median_s(lambda: torch.nn.functional.linear(x, w), device, h)
        bwd = median_s(lambda: torch.mm(g, w), device, h)
        flops += times * 2 * (2 * tokens * d_in * d_out)  # two products of tokens x in x out multiply-adds
        seconds += times * (fwd + bwd)
        del w, x, g
    return flops / seconds / 1e12


def launch_us(device: torch.device, n: int = 2000) -> float:
    """Microseconds per back-to-back launch of a one-element op (the host's dispatch and launch
    cost, or the device's smallest kernel, whichever is longer): the floor of a step made of many
    small kernels, set by the host's CPU as much as by the GPU. The median of three rounds."""
    x = torch.zeros(1, device=device)
    rounds = []
    for _ in range(4):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        sync(device)
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(rounds[1:])  # the first round warms up


def hardware(c: BenchConfig, ctx: RunContext, result: CellResult, logger: MetricLogger) -> dict:
    device, gpu = setup_device(c.device, c.gpu, result)
    h = c.hardware
    sampler = NvmlSampler(device) if device.type == "cuda" else None
    if sampler:
        sampler.start()  # clocks, power and temperature while the figures are taken
    # every matmul, the step GEMMs per token count, copy, elementwise, launch, and the host link (CUDA)
    progress = Progress(len(h.dtypes) * len(h.sizes) + len(h.tokens) + 3 + 2 * (device.type == "cuda"))
    out = matmul_rates(device, h, gpu, progress)
    # What a LoRA step of the model multiplies (model=...): the figure lorabench.report.projection scales by.
    for tokens in h.tokens:
        progress(f"step GEMMs of model={c.model.name} at {tokens} tokens")
        out[f"hw/gemm_t{tokens}_tflops"] = gemm_rate(device, h, c.model, tokens, DTYPES["bf16"])
        out[f"hw/gemm_t{tokens}_of_peak"] = fraction(out[f"hw/gemm_t{tokens}_tflops"], gpu.peak_bf16_tflops)

    # Device memory: a copy reads and writes every byte once.
    progress(f"device copy of {h.copy_mib} MiB")
    nbytes = h.copy_mib * 2**20
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    out["hw/device_copy_gbs"] = 2 * nbytes / median_s(lambda: dst.copy_(src), device, h) / 1e9
    out["hw/device_copy_of_peak"] = fraction(out["hw/device_copy_gbs"], gpu.memory_bandwidth_gbs)
    del src, dst
    # An activation-sized elementwise op (the norms, casts and adds between the matmuls): a bf16 add
    # reads two tensors and writes one.
    progress(f"elementwise add of {h.elementwise_mib} MiB")
    n = h.elementwise_mib * 2**20 // 2
    a, b = (torch.randn(n, device=device, dtype=torch.bfloat16) for _ in range(2))
    res = torch.empty_like(a)
    out["hw/elementwise_gbs"] = 3 * 2 * n / median_s(lambda: torch.add(a, b, out=res), device, h) / 1e9
    out["hw/elementwise_of_peak"] = fraction(out["hw/elementwise_gbs"], gpu.memory_bandwidth_gbs)
    del a, b, res
    progress("launch latency")
    out["hw/launch_us"] = launch_us(device)

    if device.type == "cuda":  # the host link
        nbytes = h.host_mib * 2**20
        for pinned in (True, False):
            host = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, pin_memory=pinned)
            dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
            tag = "pinned" if pinned else "pageable"
            progress(f"host link, {tag}, {h.host_mib} MiB each way")
            out[f"hw/h2d_{tag}_gbs"] = nbytes / median_s(lambda: dev.copy_(host, non_blocking=pinned), device, h) / 1e9
            out[f"hw/d2h_{tag}_gbs"] = nbytes / median_s(lambda: host.copy_(dev, non_blocking=pinned), device, h) / 1e9
            for d in ("h2d", "d2h"):
                out[f"hw/{d}_{tag}_of_peak"] = fraction(out[f"hw/{d}_{tag}_gbs"], gpu.host_link_gbs)
            del host, dev
        sampler.stop()
        out.update(sampler.summary())
    return out


def matmul_rates(device: torch.device, h: HardwareConfig, gpu, progress: Progress) -> dict:
    """Square matmuls per dtype and size: TFLOP/s and the fraction of the datasheet peak."""
    peaks = {"bf16": gpu.peak_bf16_tflops, "fp16": gpu.peak_bf16_tflops, "tf32": gpu.peak_tf32_tflops,
             "fp32": gpu.peak_fp32_tflops}
    out = {}
    for dtype in h.dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"hardware.dtypes: {dtype!r} is not one of {list(DTYPES)}")
        # tf32 is fp32 storage on the tensor cores; fp32 keeps the plain fp32 units.
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        for n in h.sizes:
            progress(f"matmul {dtype} {n}")
            a = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
            b = torch.randn(n, n, device=device, dtype=DTYPES[dtype])
            tflops = 2 * n**3 / median_s(lambda: torch.mm(a, b), device, h) / 1e12  # n^2 outputs, n multiply-adds each
            out[f"hw/matmul_{dtype}_{n}_tflops"] = tflops
            out[f"hw/matmul_{dtype}_{n}_of_peak"] = fraction(tflops, peaks[dtype])
            del a, b
        best = max(out[f"hw/matmul_{dtype}_{n}_tflops"] for n in h.sizes)
        out[f"hw/matmul_{dtype}_best_tflops"], out[f"hw/matmul_{dtype}_best_of_peak"] = best, fraction(best, peaks[dtype])
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def loading(c: BenchConfig, ctx: RunContext, result: CellResult, logger: MetricLogger) -> dict:
    check_model_path(c.model)
    device, gpu = setup_device(c.device, c.gpu, result)
    check_precision(c.precision.name, device)
    torch.manual_seed(c.seed)
    sync(device)
    t0 = time.perf_counter()
    model, weights = modeling.build_model(c, device)
    sync(device)
    seconds = time.perf_counter() - t0
    result.model = {"name": c.model.name, "weights": weights}
    out = {"load/seconds": seconds, "load/footprint_gib": model.get_memory_footprint() / 2**30}
    if device.type == "cuda":
        out["load/resident_gib"] = torch.cuda.memory_allocated(device) / 2**30  # what stays for training
        out["load/peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30  # transient copies included
    return out


def inference(c: BenchConfig, ctx: RunContext, result: CellResult, logger: MetricLogger) -> dict:
    check_model_path(c.model)
    device, gpu = setup_device(c.device, c.gpu, result)
    check_precision(c.precision.name, device)
    torch.manual_seed(c.seed)
    model, weights = modeling.build_model(c, device)
    model.eval()
    model.config.use_cache = True  # generation reuses past keys and values
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # generation's peak, not the load's transient copies
    result.model = {"name": c.model.name, "weights": weights}
    # Prompt ids below the vocabulary of the model loaded (model.path: the checkpoint's, not the model group's).
    vocab = Architecture.from_hf_config(model.config).vocab
    inf = c.inference
    timer = Timer(device, warmup=1, repeats=inf.repeats)
    out = {}
    def generate(ids, n):
        # min_new_tokens = max_new_tokens: a fixed output length, whatever the tokens say.
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0)

    progress = Progress(len(inf.batches))
    for batch in inf.batches:
        progress(f"generate at batch {batch}")
        def prompt(batch=batch):  # fresh random prompt tokens for every call
            return (torch.randint(plain_token_low(vocab), vocab, (batch, inf.prompt_len), device=device),)

        with torch.inference_mode():
            first = timer(generate, setup=prompt, n=1)  # prefill + the first token
            full = timer(generate, setup=prompt, n=inf.new_tokens)
        out[f"infer/b{batch}_tokens_per_s"] = batch * inf.new_tokens / full
        out[f"infer/b{batch}_ttft_s"] = first
        out[f"infer/b{batch}_per_token_ms"] = 1e3 * (full - first) / max(inf.new_tokens - 1, 1)
    if device.type == "cuda":
        out["mem/peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


# ---------------------------------------------------------------------------- consistency

def consistency(c: BenchConfig) -> tuple[list[dict], bool]:
    """Rows of (metric, values, spread, tolerance, ok) over the given result files; all ok?"""
    files = []
    for pattern in c.consistency.inputs:
        for match in sorted(glob.glob(pattern)):
            f = Path(match) / "metrics.json" if Path(match).is_dir() else Path(match)
            if f.is_file():
                files.append(f)
    if len(files) < 2:
        raise ValueError(f"consistency.inputs={list(c.consistency.inputs)} matched {len(files)} result file(s); "
                         "give at least two (a glob such as 'outputs/node*/metrics.json' or run dirs)")
    results = [json.loads(f.read_text()) for f in files]
    rows, all_ok = [], True
    checks = [(k, tol, True) for k, tol in c.consistency.relative.items()]
    checks += [(k, tol, False) for k, tol in c.consistency.absolute.items()]
    for key, tol, relative in checks:
        values = [r.get("metrics", {}).get(key) for r in results]
        present = [v for v in values if v is not None]
        if len(present) < 2:
            rows.append({"metric": key, "values": values, "spread": None, "tolerance": tol, "ok": None})
            continue
        spread = max(present) - min(present)
        if relative:
            spread /= statistics.median(present)
        ok = spread <= tol
        all_ok &= ok
        rows.append({"metric": key, "values": values, "spread": spread, "tolerance": tol, "ok": ok,
                     "relative": relative})
    return [{"files": [str(f) for f in files]}, *rows], all_ok


def print_consistency(rows: list[dict]) -> None:
    print("files:\n" + "\n".join(f"  {f}" for f in rows[0]["files"]))
    print("| metric | values | spread | tolerance | verdict |\n|---|---|---|---|---|")
    for r in rows[1:]:
        unit = "%" if r.get("relative") else ""
        scale = 100 if r.get("relative") else 1
        spread = "-" if r["spread"] is None else f"{r['spread'] * scale:.2f}{unit}"
        verdict = {True: "ok", False: "EXCEEDED", None: "not in two or more files"}[r["ok"]]
        values = ", ".join("-" if v is None else f"{v:.4g}" for v in r["values"])
        print(f"| {r['metric']} | {values} | {spread} | {r['tolerance'] * scale:g}{unit} | {verdict} |")


MEASURED = {Suite.hardware: hardware, Suite.loading: loading, Suite.inference: inference}


def run_suite(cfg: DictConfig, ctx: RunContext) -> int:
    """Runs the chosen suite; returns the process exit code."""
    c: BenchConfig = OmegaConf.to_object(cfg)
    if found := bench_problems(c):  # every bad suite value in one line, before anything runs (and in a preflight)
        print("bench.py: " + "; ".join(str(e) for e in found), file=sys.stderr)
        return EXIT_CODES[Status.failed]
    if c.suite is Suite.report:
        if not c.sweep_dir:
            raise ValueError("suite=report needs sweep_dir=<a sweep dir under outputs/sweeps>")
        # The report is written into the dir it reports on: only into a sweep lorabench ran, never into
        # a dir of anything else (a copy of cells, a folder of results) that was only to be read.
        if Path(c.sweep_dir).is_dir() and not is_sweep_dir(Path(c.sweep_dir)):
            print(f"bench.py: sweep_dir={c.sweep_dir} is not the dir of a sweep lorabench ran (no cells.json, no "
                  "multirun.yaml of train.py or bench.py, its cells ran elsewhere): no report is written there",
                  file=sys.stderr)
            return EXIT_CODES[Status.failed]
        out = write_report(c.sweep_dir, c.report)
        print(out.markdown)
        print("\nfiles:\n" + "\n".join(f"  {f}" for f in out.files))
        return 0
    if c.suite is Suite.project:
        if not c.sweep_dir:
            raise ValueError("suite=project needs sweep_dir=<a measured sweep or run dir>")
        results = load_cells(Path(c.sweep_dir))
        # Into this command's own run dir: sweep_dir is only read (it may be a committed run).
        out = write_projection(ctx.run_dir, results, list(c.target), list(c.measured), c.report.dataset_samples)
        if not out.rows:
            raise ValueError(f"nothing to project in {c.sweep_dir}: " + (out.markdown or "no ok cell"))
        print(out.markdown)
        print("\nfiles:\n" + "\n".join(f"  {f}" for f in out.files))
        return 0
    if c.suite is Suite.consistency:
        rows, ok = consistency(c)
        print_consistency(rows)
        return 0 if ok else 1
    return cell.run(cfg, ctx, MEASURED[c.suite], job_type=f"bench-{c.suite.value}", end_sweep=END_SWEEP,
                    row=one_row).exit_code
