"""The envelope of every cell, training or benchmark: config checks, device, the result file.

A cell's result (metrics.json) holds its status (ok / oom / failed / interrupted) and error, its
metrics, the resolved config, the device and GPU spec used for cost, and the environment.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import logging
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from lorabench import modeling
from lorabench.config import Device, GpuConfig
from lorabench.loggers import NullLogger, build_logger
from lorabench.metrics import device_name, memory_stats, resolve_gpu
from lorabench.results import atomic_write_json, env_info, flatten, load_results, summary_text

log = logging.getLogger(__name__)


def setup_device(want: Device, gpu: GpuConfig, result: dict) -> tuple[torch.device, GpuConfig]:
    """The device this cell runs on, the GPU spec that prices it (and gives its peak FLOP/s), and,
    when the gpu option names another GPU than this one, that GPU's memory as this process's budget."""
    device = modeling.resolve_device(want)
    result["device"] = str(device)
    here = device_name(device)
    if gpu.name == "auto":
        spec, target = resolve_gpu(gpu, here), None
    elif any(re.search(p, here) for p in gpu.match):
        spec, target = gpu, None  # the option names this GPU (with any fields set on the command line)
    else:  # another GPU: emulated here (target), priced as this one unless asked otherwise
        real = resolve_gpu(GpuConfig(name="auto", pricing=gpu.pricing), here)
        spec, target = (gpu if gpu.price_of_target else real), gpu
    result["gpu"] = {k: getattr(spec, k) for k in ("name", "price_per_hour", "spot_price_per_hour",
                                                    "peak_bf16_tflops")}
    result["gpu"].update(pricing=spec.pricing.value, device_name=here)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # an OOM's peak then belongs to this cell alone
        if target is not None and gpu.emulate_memory and gpu.memory_gib:
            total = torch.cuda.get_device_properties(device).total_memory
            if gpu.memory_gib * 2**30 > total:
                raise ValueError(f"gpu={gpu.name}: its memory_gib={gpu.memory_gib} is more than this device has "
                                 f"({here}, {total / 2**30:.1f} GiB); the budget cannot be emulated here")
            # PyTorch's caching allocator refuses to reserve more than this fraction of the device.
            torch.cuda.set_per_process_memory_fraction(gpu.memory_gib * 2**30 / total, device)
            result["gpu"].update(emulated=gpu.name, budget_gib=gpu.memory_gib)
    elif target is not None:
        result["gpu"]["emulated"] = None  # a CPU has no device memory to cap: nothing emulated
    return device, spec


class CellSkipped(Exception):
    """Raised by a cell that need not run; its result gets status "skipped" and this reason."""


class CellInterrupted(Exception):
    """Raised by a cell stopped on purpose before its end (SIGTERM); status "interrupted"."""


def is_host_oom(e: BaseException) -> bool:
    """A CPU cell that asked the host for more memory than it has (PyTorch's CPU allocator)."""
    msg = str(e)
    return "DefaultCPUAllocator" in msg and ("not enough memory" in msg or "can't allocate memory" in msg)


def last_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint-<step> dir. The HF Trainer writes trainer_state.json after the
    weights, optimizer and RNG states, so a dir without it is a save cut short: skipped."""
    done = [p for p in ckpt_dir.glob("checkpoint-*") if (p / "trainer_state.json").exists()] \
        if ckpt_dir.is_dir() else []
    return max(done, key=lambda p: int(p.name.split("-")[-1]), default=None)


SHAPE_KEYS = ("seq_len", "batch")


def smaller_oom(config: dict, run_dir: Path) -> dict | None:
    """In a multirun, a finished sibling cell that ran out of memory with the same configuration
    except a seq_len and batch each no larger than this cell's: then this one cannot fit either
    (activation memory grows with both), and a sizing sweep need not spend a model load on it."""
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    mine = flatten(config)
    rest = {k: v for k, v in mine.items() if k not in SHAPE_KEYS}
    for r in load_results(run_dir.parent)[0]:
        other = flatten(r.get("config", {}))
        if (r.get("status") == "oom" and {k: v for k, v in other.items() if k not in SHAPE_KEYS} == rest
                and all(other.get(k, 0) <= mine[k] for k in SHAPE_KEYS)):
            return r
    return None


def cell_name() -> str:
    """The cell's overrides as one string, e.g. "batch=8,seq_len=512" (empty for the defaults)."""
    hc = HydraConfig.get()
    return hc.job.override_dirname or "defaults"


def run(cfg: DictConfig, measure: Callable, job_type: str = "train-cell") -> dict:
    """Run `measure(typed_config, run_dir, result, logger) -> metrics` as one cell of a sweep.

    Every outcome is a result: a cell that runs out of memory or raises writes metrics.json with
    status "oom" or "failed" and the reason, and returns normally, so a multirun goes on to the
    next cell (Hydra skips its end-of-sweep callbacks if any cell raises).
    """
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # A repeated command (a requeued job, a re-run sweep) does not redo a finished cell.
    done = run_dir / "metrics.json"
    if done.exists() and not OmegaConf.select(cfg, "train.force", default=False):
        try:
            previous = json.loads(done.read_text())
        except json.JSONDecodeError:
            previous = {}
        if previous.get("status") == "ok":
            log.info("cell already finished (%s); train.force=true runs it again", done)
            print(f"\n{summary_text(previous)}\nresult (from an earlier run): {done}", file=sys.stderr)
            return previous
    result = {"status": "running", "cell": cell_name(), "job_num": hc.job.num if hc.mode == RunMode.MULTIRUN else 0,
              "run_dir": str(run_dir), "metrics": {},
              "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)}
    # A multi-node cell runs this on every node, in one shared run dir: node 0 alone writes the
    # result and talks to W&B; another node records its own outcome in node<r>.json.
    result_file = run_dir / "metrics.json"
    if OmegaConf.select(cfg, "train.nnodes", default=1) > 1:
        from lorabench.distributed import node_rank

        with contextlib.suppress(ValueError):  # no node index: the launch fails with the reason, as node 0
            if (node := node_rank()) > 0:
                result_file = run_dir / f"node{node}.json"
    logger = NullLogger()
    t_start = time.perf_counter()
    try:
        # First the logger, so that a cell failing any check below still has its W&B run.
        group = Path(hc.sweep.dir if hc.mode == RunMode.MULTIRUN else hc.run.dir).name
        if result_file.name == "metrics.json":
            logger = build_logger(cfg.logger, name=result["cell"], group=group, config=result["config"],
                                  run_dir=str(run_dir), job_type=job_type)
        # Range checks (__post_init__) run here; type errors were already caught at composition.
        result["metrics"] = measure(OmegaConf.to_object(cfg), run_dir, result, logger)
        result["status"] = "ok"
    except torch.OutOfMemoryError as e:
        result.update(status="oom", error=str(e).splitlines()[0])
    except CellSkipped as e:
        result.update(status="skipped", error=str(e))
    except CellInterrupted as e:
        result.update(status="interrupted", error=str(e))
    except Exception as e:
        if is_host_oom(e):  # a CPU cell out of host memory is as much out of memory as a GPU cell
            result.update(status="oom", error="host memory: " + str(e).splitlines()[0][:300])
        else:
            result.update(status="failed", error=f"{type(e).__name__}: {e}")
            (run_dir / "error.txt").write_text(traceback.format_exc())
            log.error("cell failed: %s (traceback in %s)", result["error"], run_dir / "error.txt")
    finally:
        if result["status"] == "running":  # KeyboardInterrupt or SystemExit passing through
            result.update(status="interrupted", error="interrupted before the cell finished")
        device = torch.device(result["device"]) if "device" in result else None
        if result.get("gpu", {}).get("budget_gib"):
            result["metrics"]["mem/budget_gib"] = result["gpu"]["budget_gib"]
        if result["status"] != "ok":
            # What was measured before the failure still tells something, e.g. the memory in
            # use when an OOM hit, and how far the cell got.
            result["metrics"].update(memory_stats(device) if device is not None else {})
            steps = run_dir / "steps.jsonl"
            if steps.exists():
                result["metrics"]["count/steps_done"] = len(steps.read_text().splitlines())
        # The process's largest resident set so far (in a multirun: over this and earlier cells).
        result["metrics"]["host/process_max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        result["time/total_s"] = time.perf_counter() - t_start
        result["env"] = env_info(device)
        atomic_write_json(result_file, result)
        try:
            logger.finish(result)
        except Exception as e:  # a logger must never turn a measured cell into a lost one
            log.warning("logger failed to finish: %s", e)
        print(f"\n{summary_text(result)}\nresult: {result_file}", file=sys.stderr)
        # The next cell of a multirun runs in this process; the model died with
        # measure's frame, so its memory can go back now. One reference outlives it:
        # for an 8-bit optimizer the HF Trainer registers every nn.Embedding with bitsandbytes'
        # process-wide GlobalOptimManager, which would keep Mistral-7B's fp32 input embedding
        # (32768 x 4096 x 4 B = 0.5 GiB) alive into every later cell (measured: +0.5 GiB peak per cell).
        if "bitsandbytes" in sys.modules:
            sys.modules["bitsandbytes"].optim.GlobalOptimManager.get_instance().initialize()
        gc.collect()
        if device is not None and device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(1.0, device)  # lift an emulated budget
    return result


