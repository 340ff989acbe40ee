"""precision.experts_nf4: an MoE model's 3-D expert weights held in nf4 and dequantised around each forward compute
the model whose experts are those dequantised values, bit for bit, with and without PEFT's expert adapters and with
the layers recomputed; between forwards the expert weights hold no memory."""

import pytest
import torch
from conftest import tiny_config

from lorabench.builders import experts_nf4

MOE = ["gpt_oss", "qwen3_moe"]


def tiny_moe(model_type: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(model_type)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="eager")


def with_rounded_experts(model):
    """The reference: the same model, each expert weight replaced for good by its nf4 round trip."""
    from bitsandbytes import functional as bnbf

    for _, module, keys in experts_nf4.expert_modules(model):
        for key in keys:
            p = module._parameters[key]
            p.data = bnbf.dequantize_4bit(*experts_nf4.quantise(p.data, True))
    return model


def batch(model, n: int = 2, seq: int = 12):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (n, seq), generator=g)
    return {"input_ids": ids, "labels": ids}


@pytest.mark.parametrize("model_type", MOE)
def test_the_quantised_experts_compute_the_model_of_their_rounded_weights(model_type):
    quantised, reference = tiny_moe(model_type), with_rounded_experts(tiny_moe(model_type))
    n = experts_nf4.quantise_experts(quantised)
    assert n == 2 * quantised.config.num_hidden_layers  # gate/up and down in each layer
    for _, module, keys in experts_nf4.expert_modules(quantised):  # between forwards: one value each, no memory
        assert all(module._parameters[k].untyped_storage().nbytes() <= 2 for k in keys)
    with torch.no_grad():
        out, ref = quantised(**batch(quantised)), reference(**batch(reference))
    assert torch.equal(out.logits, ref.logits)
    # 4 bits a weight and one 8-bit scale per 64 (double quantisation: the scales' own fp32 scales, per 256 of them)
    weights = sum(quantised.get_parameter(f"{name}.{k}").numel() for name, _, keys in
                  experts_nf4.expert_modules(quantised) for k in keys)
    assert weights / 2 + weights / 64 <= experts_nf4.nf4_bytes(quantised) <= weights / 2 + weights / 64 * 1.1


@pytest.mark.parametrize("model_type", MOE)
@pytest.mark.parametrize("recomputed", [False, True])
@pytest.mark.parametrize("on_experts", [True, False])
def test_lora_with_quantised_experts_trains_as_with_their_rounded_weights(model_type, recomputed, on_experts):
    """PEFT's expert adapters (a parametrisation over the expert weight, registered for each forward) see the
    dequantised weight, and the backward of the experts' matmuls the weight their forward saw (the attention's
    adapters below them get their gradient through it): the loss and every LoRA gradient equal the reference's,
    also with each layer recomputed in the backward (its experts dequantised again)."""
    from peft import LoraConfig, get_peft_model

    from lorabench.builders.modeling import expert_weights
    from lorabench.models import Architecture

    grads = []
    for model in (tiny_moe(model_type), with_rounded_experts(tiny_moe(model_type))):
        if not grads:
            experts_nf4.quantise_experts(model)
        if recomputed:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        targets = expert_weights(Architecture.from_hf_config(model.config)) if on_experts else None
        torch.manual_seed(2)  # the same adapters' initial values in both
        peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj"],
                                                target_parameters=targets, init_lora_weights=False))
        peft.train()
        loss = peft(**batch(peft)).loss
        loss.backward()
        grads.append((loss.item(), {n: p.grad for n, p in peft.named_parameters() if p.requires_grad}))
    (loss, g), (loss_ref, g_ref) = grads
    assert loss == loss_ref
    assert g.keys() == g_ref.keys() and any(".experts" in n for n in g) == on_experts
    for n in g:
        assert torch.equal(g[n], g_ref[n]), n


def test_a_model_without_3d_experts_is_refused_by_name():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config("llama"))
    with pytest.raises(ValueError, match="precision.experts_nf4: LlamaForCausalLM has no 3-D expert weights"):
        experts_nf4.quantise_experts(model)


def test_experts_nf4_needs_nf4():
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    with pytest.raises(ValueError, match="precision.experts_nf4=true needs precision=nf4, not bf16"):
        OmegaConf.to_object(compose_cfg(["precision=bf16", "precision.experts_nf4=true"]))


def test_random_experts_are_drawn_one_at_a_time_as_they_are_quantised():
    """Random weights (no model.path): the loader sets each expert weight as one value at every index, and each is
    drawn normal(0, initializer_range) only just before it is quantised: the bf16 experts never exist together."""
    from transformers import AutoModelForCausalLM

    from lorabench.builders import modeling

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(tiny_config("gpt_oss", initializer_range=0.1),
                                                    dtype=torch.bfloat16)
    weights = modeling.random_state_dict(skeleton, torch.device("cpu"), later=True)
    later = sorted(n for n, w in weights.items() if isinstance(w, modeling.LaterWeight))
    assert later == sorted(f"{name}.{k}" for name, _, keys in experts_nf4.expert_modules(skeleton) for k in keys)
    model = type(skeleton).from_pretrained(None, config=skeleton.config, state_dict=weights, dtype=torch.bfloat16,
                                           device_map={"": "cpu"})
    assert all(model.get_parameter(n).untyped_storage().nbytes() <= 2 for n in later)
    experts_nf4.quantise_experts(model, draw_std=0.1)
    from bitsandbytes import functional as bnbf

    for _, module, _ in experts_nf4.expert_modules(model):
        for q in module.lorabench_nf4:
            w = bnbf.dequantize_4bit(q.words, q.state).float()
            # 4 x 64 x 64 draws: the sample std's standard error is 0.1 / sqrt(2 x 16,384) = 0.0006; nf4's rounding
            # adds about 0.1 x 0.1 relative noise, uncorrelated: 0.1 x sqrt(1 + 0.01) - 0.1 = 0.0005
            assert abs(w.std().item() - 0.1) < 0.005 and abs(w.mean().item()) < 0.005


