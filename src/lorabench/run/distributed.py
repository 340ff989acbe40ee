"""Multi-GPU cells: train.nproc DDP processes on this node (and on each of train.nnodes nodes),
started by torchrun.

The Hydra process composes and resolves the cell's config once and writes it to the run dir; it
then starts `torchrun --standalone --nproc-per-node N -m lorabench.run.worker <run_dir>`. Every
rank loads that file (Hydra never runs in a rank, so no rank composes anything or makes its own
run dir), trains the same cell with the HF Trainer's DDP on its own device, one full 4-bit copy of
the model each, and writes rank<r>.json. The Hydra process adds the ranks up into the cell's one
result, and keeps every side effect (metrics.json, W&B) to itself.

Several nodes (train.nnodes > 1): every node runs the same command with the same run dir (a shared
volume); torchrun meets at MASTER_ADDR with a static rendezvous instead of --standalone; node 0
waits for every rank's file and writes the result, the other nodes only node<r>.json.

Aggregation: each step's tokens and samples are summed over ranks and its time is the slowest
rank's (the gradient all-reduce makes every rank wait for it); throughput is global, MFU is over N
GPUs' peak and cost is N GPU-hours per hour. Memory is per rank (mem/rank<r>_peak_reserved_gib) and
the cell's peak is the largest rank's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from lorabench.builders import data, modeling
from lorabench.core.config import Config, GpuConfig, Pricing
from lorabench.core.devices import node_rank
from lorabench.core.results import (
    CONFIG_FILE,
    CellInterrupted,
    CellResult,
    CellSkipped,
    Status,
    atomic_write_text,
    read_result,
)
from lorabench.measure.metrics import summarize
from lorabench.run import checkpoints, rundir, tether
from lorabench.run.preemption import HANDLER as preemption

log = logging.getLogger(__name__)


def remove_empty(ckpt_dir: Path) -> None:
    """The Trainer's output_dir, when no checkpoint was written into it."""
    with contextlib.suppress(OSError):
        ckpt_dir.rmdir()


def rendezvous_args(c: Config, node: int) -> list[str]:
    """torchrun's rendezvous arguments for this node, once the node has the devices its ranks need."""
    n, nodes = c.train.nproc, c.train.nnodes
    if nodes == 1:
        args = ["--standalone"]
    else:
        if not os.environ.get("MASTER_ADDR"):
            raise ValueError(f"train.nnodes={nodes} needs MASTER_ADDR, the address of node 0 (and MASTER_PORT, "
                             "default 29500) in the environment of every node")
        args = [f"--nnodes={nodes}", f"--node-rank={node}", f"--master-addr={os.environ['MASTER_ADDR']}",
                f"--master-port={os.environ.get('MASTER_PORT', '29500')}"]
    if c.train.device.value != "cpu":
        available = torch.cuda.device_count()
        if available < n:
            raise ValueError(f"train.nproc={n} but this node has {available} CUDA device(s); use "
                             + (f"train.nproc <= {available}, or " if available else "train.nproc=1, or ")
                             + "train.device=cpu for CPU processes (gloo)")
    return args


def prepare(c: Config, run_dir: Path, node: int) -> None:
    """Data first, in this process: bad input fails before N model loads, and the tokenised cache is written once
    instead of by N ranks at the same time; then the checkpoint the ranks resume from and the config they read."""
    tokenizer = modeling.build_tokenizer(c.model)
    data.build_dataset(c, tokenizer)
    if c.quality.on:  # the held-out rows' cache too
        data.build_eval_dataset(c, tokenizer)
    if node == 0:  # the checkpoint the ranks resume from, chosen (and checked) once, before they start
        fingerprint = checkpoints.fingerprint(checkpoints.config_of(c), data.identity(c))
        checkpoints.prepare(run_dir / "checkpoints", fingerprint, c.train.resume)
    atomic_write_text(run_dir / CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.structured(c)))


