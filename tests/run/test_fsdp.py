"""Sharded cells (train.parallel=fsdp): torchrun ranks on the CPU (gloo) with the tiny model, through the
HF Trainer's FSDP2 path (lorabench.run.sharding). Each rank holds half the weights, and the cell trains as one
process does at the doubled batch; it resumes after a kill; a rank that fails fails the cell with its
reason. The nf4 cell on 2 GPUs is at the end (skipped without 2 CUDA devices)."""

import signal
import subprocess
import sys
import time

import pytest
from conftest import EPS32, REPO, compose_cfg, read_result, read_steps, run_in_process

from lorabench.run.checkpoints import MARKER

# As tests/run/test_distributed.py's DDP cells: fixed-length synthetic rows, so the mean of the ranks' mean
# losses is the mean loss of the doubled batch; LoRA dropout off (each rank would draw its own masks).
COMMON = ["train.device=cpu", "data=synthetic", "data.max_samples=64", "seq_len=64", "lora.dropout=0",
          "train.max_steps=6", "train.untimed_steps=2"]
FSDP = [*COMMON, "batch=2", "train.nproc=2", "train.parallel=fsdp"]
# fp32, FSDP casts nothing (lorabench.run.sharding): what differs from one process is the order of sums. A
# step's loss and gradients are means over 4 x 64 = 256 tokens, taken as two halves of 128 and the
# reduce-scatter's sum of them (FSDP2 divides by the world size); a sum of 256 terms in any blocked order
# rounds at most log2(256) + 1 = 9 times on a term's way to the result, and each step adds its own to
# the weights the next one starts from: 6 steps x 9 x eps32 = 6.4e-6 of the loss (the losses seen differ
# by 1.8e-7). A batch half lost, or a rank training on the other's weights, is off by ~1%.
FSDP_LOSS = 6 * 9 * EPS32