def test_the_loader_reserves_no_more_than_the_quantised_model_holds(monkeypatch):
    """Before it loads a weight, transformers reserves on the GPU one block of the bytes it counts for all of them
    (caching_allocator_warmup), capped at the device's memory, not at a cell's emulated budget. Counting the experts
    drawn later at bf16 (four times their nf4 words), that block ran gpt-oss-20b's cells within 22 GiB out of memory
    before a weight was placed (38 GiB asked). What it would reserve is recorded here (on the CPU it reserves
    nothing): at most the bytes the loaded, quantised model holds."""
    from conftest import compose_cfg
    from omegaconf import OmegaConf
    from transformers import modeling_utils

    from lorabench.builders import modeling
    from lorabench.run import sharding

    asked = []

    def warmup(model, device_map, quantizer):  # the bytes transformers' warmup counts (get_total_byte_count)
        def size(name):
            p = model.get_parameter_or_buffer(name)
            return p.numel() * (quantizer.param_element_size(model, name, p) if quantizer else p.element_size())
        asked.append(sum(size(name) for name in device_map))

    monkeypatch.setattr(modeling_utils, "caching_allocator_warmup", warmup)
    tiny = ["model.num_hidden_layers=2", "model.hidden_size=64", "model.intermediate_size=64",
            "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.head_dim=16", "model.vocab_size=256",
            "model.hf_config.num_local_experts=4", "++model.hf_config.pad_token_id=0"]
    cfg = OmegaConf.to_object(compose_cfg(["model=gpt-oss-20b", "precision=nf4", "precision.experts_nf4=true",
                                           "data=synthetic", *tiny]))
    model, _ = modeling.build_model(cfg, torch.device("cpu"))
    assert sum(asked) <= sharding.held_bytes(model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpt_oss_experts_in_nf4_load_and_train_within_their_quantised_size():
    """On the GPU, nf4 with precision.experts_nf4: two layers of gpt-oss-20b load without their bf16 experts (the
    peak under the quantised model plus one expert weight in bf16 and the quantiser's workspace) and a step runs."""
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    from lorabench.builders import modeling

    cfg = OmegaConf.to_object(compose_cfg(["model=gpt-oss-20b", "model.num_hidden_layers=2", "precision=nf4",
                                           "precision.experts_nf4=true", "data=synthetic"]))
    device = torch.device("cuda")
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model, _ = modeling.build_model(cfg, device)
    held = torch.cuda.memory_allocated() - base
    gate_up = 32 * 2880 * 5760 * 2  # one layer's gate/up experts in bf16: 1.06 GB
    assert torch.cuda.max_memory_allocated() - base < held + 3 * gate_up
    weights = 2 * 32 * 2880 * (5760 + 2880)  # two layers' experts
    # half a byte a weight, and with double quantisation one byte of scale a block of 64 (whole blocks here)
    assert experts_nf4.nf4_bytes(model) == weights * (1 / 2 + 1 / 64)
    ids = torch.randint(0, 1000, (1, 64), device=device)
    model(input_ids=ids, labels=ids).loss.backward()


def test_experts_nf4_is_refused_where_it_cannot_run():
    """One line each, before any model loads: a dense model, a backend that builds its model its own way, and
    several processes (DDP's broadcast and FSDP's shards of the parameters it replaces were not checked)."""
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    from lorabench.models import architecture_of
    from lorabench.run import checks

    base = ["model=gpt-oss-20b", "precision=nf4", "precision.experts_nf4=true", "data=synthetic"]
    for extra, message in ((["model=llama-3.1-8b"], "llama-3.1-8b \\(llama\\) has no experts"),
                           (["backend=unsloth"], "runs with backend=hf or fast.*got backend=unsloth"),
                           (["train.nproc=2", "train.parallel=fsdp"], "in one process \\(got backend=hf, 2 processes"),
                           (["train.nproc=2"], "2 processes")):
        c = OmegaConf.to_object(compose_cfg([*base, *extra]))
        with pytest.raises(ValueError, match=message):
            checks.check_targets(c, architecture_of(c.model))
    c = OmegaConf.to_object(compose_cfg([*base, "backend=fast"]))
    checks.check_targets(c, architecture_of(c.model))


def test_the_weights_a_cell_records_count_the_experts_as_nf4():
    """metrics.json's mem/weights_gib: the quantised experts as their nf4 words and scales, not at the bf16 size
    their parameters' shapes say."""
    from lorabench.run import sharding

    model = tiny_moe("gpt_oss")
    before = sharding.held_bytes(model)
    experts = sum(module._parameters[k].numel() for _, module, keys in experts_nf4.expert_modules(model)
                  for k in keys)
    experts_nf4.quantise_experts(model)
    assert sharding.held_bytes(model) == before - 2 * experts + experts_nf4.nf4_bytes(model)
