"""The training loop of one cell in this process (or one DDP rank), as a list of steps, each one
job: prepare the device, build the data, build the model, find the state to resume from, set up
what watches the training, the Trainer's arguments, train, collect the metrics of the timed
window. lorabench.train decides where a cell runs and calls `measure` here; lorabench.run.worker calls
it in each rank's process."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PrinterCallback, TrainerCallback, TrainingArguments

from lorabench.builders import data, modeling
from lorabench.core.config import QUANTISED, Backend, Config, GpuConfig, Precision
from lorabench.core.devices import setup_device
from lorabench.core.results import OOM_AT_BUILD, CellInterrupted, CellResult, atomic_write_text
from lorabench.fast import parts
from lorabench.measure import quality
from lorabench.measure.loggers import MetricLogger
from lorabench.measure.meter import MatmulProbe, NvmlSampler, StepMeter
from lorabench.measure.metrics import hourly_price, memory_stats, summarize
from lorabench.measure.memory_snapshot import MemorySnapshot
from lorabench.measure.profile import StepProfiler
from lorabench.measure.quality import EVAL_FILE, EvalLog, read_evals
from lorabench.run import backends, checkpoints, checks, distributed, sharding
from lorabench.run.guard import Guard
from lorabench.run.preemption import HANDLER as preemption
from lorabench.run.trainer import Evaluation, MeasuredTrainer

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
    evaluation: Evaluation | None = None  # quality.eval_every > 0: the held-out rows' collator and eval.jsonl
    snapshot: MemorySnapshot | None = None  # train.memory_snapshot: the allocator's history over one step


def measure(c: Config, run_dir: Path, result: CellResult, logger: MetricLogger, rank: int = 0) -> dict:
    """Data, model and timed training in this process (one DDP rank when launched by torchrun)."""
    asked, asked_config = c.backend, c
    c, off = parts.fit(c)  # backend.fit_parts: the parts the architecture lacks a feature for, off
    if off:  # the recorded config is the one that ran (a worker's holds only what changed: its launcher merges it)
        for f in fields(c.backend):
            if getattr(c.backend, f.name) != getattr(asked, f.name):
                result.config.setdefault("backend", {})[f.name] = getattr(c.backend, f.name)
    config = checkpoints.config_of(asked_config)
    try:
        with backends.module_patches(c):  # what a backend patches in transformers is undone after the cell
            return _measure(c, run_dir, result, logger, rank, config)
    finally:
        if off and result.model is not None:
            result.model["parts_off"] = off  # {"backend.fused_add_norm=false": "fused_add_norm computes ..."}


def _measure(c: Config, run_dir: Path, result: CellResult, logger: MetricLogger, rank: int,
             config: dict) -> dict:
    device, gpu = prepare_device(c, result)
    c, unsloth = backends.unsloth_rows(c)  # Unsloth packs only where it has a varlen kernel
    if "unsloth_packing_off" in unsloth:
        result.config.setdefault("data", {})["packing"] = False  # the rows that ran
    tokenizer, dataset, data_stats = build_data(c)  # before the model: bad input fails in seconds, not after a 7B load
    held_out, eval_stats = data.build_eval_dataset(c, tokenizer) if c.quality.on else (None, {})
    ckpt_dir = run_dir / "checkpoints"
    identity = data.identity(c)  # what the rows are made of
    fingerprint = checkpoints.fingerprint(config, identity)  # what a checkpoint of this run is bound to
    # Before the model too: a checkpoint of other data or code is refused in seconds.
    last = checkpoints.find(ckpt_dir, fingerprint, c.train.resume)
    model, params = build_model(c, device, result)
    result.model.update(unsloth)
    steps_file = run_dir / ("steps.jsonl" if rank == 0 else f"steps.rank{rank}.jsonl")
    resume = resume_state(last, steps_file, result)
    first_layer = parts.decoder_layers(model)[0]
    acting = parts.trainer_parts(c, device)  # the fast path's parts that act in the Trainer and its meter
    watch = watch_training(c, device, run_dir, steps_file, resume, logger, rank, first_layer, acting.gc_every)
    watch.callbacks.append(MarkSaved(ckpt_dir, fingerprint, rank))
    if held_out is not None:
        watch.evaluation = evaluation(c, tokenizer, gpu, run_dir, resume, rank, acting.segments)
    # FSDP's unit, with train.parallel=fsdp over several processes: the decoder layer's class
    layer_class = type(first_layer).__name__ if c.train.sharded else ""
    if c.train.sharded:
        sharding.gather_head_with_final_norm(model)
    args = training_arguments(c, device, ckpt_dir, layer_class, len(dataset), run_name=logger.run_name)
    trainer = MeasuredTrainer(model=model, args=args,
                              train_dataset=dataset, eval_dataset=held_out, evaluation=watch.evaluation,
                              data_collator=data.build_collator(c, tokenizer, dataset, fixed=acting.cuda_graphs,
                                                                segments=acting.segments),
                              callbacks=watch.callbacks,
                              meter=watch.meter, flat_optimizer=acting.flat_optimizer, lean_step=acting.lean_step,
                              graph_layers=parts.decoder_layers(model) if acting.cuda_graphs else None)
    trainer.remove_callback(PrinterCallback)  # it prints every log dict; the bar shows them
    train(c, trainer, resume, watch, ckpt_dir)
    arch = flop_arch(model)
    metrics = collect_metrics(c, device, gpu, model, params, arch, {**data_stats, **eval_stats}, watch)
    # What the launcher of a DDP cell needs to add ranks up (see lorabench.run.distributed).
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
    try:
        model, weights, (checkpointed, offloaded) = build_trainable_model(c, device)
    except torch.OutOfMemoryError as e:  # said so: a search then stops (lorabench.sweep.sweeper.at_load)
        raise torch.OutOfMemoryError(OOM_AT_BUILD + str(e)) from e
    load_s = time.perf_counter() - t0
    params = modeling.count_params(model)
    arch = modeling.Architecture.from_hf_config(model.config)
    result.model = {"name": c.model.name, "model_type": arch.model_type, "family": family_note(arch),
                    "weights": weights, "load_s": load_s, **params,
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


def family_note(arch: modeling.Architecture) -> str:
    """How lorabench knows the model's family: its row's formulas, its row and its shapes as built, or the built
    model alone (a model_type without a row: trained as transformers builds it, no fast part)."""
    if not arch.known:
        note = (f"generic: model_type={arch.model_type} has no row in lorabench.models.families; its counts, FLOPs "
                "and LoRA targets come from the model as transformers builds it, and no fast part computes it")
        log.info("%s", note)
        return note
    return "formula" if arch.census is None else "measured"


def resume_state(last: Path | None, steps_file: Path, result: CellResult) -> Resume:
    """A re-run of a killed cell resumes from its newest complete checkpoint `last`; the step records after
    that checkpoint are dropped, those steps are trained again."""
    if last is None:  # a run killed before its first checkpoint starts afresh: one history per file, never two
        steps_file.unlink(missing_ok=True)
        return Resume(None, [])
    done = checkpoints.step_of(last)
    earlier = [s for s in map(json.loads, steps_file.read_text().splitlines()) if s["step"] <= done] \
        if steps_file.exists() else []
    atomic_write_text(steps_file, "".join(json.dumps(s) + "\n" for s in earlier))
    result.resumed_from_step = done
    log.info("resuming from %s (%d step records kept)", last, len(earlier))
    return Resume(last, earlier)


def evaluation(c: Config, tokenizer, gpu: GpuConfig, run_dir: Path, resume: Resume, rank: int,
               segments: bool) -> Evaluation:
    """The held-out rows' collator and eval.jsonl (rank 0's; every rank evaluates its share, the loss is summed over
    them). After a resume, the evaluations up to the checkpoint's step are kept, as steps.jsonl's steps are."""
    path = run_dir / (EVAL_FILE if rank == 0 else f"eval.rank{rank}.jsonl")
    done = int(resume.checkpoint.name.split("-")[-1]) if resume.checkpoint is not None else None
    earlier = [e for e in read_evals(run_dir) if done is not None and e.step <= done] if rank == 0 else []
    atomic_write_text(path, "".join(json.dumps(e.record()) + "\n" for e in earlier))
    price = hourly_price(gpu)
    usd_per_s = None if price is None else price * int(os.environ.get("WORLD_SIZE", 1)) / 3600
    log.info("quality: evaluating %d held-out samples every %d steps%s%s", c.quality.eval_samples,
             c.quality.eval_every, " and before the first" if c.quality.eval_at_start else "",
             f"; target eval loss {c.quality.target_loss:g}" if c.quality.target_loss is not None else "")
    return Evaluation(data.build_eval_collator(c, tokenizer, segments), EvalLog(path, usd_per_s, earlier),
                      c.quality.target_loss, c.quality.stop_at_target)


def watch_training(c: Config, device: torch.device, run_dir: Path, steps_file: Path, resume: Resume,
                   logger: MetricLogger, rank: int, first_layer: torch.nn.Module, gc_every: int) -> Watch:
    """The meter that times the steps after the untimed ones (Python's collector every `gc_every` steps: see
    StepMeter), the samplers, the matmul-width probe on the model's first decoder layer, and the callbacks."""
    sampler = NvmlSampler(device) if device.type == "cuda" else None
    # Untimed: the first train.untimed_steps, then the profiled ones (profiling slows a step down), then the one
    # whose allocations are recorded (train.memory_snapshot).
    untimed = c.train.untimed + c.train.profile_steps + int(c.train.memory_snapshot)
    log.info("timing: %d untimed steps%s%s, then %d timed", c.train.untimed,
             f" and {c.train.profile_steps} profiled" if c.train.profile_steps else "",
             " and 1 with the allocator's history recorded" if c.train.memory_snapshot else "",
             c.train.max_steps - untimed)
    meter = StepMeter(device, untimed, steps_file, sampler, earlier_steps=resume.earlier_steps, gc_every=gc_every)
    guard = Guard(c.train.host_memory_limit_gib)  # the host-memory watchdog; a signal's grace period
    callbacks = [meter, StopOnSignal()] + ([ProgressBar(c.train.max_steps, meter)] if rank == 0 else [])
    # The trackers' own Trainer callbacks (transformers' WandbCallback, MLflowCallback, TensorBoardCallback), each
    # logging every step into this cell's run (lorabench.measure.loggers), the step's tokens/s, memory and power
    # among the Trainer's logs (MeasuredTrainer.log). What they cost is in the next step's time, as the loss's read.
    callbacks += logger.callbacks() if rank == 0 else []
    profiler = None
    if c.train.profile_steps and rank == 0:  # one rank's profile: the others wait on it at the all-reduce
        profiler = StepProfiler(device, c.train.untimed, c.train.profile_steps, run_dir, meter)
        callbacks.insert(1, profiler)  # after the meter, whose step-end synchronisation it relies on
    snapshot = None
    if c.train.memory_snapshot and rank == 0:  # (checks: CUDA only)
        snapshot = MemorySnapshot(device, c.train.untimed + c.train.profile_steps + 1, run_dir)
        callbacks.append(snapshot)
    # Unsloth's kernels bypass the layer's forward and a compiled layer would trace the probe (see MatmulProbe)
    probe = MatmulProbe(first_layer) if c.backend.name is not Backend.unsloth and not c.backend.compile else None
    return Watch(meter, sampler, guard, profiler, callbacks, probe, snapshot=snapshot)


