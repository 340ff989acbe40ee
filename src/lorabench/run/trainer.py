"""The HF Trainer a cell trains with: every micro-batch counted by the StepMeter (lorabench.measure.meter) before
it trains on it, and the fast path's parts that act in the Trainer (lorabench.fast.parts.trainer_parts): the
adapters as one flat tensor for the optimizer, the model's per-step host work cut, decoder layers replayed as
CUDA graphs; under FSDP the cell's autocast (lorabench.run.sharding)."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

import torch
from transformers import Trainer

from lorabench.builders.data import IGNORE, REAL_TOKENS
from lorabench.core.devices import sync
from lorabench.fast import flat_optim
from lorabench.measure.meter import StepMeter
from lorabench.measure.quality import EvalLog
from lorabench.measure.tracking import step_values
from lorabench.run import sharding

log = logging.getLogger(__name__)

@dataclass
class Evaluation:
    """What a cell with quality.eval_every evaluates with: the held-out rows' collator, eval.jsonl, the target and
    whether reaching it ends the cell."""
    collator: object
    log: EvalLog
    target: float | None = None
    stop_at_target: bool = False


class MeasuredTrainer(Trainer):
    """HF Trainer that hands every micro-batch to the StepMeter before training on it; with
    `flat_optimizer` its optimizer updates the adapters as one flat tensor (lorabench.fast.flat_optim),
    with `lean_step` the model's per-step host work is cut (see `lean_step`), with `graph_layers` those decoder
    layers are replayed as CUDA graphs where they can be (lorabench.fast.graphs)."""

    def __init__(self, *args, meter: StepMeter, flat_optimizer: bool = False, lean_step: bool = False,
                 graph_layers=None, evaluation: Evaluation | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.meter, self.flat_optimizer, self.lean_step = meter, flat_optimizer, lean_step
        # backend.cuda_graphs: the decoder layers to capture, and lorabench.fast.graphs.Graphs once captured
        self.graph_layers, self.graphs = graph_layers, None
        self.evaluation = evaluation
        self._eval_sums: torch.Tensor | None = None  # (loss x tokens, tokens) over an evaluation's batches

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """The Trainer's own evaluation of the held-out rows (eval_strategy="steps"), timed apart from the steps: it
        runs after a step's end, where the meter has timed that step already, and the meter's clock starts again
        after it, so that the next step's time (and the throughput window) leaves it out; eval.jsonl counts it in
        the time to the target. Reaching quality.target_loss with stop_at_target ends the training there."""
        ev = self.evaluation
        if ev is None or eval_dataset is not None:
            return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        sync(self.args.device)
        t0 = time.perf_counter()
        # The held-out rows' batches, not the training's; every one of them (a short last batch too).
        collator, drop = self.data_collator, self.args.dataloader_drop_last
        self.data_collator, self.args.dataloader_drop_last = ev.collator, False
        try:
            metrics = super().evaluate(None, ignore_keys, metric_key_prefix)
        finally:
            self.data_collator, self.args.dataloader_drop_last = collator, drop
        tokens = sum(s["tokens_nonpad"] for s in self.meter.steps)
        tokens = int(all_ranks_sum(torch.tensor([tokens], dtype=torch.float64, device=self.args.device)).item())
        sync(self.args.device)
        seconds = time.perf_counter() - t0
        e = ev.log.add(self.state.global_step, tokens, sum(s["time_s"] for s in self.meter.steps),
                       metrics[f"{metric_key_prefix}_loss"], seconds)
        log.info("eval at step %d: loss %.4f after %s non-pad tokens, %.1f s of steps + %.1f s of evaluations",
                 e.step, e.eval_loss, f"{e.tokens:,}", e.train_s, e.eval_s)
        self.meter.restart_clock()
        timed = any(s["timed"] for s in self.meter.steps)  # (stopping before the window would leave no throughput)
        if ev.stop_at_target and ev.target is not None and e.eval_loss <= ev.target and timed:
            self.control.should_training_stop = True
        return metrics

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix: str = "eval"):
        """The Trainer's loop, its loss made the mean over every loss-carrying token (each batch's mean weighted by
        its tokens, summed over the ranks) instead of its mean of batch means: one number for the same held-out
        tokens, however a cell batches, packs or pads them. The Trainer's own stays as <prefix>_batch_mean_loss."""
        self._eval_sums = torch.zeros(2, dtype=torch.float64, device=self.args.device)
        try:
            out = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                          metric_key_prefix)
            total, tokens = all_ranks_sum(self._eval_sums).tolist()
        finally:
            self._eval_sums = None
        key = f"{metric_key_prefix}_loss"
        if key in out.metrics and tokens:
            out.metrics[f"{metric_key_prefix}_batch_mean_loss"] = out.metrics[key]
            out.metrics[key] = total / tokens
        return out

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = dict(inputs)
        inputs.pop(REAL_TOKENS, None)  # (the meter's, as in training_step: the model must not see it)
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        if loss is not None and self._eval_sums is not None and "labels" in inputs:
            n = (inputs["labels"][..., 1:] != IGNORE).sum().to(self._eval_sums)  # the loss's own count (shifted)
            self._eval_sums += torch.stack([loss.detach().to(self._eval_sums) * n, n])
        return loss, logits, labels

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """The step's non-pad tokens/s, time, memory and power join the Trainer's loss and grad_norm, so
        that every tracker's own Trainer callback (logger=wandb, mlflow, tensorboard) logs them at that step."""
        steps = self.meter.steps
        if "loss" in logs and steps and steps[-1]["step"] == self.state.global_step:
            logs.update(step_values(steps[-1]))
        super().log(logs, start_time)

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        sharding.enable_on_cpu(self)  # train.parallel=fsdp on CPU processes (the tests' gloo ranks)

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True):
        # The Trainer leaves autocast to accelerate, which skips it under FSDP2 (lorabench.run.sharding).
        return sharding.autocast(self.args, cache_enabled)

    def create_optimizer(self, model=None):
        fresh = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if fresh and self.flat_optimizer:
            flat_optim.flatten(optimizer)
        return optimizer

    def training_step(self, model, inputs, num_items_in_batch=None):
        inputs = dict(inputs)
        # Packed batches carry their non-pad mask apart (the model must not see an attention_mask
        # there, or it would not keep attention inside each packed sample).
        real = inputs.pop(REAL_TOKENS, None)
        self.meter.count_batch(inputs, inputs["attention_mask"] if real is None else real)
        if self.lean_step and not hasattr(model, "lorabench_lean"):
            lean_step(model)
        if self.graph_layers is not None:
            self._graphs(inputs)
        return super().training_step(model, inputs, num_items_in_batch)

    def _graphs(self, inputs: dict) -> None:
        """backend.cuda_graphs: the kept and recomputed layers captured at the first step (lorabench.fast.graphs), then
        before each step the dropout seeds and the adapters' bf16 copy that their graphs read made new."""
        from lorabench.fast import graphs

        if self.graphs is None:
            layers, dtype = self.graph_layers, torch.float16 if self.args.fp16 else torch.bfloat16
            self.graphs = graphs.capture(self.model, self._prepare_inputs(dict(inputs)), layers,
                                         [getattr(layer, "lorabench_kept", True) for layer in layers], dtype,
                                         accumulate=self.args.gradient_accumulation_steps > 1,
                                         recompute=[getattr(layer, "gradient_checkpointing", False)
                                                    for layer in layers])
            self.model.lorabench_graphs = self.graphs  # for the cell's record (lorabench.run.loop)
        self.graphs.before_step()


