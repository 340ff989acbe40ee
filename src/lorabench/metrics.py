"""What a cell measures, and how.

Window: the first `train.timing_warmup_steps` optimizer steps are excluded from every figure; the
timed window runs from the end of the last warmup step to the end of the last step. The device is
synchronised at each step boundary, so a step's time covers its data loading, forward, backward,
optimizer step and logging, and nothing of a neighbour's.

Tokens, counted per micro-batch from what the model actually received:
  perf/tokens_per_s        non-pad tokens (attention_mask == 1): the headline figure
  perf/total_tokens_per_s  every position, padding included (what a padded batch costs)
  perf/label_tokens_per_s  tokens that carry loss (labels != -100)
Memory: torch's peak allocated / reserved bytes since the end of warmup (the caching allocator's
pool; nvidia-smi shows reserved + CUDA context + other processes).
MFU: model FLOPs per non-pad token over the GPU's dense bf16 peak, with
  FLOPs = (4*N_base + 6*N_lora) per token + 12*L*H*head_dim*l^2 per sample of l tokens.
  A frozen base weight costs 2 (forward) + 2 (input gradient) FLOPs per token and has no weight
  gradient; an adapter weight costs the full 6. Recomputation from gradient checkpointing and 4-bit
  dequantisation are not model FLOPs and are not counted.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import asdict
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import Trainer, TrainerCallback

from lorabench.config import GpuConfig, Pricing
from lorabench.data import REAL_TOKENS
from lorabench.modeling import sync

GIB = 2**30
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


class MeasuredTrainer(Trainer):
    """HF Trainer that hands every micro-batch to the StepMeter before training on it."""

    def __init__(self, *args, meter: "StepMeter", **kwargs):
        super().__init__(*args, **kwargs)
        self.meter = meter

    def training_step(self, model, inputs, num_items_in_batch=None):
        inputs = dict(inputs)
        # Packed batches carry their non-pad mask apart (the model must not see an attention_mask
        # there, or it would not keep attention inside each packed sample).
        real = inputs.pop(REAL_TOKENS, None)
        self.meter.count_batch(inputs, inputs["attention_mask"] if real is None else real)
        return super().training_step(model, inputs, num_items_in_batch)


class StepMeter(TrainerCallback):
    """Per-step wall time, token counts and loss; one line per step in steps.jsonl.

    The first `warmup_steps` steps of this process are not timed, also after a resume (a new
    process warms up again); `earlier_steps` are the records of the steps before a resume."""

    def __init__(self, device: torch.device, warmup_steps: int, steps_path: Path, sampler=None, on_step=None,
                 earlier_steps: list[dict] = ()):
        self.device, self.warmup_steps, self.sampler, self.on_step = device, warmup_steps, sampler, on_step
        self.steps: list[dict] = list(earlier_steps)
        self._file = open(steps_path, "a", buffering=1)  # line-buffered: a killed cell keeps its steps
        self._counts = torch.zeros(4, dtype=torch.int64, device=device)
        self._positions = 0
        self._last_end = 0.0
        self._seen = 0  # steps ended in this process

    @property
    def window_s(self) -> float:
        """The timed steps' seconds, back to back: within one process, from the end of the last
        warmup step to the end of the last step; after a resume, the timed spans of each process."""
        return sum(s["time_s"] for s in self.steps if s["timed"])

    def count_batch(self, inputs: dict, real: torch.Tensor) -> None:
        """Count one micro-batch; `real` is 1 on real tokens, 0 on padding.

        Data-dependent counts stay on the device and are read once per step, at the step's
        synchronisation point: no host round trip per micro-batch. Shapes are known on the host.
        A sample starts where a real token has position 0 (a packed row holds several), and the
        sum of l^2 over samples (for attention FLOPs) is the sum over real tokens of 2*pos + 1.
        """
        pos = inputs.get("position_ids")
        if pos is None:
            pos = real.cumsum(dim=1) - 1
        self._counts += torch.stack([real.sum(), ((2 * pos + 1) * real).sum(), (inputs["labels"] != -100).sum(),
                                     ((pos == 0) & (real == 1)).sum()]).to(self._counts.device)
        self._positions += real.numel()

    def on_train_begin(self, args, state, control, **kwargs):
        sync(self.device)
        self._last_end = time.perf_counter()
        if self.warmup_steps == 0:
            self._start_window()

    def restart_clock(self) -> None:
        """Start the current step's clock now: what happened since the last step end (e.g. starting
        the profiler) is not part of any step."""
        sync(self.device)
        self._last_end = time.perf_counter()

    def _start_window(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.sampler:
            self.sampler.start()

    def on_step_end(self, args, state, control, **kwargs):
        sync(self.device)
        now = time.perf_counter()
        nonpad, sq, labelled, samples = self._counts.tolist()
        total = self._positions
        self._counts.zero_()
        self._positions = 0
        self._seen += 1
        self.steps.append({"step": state.global_step, "time_s": now - self._last_end,
                           "timed": self._seen > self.warmup_steps,
                           "tokens_nonpad": nonpad, "tokens_total": total, "tokens_label": labelled,
                           "samples": samples, "sum_len_sq": sq})
        self._last_end = now
        if self._seen == self.warmup_steps:
            self._start_window()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or not self.steps:
            return  # the Trainer's end-of-training summary, not a step
        rec = self.steps[-1]
        rec.update(loss=logs["loss"], lr=logs.get("learning_rate"), grad_norm=logs.get("grad_norm"))
        self._file.write(json.dumps(rec) + "\n")
        if self.on_step:
            self.on_step(rec)
        if not math.isfinite(rec["loss"]):
            raise FloatingPointError(f"loss is {rec['loss']} at step {rec['step']}: stopping this cell "
                                     "instead of training on garbage")

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        if self.sampler:
            self.sampler.stop()
        self._file.close()


class NvmlSampler:
    """Samples utilisation, power, temperature and clocks of one GPU in a background thread.

    The NVML handle is found by UUID: NVML numbers GPUs physically and ignores
    CUDA_VISIBLE_DEVICES, so cuda:0 is not always NVML index 0.
    """

    def __init__(self, device: torch.device, interval_s: float = 0.5):
        import pynvml  # from nvidia-ml-py

        self.nvml = pynvml
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        self.driver = pynvml.nvmlSystemGetDriverVersion()
        self.interval_s = interval_s
        self.samples: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = None
        self._energy0 = self._energy1 = None

    def _energy_mj(self):
        try:
            return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except self.nvml.NVMLError:
            return None

    def _run(self) -> None:
        n = self.nvml
        while not self._stop.is_set():
            try:
                self.samples.append((
                    n.nvmlDeviceGetUtilizationRates(self.handle).gpu,
                    n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,  # mW -> W
                    n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU),
                    n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM),
                ))
            except n.NVMLError:
                pass
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._energy0 = self._energy_mj()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread and not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self._energy1 = self._energy_mj()

    def summary(self) -> dict:
        if not self.samples:
            return {}
        util, power, temp, sm = zip(*self.samples)
        out = {"gpu/util_mean_pct": sum(util) / len(util), "gpu/power_mean_w": sum(power) / len(power),
               "gpu/power_max_w": max(power), "gpu/temp_max_c": max(temp), "gpu/sm_clock_mean_mhz": sum(sm) / len(sm),
               "gpu/nvml_samples": len(util)}
        if self._energy0 is not None and self._energy1 is not None:
            out["gpu/energy_j"] = (self._energy1 - self._energy0) / 1000.0
        return out


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def resolve_gpu(gpu: GpuConfig, device_name: str) -> GpuConfig:
    """gpu=auto: the conf/gpu option whose `match` fits this device name, with any field set on the
    command line (e.g. gpu.price_per_hour=2.49) on top. A device not in the table keeps its own name
    and no price or peak: cost and MFU are then left out, never guessed. Another option than auto
    is returned as given."""
    if gpu.name != "auto":
        return gpu
    spec = {"name": device_name}
    for path in sorted((CONF_DIR / "gpu").glob("*.yaml")):
        option = OmegaConf.load(path)
        option.pop("defaults", None)
        if any(re.search(pattern, device_name) for pattern in option.get("match", [])):
            spec = OmegaConf.to_container(option)
            break
    given = {k: v for k, v in asdict(gpu).items() if v is not None and k not in ("name", "match")}
    return GpuConfig(**{**spec, **given})


def hourly_price(gpu: GpuConfig):
    return gpu.spot_price_per_hour if gpu.pricing is Pricing.spot else gpu.price_per_hour


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(steps: list[dict], window_s: float, params: dict, arch: dict, gpu: GpuConfig,
              n_gpus: int = 1) -> dict:
    """Throughput, FLOPs, cost and loss from the per-step records of the timed window."""
    timed = [s for s in steps if s["timed"]]
    if not timed:
        raise RuntimeError("no timed step: train.max_steps must exceed train.timing_warmup_steps")
    tot = {k: sum(s[k] for s in timed) for k in ("tokens_nonpad", "tokens_total", "tokens_label", "samples",
                                                  "sum_len_sq")}
    times = [s["time_s"] for s in timed]
    flops = ((4 * params["base_matmul"] + 6 * params["trainable"]) * tot["tokens_nonpad"]
             + 12 * arch["layers"] * arch["heads"] * arch["head_dim"] * tot["sum_len_sq"])
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
        "train/loss_first": steps[0].get("loss"),
        "train/loss_final": steps[-1].get("loss"),
        "params/base_matmul": params["base_matmul"],
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
