"""The training loop of one cell in this process (or one DDP rank): data, model, LoRA, the HF
Trainer with the meter, and the metrics of its timed window. lorabench.train decides where a cell
runs and calls `measure` here; lorabench.worker calls it in each rank's process."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections import deque
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PrinterCallback, TrainerCallback, TrainingArguments

from lorabench import backends, checks, data, distributed, modeling
from lorabench.config import Backend, Config, Precision
from lorabench.devices import setup_device
from lorabench.guard import Guard, JobRequeued, StepAborted, slurm_requeued
from lorabench.loggers import MetricLogger
from lorabench.meter import MeasuredTrainer, NvmlSampler, StepMeter
from lorabench.metrics import memory_stats, summarize
from lorabench.profile import StepProfiler
from lorabench.results import CellInterrupted, CellResult, atomic_write_text

log = logging.getLogger(__name__)


def measure(c: Config, run_dir: Path, result: CellResult, logger: MetricLogger, rank: int = 0) -> dict:
    """Data, model and timed training in this process (one DDP rank when launched by torchrun)."""
    with backends.module_patches(c):  # what a backend patches in transformers is undone after the cell
        return _measure(c, run_dir, result, logger, rank)


def _measure(c: Config, run_dir: Path, result: CellResult, logger: MetricLogger, rank: int) -> dict:
    device, gpu = setup_device(c.train.device, c.gpu, result)
    checks.check_device(c, device)
    backends.check(c, device)
    torch.manual_seed(c.train.seed)

    # ---- data: built before the model, so bad input fails in seconds, not after a 7B load
    tokenizer = modeling.build_tokenizer(c.model)
    dataset, data_stats = data.build_dataset(c, tokenizer)
    log.info("data: %s, %d %s, seq_len %d %s", c.data.kind.value, len(dataset),
             "packed rows" if data.packs(c) else "samples", c.seq_len, data_stats)

    # ---- model: base weights at the cell's precision, then LoRA adapters
    t0 = time.perf_counter()
    model, weights, (checkpointed, offloaded) = build_trainable_model(c, device)
    load_s = time.perf_counter() - t0
    params = modeling.count_params(model)
    result.model = {"name": c.model.name, "weights": weights, "load_s": load_s, **params,
                    "checkpointed_layers": checkpointed, "offloaded_layers": offloaded}
    log.info("model %s (%s) at %s on %s in %.1f s: %.1fM matmul params, %.2fM trainable; backend %s, "
             "%d layers checkpointed, %d offloaded", c.model.name, weights, c.precision.name.value, device,
             load_s, params["base_matmul"] / 1e6, params["trainable"] / 1e6, c.backend.name.value, checkpointed,
             offloaded)

    # ---- training: HF Trainer runs the seed's recipe; the meter times it
    sampler = NvmlSampler(device) if device.type == "cuda" else None
    # Untimed: the warmup steps, then the profiled ones (profiling slows a step down).
    untimed = c.train.warmup_steps + c.train.profile_steps
    log.info("timing: %d warmup steps%s, then %d timed", c.train.warmup_steps,
             f" and {c.train.profile_steps} profiled" if c.train.profile_steps else "",
             c.train.max_steps - untimed)
    steps_file = run_dir / ("steps.jsonl" if rank == 0 else f"steps.rank{rank}.jsonl")
    # A re-run of a killed cell resumes from its newest complete checkpoint; the step records after
    # that checkpoint are dropped, those steps are trained again.
    ckpt_dir = run_dir / "checkpoints"
    last = last_checkpoint(ckpt_dir) if c.train.resume else None
    earlier = []
    if last is not None:
        done = int(last.name.split("-")[-1])
        earlier = [s for s in map(json.loads, steps_file.read_text().splitlines()) if s["step"] <= done] \
            if steps_file.exists() else []
        atomic_write_text(steps_file, "".join(json.dumps(s) + "\n" for s in earlier))
        result.resumed_from_step = done
        log.info("resuming from %s (%d step records kept)", last, len(earlier))
    else:  # a run killed before its first checkpoint starts afresh: one history per file, never two
        steps_file.unlink(missing_ok=True)
    meter = StepMeter(device, untimed, steps_file, sampler, logger.log_step, earlier_steps=earlier)
    guard = Guard(c.train.host_memory_limit_gib)  # the host-memory watchdog; SIGTERM's grace period
    preemption = Preemption(guard, c.train.sigterm_grace_s)
    callbacks = [meter, preemption] + ([ProgressBar(c.train.max_steps, meter)] if rank == 0 else [])
    profile = c.train.profile_steps and rank == 0  # one rank's profile: the others wait on it at the all-reduce
    if profile:  # after the meter, whose step-end synchronisation it relies on
        profiler = StepProfiler(device, c.train.warmup_steps, c.train.profile_steps, run_dir, meter)
        callbacks.insert(1, profiler)
    p = c.precision.name
    args = TrainingArguments(
        output_dir=str(ckpt_dir),
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
        gradient_checkpointing=False,  # set per layer above (backends.apply_checkpointing)
        # DDP (train.nproc > 1) with frozen 4-bit weights and checkpointing: every adapter gets a
        # gradient each step; searching for unused ones would fail with non-reentrant checkpointing.
        ddp_find_unused_parameters=False,
        use_cpu=device.type == "cpu",
        seed=c.train.seed,
        dataloader_num_workers=c.data.num_workers,
        dataloader_pin_memory=c.data.pin_memory and device.type == "cuda",
        remove_unused_columns=False,
        logging_steps=1,  # a loss per step; the .item() it costs is inside the step's time
        logging_nan_inf_filter=False,  # a NaN loss must show, not be averaged away
        save_strategy="steps" if c.train.save_steps else "no",
        save_steps=c.train.save_steps or 500,  # (unused when save_strategy is "no")
        save_total_limit=2,  # the newest and the one before, in case the newest is half-written
        report_to="none",
        disable_tqdm=True,
    )
    if device.type == "cuda" and c.train.nproc == 1:
        # One process on a node with several GPUs: the Trainer would wrap the model in
        # nn.DataParallel over all of them (and multiply the batch by their number). A cell uses
        # exactly the GPUs it asks for; the Trainer itself forces this for model-parallel models.
        assert args.device.index == device.index, (args.device, device)
        args._n_gpu = 1
    trainer = MeasuredTrainer(model=model, args=args, train_dataset=dataset,
                              data_collator=data.build_collator(c, tokenizer),
                              callbacks=callbacks, meter=meter, flat_optimizer=c.backend.flat_optimizer,
                              lean_step=c.backend.lean_step)
    trainer.remove_callback(PrinterCallback)  # it prints every log dict; the bar shows them
    aborted = False
    try:
        with guard:
            trainer.train(resume_from_checkpoint=str(last) if last else None)
    except StepAborted:
        aborted = True
    finally:
        meter.close()  # stops the NVML thread and closes steps.jsonl, also after an OOM
        preemption.close()
        if profile:
            profiler.close()
        # Under DDP another rank may still look into it: node 0's launcher removes it after all ranks.
        if int(os.environ.get("WORLD_SIZE", 1)) == 1:
            distributed.remove_empty(ckpt_dir)
    if preemption.signalled:
        step = meter.steps[-1]["step"] if meter.steps else 0
        newest = last_checkpoint(ckpt_dir)
        stopped = (f"the step after step {step} had not ended {c.train.sigterm_grace_s:g} s after the signal "
                   f"(train.sigterm_grace_s) and was stopped; newest checkpoint: {newest.name if newest else 'none'}"
                   if aborted else f"stopped after step {step} with a checkpoint in {ckpt_dir}")
        preemption.hand_over(stopped)
        raise CellInterrupted(f"{preemption.signal_name}: {stopped}; run the same command again to resume")

    arch = modeling.Architecture.from_hf_config(model.config)  # the FLOP count's facts: heads, head_dim, windows
    metrics = summarize(meter.steps, meter.window_s, params, arch, gpu)
    metrics["count/warmup_steps"] = c.train.warmup_steps
    metrics.update(data_stats)
    metrics.update(memory_stats(device))
    metrics["host/rss_peak_gib"] = guard.peak_gib  # this process and its workers, sampled every 0.1 s
    if getattr(model, "lorabench_offloader", None) is not None:  # train.offload_fraction > 0
        metrics.update(model.lorabench_offloader.metrics())
    if sampler:
        metrics.update(sampler.summary())
    if profile:
        metrics.update(profiler.result)
    # What the launcher of a DDP cell needs to add ranks up (see lorabench.distributed).
    result.rank = {"steps": meter.steps, "window_s": meter.window_s, "params": params, "arch": arch,
                      "data_stats": data_stats}
    return metrics


def build_trainable_model(c: Config, device: torch.device):
    """(model, weights, (checkpointed layers, offloaded layers)): the base model at the cell's precision, the backend's
    kernels, LoRA adapters, activation checkpointing, compilation; ready for the Trainer."""
    if c.backend.name is Backend.unsloth:
        return backends.build_unsloth(c, device)  # Unsloth's loader and LoRA do all of it
    model, weights = modeling.build_model(c, device)
    model = backends.apply_varlen_attention(model, c, device)
    model = backends.apply_kernels(model, c)  # Liger's fused ops go in before LoRA wraps the layers
    model = modeling.apply_lora(model, c.lora, c.precision.name, c.train.gradient_checkpointing,
                                c.backend.upcast_fp32)
    model = backends.apply_fused_lora(model, c)
    checkpointed, offloaded = backends.apply_checkpointing(model, c.train, device)
    return backends.apply_compile(model, c), weights, (checkpointed, offloaded)


def last_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint-<step> dir. The HF Trainer writes trainer_state.json after the
    weights, optimizer and RNG states, so a dir without it is a save cut short: skipped."""
    done = [p for p in ckpt_dir.glob("checkpoint-*") if (p / "trainer_state.json").exists()] \
        if ckpt_dir.is_dir() else []
    return max(done, key=lambda p: int(p.name.split("-")[-1]), default=None)