def losses(run_dir):
    return [s["loss"] for s in read_steps(run_dir)]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The 1-process cell at batch 4: the losses a 2-rank cell at batch 2 must reproduce."""
    run_dir = tmp_path_factory.mktemp("one")
    r = run_in_process([*COMMON, "batch=4"], run_dir)
    assert r.ok, r.error
    return r, losses(run_dir)


@pytest.mark.slow  # two cells, one of 2 ranks: ~30 s on 2 cores (make test-slow, CI)
def test_two_rank_sharded_cell_matches_one_process_and_holds_half_the_weights(tmp_path, one_process):
    one, expected = one_process
    two = run_in_process(FSDP, tmp_path)
    assert two.ok, two.error
    assert losses(tmp_path) == pytest.approx(expected, rel=FSDP_LOSS) and len(expected) == 6
    m = two.metrics
    assert two.dist["parallel"] == "fsdp" and m["dist/world_size"] == 2
    assert m["precision/matmul_bytes"] == one.metrics["precision/matmul_bytes"] == 4  # fp32 cells
    assert m["count/samples"] == one.metrics["count/samples"] == 16  # global: 2 ranks x 2 samples x 4 steps
    assert m["cost/usd_per_hour"] == 2 * one.metrics["cost/usd_per_hour"]
    # Each rank holds its shard of every parameter: half of them, plus at most one padding row per
    # parameter where its first dimension is odd (none is in the tiny model, so half exactly).
    whole = one.metrics["mem/weights_gib"]
    for r in (0, 1):
        assert m[f"mem/rank{r}_weights_gib"] == pytest.approx(whole / 2, rel=1e-9)


def test_a_sharded_cell_runs_its_forward_under_the_cells_autocast():
    """accelerate autocasts one process and DDP but not FSDP2 (lorabench.run.sharding): the Trainer's hook does it
    for a sharded 16-bit cell, on its device, and for nothing else."""
    from types import SimpleNamespace

    import torch

    from lorabench.run import sharding

    def args(fsdp, bf16=False, fp16=False):
        return SimpleNamespace(fsdp=fsdp, bf16=bf16, fp16=fp16, device=torch.device("cpu"))

    with sharding.autocast(args(True, bf16=True)):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") is torch.bfloat16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype is torch.bfloat16
    for plain in (args(False, bf16=True), args(True)):  # DDP / one process (accelerate's), fp32
        with sharding.autocast(plain):
            assert not torch.is_autocast_enabled("cpu")


def test_sharded_parts_are_refused_by_name_before_any_process_starts(tmp_path):
    r = run_in_process([*FSDP, "backend.flat_optimizer=true"], tmp_path)
    assert r.status.value == "skipped", r.error
    assert "flat_optimizer" in r.error and "train.parallel=fsdp" in r.error
    assert "backend.flat_optimizer=false" in r.error
    assert not (tmp_path / "ranks.log").exists()


def test_sharded_values_that_cannot_run_are_one_line_errors():
    from omegaconf import OmegaConf

    from lorabench.core.results import CellSkipped
    from lorabench.fast import parts
    from lorabench.run import checks

    fast = OmegaConf.to_object(compose_cfg(["backend=fast", "train.nproc=2", "train.parallel=fsdp"]))
    with pytest.raises(CellSkipped, match="backend=fast: fused_lora reads each projection's 4-bit weight"):
        parts.check_sharded(fast)
    for override, key in (("backend=unsloth", "backend=unsloth"), ("precision=int8", "precision=int8"),
                          ("optimizer=paged_adamw_8bit", "optimizer=paged_adamw_8bit")):
        c = OmegaConf.to_object(compose_cfg([override, "train.nproc=2", "train.parallel=fsdp"]))
        with pytest.raises(ValueError, match=f"train.parallel=fsdp with {key}"):
            checks.check_backend(c)
    single = OmegaConf.to_object(compose_cfg(["backend=fast", "train.parallel=fsdp"]))  # 1 process: not sharded
    assert not single.train.sharded
    parts.check_sharded(single)


@pytest.mark.slow  # two cells, one of 2 ranks: ~40 s
def test_the_fast_parts_that_run_sharded_train_as_in_one_process(tmp_path):
    """backend=fast less what is refused sharded (and Liger's CUDA kernels): the decoder layer's residual
    add inside the next RMSNorm, norms not upcast (backend.upcast_fp32=false), the lean Trainer step, on 2
    ranks against 1 process."""
    fast = ["backend=fast", "backend.liger=[]", "backend.fused_lora=false", "backend.fused_mlp=false",
            "backend.fused_linear=false", "backend.flat_optimizer=false"]
    two = run_in_process([*FSDP, *fast], tmp_path / "two")
    one = run_in_process([*COMMON, "batch=4", *fast], tmp_path / "one")
    assert two.ok and one.ok, (two.error, one.error)
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=FSDP_LOSS)


def test_a_sharded_cell_composes_for_slurm_on_one_node_of_n_gpus():
    """SLURM (Hydra's submitit launcher): one job, one node, 4 GPUs, 4 ranks sharding the model."""
    cfg = compose_cfg(["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=4",
                       "train.nproc=4", "train.parallel=fsdp"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher.nodes == 1 and launcher.tasks_per_node == 1 and launcher.gpus_per_node == cfg.train.nproc == 4
    assert cfg.train.parallel.value == "fsdp"


def test_the_rank_whose_own_error_came_first_explains_a_failed_cell(tmp_path):
    """Unit level (the slow test below runs it for real): a rank stopped by torchrun (interrupted) or one
    without a result never hides a failure; of two failures, the earlier error file is the cause."""
    import os

    from lorabench.core.results import CellResult, Status
    from lorabench.run.distributed import no_result, root_cause

    stopped = CellResult(Status.interrupted, "rank 0", error="SIGTERM before training began")
    broken = CellResult(Status.failed, "rank 2", error="RuntimeError: Connection closed by peer")
    own = CellResult(Status.failed, "rank 1", error="IsADirectoryError: steps.rank1.jsonl")
    lost = no_result(3, -9, 1)  # torchrun's summary: rank 3 ended by SIGKILL, no rank3.json
    for r, age in ((1, 10), (2, 5)):  # rank 1's error file written 5 s before rank 2's
        (tmp_path / f"error.rank{r}.txt").write_text("traceback")
        os.utime(tmp_path / f"error.rank{r}.txt", (1e9 - age, 1e9 - age))
    bad = [(3, lost), (0, stopped), (2, broken), (1, own)]
    assert root_cause(bad, tmp_path) == (1, own)
    # a rank killed outright went first: torchrun stopped the other one after it, and the peer lost it
    assert root_cause([(3, lost), (0, stopped), (2, broken)], tmp_path) == (3, lost)
    assert lost.status is Status.interrupted and "killed by SIGKILL" in lost.error
    assert root_cause([(0, stopped), (2, broken)], tmp_path) == (0, stopped)
    crashed = no_result(3, -11, 1)
    assert crashed.status is Status.failed and "SIGSEGV" in crashed.error
    assert no_result(1, None, -9).error.endswith("torchrun was killed by SIGKILL and its ranks ended with it")


@pytest.mark.slow  # ~55 s: rank 0 waits in a collective, deaf to torchrun's SIGTERM, until its SIGKILL 30 s later
def test_a_rank_that_fails_fails_the_cell_with_its_reason(tmp_path):
    """Rank 1 cannot write its step records (a directory is in the way): it fails at once, torchrun stops
    rank 0, and the cell is failed with rank 1's own error (not rank 0's stop) and torchrun's exit code."""
    (tmp_path / "steps.rank1.jsonl").mkdir()
    r = run_in_process(FSDP, tmp_path)
    assert r.status.value == "failed"
    assert "rank 1 of 2: IsADirectoryError" in r.error and "steps.rank1.jsonl" in r.error, r.error
    assert "torchrun exit code 1" in r.error
    assert read_result(tmp_path)["status"] == "failed"


@pytest.mark.slow  # two 2-rank runs, one killed: ~2 min on 2 cores (make test-slow, CI)
def test_kill_then_rerun_resumes_from_the_sharded_checkpoint(tmp_path, one_process):
    """kill -9 of the whole cell (the Hydra process, torchrun and both ranks, as a machine dying) right after
    its checkpoint at step 3; the same command again resumes from it and ends with the 1-process losses."""
    import psutil

    run_dir = tmp_path / "killed"
    # With every layer recomputed (FSDP gathers a layer's weights again for its recomputation) and the
    # Trainer's per-step host work cut (backend.lean_step): neither changes the arithmetic.
    cell = [*FSDP, "train.save_steps=3", "train.gradient_checkpointing=true", "backend.lean_step=true"]
    cmd = [sys.executable, str(REPO / "train.py"), *cell, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # As soon as checkpoint-3 is complete (its marker, written once every rank has saved): steps 4-6 are lost
    done, deadline = run_dir / "checkpoints" / "checkpoint-3" / MARKER, time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if done.exists():
            # torchrun starts each rank in a session of its own: the whole tree, taken at once
            tree = psutil.Process(proc.pid).children(recursive=True)
            for p in [psutil.Process(proc.pid), *tree]:
                p.kill()
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL and not (run_dir / "metrics.json").exists()
    assert not (run_dir / "checkpoints" / "checkpoint-6").exists()
    r = run_in_process(cell, run_dir)
    assert r.ok and r.resumed_from_step == 3, r.error
    assert [s["step"] for s in read_steps(run_dir)] == list(range(1, 7))
    assert losses(run_dir) == pytest.approx(one_process[1], rel=FSDP_LOSS)


# ---- on 2 GPUs: the nf4 weights sharded (bitsandbytes' quant storage as bf16 words), NCCL ----------------------

def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


two_gpus = pytest.mark.skipif(_gpus() < 2, reason="needs 2 CUDA GPUs")


@pytest.mark.gpu
@two_gpus
def test_two_gpu_nf4_sharded_cell_trains_like_its_ddp_twin_on_half_the_weights(tmp_path):
    """nf4 with PyTorch's fused AdamW (bitsandbytes' optimizers are refused sharded), activation
    checkpointing and a checkpoint every 3 steps, 2 ranks: FSDP against DDP at the same
    global batch. Both compute in bf16 under the Trainer's autocast with the same weights; the losses
    within one bf16 step per side, 2 x eps_bf16 = 1.6% (BF16_LOSS: a wrong shard or a lost half batch
    is off by more after a few steps). Each FSDP rank holds about half the weights (the 4-bit words and
    the fp32 adapters and norms are sharded; the quantisation constants, 3% of nf4's bits, stay whole)."""
    from conftest import BF16_LOSS

    gpu = ["train.device=cuda", "precision=nf4", "optimizer=adamw_torch_fused", "train.gradient_checkpointing=true",
           "data=synthetic", "data.max_samples=64", "seq_len=128", "batch=2", "train.max_steps=6",
           "train.untimed_steps=2", "lora.dropout=0", "train.nproc=2"]
    fsdp = run_in_process([*gpu, "train.parallel=fsdp", "train.save_steps=3"], tmp_path / "fsdp")
    ddp = run_in_process([*gpu, "train.parallel=ddp"], tmp_path / "ddp")
    assert fsdp.ok and ddp.ok, (fsdp.error, ddp.error)
    assert losses(tmp_path / "fsdp") == pytest.approx(losses(tmp_path / "ddp"), rel=BF16_LOSS)
    f, d = fsdp.metrics, ddp.metrics
    assert f["mem/rank1_weights_gib"] < 0.6 * d["mem/rank1_weights_gib"]
    assert fsdp.dist["parallel"] == "fsdp" and f["perf/tokens_per_s"] > 0 and f["perf/mfu_pct"] > 0
    # The matmuls ran in bf16 on both sides (without the sharded cell's own autocast, lorabench.run.sharding,
    # attention, adapters and head ran in fp32 after the fp32 norms: 2x the step on 70B, within the loss
    # tolerance above).
    assert f["precision/matmul_bytes"] == d["precision/matmul_bytes"] == 2
    # The checkpoint: the adapters' shards and their optimizer state through torch.distributed.checkpoint
    # (the CPU test resumes from the same files); the last two are kept (save_total_limit=2).
    ckpt = tmp_path / "fsdp" / "checkpoints" / "checkpoint-6"
    assert (ckpt / "trainer_state.json").exists() and (ckpt / "pytorch_model_fsdp_0").is_dir()


def test_a_head_read_without_its_forward_is_whole_once_the_final_norm_has_run(tmp_path):
    """What Liger's fused cross-entropy does under FSDP2 (lorabench.run.sharding.gather_head_with_final_norm): the
    CausalLM's forward runs the decoder and reads lm_head.weight without calling lm_head. One gloo process,
    the units accelerate makes for a PEFT model (each decoder layer, the head alone, the root): the head is a
    DTensor shard that a plain matmul refuses, yet inside the forward, after the final norm, it is whole and
    the logits are those of the model before sharding."""
    import torch
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from torch.distributed.fsdp import fully_shard
    from transformers import MistralConfig, MistralForCausalLM

    from lorabench.run import sharding

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    model = get_peft_model(MistralForCausalLM(cfg), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    causal = model.get_base_model()

    def reads_the_head(input_ids=None, **kwargs):  # Liger's lce_forward, less the loss
        return causal.model(input_ids=input_ids).last_hidden_state @ causal.lm_head.weight.t()

    causal.forward = reads_the_head
    ids = torch.randint(0, 64, (1, 5))
    expected = model(input_ids=ids)
    sharding.gather_head_with_final_norm(model)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for layer in causal.model.layers:
            fully_shard(layer)
        fully_shard([causal.lm_head], reshard_after_forward=False)
        fully_shard(model)
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
            torch.ones(1, 32) @ causal.lm_head.weight.t()
        assert torch.equal(model(input_ids=ids), expected)
    finally:
        dist.destroy_process_group()
