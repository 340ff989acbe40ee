"""Bad input is rejected before any model is built, with a message that names the bad value and
what is accepted. Composition and schema checks here are instant; cell-level ones run the cell
(tokenizer, data) up to its checks. More cases: test_train.py (impossible cells: nf4/int8/fp16 or a
CUDA-only optimizer on CPU, seq_len past the model's positions, r above the hidden size, device=cuda
without one), test_data.py (broken data files, with file:line), test_distributed.py (more
processes than GPUs), test_gpu.py (a memory budget larger than the device)."""

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
    ("train.timing_warmup_steps=100", ["train.timing_warmup_steps must be in [0, train.max_steps=100)", "100"]),
    ("train.grad_accum=0", ["train.grad_accum must be > 0", "0"]),
    ("train.nproc=0", ["train.nproc must be > 0", "0"]),
    ("train.save_steps=-1", ["train.save_steps must be >= 0", "-1"]),
    ("gpu.price_per_hour=-0.6", ["gpu.price_per_hour must be >= 0", "-0.6"]),
    ("gpu.spot_price_per_hour=-1", ["gpu.spot_price_per_hour must be >= 0", "-1"]),
    ("data.max_samples=0", ["data.max_samples must be > 0", "0"]),
    ("data.num_workers=-2", ["data.num_workers must be >= 0", "-2"]),
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

    from lorabench.modeling import mistral_config

    d = tmp_path / "ckpt"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(mistral_config(OmegaConf.to_object(compose_cfg()).model)).save_pretrained(d)
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
    (["data=synthetic", "data.packing=true"], ["data.packing=true with data=synthetic"]),
    (["data=jsonl", "data.path=/no/such/train.jsonl"], ["/no/such/train.jsonl"]),
], ids=["unknown-target-module", "missing-model-path", "conflicting-packing", "missing-data-file"])
def test_impossible_combinations_fail_before_the_model_is_built(tmp_path, overrides, words):
    r = run_in_process([*FAST, *overrides], tmp_path)
    assert r.status.value == "failed" and r.model is None, r.error
    for w in words:
        assert w in r.error, (w, r.error)


def test_an_output_dir_that_cannot_be_written_is_named(tmp_path):
    proc = run_cli("train.py", [*FAST, "hydra.run.dir=/proc/lorabench-cannot-write"], check=False)
    assert proc.returncode != 0 and "/proc/lorabench-cannot-write" in proc.stderr
