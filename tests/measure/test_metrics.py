"""The arithmetic behind every reported figure, on hand-made step records."""

import numpy as np
import pytest

from lorabench.core.config import GpuConfig, Pricing
from lorabench.core.devices import resolve_gpu
from lorabench.measure.metrics import percentile, summarize
from lorabench.models import Architecture

PARAMS = {"base_matmul": 1_000_000, "trainable": 10_000}
ARCH = Architecture.from_hf_config(__import__("transformers").MistralConfig(
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, hidden_size=128,
    sliding_window=None))  # full attention in both layers


def steps(n_warm, n_timed, nonpad=900, total=1000, samples=4, time_s=0.5, sq=300_000):
    recs = []
    for i in range(n_warm + n_timed):
        recs.append({"step": i + 1, "timed": i >= n_warm, "time_s": time_s if i >= n_warm else 9.0,
                     "tokens_nonpad": nonpad, "tokens_total": total, "tokens_label": nonpad // 2,
                     "samples": samples, "sum_len_sq": sq, "loss": 10.0 - i})
    return recs


def test_throughput_counts_only_the_timed_window():
    gpu = GpuConfig(name="x", peak_bf16_tflops=100.0, price_per_hour=0.60)
    m = summarize(steps(3, 10), window_s=5.0, params=PARAMS, arch=ARCH, gpu=gpu)
    assert m["count/timed_steps"] == 10 and m["count/tokens_nonpad"] == 9000
    assert m["perf/tokens_per_s"] == pytest.approx(9000 / 5.0)
    assert m["perf/total_tokens_per_s"] == pytest.approx(10000 / 5.0)
    assert m["perf/samples_per_s"] == pytest.approx(40 / 5.0)
    assert m["data/nonpad_fraction"] == pytest.approx(0.9)
    assert m["perf/step_time_p50_s"] == 0.5  # the 9 s warmup steps are not in it
    assert m["train/loss_first"] == 10.0 and m["train/loss_final"] == -2.0


def test_mfu_formula():
    gpu = GpuConfig(name="x", peak_bf16_tflops=100.0)
    m = summarize(steps(0, 2), window_s=1.0, params=PARAMS, arch=ARCH, gpu=gpu)
    # (4 * 1e6 + 6 * 1e4) FLOPs per non-pad token, plus 12 * L * H * head_dim * sum(l^2) for attention
    flops = (4 * 1_000_000 + 6 * 10_000) * 1800 + 12 * 2 * 4 * 32 * 600_000
    assert m["perf/model_tflops"] == pytest.approx(flops / 1e12)
    assert m["perf/mfu_pct"] == pytest.approx(100 * flops / 100e12)
    assert summarize(steps(0, 2), 1.0, PARAMS, ARCH, GpuConfig(name="cpu"))["perf/mfu_pct"] is None


def test_cost_reproduces_the_seeds_figure():
    # The seed: 1.46 samples/s on an A10 at $0.60/h -> $0.114 per 1K samples.
    gpu = GpuConfig(name="a10", price_per_hour=0.60, spot_price_per_hour=0.18)
    recs = steps(0, 1, samples=146, nonpad=146 * 512, total=146 * 512)
    m = summarize(recs, window_s=100.0, params=PARAMS, arch=ARCH, gpu=gpu)
    assert m["cost/usd_per_1k_samples"] == pytest.approx(0.114, abs=5e-4)  # the seed's 3 decimals: +-half a unit
    assert m["cost/usd_per_1m_tokens"] == pytest.approx(0.60 / 3600 / (146 * 512 / 100) * 1e6)
    gpu.pricing = Pricing.spot
    spot = summarize(recs, 100.0, PARAMS, ARCH, gpu)
    assert spot["cost/usd_per_1k_samples"] == pytest.approx(m["cost/usd_per_1k_samples"] * 0.18 / 0.60)


def test_no_price_means_no_cost_rather_than_zero():
    m = summarize(steps(0, 2), 1.0, PARAMS, ARCH, GpuConfig(name="unknown"))
    assert "cost/usd_per_1k_samples" not in m


def test_no_timed_step_is_an_error():
    with pytest.raises(RuntimeError, match="no timed step"):
        summarize(steps(3, 0), 1.0, PARAMS, ARCH, GpuConfig(name="x"))


@pytest.mark.parametrize("q", [0, 10, 50, 90, 100])
def test_percentile_matches_numpy(q):
    xs = list(np.random.default_rng(q).random(37))
    assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))