class Preemption(TrainerCallback):
    """SIGTERM (a spot reclaim, a SLURM preemption or requeue, a Kubernetes eviction): finish the
    current step, save a checkpoint and stop; a re-run of the same command resumes from it. A step
    that has not ended `grace_s` after the signal is stopped where it is (through the guard), without
    a new checkpoint: a cell whose steps take minutes still ends before the scheduler's kill.

    In a submitit job (hydra/launcher=slurm or local) the time-limit signal (SUBMITIT_PREEMPT_SIGNAL,
    USR2) is handled the same way, then handed to submitit, which requeues the job; and a SIGTERM
    because SLURM requeued the job ends the process without a result (JobRequeued), so that the
    multirun waits for the job's next run instead of reporting this one."""

    def __init__(self, guard: Guard, grace_s: float):
        self.guard, self.grace_s = guard, grace_s
        self.signalled = self.time_limit = False
        self.signal_name = "SIGTERM"
        self._previous: dict = {}
        self._timer: threading.Timer | None = None
        self._submitit_signal = self._submitit_handler = None

    def on_train_begin(self, args, state, control, **kw):
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            return
        self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
        if os.environ.get("SUBMITIT_EXECUTOR"):
            self._submitit_signal = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
            self._submitit_handler = signal.signal(self._submitit_signal, self._on_signal)
            self._previous[self._submitit_signal] = self._submitit_handler

    def _on_signal(self, signum, frame):
        log.warning("%s: saving a checkpoint at the end of this step (or stopping it in %g s), then stopping",
                    signal.Signals(signum).name, self.grace_s)
        self.signalled = True
        self.signal_name = signal.Signals(signum).name
        self.time_limit |= signum == self._submitit_signal
        if self._timer is None:
            self._timer = threading.Timer(self.grace_s, self.guard.stop, args=(StepAborted("SIGTERM grace period over"),))
            self._timer.daemon = True
            self._timer.start()

    def on_step_end(self, args, state, control, **kw):
        if self.signalled:
            if self._timer is not None:
                self._timer.cancel()  # the step ended in time: its checkpoint is written next
            control.should_save = True
            control.should_training_stop = True

    def hand_over(self, stopped: str) -> None:
        """After the loop stopped on a signal: in a SLURM job that runs again, end the process
        without a result (JobRequeued); otherwise return, and the cell is recorded interrupted."""
        if self.time_limit and callable(self._submitit_handler):  # it checkpoints the launcher's job, requeues, exits
            try:
                self._submitit_handler(self._submitit_signal, None)
            except SystemExit as e:  # its exit code tells submitit's local executor to start the job again
                raise JobRequeued(f"time limit: submitit requeued the job; {stopped}; its next run resumes",
                                  e.code) from None
            except Exception as e:  # not requeued (timed out too often): recorded interrupted
                log.warning("submitit did not requeue the job: %s", e)
        elif slurm_requeued():
            raise JobRequeued(f"SIGTERM: SLURM requeued job {os.environ['SLURM_JOB_ID']}; {stopped}; its next run "
                              "resumes")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


class ProgressBar(TrainerCallback):
    """A tqdm bar over optimizer steps with the last loss and non-pad tokens/s over the last 10
    steps (one step's rate jumps with its batch's length); replaces the Trainer's printed log dicts."""

    def __init__(self, total: int, meter: StepMeter, window: int = 10):
        self.total, self.meter = total, meter
        self.recent = deque(maxlen=window)

    def on_train_begin(self, args, state, control, **kw):
        self.bar = tqdm(total=self.total, desc="train", unit="step", mininterval=0.5)

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs and self.meter.steps:
            self.recent.append(self.meter.steps[-1])
            tokens, seconds = (sum(s[k] for s in self.recent) for k in ("tokens_nonpad", "time_s"))
            self.bar.set_postfix(loss=f"{logs['loss']:.3f}", tok_s=f"{tokens / seconds:,.0f}", refresh=False)

    def on_step_end(self, args, state, control, **kw):
        self.bar.update(1)

    def on_train_end(self, args, state, control, **kw):
        self.bar.close()

