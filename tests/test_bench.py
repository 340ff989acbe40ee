"""bench.py's suites at tiny sizes on the CPU: sane numbers in the training cells' result format;
the node-consistency check passes and fails on crafted result files."""

import json
import math
from pathlib import Path

import pytest
from conftest import compose_cfg, read_result, requires_cuda, run_cli, spy

from lorabench.bench import MEASURED, consistency
from lorabench.core.config import Suite
from lorabench.core.results import RunContext
from lorabench.run import cell


def run_bench(overrides, run_dir):
    cfg = compose_cfg(overrides, config_name="bench")
    suite = Suite(cfg.suite)
    ctx = RunContext(run_dir=Path(run_dir), name=",".join(overrides))
    return cell.run(cfg, ctx, MEASURED[suite], job_type=f"bench-{suite.value}")


def finite_positive(metrics, prefix):
    values = {k: v for k, v in metrics.items() if k.startswith(prefix) and v is not None}
    assert values and all(math.isfinite(v) and v > 0 for v in values.values()), values
    return values


def test_hardware_suite(tmp_path, caplog):
    caplog.set_level("INFO", logger="lorabench.bench")
    r = run_bench(["suite=hardware", "hardware.sizes=[64,128]", "hardware.copy_mib=8", "hardware.tokens=[64]", "hardware.elementwise_mib=4", "hardware.rep_ms=5"], tmp_path)
    assert r.status.value == "ok", r.error
    # progress: each item as it starts, 4 dtypes x 2 sizes + 1 token count + copy, add and launch on a CPU
    lines = [m for m in caplog.messages if m.startswith("[")]
    assert len(lines) == 12 and lines[0] == "[1/12] matmul bf16 64" and lines[-1].startswith("[12/12] launch latency")
    assert all(" ... ETA " in line for line in lines[1:]) and lines[8].startswith("[9/12] step GEMMs of model=tiny")
    m = finite_positive(read_result(tmp_path)["metrics"], "hw/")
    for dtype in ("bf16", "fp16", "tf32", "fp32"):
        assert m[f"hw/matmul_{dtype}_best_tflops"] == max(m[f"hw/matmul_{dtype}_{n}_tflops"] for n in (64, 128))
    assert m["hw/device_copy_gbs"] > 0.1  # GB/s, bytes read plus written
    assert r.metrics["hw/matmul_bf16_best_of_peak"] is None  # no datasheet for a CPU: no made-up fraction


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_help_lists_suites_examples_and_the_bench_groups_only():
    out = run_cli("bench.py", ["--help"]).stdout
    for suite in Suite:
        assert f"\n  {suite.value} " in out, suite
    assert "python bench.py -m suite=loading model=mistral-7b-v0.3" in out and "Exit codes: 0 ok" in out
    assert "precision=  bf16, fp16, fp32, int8, nf4" in out and "base_" not in out
    assert "backend=" not in out and "optimizer=" not in out and "experiment" not in out  # train.py's groups


def test_loading_suite_measures_each_precision(tmp_path):
    fp32 = run_bench(["suite=loading", "precision=fp32"], tmp_path / "fp32")
    bf16 = run_bench(["suite=loading", "precision=bf16"], tmp_path / "bf16")
    assert fp32.status.value == bf16.status.value == "ok" and fp32.model["weights"] == "random_init"
    # Half the bytes per weight; the rotary frequencies stay fp32 (inv_freq and original_inv_freq,
    # head_dim / 2 = 16 values each: 128 bytes, of which bf16 keeps all, not half). Bytes / 2^30 are
    # exact in float64 (integers below 2^53 units of 2^-30 GiB), so the equation holds to the bit.
    kept = 2 * 16 * 4
    assert bf16.metrics["load/footprint_gib"] == fp32.metrics["load/footprint_gib"] / 2 + kept / 2 / 2**30
    assert fp32.metrics["load/seconds"] > 0
    nf4 = run_bench(["suite=loading", "precision=nf4"], tmp_path / "nf4")
    assert nf4.status.value == "failed" and "needs a CUDA GPU" in nf4.error


def test_inference_suite(tmp_path):
    r = run_bench(["suite=inference", "inference.batches=[1,3]", "inference.prompt_len=8",
                   "inference.new_tokens=6", "inference.repeats=2"], tmp_path)
    assert r.status.value == "ok", r.error
    m = finite_positive(r.metrics, "infer/")
    for b in (1, 3):
        # tokens/s, time to first token and per-token latency describe the same generate() calls
        full_s = b * 6 / m[f"infer/b{b}_tokens_per_s"]
        assert full_s > m[f"infer/b{b}_ttft_s"]
        assert m[f"infer/b{b}_per_token_ms"] == pytest.approx(1e3 * (full_s - m[f"infer/b{b}_ttft_s"]) / 5)