@pytest.mark.parametrize("device_name,expected", [
    ("NVIDIA A10", "a10"), ("NVIDIA A100-SXM4-80GB", "a100_80"), ("NVIDIA A100-SXM4-40GB", "a100_40"), ("NVIDIA L4", "l4"), ("NVIDIA L40S", "l40s"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200", "h200"), ("cpu", "cpu"), ("NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090"),
])
def test_auto_gpu_is_found_in_the_price_table(device_name, expected):
    spec = resolve_gpu(GpuConfig(name="auto"), device_name)
    assert spec.name == expected
    if expected == "a10":
        assert (spec.price_per_hour, spec.spot_price_per_hour, spec.peak_bf16_tflops) == (0.60, 0.18, 125.0)
    if expected.startswith("NVIDIA"):  # not in the table: no price, no peak, never a made-up figure
        assert spec.price_per_hour is None and spec.peak_bf16_tflops is None


def test_command_line_price_wins_over_the_table():
    spec = resolve_gpu(GpuConfig(name="auto", price_per_hour=2.49, pricing=Pricing.spot), "NVIDIA H100 80GB HBM3")
    assert spec.name == "h100" and spec.price_per_hour == 2.49 and spec.peak_bf16_tflops == 989.0
    assert spec.pricing is Pricing.spot


def test_commit_passed_by_the_launcher_wins_over_a_stale_git(monkeypatch):
    """A tree copied to a GPU box may carry an old .git: the commit the launcher passes is recorded."""
    from lorabench.core.results import git_sha

    monkeypatch.setenv("LORABENCH_GIT_SHA", "0123abc")
    assert git_sha()["sha"] == "0123abc"
    monkeypatch.delenv("LORABENCH_GIT_SHA")
    assert git_sha()["sha"] != "0123abc"


def test_gc_every_collects_young_garbage_on_schedule_inside_the_step_and_restores_the_collector(tmp_path):
    """backend.gc_every=2: while training the collector runs only when steps 1 and 3 begin (global_step 0
    and 2), inside their time; each step makes 5,000 reference cycles (700 allocations start an automatic
    collection), so with the collector on every step would collect; none is full; the cycles made in
    step 1 are freed when step 3 begins; after the cell the collector is on again."""
    import gc
    import weakref
    from types import SimpleNamespace as NS

    import torch

    from lorabench.measure.meter import StepMeter

    class Cycle:
        def __init__(self):
            self.me = self

    assert gc.isenabled()
    meter = StepMeter(torch.device("cpu"), 0, tmp_path / "steps.jsonl", gc_every=2)
    state = NS(global_step=0)
    meter.on_train_begin(None, state, None)
    first = None
    for step in (1, 2, 3, 4):
        meter.on_step_begin(None, state, None)
        assert not gc.isenabled()
        cycles = [Cycle() for _ in range(5000)]
        first = first or weakref.ref(cycles[0])
        del cycles
        if step == 3:
            assert first() is None  # collected when step 3 began
        state.global_step = step
        meter.count_batch({"labels": torch.ones(1, 4, dtype=torch.long)}, torch.ones(1, 4, dtype=torch.long))
        meter.on_step_end(None, state, None)
        if step == 2:
            assert first() is not None  # no collection since step 1 began
    meter.close()
    assert gc.isenabled()
    assert [s["gc_ms"] > 0 for s in meter.steps] == [True, False, True, False]
    assert [s["gc_full"] for s in meter.steps] == [0, 0, 0, 0]


def test_a_full_garbage_collection_in_a_step_is_recorded_with_that_step(tmp_path):
    """StepMeter records, per step, the time Python's cyclic garbage collector held the process and its full
    collections: a gc.collect() inside step 2 shows in step 2's record only; summarize adds up the timed
    steps' (step 1 is warmup); the meter's callback is gone after the cell."""
    import gc
    from types import SimpleNamespace as NS

    import torch

    from lorabench.measure.meter import StepMeter

    meter = StepMeter(torch.device("cpu"), 1, tmp_path / "steps.jsonl")
    state = NS(global_step=0)
    meter.on_train_begin(None, state, None)
    for step in (1, 2, 3):
        state.global_step = step
        meter.count_batch({"labels": torch.ones(1, 4, dtype=torch.long)}, torch.ones(1, 4, dtype=torch.long))
        if step == 2:
            gc.collect()
        meter.on_step_end(None, state, None)
    meter.close()
    full = [s["gc_full"] for s in meter.steps]
    assert full[1] >= 1 and meter.steps[1]["gc_ms"] > 0 and meter.steps[1]["gc_ms"] <= 1e3 * meter.steps[1]["time_s"]
    assert meter._gc not in gc.callbacks
    out = summarize(meter.steps, meter.window_s, PARAMS, ARCH, GpuConfig(name="x", peak_bf16_tflops=1.0))
    assert out["count/gc_full_collections"] == sum(full[1:]) and out["time/gc_ms"] == pytest.approx(
        sum(s["gc_ms"] for s in meter.steps[1:]))