def launch(c: Config, run_dir: Path, result: CellResult) -> dict:
    """Runs the cell on c.train.nproc processes (on each of c.train.nnodes nodes) and returns the
    aggregated metrics; on a node other than 0, an empty dict (node 0 adds all ranks up)."""
    n, nodes = c.train.nproc, c.train.nnodes
    node = node_rank() if nodes > 1 else 0
    rendezvous = rendezvous_args(c, node)
    prepare(c, run_dir, node)
    world, mine = n * nodes, range(node * n, (node + 1) * n)  # this node's global ranks
    for r in mine:
        (run_dir / f"rank{r}.json").unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if world == 1:  # one process of its own (backend=unsloth), no process group to set up
        cmd, env["RANK"] = [sys.executable, "-m", "lorabench.run.worker", str(run_dir)], "0"
        env[tether.PARENT_ENV] = str(os.getpid())  # the worker dies with this process
    else:  # torchrun dies with this process, and each rank with torchrun (lorabench.run.tether)
        cmd = tether.command([sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc-per-node={n}",
                              "-m", "lorabench.run.worker", str(run_dir)])
    ranks_log = run_dir / ("ranks.log" if nodes == 1 else f"ranks.node{node}.log")
    log.info("launching %d ranks: %s (their output: %s)", n, " ".join(cmd), ranks_log)
    # The run dir's lock (and a multirun's sweep lock) goes to the child too: it is held until the last process
    # of the cell has ended, not only this one (lorabench.run.rundir).
    with open(ranks_log, "w") as out, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                        pass_fds=rundir.held_fds(), start_new_session=True) as proc:
        with preemption.forwarding(proc):  # a signal stops the ranks as it stops a cell
            proc.wait()
    if node > 0:
        result.dist = {"node": node, "nnodes": nodes, "note": "node 0's metrics.json holds every rank"}
        if proc.returncode < 0:
            raise CellInterrupted(f"node {node}: torchrun was killed by {signal.Signals(-proc.returncode).name}; "
                                  "run the same command again to resume")
        if proc.returncode != 0:
            raise RuntimeError(f"node {node}: torchrun exit code {proc.returncode} (its ranks' output: {ranks_log})")
        return {}
    # The other nodes' ranks end with ours (every step all-reduces); their files may lag on a shared volume.
    deadline = time.time() + (120 if proc.returncode == 0 else 0)
    while time.time() < deadline and not all((run_dir / f"rank{r}.json").exists() for r in range(world)):
        time.sleep(1)
    remove_empty(run_dir / "checkpoints")  # every rank is done with it now
    exits = rank_exits(ranks_log)
    ranks = [read_result(run_dir / f"rank{r}.json") if (run_dir / f"rank{r}.json").exists()
             else no_result(r, exits.get(r), proc.returncode) for r in range(world)]
    bad = [(r, x) for r, x in enumerate(ranks) if not x.ok]
    if bad:
        # what the ranks measured before they failed: an OOM's peak and the device's size (the budget a
        # search under gpu=auto learns from its first cell, an Unsloth one too)
        result.metrics.update(memory(ranks))
        raise explain(bad, world, run_dir, ranks_log, proc.returncode)
    adopt(result, ranks[0])
    result.dist = {"nproc": n, "nnodes": nodes, "parallel": c.train.parallel.value if world > 1 else "none",
                   "devices": [x.device for x in ranks]}
    g = ranks[0].gpu  # the spec rank 0 priced its device with (devices.setup_device)
    spec = GpuConfig(name=g["name"], price_per_hour=g["price_per_hour"], spot_price_per_hour=g["spot_price_per_hour"],
                     peak_bf16_tflops=g["peak_bf16_tflops"], pricing=Pricing(g["pricing"]))
    return aggregate(ranks, spec)


def adopt(result: CellResult, rank0: CellResult) -> None:
    """The cell's record takes rank 0's: its model, device, GPU spec, the step it resumed from (every rank resumes
    from the same checkpoint), and what it changed in the config as it ran (a part the architecture lacks turned
    off, packed rows unpacked where Unsloth has no varlen kernel): the config recorded is the one that ran."""
    result.model, result.device, result.gpu = rank0.model, rank0.device, rank0.gpu
    result.resumed_from_step = rank0.resumed_from_step
    for section, changed in rank0.config.items():
        result.config.setdefault(section, {}).update(changed)


NO_RESULT = "ended without a result"
# An error a rank gets because another one is gone (the collective's peer closed its socket, NCCL aborted):
# the consequence of a failure elsewhere, never its cause.
PEER_LOST = re.compile(r"closed by peer|reset by peer|remote process exited|Broken pipe|communicator was aborted|"
                       r"Socket Timeout|NCCL.*(?:abort|timeout)", re.IGNORECASE)
