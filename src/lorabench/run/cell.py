"""The envelope of every cell, training or benchmark: the result file whatever happens.

A cell's result (metrics.json, a CellResult) holds its status (ok / oom / skipped / failed /
interrupted) and whole error, its metrics, the resolved config, the device and GPU spec used for
cost, and the environment. The entrypoint turns the status into the process's exit code.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from statistics import mean
from typing import Callable, NoReturn, Protocol

import torch
from omegaconf import DictConfig, OmegaConf

from lorabench.core.devices import node_rank
from lorabench.core.results import (
    RESULT_FILE,
    CellInterrupted,
    CellResult,
    CellSkipped,
    RunContext,
    Status,
    env_info,
    load_results,
    read_cells,
    read_result,
    write_result,
)
from lorabench.measure.loggers import MetricLogger, NullLogger, build_logger, check_logger
from lorabench.measure.metrics import memory_stats
from lorabench.run import rundir
from lorabench.run.preemption import HANDLER as preemption
from lorabench.run.preemption import JobRequeued, Stopped

log = logging.getLogger(__name__)

# measure(typed config, context, result, logger) -> metrics; it may fill result.device, .gpu, .model ...
Measure = Callable[[object, RunContext, CellResult, MetricLogger], dict]


class EndSweep(Protocol):
    """How a multirun ends between two cells (lorabench.sweep.callbacks.END_SWEEP): after a stop signal, or
    when the next cell would not end by the sweep's deadline."""

    def out_of_time(self, cfg: DictConfig, ctx: RunContext) -> str | None: ...

    def now(self, cfg: DictConfig, ctx: RunContext, why: str | None = None) -> NoReturn: ...


def is_host_oom(e: BaseException) -> bool:
    """A CPU cell that asked the host for more memory than it has (PyTorch's CPU allocator)."""
    msg = str(e)
    return "DefaultCPUAllocator" in msg and ("not enough memory" in msg or "can't allocate memory" in msg)


def finished(result_file: Path) -> CellResult | None:
    """The result of an earlier run of this cell that ended ok (a repeated command, a requeue)."""
    try:
        previous = read_result(result_file)
    except (OSError, ValueError, TypeError):
        return None
    return previous if previous.ok else None


def name_link(ctx: RunContext) -> None:
    """In a multirun: <sweep dir>/by_name/<cell name> -> ../<n>, so a cell's dir can be found by what
    sets it apart (backend=fast,batch=16) while the dirs stay numbered in launch order (stable across a
    requeue, and what tools and Kubernetes Jobs address)."""
    if not ctx.multirun:
        return
    link = ctx.sweep_dir / "by_name" / link_name(ctx.name)
    link.parent.mkdir(exist_ok=True)
    try:
        if not link.is_symlink():
            link.symlink_to(Path("..") / ctx.run_dir.relative_to(ctx.sweep_dir))
    except (OSError, ValueError):
        pass  # a file system without links, or a run dir outside the sweep dir: the numbers remain


def link_name(name: str, limit: int = 255) -> str:
    """A cell's name as one file name: '/' replaced, and past `limit` bytes (most file systems' limit;
    a cell with many overrides reaches it) cut, with a hash of the whole name so two stay apart."""
    name = name.replace("/", "_")
    if len(name.encode()) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return name.encode()[:limit - 14].decode(errors="ignore") + "~" + digest


def announce(ctx: RunContext) -> None:
    """In a multirun: which cell of how many this is, and an estimate of the time left from the
    cells already done (their whole wall time, model loads included)."""
    if not ctx.multirun:
        return
    total = len(read_cells(ctx.sweep_dir)) or None
    done = [r.total_s for r in load_results(ctx.sweep_dir)[0] if r.total_s and r.job_num != ctx.job_num]
    eta = ""
    if done and total:
        left_s = mean(done) * (total - len(done))  # this cell and those after it
        eta = f"; {len(done)} done, about {left_s / 60:.1f} min left (mean of the cells done)"
    log.info("cell %d of %s: %s%s", ctx.job_num + 1, total or "?", ctx.name, eta)


