"""Multi-GPU cells: train.nproc DDP processes on this node (and on each of train.nnodes nodes),
started by torchrun.

The Hydra process composes and resolves the cell's config once and writes it to the run dir; it
then starts `torchrun --standalone --nproc-per-node N -m lorabench.worker <run_dir>`. Every
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
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from lorabench import data, modeling
from lorabench.config import Config, GpuConfig, Pricing
from lorabench.devices import node_rank
from lorabench.metrics import summarize
from lorabench.preemption import HANDLER as preemption
from lorabench.results import (CONFIG_FILE, CellInterrupted, CellResult, CellSkipped, Status, atomic_write_text,
                               read_result)

log = logging.getLogger(__name__)


def remove_empty(ckpt_dir: Path) -> None:
    """The Trainer's output_dir, when no checkpoint was written into it."""
    with contextlib.suppress(OSError):
        ckpt_dir.rmdir()


def launch(c: Config, run_dir: Path, result: CellResult) -> dict:
    """Runs the cell on c.train.nproc processes (on each of c.train.nnodes nodes) and returns the
    aggregated metrics; on a node other than 0, an empty dict (node 0 adds all ranks up)."""
    n, nodes = c.train.nproc, c.train.nnodes
    node = node_rank() if nodes > 1 else 0
    if nodes == 1:
        rendezvous = ["--standalone"]
    else:
        if not os.environ.get("MASTER_ADDR"):
            raise ValueError(f"train.nnodes={nodes} needs MASTER_ADDR, the address of node 0 (and MASTER_PORT, "
                             "default 29500) in the environment of every node")
        rendezvous = [f"--nnodes={nodes}", f"--node-rank={node}", f"--master-addr={os.environ['MASTER_ADDR']}",
                      f"--master-port={os.environ.get('MASTER_PORT', '29500')}"]
    if c.train.device.value != "cpu":
        available = torch.cuda.device_count()
        if available < n:
            raise ValueError(f"train.nproc={n} but this node has {available} CUDA device(s); use "
                             + (f"train.nproc <= {available}, or " if available else "train.nproc=1, or ")
                             + "train.device=cpu for CPU processes (gloo)")
    # Data first, in this process: bad input fails before N model loads, and the tokenised cache
    # is written once instead of by N ranks at the same time.
    data.build_dataset(c, modeling.build_tokenizer(c.model))
    atomic_write_text(run_dir / CONFIG_FILE, OmegaConf.to_yaml(OmegaConf.structured(c)))
    world, mine = n * nodes, range(node * n, (node + 1) * n)  # this node's global ranks
    for r in mine:
        (run_dir / f"rank{r}.json").unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if world == 1:  # one process of its own (backend=unsloth), no process group to set up
        cmd, env["RANK"] = [sys.executable, "-m", "lorabench.worker", str(run_dir)], "0"
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc-per-node={n}",
               "-m", "lorabench.worker", str(run_dir)]
    ranks_log = run_dir / ("ranks.log" if nodes == 1 else f"ranks.node{node}.log")
    log.info("launching %d ranks: %s (their output: %s)", n, " ".join(cmd), ranks_log)
    with open(ranks_log, "w") as out, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env) as proc:
        with preemption.forwarding(proc):  # a signal stops the ranks as it stops a cell
            proc.wait()
    if node > 0:
        result.dist = {"node": node, "nnodes": nodes, "note": "node 0's metrics.json holds every rank"}
        if proc.returncode != 0:
            raise RuntimeError(f"node {node}: torchrun exit code {proc.returncode}; end of {ranks_log.name}:\n"
                               + ranks_log.read_text()[-2000:])
        return {}
    # The other nodes' ranks end with ours (every step all-reduces); their files may lag on a shared volume.
    deadline = time.time() + (120 if proc.returncode == 0 else 0)
    while time.time() < deadline and not all((run_dir / f"rank{r}.json").exists() for r in range(world)):
        time.sleep(1)
    remove_empty(run_dir / "checkpoints")  # every rank is done with it now
    ranks = []
    for r in range(world):
        path = run_dir / f"rank{r}.json"
        ranks.append(read_result(path) if path.exists() else CellResult(Status.failed, f"rank {r}", error="no result"))
    bad = [(r, x) for r, x in enumerate(ranks) if not x.ok]
    if bad:
        # what the ranks measured before they failed: an OOM's peak and the device's size (the budget a
        # search under gpu=auto learns from its first cell, an Unsloth one too)
        result.metrics.update(memory(ranks))
        first = root_cause(bad, run_dir)
        msg = f"rank {first[0]} of {world}: {first[1].error}"
        if first[1].status is Status.oom:
            raise torch.OutOfMemoryError(msg)
        if first[1].status is Status.interrupted:
            raise CellInterrupted(msg)
        if first[1].status is Status.skipped:  # every rank refuses the same cell (lorabench.fastpath)
            raise CellSkipped(first[1].error)
        tail = ranks_log.read_text()[-2000:]
        raise RuntimeError(f"{msg} (torchrun exit code {proc.returncode}); end of {ranks_log.name}:\n{tail}")
    result.model, result.device, result.gpu = ranks[0].model, ranks[0].device, ranks[0].gpu
    result.resumed_from_step = ranks[0].resumed_from_step  # (every rank resumes from the same checkpoint)
    result.dist = {"nproc": n, "nnodes": nodes, "parallel": c.train.parallel.value if world > 1 else "none",
                   "devices": [x.device for x in ranks]}
    g = ranks[0].gpu  # the spec rank 0 priced its device with (devices.setup_device)
    spec = GpuConfig(name=g["name"], price_per_hour=g["price_per_hour"], spot_price_per_hour=g["spot_price_per_hour"],
                     peak_bf16_tflops=g["peak_bf16_tflops"], pricing=Pricing(g["pricing"]))
    return aggregate(ranks, spec)


# A rank's own failure explains the cell; the others typically died of the broken group (an error of
# their own, written later) or were stopped by torchrun once one rank had failed (SIGTERM: interrupted).
CAUSE_ORDER = (Status.oom, Status.failed, Status.skipped, Status.interrupted)


def root_cause(bad: list[tuple[int, CellResult]], run_dir: Path) -> tuple[int, CellResult]:
    """The (rank, result) that explains a failed multi-process cell: out of memory first, then a failure
    (the earliest error.rank<r>.txt of them), a refusal, an interruption; a rank without a result last."""
    def key(rx):
        r, x = rx
        error_file = run_dir / f"error.rank{r}.txt"
        when = error_file.stat().st_mtime if error_file.exists() else float("inf")
        return (x.error == "no result", CAUSE_ORDER.index(x.status) if x.status in CAUSE_ORDER else len(CAUSE_ORDER),
                when, r)

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
        if k.startswith(("prof/", "gpu/", "count/warmup", "precision/")):
            out[k] = v
    return out

