"""Bad input is rejected before any model is built, with a message that names the bad value and
what is accepted. Composition and schema checks here are instant; cell-level ones run the cell
(tokenizer, data) up to its checks. More cases: test_train.py (impossible cells: nf4/int8/fp16 or a
CUDA-only optimizer on CPU, seq_len past the model's positions, r above the hidden size, device=cuda
without one), test_data.py (broken data files, with file:line), test_distributed.py (more
processes than GPUs), test_gpu.py (a memory budget larger than the device)."""

import json

import pytest
from conftest import FAST, compose_cfg, run_cli, run_in_process
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

# (override, words the message must hold: the bad value and what is accepted)
SCHEMA_CASES = [
    ("seq_len=0", ["seq_len must be > 0", "0"]),
    ("seq_len=-512", ["seq_len must be > 0", "-512"]),
    ("batch=0", ["batch must be > 0", "0"]),
    ("batch=-4", ["batch must be > 0", "-4"]),
    ("lora.r=0", ["lora.r must be > 0", "0"]),
    ("lora.alpha=-16", ["lora.alpha must be > 0", "-16"]),
    ("lora.dropout=1.5", ["lora.dropout must be in [0, 1)", "1.5"]),
    ("lora.target_modules=[]", ["lora.target_modules is empty", "q_proj"]),
    ("train.max_steps=0", ["train.max_steps must be > 0", "0"]),
    ("train.untimed_steps=100", ["train.untimed_steps must be in [0, train.max_steps=100)", "100"]),
    ("train.grad_accum=0", ["train.grad_accum must be > 0", "0"]),
    ("train.nproc=0", ["train.nproc must be > 0", "0"]),
    ("train.save_steps=-1", ["train.save_steps must be >= 0", "-1"]),
    ("gpu.price_per_hour=-0.6", ["gpu.price_per_hour must be >= 0", "-0.6"]),
    ("gpu.spot_price_per_hour=-1", ["gpu.spot_price_per_hour must be >= 0", "-1"]),
    ("data.max_samples=0", ["data.max_samples must be > 0", "0"]),
    ("data.num_workers=-2", ["data.num_workers must be >= 0", "-2"]),
    ("sweep.deadline_s=0", ["sweep.deadline_s must be > 0 seconds", "0"]),
    ("backend.ce_chunk_mem=0", ["backend.ce_chunk_mem must be >= 1", "got 0"]),
    ("backend.gc_every=-1", ["backend.gc_every must be >= 0", "got -1"]),
]


