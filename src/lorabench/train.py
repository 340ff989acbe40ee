"""One cell of a sweep, top to bottom: config -> data -> model -> LoRA -> timed training -> result.

Every outcome is a result: a cell that runs out of memory or raises writes metrics.json with
status "oom" or "failed" and the reason, and returns normally, so a multirun goes on to the next
cell (Hydra skips its end-of-sweep callbacks if any cell raises).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import resource
import sys
import time
import traceback
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm
from transformers import PrinterCallback, TrainerCallback, TrainingArguments

from lorabench import data, modeling
from lorabench.config import Config, Precision
from lorabench.loggers import NullLogger, build_logger
from lorabench.metrics import (MeasuredTrainer, NvmlSampler, StepMeter, device_name, memory_stats,
                               resolve_gpu, summarize)
from lorabench.results import atomic_write_json, env_info, markdown_table

log = logging.getLogger(__name__)


def cell_name() -> str:
    """The cell's overrides as one string, e.g. "batch=8,seq_len=512" (empty for the defaults)."""
    hc = HydraConfig.get()
    return hc.job.override_dirname or "defaults"


def run_cell(cfg: DictConfig) -> dict:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    result = {"status": "running", "cell": cell_name(), "job_num": hc.job.num if hc.mode == RunMode.MULTIRUN else 0,
              "run_dir": str(run_dir), "config": OmegaConf.to_container(cfg, resolve=True), "metrics": {}}
    logger, device = NullLogger(), None
    t_start = time.perf_counter()
    try:
        # First the logger, so that a cell failing any check below still has its W&B run.
        group = Path(hc.sweep.dir if hc.mode == RunMode.MULTIRUN else hc.run.dir).name
        logger = build_logger(cfg.logger, name=result["cell"], group=group, config=result["config"],
                              run_dir=str(run_dir))
        # Range checks (__post_init__) run here; type errors were already caught at composition.
        c: Config = OmegaConf.to_object(cfg)
        device = modeling.resolve_device(c)
        modeling.check_compatible(c, device)
        gpu = resolve_gpu(c.gpu, device_name(device))
        result["gpu"] = {"name": gpu.name, "price_per_hour": gpu.price_per_hour,
                         "spot_price_per_hour": gpu.spot_price_per_hour, "pricing": gpu.pricing.value,
                         "peak_bf16_tflops": gpu.peak_bf16_tflops}
        result["metrics"] = train_and_measure(c, device, gpu, run_dir, result, logger)
        result["status"] = "ok"
    except torch.OutOfMemoryError as e:
        result.update(status="oom", error=str(e).splitlines()[0])
    except Exception as e:
        result.update(status="failed", error=f"{type(e).__name__}: {e}")
        (run_dir / "error.txt").write_text(traceback.format_exc())
        log.error("cell failed: %s (traceback in %s)", result["error"], run_dir / "error.txt")
    finally:
        if result["status"] == "running":  # KeyboardInterrupt or SystemExit passing through
            result.update(status="interrupted", error="interrupted before the cell finished")
        if result["status"] != "ok":
            # What was measured before the failure still tells something, e.g. the memory in
            # use when an OOM hit, and how far the cell got.
            result["metrics"].update(memory_stats(device) if device is not None else {})
            steps = run_dir / "steps.jsonl"
            result["metrics"]["count/steps_done"] = len(steps.read_text().splitlines()) if steps.exists() else 0
        # The process's largest resident set so far (in a multirun: over this and earlier cells).
        result["metrics"]["host/process_max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        result["time/total_s"] = time.perf_counter() - t_start
        result["env"] = env_info(device)
        atomic_write_json(run_dir / "metrics.json", result)
        try:
            logger.finish(result)
        except Exception as e:  # a logger must never turn a measured cell into a lost one
            log.warning("logger failed to finish: %s", e)
        print(f"\n{markdown_table([result])}\nresult: {run_dir / 'metrics.json'}", file=sys.stderr)
        # The next cell of a multirun runs in this process; the model died with
        # train_and_measure's frame, so its memory can go back now. One reference outlives it:
        # for an 8-bit optimizer the HF Trainer registers every nn.Embedding with bitsandbytes'
        # process-wide GlobalOptimManager, which would keep Mistral-7B's fp32 input embedding
        # (32768 x 4096 x 4 B = 0.5 GiB) alive into every later cell (measured: +0.5 GiB peak per cell).
        if "bitsandbytes" in sys.modules:
            sys.modules["bitsandbytes"].optim.GlobalOptimManager.get_instance().initialize()
        gc.collect()
        if device is not None and device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def train_and_measure(c: Config, device: torch.device, gpu, run_dir: Path, result: dict, logger) -> dict:
    """Data, model and timed training for one cell; returns its metrics."""
    torch.manual_seed(c.train.seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # an OOM's peak then belongs to this cell alone

    # ---- data: built before the model, so bad input fails in seconds, not after a 7B load
    tokenizer = modeling.build_tokenizer(c.model)
    dataset, data_stats = data.build_dataset(c, tokenizer)
    log.info("data: %s, %d %s, seq_len %d %s", c.data.kind.value, len(dataset),
             "packed rows" if c.data.packing else "samples", c.seq_len, data_stats)

    # ---- model: base weights at the cell's precision, then LoRA adapters
    t0 = time.perf_counter()
    model, weights = modeling.build_model(c, device)
    model = modeling.apply_lora(model, c.lora, c.precision.name, c.train.gradient_checkpointing)
    load_s = time.perf_counter() - t0
    params = modeling.count_params(model)
    result["model"] = {"name": c.model.name, "weights": weights, "load_s": load_s, **params}
    log.info("model %s (%s) at %s on %s in %.1f s: %.1fM matmul params, %.2fM trainable",
             c.model.name, weights, c.precision.name.value, device, load_s,
             params["base_matmul"] / 1e6, params["trainable"] / 1e6)

    # ---- training: HF Trainer runs the seed's recipe; the meter times it
    sampler = NvmlSampler(device) if device.type == "cuda" else None
    meter = StepMeter(device, c.train.timing_warmup_steps, run_dir / "steps.jsonl", sampler, logger.log_step)
    p = c.precision.name
    args = TrainingArguments(
        output_dir=str(run_dir / "trainer"),
        per_device_train_batch_size=c.batch,
        gradient_accumulation_steps=c.train.grad_accum,
        max_steps=c.train.max_steps,
        learning_rate=c.optimizer.lr,
        lr_scheduler_type=c.optimizer.schedule.value,
        warmup_steps=c.optimizer.warmup_steps,
        weight_decay=c.optimizer.weight_decay,
        max_grad_norm=c.optimizer.max_grad_norm,
        optim=c.optimizer.name.value,
        bf16=p in (Precision.bf16, Precision.nf4, Precision.int8),
        fp16=p is Precision.fp16,
        gradient_checkpointing=c.train.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        use_cpu=device.type == "cpu",
        seed=c.train.seed,
        dataloader_num_workers=c.data.num_workers,
        dataloader_pin_memory=c.data.pin_memory and device.type == "cuda",
        remove_unused_columns=False,
        logging_steps=1,  # a loss per step; the .item() it costs is inside the step's time
        logging_nan_inf_filter=False,  # a NaN loss must show, not be averaged away
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer = MeasuredTrainer(model=model, args=args, train_dataset=dataset,
                              data_collator=data.build_collator(c, tokenizer),
                              callbacks=[meter, ProgressBar(c.train.max_steps, meter)], meter=meter)
    trainer.remove_callback(PrinterCallback)  # it prints every log dict; the bar shows them
    try:
        trainer.train()
    finally:
        meter.close()  # stops the NVML thread and closes steps.jsonl, also after an OOM
        with contextlib.suppress(OSError):
            (run_dir / "trainer").rmdir()  # the Trainer's output_dir: nothing is saved there yet

    arch = {"layers": model.config.num_hidden_layers, "heads": model.config.num_attention_heads,
            "head_dim": model.config.head_dim}
    metrics = summarize(meter.steps, meter.window_s, params, arch, gpu)
    metrics.update(data_stats)
    metrics.update(memory_stats(device))
    if sampler:
        metrics.update(sampler.summary())
    return metrics


class ProgressBar(TrainerCallback):
    """A tqdm bar over optimizer steps with the last loss and non-pad tokens/s; replaces the
    Trainer's printed log dicts."""

    def __init__(self, total: int, meter: StepMeter):
        self.total, self.meter = total, meter

    def on_train_begin(self, args, state, control, **kw):
        self.bar = tqdm(total=self.total, desc="train", unit="step", mininterval=0.5)

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs and self.meter.steps:
            last = self.meter.steps[-1]
            self.bar.set_postfix(loss=f"{logs['loss']:.3f}", tok_s=f"{last['tokens_nonpad'] / last['time_s']:,.0f}",
                                 refresh=False)

    def on_step_end(self, args, state, control, **kw):
        self.bar.update(1)

    def on_train_end(self, args, state, control, **kw):
        self.bar.close()