def all_ranks_sum(t: torch.Tensor) -> torch.Tensor:
    """t summed over the processes of a DDP or FSDP cell (t itself in one process)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        t = t.clone()
        torch.distributed.all_reduce(t)
    return t


def lean_step(model: torch.nn.Module) -> None:
    """Cut the host work the Trainer does on `model` at every step, where the GPU waits for it.

    Between the optimizer's step (bitsandbytes waits for the GPU there) and the next step's first
    kernel the GPU is idle while the host runs the Trainer's bookkeeping. Two of its calls walk every
    module of the model: `model.zero_grad()` (all ~550 parameters of a 7B QLoRA model, to find the
    256 with a gradient at LoRA r16 on q/k/v/o) and `model.train()` (~2,000 modules, PEFT's included). In a py-spy
    sample of a 32-layer cell on a 2-core CPU machine they took 1.2 and 4.3 ms a step. Here `zero_grad` clears
    only the trainable parameters' gradients (no other has one) and `train` walks the modules only
    when the mode changes (eval() goes through it too). The Trainer's flop count for its total_flos
    (6 x tokens x parameters) asks `model.num_parameters()` at every step, another walk over every module:
    counted once here, as no parameter is added or removed while training. Nothing the model computes
    changes."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    walk_train, mode = type(model).train, [None]

    def zero_grad(set_to_none: bool = True) -> None:
        for p in trainable:
            if p.grad is not None and not set_to_none:
                p.grad.zero_()
            else:
                p.grad = None

    def train(training: bool = True):
        if mode[0] is not training:
            walk_train(model, training)
            mode[0] = training
        return model

    model.zero_grad, model.train, model.lorabench_lean = zero_grad, train, True
    if hasattr(model, "num_parameters"):
        model.num_parameters = functools.cache(model.num_parameters)
