"""On a CUDA GPU: the quantised path (bitsandbytes nf4 / int8, paged optimizer) and GPU metrics.
Skipped without CUDA."""

import pytest
from conftest import EPS64, FAST, read_result, read_steps, requires_cuda, run_in_process

pytestmark = [pytest.mark.gpu, requires_cuda]


@pytest.mark.parametrize("precision,optimizer", [("nf4", "paged_adamw_8bit"), ("int8", "adamw_8bit"),
                                                 ("bf16", "adamw_torch_fused"), ("fp16", "adamw_torch")])
def test_quantised_and_half_precision_cells_run(tmp_path, precision, optimizer):
    result = run_in_process([f"precision={precision}", f"optimizer={optimizer}", "train.gradient_checkpointing=true",
                             *FAST], tmp_path)
    assert result.status.value == "ok", result.error
    m = read_result(tmp_path)["metrics"]
    assert m["mem/peak_allocated_gib"] > 0 and m["mem/peak_reserved_gib"] >= m["mem/peak_allocated_gib"]
    assert m["gpu/nvml_samples"] >= 1 and m["gpu/power_mean_w"] > 0
    assert m["perf/mfu_pct"] > 0 and m["perf/tokens_per_s"] > 0
    # one GPU, one batch of 4 per step, also on a node with several GPUs (no DataParallel)
    assert m["count/samples"] == 4 * m["count/timed_steps"]
    assert all(s["loss"] == s["loss"] for s in read_steps(tmp_path))  # no NaN


def test_nf4_layers_are_4bit(tmp_path):
    import bitsandbytes as bnb
    import torch
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    from lorabench.builders.modeling import build_model

    cfg = OmegaConf.to_object(compose_cfg(["precision=nf4"]))
    model, weights = build_model(cfg, torch.device("cuda", 0))
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, bnb.nn.Linear4bit) and q.weight.quant_type == "nf4" and weights == "random_init"


def test_consecutive_cells_do_not_accumulate_memory(tmp_path):
    """Cells of a multirun share a process: each must give back all its device memory, or later
    cells' peaks would include earlier cells' leftovers."""
    import torch

    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    for i in range(2):
        r = run_in_process(["precision=nf4", "optimizer=paged_adamw_8bit", *FAST], tmp_path / str(i))
        assert r.status.value == "ok", r.error
        assert torch.cuda.memory_allocated() - before < 1 * 2**20, f"cell {i} left memory allocated"


def test_an_emulated_memory_budget_turns_a_cell_into_oom(tmp_path):
    """gpu=a10 on a bigger GPU caps this process's memory; here at 10 MiB, which nothing fits in."""
    r = run_in_process(["gpu=a10", "gpu.match=[no-such-gpu]", "gpu.memory_gib=0.01", *FAST], tmp_path / "oom")
    assert r.status.value == "oom" and r.gpu["emulated"] == "a10" and r.metrics["mem/budget_gib"] == 0.01
    assert r.gpu["name"] != "a10"  # priced as the real GPU
    big = run_in_process(["gpu=a10", "gpu.match=[no-such-gpu]", "gpu.memory_gib=100000", *FAST], tmp_path / "big")
    assert big.status.value == "failed" and "more than this device has" in big.error
    ok = run_in_process(FAST, tmp_path / "after")  # the budget is lifted for the next cell
    assert ok.status.value == "ok"


def test_sizing_sweep_on_cuda_finds_the_largest_batch(tmp_path):
    """A real OOM within a 2 GiB budget: fp32 logits of batch 64 x 1024 tokens x 32768 vocab are
    8 GiB; batch 1 fits (its logits are 0.125 GiB); batch 128 is then skipped without a model load."""
    from conftest import run_cli

    proc = run_cli("train.py", ["+experiment=gpu_sizing", "model=tiny", "precision=fp32", "optimizer=adamw_torch",
                                "data=synthetic", "data.max_samples=512", "train.gradient_checkpointing=false",
                                "gpu=a10", "gpu.match=[no-such-gpu]", "gpu.memory_gib=2", "seq_len=1024",
                                "batch=1,64,128", f"hydra.sweep.dir={tmp_path}"])
    results = [read_result(tmp_path / str(i)) for i in range(3)]
    assert [r["status"] for r in results] == ["ok", "oom", "skipped"], [r.get("error") for r in results]
    # The multirun's end (lorabench.sweep.callbacks.SweepSummary) writes the report into the sweep dir; where it
    # cannot, it says why on stderr and the cells' results stand: that line is the failure's message.
    report = tmp_path / "results.md"
    assert report.is_file(), proc.stderr[-3000:]
    assert "| 1024 | 1 |" in report.read_text()  # "What fits": seq 1024, largest batch 1


def test_profile_on_cuda_attributes_kernels(tmp_path):
    """nf4 on the GPU: the breakdown sees matmuls, attention and bitsandbytes' dequantisation, and
    adds up to the meter's step time (tolerance as in the CPU test)."""
    from lorabench.measure.profile import CATEGORIES

    r = run_in_process(["precision=nf4", "optimizer=paged_adamw_8bit", "train.gradient_checkpointing=true",
                        "train.max_steps=8", "train.untimed_steps=2", "train.profile_steps=3",
                        "data.max_samples=64"], tmp_path)
    assert r.status.value == "ok", r.error
    m = r.metrics
    assert sum(m[f"prof/{c}_ms"] for c in CATEGORIES) == pytest.approx(m["prof/step_ms"], rel=1e6 * EPS64)
    assert abs(m["prof/step_ms"] - m["prof/measured_step_ms"]) <= 0.05 * m["prof/measured_step_ms"] + 2.0
    for c in ("matmul", "dequant", "attention", "elementwise", "loss", "optimizer"):
        assert m[f"prof/{c}_ms"] > 0, c