@pytest.mark.parametrize("override,words", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_out_of_range_values_fail_at_composition(override, words):
    with pytest.raises((ValueError, ValidationError)) as e:
        OmegaConf.to_object(compose_cfg([override]))
    for w in words:
        assert w in str(e.value), (w, str(e.value))


HYDRA_CASES = [
    # an unknown option of a group: Hydra lists the valid ones
    ("optimizer=adamw9", ["optimizer/adamw9", "Available options", "paged_adamw_8bit"]),
    ("precision=int4", ["precision/int4", "Available options", "nf4"]),
    ("gpu=h300", ["gpu/h300", "Available options", "h100"]),  # a GPU without a price table entry
    ("model=mistral-7b", ["model/mistral-7b", "Available options", "mistral-7b-v0.3"]),
    # a typo in a group's name, a value of the wrong type, a key no schema has
    ("modle=tiny", ["modle"]),
    ("batch=four", ["four", "batch", "int"]),
    ("train.max_step=10", ["max_step", "TrainConfig"]),
    ("optimizer.name=sgd", ["sgd", "expected one of", "adamw_torch"]),
]


@pytest.mark.parametrize("override,words", HYDRA_CASES, ids=[c[0] for c in HYDRA_CASES])
def test_unknown_names_and_wrong_types_fail_with_the_valid_choices(override, words):
    with pytest.raises((ConfigCompositionException, HydraException, ValidationError, ConfigKeyError)) as e:
        compose_cfg([override])
    text = f"{e.value} {e.value.__cause__ or ''}"
    for w in words:
        assert w.lower() in text.lower(), (w, text)


def safetensors_dir(tmp_path, damage):
    """A local checkpoint dir of the tiny model, then damaged as asked."""
    import torch
    from transformers import AutoModelForCausalLM

    from lorabench.models import hf_config

    d = tmp_path / "ckpt"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(hf_config(OmegaConf.to_object(compose_cfg()).model)).save_pretrained(d)
    [f] = d.glob("*.safetensors")
    if damage == "truncated":
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif damage == "corrupt":
        f.write_bytes(b"\x00" * 64 + f.read_bytes()[64:])
    elif damage == "pickled":
        f.rename(d / "pytorch_model.bin")
    return d, f.name


@pytest.mark.parametrize("damage,words", [
    ("truncated", ["is not a readable safetensors file", "model.safetensors"]),
    ("corrupt", ["is not a readable safetensors file", "model.safetensors"]),
    ("pickled", ["no *.safetensors file", "pytorch_model.bin", "model.safetensors_only=false"]),
])
def test_damaged_or_pickled_checkpoints_fail_before_the_load(tmp_path, damage, words):
    d, _ = safetensors_dir(tmp_path, damage)
    r = run_in_process([*FAST, f"model.path={d}"], tmp_path / "run")
    assert r.status.value == "failed" and r.model is None
    for w in words + [str(d)]:
        assert w in r.error, (w, r.error)


@pytest.mark.parametrize("overrides,words", [
    (["lora.target_modules=[q_proj,nope_proj]"], ["nope_proj", "not a linear layer", "gate_proj", "all-linear"]),
    (["model.path=/no/such/checkpoint"], ["model.path='/no/such/checkpoint'", "no such directory",
                                         "HF_HUB_OFFLINE"]),
    (["data=jsonl", "data.path=/no/such/train.jsonl"], ["/no/such/train.jsonl"]),
], ids=["unknown-target-module", "missing-model-path", "missing-data-file"])
def test_impossible_combinations_fail_before_the_model_is_built(tmp_path, overrides, words):
    r = run_in_process([*FAST, *overrides], tmp_path)
    assert r.status.value == "failed" and r.model is None, r.error
    for w in words:
        assert w in r.error, (w, r.error)


def test_an_output_dir_that_cannot_be_written_is_named(tmp_path):
    proc = run_cli("train.py", [*FAST, "hydra.run.dir=/proc/lorabench-cannot-write"], check=False)
    assert proc.returncode == 2 and "hydra.run.dir=/proc/lorabench-cannot-write: cannot write there" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------- the cell contract
# Each case runs the cell as train.py would (in this process, with the entrypoint's context) and
# asserts what a script reading it gets: the exit code, one line naming the bad value, no
# traceback on the console, no model built, and a result file that is whole (or none at all).

def planted(tmp_path):
    """Files of the wrong kind or content for the path cases."""
    (tmp_path / "a_dir").mkdir(exist_ok=True)
    (tmp_path / "a_file.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "latin1.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    return tmp_path


CONTRACT_CASES = [
    # non-finite or negative where none makes sense: NaN passes a plain `<= 0` check
    (["optimizer.lr=nan"], ["optimizer.lr must be > 0", "nan"]),
    (["optimizer.lr=inf"], ["optimizer.lr must be > 0", "inf"]),
    (["optimizer.weight_decay=-0.1"], ["optimizer.weight_decay must be >= 0", "-0.1"]),
    (["optimizer.max_grad_norm=-1"], ["optimizer.max_grad_norm must be >= 0", "-1"]),
    (["optimizer.max_grad_norm=nan"], ["optimizer.max_grad_norm must be >= 0", "nan"]),
    (["optimizer.lr_warmup_steps=-3"], ["optimizer.lr_warmup_steps must be >= 0", "-3"]),
    (["gpu.price_per_hour=nan"], ["gpu.price_per_hour must be >= 0", "nan"]),
    (["gpu.price_per_hour=inf"], ["gpu.price_per_hour must be >= 0", "inf"]),
    (["gpu.peak_bf16_tflops=-989"], ["gpu.peak_bf16_tflops must be >= 0", "-989"]),
    (["lora.dropout=nan"], ["lora.dropout must be in [0, 1)", "nan"]),
    (["train.checkpoint_fraction=nan"], ["train.checkpoint_fraction must be in [0, 1]", "nan"]),
    (["model.rope_theta=-1"], ["model.rope_theta must be > 0", "-1"]),
    (["model.rms_norm_eps=0"], ["model.rms_norm_eps must be > 0", "0"]),
    (["report.reference_usd_per_1m_tokens=nan"], ["report.reference_usd_per_1m_tokens must be >= 0", "nan"]),
    (["report.reference_usd_per_1m_tokens=-2"], ["report.reference_usd_per_1m_tokens must be >= 0", "-2"]),
    (["train.max_steps=5", "train.untimed_steps=5"],
     ["train.untimed_steps must be in [0, train.max_steps=5)", "got 5"]),
    (["train.max_steps=6", "train.profile_steps=4"], ["train.profile_steps must be in [0", "6 - 2", "got 4"]),
    # paths of the wrong kind, named as such (not "missing", not a hub "repo id")
    (["data=jsonl", "data.path={tmp}/a_dir"], ["data.path=", "a_dir' is a directory", "data=hf"]),
    (["data=hf", "data.path={tmp}/a_file.jsonl"], ["a_file.jsonl' is a file", "data=jsonl"]),
    (["model.path={tmp}/a_file.jsonl"], ["model.path=", "a_file.jsonl' is a file", "model directory"]),
    (["model.tokenizer={tmp}/no_such.model"], ["model.tokenizer=", "no_such.model", "no such file"]),
    (["data=hf", "data.path={tmp}/no_such_dataset"], ["no_such_dataset", "no such directory", "HF_DATASETS_OFFLINE"]),
    # undecodable bytes name the file and the line
    (["data=jsonl", "data.path={tmp}/latin1.jsonl"], ["latin1.jsonl:2", "not UTF-8", "0xe9"]),
]


@pytest.mark.parametrize("overrides,words", CONTRACT_CASES, ids=[",".join(c[0]) for c in CONTRACT_CASES])
def test_bad_value_fails_the_cell_with_its_exit_code_and_one_line(tmp_path, capfd, overrides, words):
    tmp = planted(tmp_path)
    run = tmp_path / "run"
    r = run_in_process([*FAST, *(o.format(tmp=tmp) for o in overrides)], run)
    out, err = capfd.readouterr()
    assert r.status.value == "failed" and r.exit_code == 2 and r.model is None, r.error
    for w in words:
        assert w.format(tmp=tmp) in r.error, (w, r.error)
    assert "Traceback" not in out + err and r.error in err  # the whole reason on the console, no traceback
    assert json.loads((run / "metrics.json").read_text())["error"] == r.error  # whole, and the whole reason
    assert not list(run.glob(".*.tmp")) and oct((run / "metrics.json").stat().st_mode & 0o777) == "0o644"


# A cell that fails at run time in a sweep (valid JSON with no usable conversation: recorded with its
# reason, the other cells finish, exit code 2): test_reliability.py, the 12-cell sweep.


def test_a_failed_single_run_exits_2_with_one_line(tmp_path):
    proc = run_cli("train.py", ["seq_len=-5", f"hydra.run.dir={tmp_path}"], check=False, fresh=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "seq_len must be > 0, got -5" in proc.stderr and "Failed to load CPU" not in proc.stderr  # quiet console


def test_a_sweep_with_an_invalid_cell_stops_in_preflight(tmp_path):
    """Every cell is composed and checked before the first model is built; each invalid one is named
    with its key and value, and nothing runs."""
    proc = run_cli("train.py", ["-m", "lora.r=8,0", "optimizer.lr=2e-4,nan", *FAST, f"hydra.sweep.dir={tmp_path}"],
                   check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "invalid cell 1 (lora.r=8,optimizer.lr=nan" in proc.stderr and "optimizer.lr must be > 0, got nan" in proc.stderr
    assert "invalid cell 2 (lora.r=0" in proc.stderr and "lora.r must be > 0, got 0" in proc.stderr
    assert "4 cells, none run" in proc.stderr and not list(tmp_path.glob("[0-9]*"))  # no cell ran


def test_a_report_baseline_that_names_no_cell_stops_in_preflight(tmp_path):
    proc = run_cli("train.py", ["-m", "batch=2,3", "report.baseline=99", *FAST, f"hydra.sweep.dir={tmp_path}"],
                   check=False)
    assert proc.returncode == 2 and "report.baseline='99' names no cell" in proc.stderr
    assert not list(tmp_path.glob("[0-9]*"))


def test_hub_ids_with_offline_mode_off_and_no_network_fail_in_seconds(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=0 on a machine without a route to the hub: one line naming the id and the
    setting within 15 s (the loaders' retries took 77 s), before any data or model is built."""
    import time

    import huggingface_hub.constants
    import huggingface_hub.hf_api

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    # huggingface_hub reads its switch and endpoint once, at import (this process imported it offline): set as a
    # train.py started with HF_HUB_OFFLINE=0 and HF_ENDPOINT would have them. Nothing listens at port 9.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.hf_api.api, "endpoint", "http://127.0.0.1:9")
    for overrides, words in ((["model.path=mistralai/Mistral-7B-v0.3"], ["model.path='mistralai/Mistral-7B-v0.3'"]),
                             (["data=hf", "data.path=org/no-such-set"], ["data.path='org/no-such-set'"])):
        t0 = time.time()
        r = run_in_process([*FAST, *overrides], tmp_path / overrides[-1].split("=")[0])
        assert time.time() - t0 < 15 and r.exit_code == 2 and r.model is None
        for w in [*words, "OFFLINE=0", "set) did not answer"]:
            assert w in r.error, (w, r.error)


def test_bench_report_of_a_file_says_it_is_a_file(tmp_path):
    f = tmp_path / "results.csv"
    f.write_text("x\n")
    proc = run_cli("bench.py", [f"sweep_dir={f}"], check=False)
    assert proc.returncode != 0 and "is a file" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("triton_version, tilelang, unsloths, refused", [
    ("3.6.0", False, False, True), ("3.7.1", False, False, False), ("3.3.1", False, False, False),
    ("3.6.0", True, False, False), ("3.6.0", False, True, False)])
def test_fla_on_hopper_under_an_old_triton_is_refused_before_the_model(monkeypatch, triton_version, tilelang, unsloths,
                                                                       refused):
    """flash-linear-attention raises only at the first backward of a Hopper GPU under Triton 3.4.0 to 3.7.0, after
    the model is built, unless TileLang takes its kernel: the device check says so for a model with linear
    attention, and lets another Triton, TileLang, or Unsloth's own copy of fla (its `fla` module marked) run."""
    import importlib.metadata
    import importlib.util
    import sys
    import types

    import torch

    from lorabench.models import architecture_of
    from lorabench.run import checks
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda n: triton_version if n == "triton" else real_version(n))
    real_find_spec = importlib.util.find_spec
    present = {"fla", "tilelang"} if tilelang else {"fla"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: object() if n in present else None if n == "tilelang" else real_find_spec(n, *a))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    if unsloths:  # what unsloth_zoo registers as `fla` when Unsloth is imported
        monkeypatch.setitem(sys.modules, "fla", types.SimpleNamespace(**{checks.UNSLOTH_FLA_MARK: True}))
    cuda = torch.device("cuda", 0)
    qwen35 = OmegaConf.to_object(compose_cfg(["model=qwen3.5-9b", "precision=bf16"]))
    if refused:
        with pytest.raises(RuntimeError, match=r"model=qwen3.5-9b: flash-linear-attention .* Triton 3.6.0"):
            checks.check_model_on(qwen35, cuda, architecture_of(qwen35.model))
    else:
        checks.check_model_on(qwen35, cuda, architecture_of(qwen35.model))
    mistral = OmegaConf.to_object(compose_cfg(["precision=bf16"]))
    checks.check_model_on(mistral, cuda, architecture_of(mistral.model))


def test_fast_lets_fla_through_on_hopper_where_the_keys_take_another_tile(monkeypatch):
    """backend=fast (fla_on_hopper): Qwen3.5-9B's 128-wide key heads take fla's 128 tile, which Triton 3.6 compiles
    right: not refused; 64-wide ones take the miscompiled tile: refused as for hf."""
    import importlib.metadata
    import importlib.util

    import torch

    from lorabench.models import architecture_of
    from lorabench.run import checks
    real_version, real_find_spec = importlib.metadata.version, importlib.util.find_spec
    monkeypatch.setattr(importlib.metadata, "version", lambda n: "3.6.0" if n == "triton" else real_version(n))
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: object() if n == "fla" else None if n == "tilelang" else real_find_spec(n, *a))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cuda = torch.device("cuda", 0)
    fast = OmegaConf.to_object(compose_cfg(["model=qwen3.5-9b", "precision=bf16", "backend=fast"]))
    checks.check_model_on(fast, cuda, architecture_of(fast.model))
    narrow = OmegaConf.to_object(compose_cfg(["model=qwen3.5-9b", "precision=bf16", "backend=fast",
                                              "model.hf_config.linear_key_head_dim=64"]))
    with pytest.raises(RuntimeError, match=r"flash-linear-attention .* Triton 3.6.0"):
        checks.check_model_on(narrow, cuda, architecture_of(narrow.model))
