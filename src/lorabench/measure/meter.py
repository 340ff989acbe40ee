"""The Trainer's instruments: per-step timing and token counts (StepMeter, fed every micro-batch by
lorabench.run.trainer.MeasuredTrainer), the matmul width probe and the GPU sampler (NvmlSampler). What their
records mean: lorabench.measure.metrics."""

from __future__ import annotations

import gc
import json
import math
import os
import threading
import time
from pathlib import Path

import psutil
import torch
from transformers import TrainerCallback

from lorabench.core.devices import sync
from lorabench.core.results import strict


class MatmulProbe:
    """The width the model's matmuls ran at, read as the first forward of decoder layer `layer` begins: the
    element size in bytes of autocast's dtype where autocast is on, else of the layer's input (2: bf16/fp16,
    4: fp32). Not a layer's output: bitsandbytes casts its 4-bit layers' bf16 products back to their input's
    dtype, fp32 after the QLoRA recipe's fp32 norms. A cell labelled bf16 that ran without autocast (sharded
    cells did, lorabench.run.sharding) computes attention, adapters and head in fp32 and takes about twice as
    long: this says so. None where the layer is compiled (a hook that removes itself would be traced)."""

    def __init__(self, layer: torch.nn.Module):
        self.bytes: int | None = None
        self._handle = layer.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs) -> None:
        x = next(t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point())
        on = torch.is_autocast_enabled(x.device.type)
        self.bytes = (torch.get_autocast_dtype(x.device.type) if on else x.dtype).itemsize
        self._handle.remove()


class StepMeter(TrainerCallback):
    """Per-step wall time, token counts, loss and gradient norm, and the memory (CUDA: the allocator's
    reserved bytes at the step's end; CPU: the process's resident set) and, with the NVML sampler, the
    GPU's last power reading; one line per step in steps.jsonl.

    The first `warmup_steps` steps of this process are not timed, also after a resume (a new
    process warms up again); `earlier_steps` are the records of the steps before a resume. Each
    step also records the time Python's cyclic garbage collector held the process in it (gc_ms, any
    thread) and how many of its full collections (generation 2, which walk every tracked object: the
    model's modules and tensors too) ran: one of them is a slow step's first suspect.

    With `gc_every` N > 0 (backend.gc_every) the collector runs on a schedule instead (torchtitan's
    training.gc_freq): off while training, one collection of its two young generations when every Nth
    step begins, inside that step's time; a full collection never runs mid-training."""

    def __init__(self, device: torch.device, warmup_steps: int, steps_path: Path, sampler=None,
                 earlier_steps: list[dict] = (), gc_every: int = 0):
        self.device, self.warmup_steps, self.sampler = device, warmup_steps, sampler
        self.gc_every, self._gc_was_on = gc_every, None
        self.steps: list[dict] = list(earlier_steps)
        self._file = JsonLines(steps_path)  # each line written whole: a killed cell keeps its steps
        self._counts = torch.zeros(4, dtype=torch.int64, device=device)
        self._positions = 0
        self._last_end = 0.0
        self._seen = 0  # steps ended in this process
        self._gc_start, self._gc_ms, self._gc_full = 0.0, 0.0, 0
        self._process = None if device.type == "cuda" else psutil.Process()  # (CPU: the resident set per step)

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

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self._gc_ms += 1e3 * (time.perf_counter() - self._gc_start)
            self._gc_full += info["generation"] == 2

    def on_train_begin(self, args, state, control, **kwargs):
        if self._gc not in gc.callbacks:
            gc.callbacks.append(self._gc)
        if self.gc_every and self._gc_was_on is None:
            self._gc_was_on = gc.isenabled()
            gc.collect()  # what building the model left, before the clock starts
            gc.disable()
        self.restart_clock()
        if self.warmup_steps == 0:
            self._start_window()

    def restart_clock(self) -> None:
        """Start the current step's clock now: what happened since the last step end (e.g. starting
        the profiler) is not part of any step."""
        sync(self.device)
        self._last_end = time.perf_counter()
        self._gc_ms, self._gc_full = 0.0, 0

    def _start_window(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.sampler:
            self.sampler.start()

    def on_step_begin(self, args, state, control, **kwargs):
        if self.gc_every and state.global_step % self.gc_every == 0:
            gc.collect(1)

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
                           "samples": samples, "sum_len_sq": sq,
                           "gc_ms": round(self._gc_ms, 3), "gc_full": self._gc_full, **self._memory_and_power()})
        self._last_end = now
        self._gc_ms, self._gc_full = 0.0, 0
        if self._seen == self.warmup_steps:
            self._start_window()

    def _memory_and_power(self) -> dict:
        """Read at the step's end, after its synchronisation: a counter of the allocator's and NVML's
        last sample (no wait for the GPU); on a CPU one read of /proc (~20 us)."""
        if self._process is not None:
            return {"host_rss_gib": round(self._process.memory_info().rss / 2**30, 4)}
        out = {"mem_reserved_gib": round(torch.cuda.memory_reserved(self.device) / 2**30, 4)}
        if self.sampler and self.sampler.samples:
            out["power_w"] = self.sampler.samples[-1][1]
        return out

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or not self.steps:
            return  # the Trainer's end-of-training summary, not a step
        rec = self.steps[-1]
        rec.update(loss=logs["loss"], lr=logs.get("learning_rate"), grad_norm=logs.get("grad_norm"))
        self._file.append(rec)
        if not math.isfinite(rec["loss"]):
            raise FloatingPointError(f"loss is {rec['loss']} at step {rec['step']}: stopping this cell "
                                     "instead of training on garbage")

    def on_train_end(self, args, state, control, **kwargs):
        self.close()

    def close(self) -> None:
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)
        if self._gc_was_on:  # the collector as it was before training (a multirun's next cell, the tests)
            gc.enable()
        self._gc_was_on = None
        if self.sampler:
            self.sampler.stop()
        self._file.close()