# Signals a user or a scheduler stops a process with: a rank killed by one was interrupted, not broken.
STOP_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def rank_exits(ranks_log: Path) -> dict[int, int]:
    """{global rank: exit code} of the ranks torchrun's failure summary lists (negative: killed by that signal)."""
    try:
        text = ranks_log.read_text(errors="replace")
    except OSError:
        return {}
    return {int(r): int(code) for r, code in
            re.findall(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", text)}


def no_result(r: int, code: int | None, torchrun_code: int) -> CellResult:
    """The record of rank `r`, which wrote none: killed (interrupted: the same command resumes), crashed, or
    gone with torchrun (lorabench.run.tether ends the ranks of a torchrun that is killed)."""
    if torchrun_code < 0:
        return CellResult(Status.interrupted, f"rank {r}", error=f"{NO_RESULT}: torchrun was killed by "
                          f"{signal.Signals(-torchrun_code).name} and its ranks ended with it")
    if code is not None and code < 0 and -code in STOP_SIGNALS:
        return CellResult(Status.interrupted, f"rank {r}", error=f"{NO_RESULT}: killed by {signal.Signals(-code).name}")
    how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else \
        f"exit code {code}" if code is not None else "no exit code in torchrun's summary"
    return CellResult(Status.failed, f"rank {r}", error=f"{NO_RESULT} ({how})")


def explain(bad: list[tuple[int, CellResult]], world: int, run_dir: Path, ranks_log: Path,
            torchrun_code: int) -> Exception:
    """The exception that records a multi-process cell whose ranks did not all end ok: its status and reason
    are the root cause's (root_cause), named by rank; the traceback is in that rank's error file."""
    r, x = root_cause(bad, run_dir)
    msg = f"rank {r} of {world}: {x.error}"
    if x.status is Status.oom:
        return torch.OutOfMemoryError(msg)
    if x.status is Status.interrupted:
        return CellInterrupted(f"{msg}; run the same command again to resume" if NO_RESULT in msg else msg)
    if x.status is Status.skipped:  # every rank refuses the same cell (lorabench.fast.parts)
        return CellSkipped(x.error)
    where = run_dir / f"error.rank{r}.txt"
    where = where if where.exists() else ranks_log
    return RuntimeError(f"{msg} (torchrun exit code {torchrun_code}; the rank's traceback: {where})")


def root_cause(bad: list[tuple[int, CellResult]], run_dir: Path) -> tuple[int, CellResult]:
    """The (rank, result) that explains a failed multi-process cell: out of memory first; then a rank's own
    failure (the earliest error.rank<r>.txt of them); a rank that ended without a result (crashed, then killed);
    a rank stopped by a signal; a failure of a lost peer (another rank gone); a refusal. A rank stopped by
    torchrun, or failing because another rank is gone, never hides the rank that went first."""
    def category(x: CellResult) -> int:
        dead = NO_RESULT in (x.error or "")
        if x.status is Status.oom:
            return 0
        if x.status is Status.failed:
            return 2 if dead else 5 if PEER_LOST.search(x.error or "") else 1
        if x.status is Status.interrupted:
            return 3 if dead else 4
        return 6

    def key(rx):
        r, x = rx
        error_file = run_dir / f"error.rank{r}.txt"
        when = error_file.stat().st_mtime if error_file.exists() else float("inf")
        return category(x), when, r

    return min(bad, key=key)


def memory(ranks: list[CellResult]) -> dict:
    """The largest of the ranks' peaks, device sizes and weights (GiB)."""
    keys = ("mem/peak_allocated_gib", "mem/peak_reserved_gib", "mem/device_total_gib", "mem/weights_gib")
    return {k: max(x.metrics[k] for x in ranks if k in x.metrics) for k in keys
            if any(k in x.metrics for x in ranks)}


def aggregate(ranks: list[CellResult], gpu: GpuConfig) -> dict:
    """One cell's metrics from its ranks' records (see the module's docstring)."""
    n = len(ranks)
    per_rank_steps = [x.rank["steps"] for x in ranks]
    steps = []
    for recs in zip(*per_rank_steps):
        step = dict(recs[0])  # step number, timed flag and rank 0's loss (the Trainer's mean over ranks)
        for k in ("tokens_nonpad", "tokens_total", "tokens_label", "samples", "sum_len_sq"):
            step[k] = sum(r[k] for r in recs)
        step["time_s"] = max(r["time_s"] for r in recs)
        step["gc_ms"] = max(r.get("gc_ms", 0.0) for r in recs)  # the rank that held the others at the all-reduce
        step["gc_full"] = max(r.get("gc_full", 0) for r in recs)
        steps.append(step)
    first = ranks[0].rank
    window = max(x.rank["window_s"] for x in ranks)
    out = summarize(steps, window, first["params"], first["arch"], gpu, n_gpus=n)
    out.update(first["data_stats"])
    out["dist/world_size"] = n
    for r, x in enumerate(ranks):
        m = x.metrics
        for k in ("mem/peak_allocated_gib", "mem/peak_reserved_gib", "mem/weights_gib"):
            if k in m:
                out[k.replace("mem/", f"mem/rank{r}_")] = m[k]
    out.update(memory(ranks))
    for k, v in ranks[0].metrics.items():  # rank 0's profile, NVML figures and matmul width, if any
        if k.startswith(("prof/", "gpu/", "count/warmup", "precision/", "quality/")):  # (rank 0 wrote eval.jsonl)
            out[k] = v
    return out

