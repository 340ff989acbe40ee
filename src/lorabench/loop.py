"""The training loop of one cell in this process (or one DDP rank), as a list of steps, each one
job: prepare the device, build the data, build the model, find the state to resume from, set up
what watches the training, the Trainer's arguments, train, collect the metrics of the timed
window. lorabench.train decides where a cell runs and calls `measure` here; lorabench.worker calls
it in each rank's process."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PrinterCallback, TrainerCallback, TrainingArguments

from lorabench import backends, checks, data, distributed, fastpath, modeling, sharding
from lorabench.config import QUANTISED, Backend, Config, GpuConfig, Precision
from lorabench.devices import setup_device
from lorabench.guard import Guard
from lorabench.loggers import MetricLogger
from lorabench.meter import MatmulProbe, MeasuredTrainer, NvmlSampler, StepMeter
from lorabench.metrics import memory_stats, summarize
from lorabench.preemption import HANDLER as preemption
from lorabench.profile import StepProfiler
from lorabench.results import CellInterrupted, CellResult, atomic_write_text

log = logging.getLogger(__name__)


@dataclass
class Resume:
    """Where training starts: the newest complete checkpoint (None: step 0) and the step records
    of the steps before it, kept in steps.jsonl."""
    checkpoint: Path | None
    earlier_steps: list


@dataclass
class Watch:
    """What watches the training: the step meter, the NVML sampler (CUDA), the host-memory guard
    and the profiler (rank 0 with train.profile_steps), and the Trainer callbacks they make up."""
    meter: StepMeter
    sampler: NvmlSampler | None
    guard: Guard
    profiler: StepProfiler | None
    callbacks: list
    probe: MatmulProbe | None


def measure(c: Config, run_dir: Path, result: CellResult, logger: MetricLogger, rank: int = 0) -> dict:
    """Data, model and timed training in this process (one DDP rank when launched by torchrun)."""
    asked = c.backend
    c, off = fastpath.fit(c)  # backend.fit_parts: the parts the architecture lacks a feature for, off
    if off:  # the recorded config is the one that ran
        for key in result.config.get("backend", {}):
            if getattr(c.backend, key, None) != getattr(asked, key, None):
                result.config["backend"][key] = getattr(c.backend, key)
    try:
        with backends.module_patches(c):  # what a backend patches in transformers is undone after the cell
            return _measure(c, run_dir, result, logger, rank)
    finally:
        if off and result.model is not None:
            result.model["parts_off"] = off  # {"backend.fused_add_norm=false": "fused_add_norm computes ..."}


def _measure(c: Config, run_dir: Path, result: CellResult, logger: MetricLogger, rank: int) -> dict:
    device, gpu = prepare_device(c, result)
    tokenizer, dataset, data_stats = build_data(c)  # before the model: bad input fails in seconds, not after a 7B load
    model, params = build_model(c, device, result)
    ckpt_dir = run_dir / "checkpoints"
    steps_file = run_dir / ("steps.jsonl" if rank == 0 else f"steps.rank{rank}.jsonl")
    resume = resume_state(c, ckpt_dir, steps_file, result)
    first_layer = fastpath.decoder_layers(model)[0]
    parts = fastpath.trainer_parts(c, device)  # the fast path's parts that act in the Trainer and its meter
    watch = watch_training(c, device, run_dir, steps_file, resume, logger, rank, first_layer, parts.gc_every)
    # FSDP's unit, with train.parallel=fsdp over several processes: the decoder layer's class
    layer_class = type(first_layer).__name__ if c.train.sharded else ""
    if c.train.sharded:
        sharding.gather_head_with_final_norm(model)
    trainer = MeasuredTrainer(model=model, args=training_arguments(c, device, ckpt_dir, layer_class, len(dataset)),
                              train_dataset=dataset,
                              data_collator=data.build_collator(c, tokenizer, dataset, fixed=parts.cuda_graphs,
                                                                segments=parts.segments),
                              callbacks=watch.callbacks,
                              meter=watch.meter, flat_optimizer=parts.flat_optimizer, lean_step=parts.lean_step,
                              graph_layers=fastpath.decoder_layers(model) if parts.cuda_graphs else None)
    trainer.remove_callback(PrinterCallback)  # it prints every log dict; the bar shows them
    train(c, trainer, resume, watch, ckpt_dir)
    arch = flop_arch(model)
    metrics = collect_metrics(c, device, gpu, model, params, arch, data_stats, watch)
    # What the launcher of a DDP cell needs to add ranks up (see lorabench.distributed).
    result.rank = {"steps": watch.meter.steps, "window_s": watch.meter.window_s, "params": params, "arch": arch,
                   "data_stats": data_stats}
    return metrics


def prepare_device(c: Config, result: CellResult) -> tuple[torch.device, GpuConfig]:
    """The cell's device and the GPU spec it is priced with; the checks that need the device; the seed."""
    device, gpu = setup_device(c.train.device, c.gpu, result)
    checks.check_device(c, device)
    backends.check(c, device)
    torch.manual_seed(c.train.seed)
    return device, gpu