def test_inference_and_gemms_are_the_checkpoints(tmp_path, monkeypatch):
    """model.path: the inference prompts are drawn below the checkpoint's vocabulary (512, not the
    model group's 32,768, whose ids would index past its embedding), the position limit checked is its
    config.json's, and the hardware suite's step GEMMs are its shapes."""
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoConfig, AutoModelForCausalLM

    from lorabench import bench
    from lorabench.models import Architecture
    from lorabench.run.checks import bench_problems

    cfg = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                               vocab_size=512)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "ckpt")
    drawn = spy(monkeypatch, torch, "randint")
    r = run_bench(["suite=inference", f"model.path={tmp_path / 'ckpt'}", "inference.batches=[2]",
                   "inference.prompt_len=8", "inference.new_tokens=4", "inference.repeats=1"], tmp_path / "run")
    assert r.status.value == "ok", r.error
    prompts = [ids for ids in drawn if ids.shape == (2, 8)]
    assert prompts and max(int(ids.max()) for ids in prompts) < 512  # (every id of a vocabulary this small)
    over = OmegaConf.to_object(compose_cfg(["suite=inference", f"model.path={tmp_path / 'ckpt'}",
                                            "inference.prompt_len=60", "inference.new_tokens=8"], config_name="bench"))
    [problem] = bench_problems(over)  # the model group's 4096 positions would let 68 through
    assert f"= 68 exceeds {tmp_path / 'ckpt'}'s max_position_embeddings=64" in str(problem)
    shapes = bench.layer_gemms(over.model)
    assert shapes == Architecture.from_hf_config(cfg).gemm_shapes() and shapes[-1] == (64, 512, 1)  # the head


def write(tmp_path, name, samples_per_s, mem, temp):
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"status": "ok", "metrics": {
        "perf/samples_per_s": samples_per_s, "mem/peak_reserved_gib": mem, "gpu/temp_max_c": temp}}))
    return d


def check(tmp_path, pattern):
    from omegaconf import OmegaConf

    cfg = compose_cfg(["suite=consistency", f"consistency.inputs=[{tmp_path}/{pattern}]"], config_name="bench")
    return consistency(OmegaConf.to_object(cfg))


def test_consistency_passes_and_fails(tmp_path):
    for i, (sps, temp) in enumerate([(1.46, 60), (1.47, 64), (1.45, 66)]):
        write(tmp_path, f"node{i}", sps, 20.0, temp)
    rows, all_ok = check(tmp_path, "node*/metrics.json")
    assert all_ok and [r["ok"] for r in rows[1:]] == [True, True, True] and len(rows[0]["files"]) == 3
    write(tmp_path, "node3", 1.30, 20.5, 79)  # slow, more memory, 19 degrees hotter
    rows, all_ok = check(tmp_path, "node*")  # run dirs work as well as files
    spread = {r["metric"]: r["spread"] for r in rows[1:]}
    assert not all_ok and [r["ok"] for r in rows[1:]] == [False, False, False]
    assert spread["perf/samples_per_s"] == pytest.approx((1.47 - 1.30) / 1.455)  # (max - min) / median
    assert spread["mem/peak_reserved_gib"] == pytest.approx(0.5 / 20.0) and spread["gpu/temp_max_c"] == 19
    # the command exits non-zero when a tolerance is exceeded, and prints the verdicts
    proc = run_cli("bench.py", ["suite=consistency", f"consistency.inputs=[{tmp_path}/node*]"], check=False)
    assert proc.returncode == 1 and proc.stdout.count("EXCEEDED") == 3


def test_consistency_needs_two_files(tmp_path):
    write(tmp_path, "node0", 1.0, 1.0, 1)
    with pytest.raises(ValueError, match="matched 1 result file"):
        check(tmp_path, "node*")


@pytest.mark.gpu
@requires_cuda
def test_hardware_fractions_on_a_gpu(tmp_path):
    r = run_bench(["suite=hardware", "hardware.sizes=[4096]", "hardware.copy_mib=512"], tmp_path)
    m = r.metrics
    assert 0.2 < m["hw/matmul_bf16_best_of_peak"] < 1.2 and 0.3 < m["hw/device_copy_of_peak"] < 1.2
    assert m["hw/h2d_pinned_gbs"] > m["hw/h2d_pageable_gbs"] * 0.8


def test_loading_reads_real_weights_from_a_local_path(tmp_path):
    """model.path: a local directory of safetensors, loaded by the same builder as train.py."""
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from lorabench.models import hf_config

    torch.manual_seed(0)
    saved = AutoModelForCausalLM.from_config(hf_config(OmegaConf.to_object(compose_cfg()).model))
    saved.save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    r = run_bench(["suite=loading", f"model.path={tmp_path / 'ckpt'}"], tmp_path / "run")
    assert r.status.value == "ok" and r.model["weights"] == str(tmp_path / "ckpt")
    missing = run_bench(["suite=loading", f"model.path={tmp_path / 'nope'}"], tmp_path / "run2")
    assert missing.status.value == "failed" and "no such directory" in missing.error


def test_a_bench_multirun_with_a_failed_cell_exits_2(tmp_path):
    """bench.py's multiruns keep train.py's contract: every cell recorded, the table written, the
    failed one named in the last line, exit code 2 (nf4 needs CUDA: refused on this CPU)."""
    proc = run_cli("bench.py", ["-m", "suite=loading", "precision=fp32,nf4", f"hydra.sweep.dir={tmp_path}"],
                   check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "cells: 2 = 1 ok, 1 failed; not measured: 1 (precision=nf4): failed"
    assert "load/seconds" in (tmp_path / "results.md").read_text()