def record(result: CellResult, error_file: Path, measure: Callable[[], dict], keep_handlers: bool = False) -> None:
    """measure() under lorabench.run.preemption's signal handlers; its metrics, or what stopped it, in
    result.status and .error. The one place an exception becomes a status, for a cell (run, below)
    and for a DDP rank (lorabench.run.worker) alike. JobRequeued alone passes through, once recorded: the
    process then ends without a result for its launcher. keep_handlers: see Preemption.cell."""
    try:
        with preemption.cell(keep=keep_handlers):
            result.metrics = measure()
        result.status = Status.ok
    except torch.OutOfMemoryError as e:
        result.status, result.error = Status.oom, str(e).splitlines()[0]
    except CellSkipped as e:
        result.status, result.error = Status.skipped, str(e)
    except (CellInterrupted, Stopped) as e:
        result.status, result.error = Status.interrupted, str(e)
    except KeyboardInterrupt:  # where no handler could be installed (a thread other than the main one)
        result.status, result.error = Status.interrupted, "KeyboardInterrupt before the cell finished"
    except JobRequeued as e:
        result.status, result.error = Status.interrupted, str(e)
        raise
    except MemoryError as e:  # the host-memory estimate or watchdog (lorabench.run.guard), or Python's own
        result.status, result.error = Status.oom, str(e) or "host memory: Python could not allocate (MemoryError)"
    except Exception as e:
        if is_host_oom(e):  # a CPU cell out of host memory is as much out of memory as a GPU cell
            result.status, result.error = Status.oom, "host memory: " + str(e).splitlines()[0]
        else:
            result.status, result.error = Status.failed, rundir.describe(e, error_file.parent)
            log.error("failed: %s (%s)", result.error, keep_traceback(error_file))






def run(cfg: DictConfig, ctx: RunContext, measure: Measure, job_type: str = "train-cell",
        end_sweep: EndSweep | None = None, row: Callable[[CellResult], str] | None = None) -> CellResult:
    """Run `measure` as one cell. Every outcome is a result: a cell that runs out of memory or raises
    writes metrics.json with status "oom" or "failed" and the whole reason, and returns normally, so
    a multirun goes on to the next cell (Hydra skips its end-of-sweep callbacks if any cell raises).
    After a stop signal, or past sweep.deadline_s (`end_sweep` says why a next cell would not end in time),
    a multirun goes on to no further cell: `end_sweep` writes its report and ends the process. `row` formats
    the cell's one-row table for the console (the report's, from the entry point; else status and tokens/s)."""
    row = row or plain_row
    # The multirun's cells run one after another in this process (Hydra's basic launcher); a submitit
    # job is one cell in a process of its own, and its launcher decides what runs next.
    sweep_here = ctx.multirun and not os.environ.get("SUBMITIT_EXECUTOR") and end_sweep is not None
    if sweep_here and preemption.requested:  # the signal came between two cells
        end_sweep.now(cfg, ctx)
    run_dir = ctx.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    result_file = run_dir / RESULT_FILE
    result = CellResult(status=Status.running, cell=ctx.name, job_num=ctx.job_num, run_dir=str(run_dir),
                        config=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), choices=ctx.choices or
                        None)
    try:  # this run alone in the dir, and the dir's result made by this config (lorabench.run.rundir)
        rundir.enter(run_dir, result.config, OmegaConf.select(cfg, "sweep.overwrite", default=False), node=_node(cfg))
    except (rundir.RunDirError, OSError) as e:  # nothing of the dir's is touched: no result written
        result.status, result.error = Status.failed, rundir.describe(e, run_dir)
        print(result.error, file=sys.stderr)
        rundir.leave(run_dir, _node(cfg))  # (a lock this run took; another run's is untouched)
        return result
    if not OmegaConf.select(cfg, "train.force", default=False) and (previous := finished(result_file)):
        log.info("cell already finished (%s); train.force=true runs it again", result_file)
        print(f"\n{row(previous)}\nresult (from an earlier run): {result_file}", file=sys.stderr)
        rundir.leave(run_dir, _node(cfg))
        return previous
    # A multi-node cell runs this on every node, in one shared run dir: node 0 alone writes the
    # result and talks to the trackers; another node records its own outcome in node<r>.json.
    if OmegaConf.select(cfg, "train.nnodes", default=1) > 1:
        try:
            if (node := node_rank()) > 0:
                result_file = run_dir / f"node{node}.json"
        except ValueError:
            pass  # no node index: the launch fails with the reason, as node 0
    name_link(ctx)
    announce(ctx)
    logger: MetricLogger = NullLogger()

    def work() -> dict:
        nonlocal logger
        if result_file.name == RESULT_FILE:  # first, so that a cell failing a check still has its tracker runs
            logger_cfg = OmegaConf.to_object(cfg.logger)
            check_logger(logger_cfg)  # (one line naming a bad WANDB_MODE, say: no run can start with it)
            logger = build_logger(logger_cfg, ctx, result.config, job_type)
        # The range checks (__post_init__) run here; type errors were already caught at composition.
        return measure(OmegaConf.to_object(cfg), ctx, result, logger)

    t_start = time.perf_counter()
    try:
        record(result, run_dir / "error.txt", work, keep_handlers=sweep_here)
    finally:
        if result.status is Status.running:  # SystemExit passing through
            result.status, result.error = Status.interrupted, "interrupted before the cell finished"
        result.total_s = time.perf_counter() - t_start
        close(result, run_dir, result_file, logger, row)
        rundir.leave(run_dir, _node(cfg))
    if sweep_here and preemption.requested:
        end_sweep.now(cfg, ctx)
    if sweep_here and (why := end_sweep.out_of_time(cfg, ctx)):  # (here, before Hydra makes the next cell's dir)
        end_sweep.now(cfg, ctx, why)
    return result