def build_data(c: Config):
    """(tokenizer, dataset, data stats): the cell's rows, tokenised (and packed with data.packing)."""
    tokenizer = modeling.build_tokenizer(c.model)
    dataset, data_stats = data.build_dataset(c, tokenizer)
    log.info("data: %s, %d %s, seq_len %d %s", c.data.kind.value, len(dataset),
             "packed rows" if data.packs(c) else "samples", c.seq_len, data_stats)
    return tokenizer, dataset, data_stats


def build_model(c: Config, device: torch.device, result: CellResult):
    """(model, its parameter counts): base weights at the cell's precision, then LoRA adapters;
    what was built goes into result.model."""
    t0 = time.perf_counter()
    model, weights, (checkpointed, offloaded) = build_trainable_model(c, device)
    load_s = time.perf_counter() - t0
    params = modeling.count_params(model)
    result.model = {"name": c.model.name, "weights": weights, "load_s": load_s, **params,
                    "checkpointed_layers": checkpointed, "offloaded_layers": offloaded,
                    "attention": model.config._attn_implementation}  # what ran (modeling.attention_implementation)
    log.info("model %s (%s) at %s on %s in %.1f s: %.1fM matmul params, %.2fM trainable; backend %s, "
             "%d layers checkpointed, %d offloaded", c.model.name, weights, c.precision.name.value, device,
             load_s, params["base_matmul"] / 1e6, params["trainable"] / 1e6, c.backend.name.value, checkpointed,
             offloaded)
    if params["experts_unquantised"] and c.precision.name in QUANTISED:
        log.info("MoE experts: %.1fM weights in %s, not %s: bitsandbytes quantises nn.Linear layers only and "
                 "transformers stores the experts as 3-D parameters", params["experts_unquantised"] / 1e6,
                 str(modeling.WEIGHT_DTYPE[c.precision.name]).removeprefix("torch."), c.precision.name.value)
    return model, params


def resume_state(c: Config, ckpt_dir: Path, steps_file: Path, result: CellResult) -> Resume:
    """A re-run of a killed cell resumes from its newest complete checkpoint; the step records after
    that checkpoint are dropped, those steps are trained again."""
    last = last_checkpoint(ckpt_dir) if c.train.resume else None
    if last is None:  # a run killed before its first checkpoint starts afresh: one history per file, never two
        steps_file.unlink(missing_ok=True)
        return Resume(None, [])
    done = int(last.name.split("-")[-1])
    earlier = [s for s in map(json.loads, steps_file.read_text().splitlines()) if s["step"] <= done] \
        if steps_file.exists() else []
    atomic_write_text(steps_file, "".join(json.dumps(s) + "\n" for s in earlier))
    result.resumed_from_step = done
    log.info("resuming from %s (%d step records kept)", last, len(earlier))
    return Resume(last, earlier)


