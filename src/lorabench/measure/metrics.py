"""What a cell measures, and how.

Window: the first `train.untimed_steps` optimizer steps are excluded from every figure; the
timed window runs from the end of the last warmup step to the end of the last step. The device is
synchronised at each step boundary, so a step's time covers its data loading, forward, backward,
optimizer step and logging, and nothing of a neighbour's.

Tokens, counted per micro-batch from what the model actually received:
  perf/tokens_per_s        non-pad tokens (attention_mask == 1): the headline figure
  perf/total_tokens_per_s  every position, padding included (what a padded batch costs)
  perf/label_tokens_per_s  tokens that carry loss (labels != -100)
Memory: torch's peak allocated / reserved bytes since the end of warmup (the caching allocator's
pool; nvidia-smi shows reserved + CUDA context + other processes). With train.offload_fraction:
  mem/host_offload_peak_gib   pinned host memory that one micro-batch's offloaded activations hold
  count/offload_late_tensors  offloaded tensors the backward waited for (not prefetched in time)
Host: time/gc_ms, the milliseconds Python's cyclic garbage collector held the process in the timed steps,
and count/gc_full_collections, its full collections there (each walks every tracked object, the model's
too); steps.jsonl has both per step (gc_ms, gc_full), to tell a slow step that a collection made.
Arithmetic: precision/matmul_bytes, the element size of the dtype the matmuls ran at (autocast's, else the
activations'), 2 for bf16/fp16 and 4 for fp32, read as the first decoder layer ran, not as configured
(lorabench.measure.meter.MatmulProbe).
MFU: model FLOPs per non-pad token over the GPU's dense bf16 peak, with
  FLOPs = (4*N_active + 6*N_lora) per token + 12*H*head_dim*l*min(l, window) per layer and sample of l tokens.
  N_lora counts the adapters a token runs through (with lora.experts, each expert's at the top-k share).
  A frozen base weight costs 2 (forward) + 2 (input gradient) FLOPs per token and has no weight
  gradient; an adapter weight costs the full 6. N_active counts an MoE layer's top-k experts only
  (what a token runs through); window is each layer's own (None: l). Recomputation from gradient
  checkpointing and 4-bit dequantisation are not model FLOPs and are not counted. The architecture's
  facts come from lorabench.models.Architecture.
"""

from __future__ import annotations

import math

import torch

from lorabench.core.config import GpuConfig, Pricing
from lorabench.models.architecture import Architecture

GIB = 2**30
# Where a profiled step's time goes (lorabench.measure.profile); in this order in tables and plots.
CATEGORIES = ("matmul", "dequant", "attention", "elementwise", "loss", "optimizer", "data", "idle")


def hourly_price(gpu: GpuConfig):
    return gpu.spot_price_per_hour if gpu.pricing is Pricing.spot else gpu.price_per_hour


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(steps: list[dict], window_s: float, params: dict, arch: Architecture | dict, gpu: GpuConfig,
              n_gpus: int = 1) -> dict:
    """Throughput, FLOPs, cost and loss from the per-step records of the timed window. `arch`: the
    model's Architecture, or its fields as a DDP rank's JSON file holds them."""
    arch = arch if isinstance(arch, Architecture) else Architecture.from_dict(arch)
    timed = [s for s in steps if s["timed"]]
    if not timed:
        raise RuntimeError("no timed step: train.max_steps must exceed train.untimed_steps")
    tot = {k: sum(s[k] for s in timed) for k in ("tokens_nonpad", "tokens_total", "tokens_label", "samples",
                                                  "sum_len_sq")}
    times = [s["time_s"] for s in timed]
    active = params.get("active_matmul", params["base_matmul"])  # a dense model's are its all
    lora = params.get("trainable_active", params["trainable"])  # (records before lora.experts: all of them)
    flops = ((4 * active + 6 * lora) * tot["tokens_nonpad"]
             + arch.attention_flops(tot["sum_len_sq"], tot["tokens_nonpad"]))
    out = {
        "perf/tokens_per_s": tot["tokens_nonpad"] / window_s,
        "perf/total_tokens_per_s": tot["tokens_total"] / window_s,
        "perf/label_tokens_per_s": tot["tokens_label"] / window_s,
        "perf/samples_per_s": tot["samples"] / window_s,
        "perf/step_time_p50_s": percentile(times, 50),
        "perf/step_time_p90_s": percentile(times, 90),
        "perf/step_time_mean_s": sum(times) / len(times),
        "perf/model_tflops": flops / window_s / 1e12,
        "perf/mfu_pct": (100 * flops / window_s / (n_gpus * gpu.peak_bf16_tflops * 1e12)
                         if gpu.peak_bf16_tflops else None),
        # Packing efficiency: the share of the positions computed that hold real tokens.
        "data/nonpad_fraction": tot["tokens_nonpad"] / tot["tokens_total"],
        "count/timed_steps": len(timed),
        "count/tokens_nonpad": tot["tokens_nonpad"],
        "count/tokens_total": tot["tokens_total"],
        "count/samples": tot["samples"],
        "time/window_s": window_s,
        # Python's cyclic garbage collector in the timed steps (records before it was measured: 0)
        "time/gc_ms": sum(s.get("gc_ms", 0.0) for s in timed),
        "count/gc_full_collections": sum(s.get("gc_full", 0) for s in timed),
        "train/loss_first": steps[0].get("loss"),
        "train/loss_final": steps[-1].get("loss"),
        "params/base_matmul": params["base_matmul"],
        "params/active_matmul": active,
        "params/trainable": params["trainable"],
    }
    price = hourly_price(gpu)
    if price is not None:
        usd_per_s = price * n_gpus / 3600
        out["cost/usd_per_hour"] = price * n_gpus
        out["cost/usd_per_1k_samples"] = usd_per_s / out["perf/samples_per_s"] * 1e3
        out["cost/usd_per_1m_tokens"] = usd_per_s / out["perf/tokens_per_s"] * 1e6
    return out


def memory_stats(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    return {"mem/peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GIB,
            "mem/peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB,
            "mem/device_total_gib": torch.cuda.get_device_properties(device).total_memory / GIB,
            "mem/num_alloc_retries": torch.cuda.memory_stats(device).get("num_alloc_retries", 0)}
