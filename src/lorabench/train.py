"""One training cell: its checks, then where it trains: here (lorabench.run.loop.measure: data -> model
-> LoRA -> timed training -> metrics) or, with train.nproc > 1 or backend=unsloth, in processes of
lorabench.run.worker launched by lorabench.run.distributed.

cell.run wraps it: the result file after, whatever happens in between.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from lorabench.core.config import Backend, Config, Parallel
from lorabench.core.devices import resolve_device
from lorabench.core.results import CellResult, CellSkipped, RunContext, Status, flatten, load_results
from lorabench.fast import parts
from lorabench.measure.loggers import MetricLogger
from lorabench.run import backends, cell, checks
from lorabench.sweep.callbacks import END_SWEEP, one_row

log = logging.getLogger(__name__)


def run_cell(cfg: DictConfig, ctx: RunContext) -> CellResult:
    """One training cell; its result is written to metrics.json whatever happens (see cell.run)."""
    return cell.run(cfg, ctx, train_and_measure, end_sweep=END_SWEEP, row=one_row)


def train_and_measure(c: Config, ctx: RunContext, result: CellResult, logger: MetricLogger) -> dict:
    """One cell's metrics: measured here, or with train.nproc > 1 by that many DDP processes."""
    checks.check_values(c)  # the multirun's preflight ran these already; a single run's start here
    resolve_gguf(c)
    if c.train.skip_if_smaller_oom and (oom := smaller_oom(result.config, ctx)):
        raise CellSkipped(f"does not fit: cell {oom.job_num} ({oom.cell}) with no larger seq_len and batch ran "
                          "out of memory")
    # What the device and the installed packages cannot run (a precision or backend that needs CUDA, Liger-Kernel
    # or Unsloth not installed), refused before the data is built or any process started.
    device = resolve_device(c.train.device)
    checks.check_device(c, device)
    backends.check(parts.fit(c)[0], device)  # (the parts the architecture lacks a feature for, off); backend=unsloth:
    # skipped here when it is not installed
    parts.check_sharded(c)  # a part that cannot run under FSDP: skipped before N processes start
    # The training code (transformers, PEFT, bitsandbytes: 5 s of imports on a CPU) is imported only
    # now, so a bad value above fails a cell in a second or two.
    from lorabench.run import distributed, loop

    if c.train.parallel is Parallel.fsdp and not c.train.sharded:
        log.info("train.parallel=fsdp with one process: nothing to shard, a plain one-process cell")
    if c.train.nproc > 1 or c.train.nnodes > 1 or c.backend.name is Backend.unsloth:
        return distributed.launch(c, ctx.run_dir, result)
    metrics = loop.measure(c, ctx.run_dir, result, logger)
    result.rank = None  # for a rank's launcher only; steps.jsonl has the steps
    return metrics


def resolve_gguf(c: Config) -> None:
    """model.gguf without model.path: the file converted (once, into the model cache) and its folder this cell's
    model.path, read from here on as any checkpoint (lorabench.models.gguf), and checked as one."""
    if c.model.gguf and not c.model.path:
        from lorabench.models import gguf

        c.model.path = str(gguf.ensure_converted(c.model.gguf))
        checks.check_model_path(c.model)


SHAPE_KEYS = ("seq_len", "batch")


def smaller_oom(config: dict, ctx: RunContext) -> CellResult | None:
    """In a multirun, a finished sibling cell that ran out of memory with the same configuration
    except a seq_len and batch each no larger than this cell's: then this one cannot fit either
    (activation memory grows with both), and a sizing sweep need not spend a model load on it."""
    if not ctx.multirun:
        return None
    mine = flatten(config)
    rest = {k: v for k, v in mine.items() if k not in SHAPE_KEYS}
    for r in load_results(ctx.sweep_dir)[0]:
        other = flatten(r.config)
        if (r.status is Status.oom and {k: v for k, v in other.items() if k not in SHAPE_KEYS} == rest
                and all(other.get(k, 0) <= mine[k] for k in SHAPE_KEYS)):
            return r
    return None