def watch_training(c: Config, device: torch.device, run_dir: Path, steps_file: Path, resume: Resume,
                   logger: MetricLogger, rank: int, first_layer: torch.nn.Module, gc_every: int) -> Watch:
    """The meter that times the steps after the untimed ones (Python's collector every `gc_every` steps: see
    StepMeter), the samplers, the matmul-width probe on the model's first decoder layer, and the callbacks."""
    sampler = NvmlSampler(device) if device.type == "cuda" else None
    # Untimed: the first train.untimed_steps, then the profiled ones (profiling slows a step down).
    untimed = c.train.untimed + c.train.profile_steps
    log.info("timing: %d untimed steps%s, then %d timed", c.train.untimed,
             f" and {c.train.profile_steps} profiled" if c.train.profile_steps else "",
             c.train.max_steps - untimed)
    meter = StepMeter(device, untimed, steps_file, sampler, logger.log_step, earlier_steps=resume.earlier_steps,
                      gc_every=gc_every)
    guard = Guard(c.train.host_memory_limit_gib)  # the host-memory watchdog; a signal's grace period
    callbacks = [meter, StopOnSignal()] + ([ProgressBar(c.train.max_steps, meter)] if rank == 0 else [])
    profiler = None
    if c.train.profile_steps and rank == 0:  # one rank's profile: the others wait on it at the all-reduce
        profiler = StepProfiler(device, c.train.untimed, c.train.profile_steps, run_dir, meter)
        callbacks.insert(1, profiler)  # after the meter, whose step-end synchronisation it relies on
    # Unsloth's kernels bypass the layer's forward and a compiled layer would trace the probe (see MatmulProbe)
    probe = MatmulProbe(first_layer) if c.backend.name is not Backend.unsloth and not c.backend.compile else None
    return Watch(meter, sampler, guard, profiler, callbacks, probe)


def training_arguments(c: Config, device: torch.device, ckpt_dir: Path, layer_class: str = "",
                       rows: int = 0) -> TrainingArguments:
    """The HF Trainer's arguments: the seed's recipe from the cell's config; with train.parallel=fsdp over
    several processes, FSDP2 with one unit per decoder layer of class `layer_class` (lorabench.sharding); rows: the
    dataset's."""
    p = c.precision.name
    args = TrainingArguments(
        output_dir=str(ckpt_dir),
        per_device_train_batch_size=c.batch,
        gradient_accumulation_steps=c.train.grad_accum,
        max_steps=c.train.max_steps,
        learning_rate=c.optimizer.lr,
        lr_scheduler_type=c.optimizer.schedule.value,
        warmup_steps=c.optimizer.lr_warmup_steps,
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
        # Every step of one size: an epoch's last, short batch is left out where a full one exists (at batch 96 over
        # 1,024 synthetic rows the 11th step held 64 rows, inside the timed window, and ran without the CUDA graphs
        # captured for 96). Each process batches its 1/ranks of the rows.
        dataloader_drop_last=rows >= c.batch * c.train.nproc * c.train.nnodes,
        remove_unused_columns=False,
        logging_steps=1,  # a loss per step; the .item() it costs is inside the step's time
        logging_nan_inf_filter=False,  # a NaN loss must show, not be averaged away
        save_strategy="steps" if c.train.save_steps else "no",
        save_steps=c.train.save_steps or 500,  # (unused when save_strategy is "no")
        save_total_limit=2,  # the newest and the one before, in case the newest is half-written
        report_to="none",
        disable_tqdm=True,
        **(sharding.trainer_arguments(layer_class) if c.train.sharded else {}),
    )
    sharding.set_mixed_precision(args)
    if device.type == "cuda" and c.train.nproc == 1:
        # One process on a node with several GPUs: the Trainer would wrap the model in
        # nn.DataParallel over all of them (and multiply the batch by their number). A cell uses
        # exactly the GPUs it asks for; the Trainer itself forces this for model-parallel models.
        assert args.device.index == device.index, (args.device, device)
        args._n_gpu = 1
    return args