def training_arguments(c: Config, device: torch.device, ckpt_dir: Path, layer_class: str = "",
                       rows: int = 0, run_name: str | None = None) -> TrainingArguments:
    """The HF Trainer's arguments: the seed's recipe from the cell's config; with train.parallel=fsdp over
    several processes, FSDP2 with one unit per decoder layer of class `layer_class` (lorabench.run.sharding); rows: the
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
        **evaluation_arguments(c),
        # The trackers' callbacks come from the cell's logger, made for its runs (lorabench.measure.loggers):
        # report_to would build a second, unconfigured set (TensorBoard's in output_dir/runs, W&B's project
        # huggingface).
        report_to="none",
        run_name=run_name,
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


def evaluation_arguments(c: Config) -> dict:
    """The Trainer's own evaluation schedule (quality.eval_every > 0): every eval_every optimizer steps and after the
    last step (the Trainer adds that one where the last is not a multiple), quality.eval_batch samples a batch, the
    loss alone (no logits kept)."""
    q = c.quality
    if not q.on:
        return {}
    return {"eval_strategy": "steps", "eval_steps": q.eval_every, "eval_on_start": q.eval_at_start,
            "per_device_eval_batch_size": q.eval_batch, "prediction_loss_only": True}


def train(c: Config, trainer: MeasuredTrainer, resume: Resume, watch: Watch, ckpt_dir: Path) -> None:
    """The Trainer's loop under the host-memory guard and lorabench.run.preemption; a signal ends it
    with a checkpoint and CellInterrupted (or JobRequeued, where the job runs again)."""
    try:
        with preemption.training(watch.guard, c.train.sigterm_grace_s), watch.guard:
            trainer.train(resume_from_checkpoint=str(resume.checkpoint) if resume.checkpoint else None)
    finally:
        watch.meter.close()  # stops the NVML thread and closes steps.jsonl, also after an OOM
        if watch.evaluation is not None:
            watch.evaluation.log.close()
        if watch.profiler:
            watch.profiler.close()
        # Under DDP another rank may still look into it: node 0's launcher removes it after all ranks.
        if int(os.environ.get("WORLD_SIZE", 1)) == 1:
            distributed.remove_empty(ckpt_dir)
    if preemption.requested:
        step = watch.meter.steps[-1]["step"] if watch.meter.steps else 0
        stopped = preemption.stopped_message(step, checkpoints.newest_complete(ckpt_dir), ckpt_dir)
        preemption.hand_over(stopped)
        raise CellInterrupted(f"{preemption.signal_name}: {stopped}; run the same command again to resume")


def flop_arch(model) -> modeling.Architecture:
    """The FLOP count's facts (lorabench.measure.metrics): layers, heads, head_dim, each layer's attention window,
    the active experts, from the built model's own config."""
    return modeling.Architecture.from_hf_config(model.config)


