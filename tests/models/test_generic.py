"""A family lorabench has no row for trains with backend=hf as transformers builds it, and says so.

GPT-NeoX keeps its layers at gpt_neox.layers with one fused query_key_value projection; DeepSeek-V3 projects
its attention through low-rank matrices (MLA) and mixes dense, shared-expert and routed-expert MLPs. Neither
has a row: their counts, FLOPs and LoRA targets come from the built model (lorabench.models.census). A
vision-language config is refused in one line before anything is built.
"""

import json

import pytest
import torch
from conftest import TINY_SHAPE, compose_cfg, run_in_process, spy
from omegaconf import OmegaConf
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

from lorabench.builders import modeling
from lorabench.models import Architecture, architecture_of
from lorabench.run import checks

CELL = ["data=synthetic", "seq_len=16", "batch=4", "data.max_samples=4", "train.max_steps=3",
        "train.untimed_steps=1", "lora.r=4", "lora.dropout=0"]
MLA = dict(q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)


def save(path, model_type, **keys):
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **keys)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    shape = {k: v for k, v in TINY_SHAPE.items() if k not in ("num_key_value_heads",)}
    return save(tmp_path_factory.mktemp("neox") / "tiny-neox", "gpt_neox", **shape)


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return save(tmp_path_factory.mktemp("deepseek") / "tiny-deepseek", "deepseek_v3", **TINY_SHAPE, **MLA,
                n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                first_k_dense_replace=1, n_group=2, topk_group=1)


def test_a_family_without_a_row_trains_on_hf_and_says_so(neox, tmp_path, monkeypatch):
    built = spy(monkeypatch, modeling, "apply_lora")
    r = run_in_process([f"model.path={neox}", *CELL, "lora.target_modules=[all-linear]"], tmp_path)
    assert r.status.value == "ok", r.error
    assert r.metrics["train/loss_final"] < r.metrics["train/loss_first"]
    assert r.model["model_type"] == "gpt_neox" and r.model["family"].startswith("generic: model_type=gpt_neox")
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["model"]["family"] == r.model["family"]
    # all-linear: every linear layer of a decoder layer, by its own name
    adapted = {n.split(".")[-1] for n, m in built[0].named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}
    arch = Architecture.from_hf_config(built[0].config)
    assert r.model["trainable"] == arch.lora_params(tuple(adapted), 4)
    # FLOPs: 4 per active matmul weight and 6 per adapter weight a token, plus attention over its pairs
    assert r.metrics["perf/model_tflops"] > 0 and r.model["base_matmul"] == arch.matmul_params()


def test_a_target_that_matches_nothing_names_the_modules_that_exist(neox):
    c = OmegaConf.to_object(compose_cfg([f"model.path={neox}", "data=synthetic", "lora.target_modules=[q_proj]"]))
    with pytest.raises(ValueError, match=r"'q_proj' is not a linear layer of model_type=gpt_neox; use any of "
                                         r"\['query_key_value', 'dense', 'dense_h_to_4h', 'dense_4h_to_h'\]"):
        checks.check_values(c)


def test_peft_gets_the_targets_asked_for_on_a_deepseek_moe(deepseek, tmp_path, monkeypatch):
    """PEFT rewrites gate/up/down_proj into the 3-D experts for DeepSeek (adapters trained on transformers 4):
    lorabench asks in the built model's names, so the dense and shared-expert MLPs keep their adapters, and
    the experts get theirs with lora.experts alone."""
    built = spy(monkeypatch, modeling, "apply_lora")
    r = run_in_process([f"model.path={deepseek}", *CELL, "lora.target_modules=[all-linear]"], tmp_path / "a")
    assert r.status.value == "ok", r.error
    names = {n for n, m in built[0].named_modules() if hasattr(m, "lora_A")}
    assert any(n.endswith("shared_experts.gate_proj") for n in names)
    assert any(n.endswith("layers.0.mlp.gate_proj") for n in names)  # the dense first layer
    assert r.model["lora_expert_weights"] == 0 and not any(".experts" in n for n in names)
    r = run_in_process([f"model.path={deepseek}", *CELL, "lora.target_modules=[all-linear]", "lora.experts=true"],
                       tmp_path / "b")
    assert r.status.value == "ok", r.error
    assert r.model["lora_expert_weights"] == 2  # gate_up_proj and down_proj of the one MoE layer


def test_a_vision_language_checkpoint_is_refused_in_one_line(tmp_path):
    path = tmp_path / "tiny-llava"
    path.mkdir()
    (path / "config.json").write_text(AutoConfig.for_model("llava").to_json_string())
    save_file({"w": torch.zeros(1)}, path / "model.safetensors")  # (the checks look for weights first)
    c = OmegaConf.to_object(compose_cfg([f"model.path={path}", "data=synthetic"]))
    with pytest.raises(ValueError) as refused:
        checks.check_values(c)
    line = str(refused.value)
    assert "\n" not in line and len(line) < 400, line
    assert "model_type='llava': transformers builds no causal LM for it" in line


def test_the_census_counts_what_transformers_builds():
    """Every parameter the built model holds, and its matmul weights; the FLOPs of a token follow."""
    cfg = AutoConfig.for_model("deepseek_v3", **TINY_SHAPE, **MLA, n_routed_experts=4, n_shared_experts=1,
                               num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, n_group=2,
                               topk_group=1)
    arch = Architecture.from_hf_config(cfg)
    model = AutoModelForCausalLM.from_config(cfg)
    assert arch.total_params() == sum(p.numel() for p in model.parameters())
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert arch.matmul_params() == linear + experts and arch.expert_params() == experts
    assert arch.matmul_params(active=True) == linear + experts // 2  # top-2 of 4
    assert not arch.known and architecture_of is not None


def test_a_config_in_another_library_s_wrapper_is_read_as_its_model_type_s():
    """Unsloth hands Gemma 4's text config out in a proxy that forwards every attribute but has no class methods
    (from_dict): the architecture read from it is the one read from the config itself."""
    from conftest import tiny_config

    class Proxy:  # the shape of unsloth_zoo's _Gemma4KVSharedSafeProxy
        __slots__ = ("_real",)

        def __init__(self, real):
            object.__setattr__(self, "_real", real)

        def __getattr__(self, name):
            return getattr(self._real, name)

        def get_text_config(self, decoder=None, encoder=None):
            return self

    cfg = tiny_config("gemma4_text")
    arch = Architecture.from_hf_config(cfg)
    wrapped = Architecture.from_hf_config(Proxy(cfg))
    assert wrapped.census == arch.census and wrapped.total_params() == arch.total_params() > 0