def train(c: Config, trainer: MeasuredTrainer, resume: Resume, watch: Watch, ckpt_dir: Path) -> None:
    """The Trainer's loop under the host-memory guard and lorabench.preemption; a signal ends it
    with a checkpoint and CellInterrupted (or JobRequeued, where the job runs again)."""
    try:
        with preemption.training(watch.guard, c.train.sigterm_grace_s), watch.guard:
            trainer.train(resume_from_checkpoint=str(resume.checkpoint) if resume.checkpoint else None)
    finally:
        watch.meter.close()  # stops the NVML thread and closes steps.jsonl, also after an OOM
        if watch.profiler:
            watch.profiler.close()
        # Under DDP another rank may still look into it: node 0's launcher removes it after all ranks.
        if int(os.environ.get("WORLD_SIZE", 1)) == 1:
            distributed.remove_empty(ckpt_dir)
    if preemption.requested:
        step = watch.meter.steps[-1]["step"] if watch.meter.steps else 0
        stopped = preemption.stopped_message(step, last_checkpoint(ckpt_dir), ckpt_dir)
        preemption.hand_over(stopped)
        raise CellInterrupted(f"{preemption.signal_name}: {stopped}; run the same command again to resume")


def flop_arch(model) -> modeling.Architecture:
    """The FLOP count's facts (lorabench.metrics): layers, heads, head_dim, each layer's attention window,
    the active experts, from the built model's own config."""
    return modeling.Architecture.from_hf_config(model.config)


def collect_metrics(c: Config, device: torch.device, gpu: GpuConfig, model, params: dict, arch: modeling.Architecture,
                    data_stats: dict, watch: Watch) -> dict:
    """The cell's metrics: the timed window's throughput, MFU and cost, the data, device and host
    memory, offload, NVML and profile figures."""
    metrics = summarize(watch.meter.steps, watch.meter.window_s, params, arch, gpu)
    metrics["count/warmup_steps"] = c.train.untimed
    metrics.update(data_stats)
    metrics.update(memory_stats(device))
    metrics["host/rss_peak_gib"] = watch.guard.peak_gib  # this process and its workers, sampled every 0.1 s
    metrics["mem/weights_gib"] = sharding.held_bytes(model) / 2**30  # this process's (FSDP: its shards)
    if watch.probe is not None and watch.probe.bytes is not None:
        metrics["precision/matmul_bytes"] = watch.probe.bytes
    if getattr(model, "lorabench_offloader", None) is not None:  # train.offload_fraction > 0
        metrics.update(model.lorabench_offloader.metrics())
    if getattr(model, "lorabench_graphs", None) is not None:  # backend.cuda_graphs: the graphs' memory counted
        metrics.update(model.lorabench_graphs.metrics(metrics))
    if watch.sampler:
        metrics.update(watch.sampler.summary())
    if watch.profiler:
        metrics.update(watch.profiler.result)
    return metrics


def build_trainable_model(c: Config, device: torch.device):
    """(model, weights, (checkpointed layers, offloaded layers)): the base model at the cell's precision, the backend's
    kernels, LoRA adapters, activation checkpointing, compilation; ready for the Trainer."""
    if c.backend.name is Backend.unsloth:
        return backends.build_unsloth(c, device)  # Unsloth's loader and LoRA do all of it
    model, weights = modeling.build_model(c, device, sharded=c.train.sharded)
    model = fastpath.apply(model, c, device, fastpath.Stage.BEFORE_LORA)  # Liger's ops before LoRA wraps layers
    model = modeling.apply_lora(model, c.lora, c.precision.name, c.train.gradient_checkpointing,
                                c.backend.upcast_fp32)
    model = fastpath.apply(model, c, device, fastpath.Stage.AFTER_LORA)
    checkpointed, offloaded = backends.apply_checkpointing(model, c.train, device)
    return backends.apply_compile(model, c), weights, (checkpointed, offloaded)


def last_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint-<step> dir. The HF Trainer writes trainer_state.json after the
    weights, optimizer and RNG states, so a dir without it is a save cut short: skipped."""
    done = [p for p in ckpt_dir.glob("checkpoint-*") if (p / "trainer_state.json").exists()] \
        if ckpt_dir.is_dir() else []
    return max(done, key=lambda p: int(p.name.split("-")[-1]), default=None)


class StopOnSignal(TrainerCallback):
    """lorabench.preemption's request, seen by the Trainer: after a signal, the step under way ends,
    its checkpoint is written and the loop stops."""

    def on_step_end(self, args, state, control, **kw):
        if preemption.should_stop():
            control.should_save = True
            control.should_training_stop = True


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