def collect_metrics(c: Config, device: torch.device, gpu: GpuConfig, model, params: dict, arch: modeling.Architecture,
                    data_stats: dict, watch: Watch) -> dict:
    """The cell's metrics: the timed window's throughput, MFU and cost, the data, device and host
    memory, offload, NVML and profile figures."""
    metrics = summarize(watch.meter.steps, watch.meter.window_s, params, arch, gpu)
    metrics["count/warmup_steps"] = c.train.untimed
    if watch.evaluation is not None:
        warmup_s = sum(s["time_s"] for s in watch.meter.steps if not s["timed"])
        metrics.update(quality.summary(watch.evaluation.log.evals, c.quality.target_loss, warmup_s))
    metrics.update(data_stats)
    metrics.update(memory_stats(device))
    metrics["host/rss_peak_gib"] = watch.guard.peak_gib  # this process and its workers, sampled every 0.1 s
    metrics["mem/weights_gib"] = sharding.held_bytes(model) / 2**30  # this process's (FSDP: its shards)
    if watch.probe is not None and watch.probe.bytes is not None:
        metrics["precision/matmul_bytes"] = watch.probe.bytes
    if getattr(model, "lorabench_offloader", None) is not None:  # train.offload_fraction > 0
        metrics.update(model.lorabench_offloader.metrics())
    if getattr(model, "lorabench_host_checkpoints", None) is not None:  # train.offload_checkpoints
        metrics.update(model.lorabench_host_checkpoints.metrics())
    if getattr(model, "lorabench_graphs", None) is not None:  # backend.cuda_graphs: the graphs' memory counted
        metrics.update(model.lorabench_graphs.metrics(metrics))
    if watch.sampler:
        metrics.update(watch.sampler.summary())
    if watch.profiler:
        metrics.update(watch.profiler.result)
    if watch.snapshot:
        metrics.update(watch.snapshot.metrics())
    return metrics