def _node(cfg: DictConfig) -> int:
    """This node's index in a multi-node cell (0 otherwise, or when it has none: node 0's launch names that)."""
    try:
        return node_rank() if OmegaConf.select(cfg, "train.nnodes", default=1) > 1 else 0
    except ValueError:
        return 0


def keep_traceback(path: Path) -> str:
    """The current exception's traceback into `path`, if the disk lets it; where it went, in words."""
    try:
        path.write_text(traceback.format_exc())
        return f"traceback in {path}"
    except OSError as e:
        path.unlink(missing_ok=True)  # never a half-written one
        return f"no traceback kept: {rundir.describe(e, path)}"


def close(result: CellResult, run_dir: Path, result_file: Path, logger: MetricLogger,
          row: Callable[[CellResult], str]) -> None:
    """Write the result, tell the logger, print the row, and give the device back for the next cell."""
    device = torch.device(result.device) if result.device else None
    if result.gpu and result.gpu.get("budget_gib"):
        result.metrics["mem/budget_gib"] = result.gpu["budget_gib"]
    if not result.ok:
        # What was measured before the failure still tells something, e.g. the memory in use when
        # an OOM hit, and how far the cell got.
        result.metrics.update(memory_stats(device) if device is not None else {})
        steps = run_dir / "steps.jsonl"
        if steps.exists():
            result.metrics["count/steps_done"] = len(steps.read_text().splitlines())
    # The process's largest resident set so far (in a multirun: over this and earlier cells).
    result.metrics["host/process_max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    result.env = env_info(device)
    written = True
    try:
        write_result(result_file, result)  # atomic: a full disk leaves the old file or none, never half of one
    except OSError as e:
        result.status, result.error = Status.failed, f"{rundir.describe(e, result_file)} (the cell: " \
            f"{result.error or 'ok'})"
        written = False
    try:
        logger.finish(result)
    except Exception as e:  # a logger must never turn a measured cell into a lost one
        log.warning("logger failed to finish: %s", e)
    # The last line names the result file only where it was written: a script reads it next.
    print(f"\n{row(result)}\n" + (f"result: {result_file}" if written else
                                     f"no result file: {result_file} could not be written"), file=sys.stderr)
    # The next cell of a multirun runs in this process; the model died with measure's frame, so its
    # memory can go back now. One reference outlives it: for an 8-bit optimizer the HF Trainer
    # registers every nn.Embedding with bitsandbytes' process-wide GlobalOptimManager, which would
    # keep Mistral-7B's fp32 input embedding (32768 x 4096 x 4 B = 0.5 GiB) alive into every later
    # cell (measured: +0.5 GiB peak per cell).
    if "bitsandbytes" in sys.modules:
        sys.modules["bitsandbytes"].optim.GlobalOptimManager.get_instance().initialize()
    if device is not None and device.type == "cuda":
        gc.collect()  # (0.3 s: on a CPU, reference counting has freed the model already)
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, device)  # lift an emulated budget


def plain_row(result: CellResult) -> str:
    """The cell's status and non-pad tokens/s in one line, where no report formats its row."""
    tok = result.metrics.get("perf/tokens_per_s")
    return f"{result.cell}: {result.status.value}" + (f", {tok:,.0f} non-pad tok/s" if tok else "")