class JsonLines:
    """Appends one JSON record per line to a file, each line whole or not at all: one os.write of the
    whole line, and a write the disk cuts short (full, a quota, the file-size limit) is cut back to
    the last whole line before its error goes on. A reader never sees half a record."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def append(self, record: dict) -> None:
        data = (json.dumps(strict(record), allow_nan=False) + "\n").encode()
        end = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            written = 0
            while written < len(data):  # a short write (the disk took part of the line): the rest's write says why
                written += os.write(self.fd, data[written:])
        except OSError as e:
            os.ftruncate(self.fd, end)  # shrinking a file needs no space
            e.filename = e.filename or str(self.path)
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class NvmlSampler:
    """Samples utilisation, power, temperature, SM and memory clocks and power capping of one GPU in a
    background thread; its summary adds the card's clock and power limits.

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
                    n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_MEM),
                    self._power_capped(),
                ))
            except n.NVMLError:
                pass
            self._stop.wait(self.interval_s)

    def _power_capped(self) -> bool:
        """Whether the clocks are held down by the power limit right now (software or hardware cap)."""
        n = self.nvml
        try:
            reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle)
        except (n.NVMLError, AttributeError):
            return False
        return bool(reasons & (n.nvmlClocksThrottleReasonSwPowerCap | n.nvmlClocksThrottleReasonHwSlowdown))

    def limits(self) -> dict:
        """The card's own ceilings, read once: clocks differ between machines of one model, and a
        projection from one to another must know which it ran at."""
        n, out = self.nvml, {}
        for key, call in (("gpu/sm_clock_max_mhz", lambda: n.nvmlDeviceGetMaxClockInfo(self.handle, n.NVML_CLOCK_SM)),
                          ("gpu/mem_clock_max_mhz", lambda: n.nvmlDeviceGetMaxClockInfo(self.handle, n.NVML_CLOCK_MEM)),
                          ("gpu/power_limit_w", lambda: n.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000.0)):
            try:
                out[key] = call()
            except n.NVMLError:
                pass
        return out

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
        util, power, temp, sm, mem, capped = zip(*self.samples)
        out = {"gpu/util_mean_pct": sum(util) / len(util), "gpu/power_mean_w": sum(power) / len(power),
               "gpu/power_max_w": max(power), "gpu/temp_max_c": max(temp), "gpu/sm_clock_mean_mhz": sum(sm) / len(sm),
               "gpu/sm_clock_min_mhz": min(sm), "gpu/mem_clock_mean_mhz": sum(mem) / len(mem),
               "gpu/power_capped_frac": sum(capped) / len(capped), "gpu/nvml_samples": len(util), **self.limits()}
        if self._energy0 is not None and self._energy1 is not None:
            out["gpu/energy_j"] = (self._energy1 - self._energy0) / 1000.0
        return out