def build_trainable_model(c: Config, device: torch.device):
    """(model, weights, (checkpointed layers, offloaded layers)): the base model at the cell's precision, the backend's
    kernels, LoRA adapters, activation checkpointing, compilation; ready for the Trainer."""
    if c.backend.name is Backend.unsloth:
        return backends.build_unsloth(c, device)  # Unsloth's loader and LoRA do all of it
    model, weights = modeling.build_model(c, device, sharded=c.train.sharded)
    model = parts.apply(model, c, device, parts.Stage.BEFORE_LORA)  # Liger's ops before LoRA wraps layers
    model = modeling.apply_lora(model, c.lora, c.precision.name, c.train.gradient_checkpointing,
                                c.backend.upcast_fp32)
    model = parts.apply(model, c, device, parts.Stage.AFTER_LORA)
    checkpointed, offloaded = backends.apply_checkpointing(model, c.train, device)
    return backends.apply_compile(model, c), weights, (checkpointed, offloaded)


class MarkSaved(TrainerCallback):
    """After the Trainer has saved a checkpoint (every rank its part: they meet at a barrier first), rank 0
    marks it whole with this run's fingerprint (lorabench.run.checkpoints): a save cut short has no marker."""

    def __init__(self, ckpt_dir: Path, fingerprint: dict, rank: int):
        self.ckpt_dir, self.fingerprint, self.rank = ckpt_dir, fingerprint, rank

    def on_save(self, args, state, control, **kw):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        if self.rank == 0:
            checkpoints.write_marker(self.ckpt_dir / f"checkpoint-{state.global_step}", self.fingerprint)


class StopOnSignal(TrainerCallback):
    """lorabench.run.preemption's request, seen by the Trainer: after a signal, the step under way ends,
    its checkpoint is written and the loop stops. Under several processes every rank stops after the
    same step: a signal may reach one rank alone (kill -TERM of a rank), or the ranks on either side of a
    step's end, and a rank that stopped alone would leave the others waiting in the next step's all-reduce
    and a checkpoint of two different steps."""

    def on_step_end(self, args, state, control, **kw):
        if any_rank(preemption.should_stop(), args.device):
            preemption.follow("a signal to another rank")  # (this rank's own signal, where it had one)
            control.should_save = True
            control.should_training_stop = True


def any_rank(flag: bool, device: torch.device) -> bool:
    """Whether `flag` holds on any rank of the cell: one all-reduce of a single number (on the cell's
    device, as NCCL needs) after the step, where the meter has synchronised the device already."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


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

