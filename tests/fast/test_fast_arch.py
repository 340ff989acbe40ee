"""backend=fast on every architecture it meets: the same model as backend=hf, or refused by name.

Each architecture is a tiny random model built from its transformers config class (2 layers, hidden 64,
vocab 256), its features made visible: random biases and norm weights (transformers starts biases at 0
and norms at 1 or 0), a sliding window shorter than the sequence, Gemma's soft-capping at 2 (at its
default 50 a tiny model's logits would never reach it), explicit head_dim != hidden / heads (Qwen3).

On CPU the fast path's parts that run there (Liger off: its kernels are Triton) are compared with hf in
float64: every difference is round-off, at most ~n x 2^-53 for a sum of n terms (n <= 256 here: 3e-14),
so 1e-10 of a tensor's norm is 3 orders of magnitude above it, and far below what a missing bias, norm,
soft-cap or scale changes (1e-3 and more). The GPU tests do it in bf16 with Liger on.
"""

import contextlib
import copy
import functools
import importlib.util
import inspect

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, TINY_SHAPE, breadth, compose_cfg, requires_cuda, run_in_process, tiny_config
from omegaconf import OmegaConf

from lorabench.builders import modeling
from lorabench.core.results import CellSkipped
from lorabench.fast import parts
from lorabench.models import FAMILIES
from lorabench.run import backends

VOCAB = 256
SEQ = 16  # tokens a sample: longer than every tiny checkpoint's sliding window (families.WINDOW)


def arch_config(model_type: str, **shape):
    """The tiny config of `model_type` (its family's row), `shape` over it."""
    return tiny_config(model_type, vocab_size=VOCAB, max_position_embeddings=128, use_cache=False, **shape)


# The parts of backend=fast each architecture refuses, first in the table's order, with the line's gist,
# and the settings that leave out all it refuses (what the comparison with hf runs).
REFUSED = {
    "gemma2": ("varlen_attention is flash attention, without logit soft-capping; gemma2 caps attention logits at 2",
               ["backend.varlen_attention=false", "backend.fused_add_norm=false"]),
    "gemma3_text": ("fused_add_norm computes Mistral's decoder layer", ["backend.fused_add_norm=false"]),
    "qwen3_moe": ("fused_mlp computes dense gated MLPs; qwen3_moe routes tokens to experts (MoE)",
                  ["backend.fused_mlp=false", "backend.cuda_graphs=false"]),
    "mixtral": ("fused_mlp computes dense gated MLPs; mixtral routes tokens to experts (MoE)",
                ["backend.fused_mlp=false", "backend.cuda_graphs=false"]),
    # the families of 2026: their attention is none of the fused path's (fused_lora off: fused_linear takes
    # their adapted projections one at a time); of their layers, Qwen3.5's is computed (fused_add_norm), no other
    **{t: ("packing puts several samples in a row; " + t + "'s linear-attention layers carry a state along the row",
           ["data.packing=false", "backend.varlen_attention=false", "backend.fused_lora=false",
            "backend.fused_linear=false", *moe]) for t, moe in
       (("qwen3_5_text", []), ("qwen3_5_moe_text", ["backend.fused_add_norm=false", "backend.fused_mlp=false",
                                                   "backend.cuda_graphs=false"]))},
    **{t: ("varlen_attention replaces the attention of mistral/llama/qwen2/qwen3/qwen3_moe/mixtral/gemma2/"
           f"gemma3_text/phi3/granite; {t} is not among them",
           ["backend.varlen_attention=false", "backend.fused_lora=false", *rest]) for t, rest in (
        ("gemma4_text", ["backend.fused_mlp=false", "backend.fused_add_norm=false", "backend.cuda_graphs=false"]),
        ("gpt_oss", ["backend.flex_attention=false", "backend.fused_mlp=false", "backend.fused_add_norm=false",
                     "backend.cuda_graphs=false"]),
        ("llama4_text", ["backend.fused_mlp=false", "backend.fused_add_norm=false", "backend.cuda_graphs=false"]),
        ("olmo3", ["backend.fused_add_norm=false"]), ("olmo2", ["backend.fused_add_norm=false"]),
        ("ministral3", []), ("smollm3", []))},
    "granite": ("fused_add_norm computes Mistral's decoder layer", ["backend.fused_add_norm=false"]),
}
ARCHS = list(FAMILIES)
# make test: the plain decoder, fused q/k/v (Phi-3), soft-capped eager attention (Gemma-2), linear attention
# (Qwen3.5), routed experts (Qwen3-MoE), experts with attention sinks (gpt-oss); make test-all: every family
QUICK_ARCHS = ("llama", "phi3", "gemma2", "qwen3_5_text", "qwen3_moe", "gpt_oss")


@functools.lru_cache(maxsize=None)
def cfg(*overrides):
    """The typed config of `overrides` (composed once: Hydra's composition is most of a CPU test's time)."""
    return OmegaConf.to_object(compose_cfg(list(overrides)))


def fast_cfg(*overrides):
    return cfg("backend=fast", "backend.liger=[]", *overrides)


@pytest.mark.parametrize("model_type", ARCHS)
def test_fast_parts_are_checked_against_the_architecture(model_type):
    """backend=fast (Liger off) passes the check, or is refused as skipped with one line naming the part and
    the feature, and passes once that part is off."""
    hf, cpu = arch_config(model_type), torch.device("cpu")
    if model_type not in REFUSED:
        parts.check_parts(fast_cfg(), hf, cpu)
        return
    gist, offs = REFUSED[model_type]
    with pytest.raises(CellSkipped) as refused:
        parts.check_parts(fast_cfg(), hf, cpu)
    line = str(refused.value)
    assert line.startswith("backend=fast: ") and gist in line and "\n" not in line, line
    assert "(use backend=hf, or backend." in line or "(use backend=hf, or data.packing=false" in line
    parts.check_parts(fast_cfg(*offs), hf, cpu)


def test_every_key_of_backend_fast_is_a_part_of_the_table():
    """The home lists every part backend=fast turns on (conf/backend/fast.yaml), each with a stage, once
    (fit_parts is how the parts are checked, not a part)."""
    from conftest import CONF

    fast = OmegaConf.load(CONF / "backend" / "fast.yaml")  # (global package: backend.* and data.packing)
    keys = (set(fast.backend) - {"name", "fit_parts"}) | ({"packing"} if fast.data.packing else set())
    listed = [p.key for p in parts.PARTS]
    assert keys <= set(listed) and len(listed) == len(set(listed)), keys - set(listed)
    assert [p.key for p in parts.parts_on(fast_cfg("backend.liger=[rope]"))] == \
        [p.key for p in parts.PARTS if p.key in keys]


def test_every_backend_key_but_name_fit_parts_and_unsloth_s_is_a_part_described_in_the_table():
    """BackendConfig's keys are the parts of PARTS (packing is data.packing) and name, fit_parts and Unsloth's three
    (unsloth_offload, unsloth_tiled_mlp, unsloth_fused_lora), which are not parts: each part's description lives in
    PARTS alone."""
    import dataclasses

    from lorabench.core.config import BackendConfig

    keys = {f.name for f in dataclasses.fields(BackendConfig)} - {"name", "fit_parts", "unsloth_offload",
                                                                   "unsloth_tiled_mlp", "unsloth_fused_lora"}
    assert keys == {p.key for p in parts.PARTS} - {"packing"}
    assert all(p.what and not p.what.endswith(".") for p in parts.PARTS)


def test_the_trainer_s_parts_act_where_the_table_says_they_need():
    """What lorabench.run.loop hands the Trainer comes from the table: cuda_graphs acts through fused_lora and on CUDA
    only (elsewhere the cell runs without it), gc_every where it is not 0, the others where they are on; the
    collator's sample offsets where packed rows go through varlen attention (CUDA, data with padding to pack)."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    acting = parts.trainer_parts(fast_cfg(), cuda)
    assert acting == parts.TrainerParts(flat_optimizer=True, lean_step=True, cuda_graphs=True, gc_every=0,
                                          segments=True)
    assert not parts.trainer_parts(fast_cfg(), cpu).cuda_graphs
    for c, device in ((fast_cfg(), cpu), (fast_cfg("data=synthetic"), cuda),
                      (fast_cfg("backend.varlen_attention=false"), cuda)):
        assert not parts.trainer_parts(c, device).segments
    assert not parts.trainer_parts(fast_cfg("backend.fused_lora=false"), cuda).cuda_graphs
    off = parts.trainer_parts(fast_cfg("backend.flat_optimizer=false", "backend.lean_step=false",
                                          "backend.gc_every=50"), cpu)
    assert (off.flat_optimizer, off.lean_step, off.gc_every) == (False, False, 50)


def test_liger_patch_is_refused_where_the_architecture_lacks_what_its_kernel_computes():
    """Liger's RoPE rotates whole heads (Phi-4-mini rotates 3/4 of each), and an architecture Liger has no
    patch for is refused by name; the check is the architecture's, whatever the device (on this CPU too,
    before Liger's need of CUDA is)."""
    cpu = torch.device("cpu")
    with pytest.raises(CellSkipped, match=r"liger rope rotates the whole head; phi3 rotates 0.75 of it .*"
                                          r"backend.liger=\[rms_norm,swiglu,fused_linear_cross_entropy\]"):
        parts.check_parts(fast_cfg("backend.liger=[rms_norm,rope,swiglu,fused_linear_cross_entropy]"),
                             arch_config("phi3"), cpu)
    from transformers import GPT2Config

    with pytest.raises(CellSkipped, match="liger has no Liger patch for gpt2"):
        parts.check_parts(fast_cfg("backend.liger=[rms_norm]", "backend.varlen_attention=false"),
                          GPT2Config(n_layer=2), cpu)
    from transformers import Gemma3Config

    with pytest.raises(CellSkipped, match="fused_lora computes the attention of .*; gemma3 is not among them"):
        # Gemma-3 with its vision tower (the parts before fused_lora refuse it too, each by name)
        parts.check_parts(fast_cfg("backend.varlen_attention=false", "backend.chunked_loss=false"), Gemma3Config(),
                          cpu)
    gemma = arch_config("gemma2")
    gemma.hidden_activation = "gelu"  # exact GELU: Liger's GeGLU computes the tanh approximation
    with pytest.raises(CellSkipped, match="swiglu is Liger's geglu kernel for gemma2 .* its MLP uses gelu"):
        parts.check_parts(fast_cfg("backend.liger=[swiglu]", "backend.varlen_attention=false",
                                      "backend.fused_add_norm=false"), gemma, cpu)


def test_fused_forwards_are_refused_under_another_transformers_release(monkeypatch):
    """lorabench.fast.fused's attention forward and lorabench.fast.delta_net's Gated DeltaNet layer are the pinned
    transformers release's: under any other they are refused, a patch release too (its forwards may differ)."""
    import transformers

    assert f"transformers=={parts.FORWARDS_OF}" in (REPO / "pyproject.toml").read_text()
    for other in ("5.17.1", "6.0.0"):
        monkeypatch.setattr(transformers, "__version__", other)
        line = rf"fused_lora computes transformers 5.17.0's attention forwards; transformers {other} is installed "
        with pytest.raises(CellSkipped, match=line + r"\(use backend=hf, or backend.fused_lora=false\)"):
            parts.check_parts(fast_cfg(), arch_config("llama"), torch.device("cpu"))
        # Qwen3.5's Gated DeltaNet layer (lorabench.fast.delta_net) likewise
        assert parts._delta_net_lacks(parts.features(arch_config("qwen3_5_text")), None).off == {
            "fla_delta_net": False}
    monkeypatch.undo()
    assert parts._delta_net_lacks(parts.features(arch_config("qwen3_5_text")), None) is None


# The source of every forward the fast path copies, as it was when its copy was checked against it (sha256,
# first 16 hex digits). A new transformers release that changes one fails here, naming it: compare the copy
# (lorabench.fast.fused, lorabench.fast.kernels.norm, lorabench.fast.delta_net) with the new forward before updating
# its digest.
COPIED = {
    "transformers.models.mistral.modeling_mistral.MistralAttention.forward": "98e841a5cfbac696",
    "transformers.models.llama.modeling_llama.LlamaAttention.forward": "dc6807936ef6103d",
    "transformers.models.qwen2.modeling_qwen2.Qwen2Attention.forward": "3d7ae1485294d0c8",
    "transformers.models.qwen3.modeling_qwen3.Qwen3Attention.forward": "6c8fb032ff374243",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeAttention.forward": "6c8fb032ff374243",
    "transformers.models.mixtral.modeling_mixtral.MixtralAttention.forward": "98e841a5cfbac696",
    "transformers.models.gemma2.modeling_gemma2.Gemma2Attention.forward": "7da2c26d036c4a65",
    "transformers.models.gemma3.modeling_gemma3.Gemma3Attention.forward": "c96be90cc1da325e",
    "transformers.models.phi3.modeling_phi3.Phi3Attention.forward": "609bcef01ad9d046",
    "transformers.models.granite.modeling_granite.GraniteAttention.forward": "dc6807936ef6103d",
    "transformers.models.mistral.modeling_mistral.MistralMLP.forward": "03df2d7685cf8446",
    "transformers.models.llama.modeling_llama.LlamaMLP.forward": "03df2d7685cf8446",
    "transformers.models.qwen2.modeling_qwen2.Qwen2MLP.forward": "03df2d7685cf8446",
    "transformers.models.qwen3.modeling_qwen3.Qwen3MLP.forward": "03df2d7685cf8446",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeMLP.forward": "03df2d7685cf8446",
    "transformers.models.gemma2.modeling_gemma2.Gemma2MLP.forward": "03df2d7685cf8446",
    "transformers.models.gemma3.modeling_gemma3.Gemma3MLP.forward": "03df2d7685cf8446",
    "transformers.models.phi3.modeling_phi3.Phi3MLP.forward": "42b4de3cc6a5ab01",
    "transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5MLP.forward": "03df2d7685cf8446",
    "transformers.models.olmo3.modeling_olmo3.Olmo3MLP.forward": "03df2d7685cf8446",
    "transformers.models.olmo2.modeling_olmo2.Olmo2MLP.forward": "03df2d7685cf8446",
    "transformers.models.granite.modeling_granite.GraniteMLP.forward": "03df2d7685cf8446",
    "transformers.models.ministral3.modeling_ministral3.Ministral3MLP.forward": "03df2d7685cf8446",
    "transformers.models.smollm3.modeling_smollm3.SmolLM3MLP.forward": "03df2d7685cf8446",
    "transformers.models.mistral.modeling_mistral.MistralDecoderLayer.forward": "75d1d62e173e8c57",
    "transformers.models.llama.modeling_llama.LlamaDecoderLayer.forward": "75d1d62e173e8c57",
    "transformers.models.qwen2.modeling_qwen2.Qwen2DecoderLayer.forward": "75d1d62e173e8c57",
    "transformers.models.qwen3.modeling_qwen3.Qwen3DecoderLayer.forward": "75d1d62e173e8c57",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeDecoderLayer.forward": "75d1d62e173e8c57",
    "transformers.models.mixtral.modeling_mixtral.MixtralDecoderLayer.forward": "681505db8893a5b7",
    "transformers.models.phi3.modeling_phi3.Phi3DecoderLayer.forward": "d9c19cbe2c39a431",
    "transformers.models.ministral3.modeling_ministral3.Ministral3DecoderLayer.forward": "75d1d62e173e8c57",
    "transformers.models.smollm3.modeling_smollm3.SmolLM3DecoderLayer.forward": "75d1d62e173e8c57",
    "transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5DecoderLayer.forward": "07a700417d4e0eae",
    "transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5GatedDeltaNet.forward": "bd25761e1031fff0",
    "transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5RMSNormGated.forward": "5a4bd64da7fd08bd",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeGatedDeltaNet.forward": "bd25761e1031fff0",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeRMSNormGated.forward": "5a4bd64da7fd08bd",
}


def test_the_copied_forwards_are_the_installed_transformers_ones():
    assert parts.copied_forwards() == COPIED


def build(model_type: str, dtype=torch.float64, device=torch.device("cpu"), layers: int | None = None, **shape):
    """The tiny model of `model_type`, eager attention (it applies Gemma-2's soft-cap and each layer's
    scaling), its biases and norm weights random; layers: another number of decoder layers than its config's;
    shape: config keys over the tiny config's."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = arch_config(model_type, **shape)
    if layers is not None:
        hf.num_hidden_layers = layers
    with torch.device(device):
        # eager experts: the grouped GEMM of transformers' MoE runs no float64
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype, attn_implementation="eager",
                                                 experts_implementation="eager")
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype).to(device) * 0.3)
    return model


def targets(model_type: str) -> str:
    # The MoE models' experts are 3-D parameters (not lorabench's LoRA targets): their attention alone.
    return "[q_proj,k_proj,v_proj,o_proj]" if model_type in ("qwen3_moe", "mixtral") else "[all-linear]"


def logits_and_grads(model, c, device, batch, jitter: float = 0.0):
    """The built model through the cell's steps (fast path parts before and after LoRA, checkpointing):
    logits, loss and every LoRA gradient of one batch. jitter: every parameter scaled by 1 + jitter x U(-1, 1)
    first (one rounding's worth of each weight at jitter = 2^-8), to see how far the answer itself moves."""
    model = parts.apply(model, c, device, parts.Stage.BEFORE_LORA)
    model = modeling.apply_lora(model, c.lora, c.precision.name, c.train.gradient_checkpointing, c.backend.upcast_fp32)
    model = parts.apply(model, c, device, parts.Stage.AFTER_LORA)
    backends.apply_checkpointing(model, c.train, device)
    model.train()
    # The adapters from one generator, whatever their dtype (PEFT's B = 0 would leave A without a gradient,
    # and its draw of A depends on the dtype)
    g = torch.Generator().manual_seed(1)
    for n, p in model.named_parameters():
        if "lora_A" in n or "lora_B" in n:
            p.data.copy_(torch.randn(p.shape, generator=g) * (0.1 if "lora_A" in n else 0.05))
    if jitter:
        for p in model.parameters():
            if p.is_floating_point():
                u = torch.rand(p.shape, generator=g, dtype=torch.float64).to(p.device, p.dtype)
                p.data.mul_(1 + jitter * (2 * u - 1))
    bf16 = next(model.parameters()).dtype == torch.bfloat16  # as the Trainer runs bf16 cells: under autocast
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        out = model(**batch)
    out.loss.backward()
    grads = {n: p.grad.double().cpu() for n, p in model.named_parameters() if p.requires_grad}
    logits = None if out.logits is None else out.logits.detach().double().cpu()  # None: Liger's fused loss
    return logits, out.loss.item(), grads


def assert_close(a: torch.Tensor, b: torch.Tensor, rtol: float, what: str):
    err = ((a - b).norm() / b.norm()).item()  # of the norm: elementwise rtol fails on entries near 0
    assert err < rtol, (what, err)


def compare(model_type: str, hf_overrides, fast_overrides, device, dtype, rtol):
    base = build(model_type, dtype, device)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3)).to(device)
    batch = {"input_ids": ids, "labels": ids}
    common = [f"lora.target_modules={targets(model_type)}", "train.gradient_checkpointing=true",
              "train.checkpoint_fraction=0.5"]
    c_hf = cfg(*common, *hf_overrides)
    c_fast = cfg(*common, "backend=fast", "data.packing=false", *fast_overrides, *REFUSED.get(model_type, ("", []))[1])
    parts.check_parts(c_fast, base.config, device)
    torch.manual_seed(4)
    logits_hf, loss_hf, g_hf = logits_and_grads(copy.deepcopy(base), c_hf, device, batch)
    with parts.around_cell(c_fast, base.config):
        torch.manual_seed(4)
        logits_fast, loss_fast, g_fast = logits_and_grads(base, c_fast, device, batch)
    if logits_fast is not None:  # (a loss computed from the hidden states in chunks returns none: chunked_loss)
        assert_close(logits_fast, logits_hf, rtol, "logits")
    assert loss_fast == pytest.approx(loss_hf, rel=rtol)
    assert g_fast.keys() == g_hf.keys() and g_hf
    for n in g_hf:
        assert_close(g_fast[n], g_hf[n], rtol, n)
    return base


@pytest.mark.parametrize("model_type", breadth(ARCHS, QUICK_ARCHS))
def test_fast_path_computes_the_architecture_s_model_on_cpu(same_masks, monkeypatch, model_type):  # noqa: F811
    """float64, LoRA dropout 0.1 (PEFT's masks and the fused path's from one source: tests/fast/test_fused.py),
    half the layers recomputed: logits, loss and every LoRA gradient within 1e-10 of hf's (see above);
    the fused forwards ran in every layer."""
    from lorabench.fast import fused

    calls = []
    real = fused.project
    monkeypatch.setattr(fused, "project", lambda *a, **k: calls.append(1) or real(*a, **k))
    # (the loss head in chunks computes transformers' fp32 loss in another order: tests/fast/test_chunked_loss.py)
    model = compare(model_type, ["lora.dropout=0.1"],
                    ["lora.dropout=0.1", "backend.liger=[]", "backend.chunked_loss=false"],
                    torch.device("cpu"), torch.float64, 1e-10)
    layers = parts.decoder_layers(model)
    if FAMILIES[model_type].fused_attention:
        groups = 2 + (0 if model_type in ("qwen3_moe", "mixtral") else 2)  # attention's q/k/v and o; MLP's two
        assert len(calls) == groups * 3  # 2 layers and the checkpointed one's recompute
        assert all(layer.self_attn.forward.__func__ is fused._attention_forward for layer in layers)
    elif "backend.fused_linear=false" in REFUSED.get(model_type, ("", []))[1]:  # PEFT's layers as they are
        assert not any(getattr(m.forward, "__func__", None) is fused._linear_forward
                       for layer in layers for m in layer.modules())
    else:  # each adapted projection on its own (fused_linear), the gated MLP's in its two groups (fused_mlp)
        adapted = [m for layer in layers for m in layer.modules() if hasattr(m, "lorabench_proj")]
        assert adapted and all(m.forward.__func__ is fused._linear_forward for m in adapted)
        assert len(calls) >= len(adapted)
    if FAMILIES[model_type].hybrid_layer:  # Qwen3.5's layer, the mixer's residual add in the next norm, computed
        from lorabench.fast.kernels import norm

        assert all(layer.forward.__func__ is norm._hybrid_layer_forward for layer in layers)
        assert {layer.block_type for layer in layers} == {"linear_attention", "full_attention"}


def test_fast_path_computes_a_family_without_a_row_on_cpu(same_masks, tmp_path):  # noqa: F811
    """GPT-NeoX has no row in lorabench.models.families: backend.fit_parts turns off each part that needs one (by
    name, in the cell's record), and what stays on (its fused query_key_value and its other linear layers through
    fused_linear) computes hf's model: float64, dropout 0.1, logits, loss and LoRA gradients within 1e-10."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from lorabench.fast import fused

    shape = {k: v for k, v in TINY_SHAPE.items() if k not in ("num_key_value_heads", "vocab_size")}
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt_neox", **shape, vocab_size=VOCAB)).save_pretrained(
        tmp_path / "neox")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "neox", dtype=torch.float64, attn_implementation="eager")
    common = [f"model.path={tmp_path / 'neox'}", "lora.target_modules=[all-linear]", "lora.dropout=0.1",
              "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5"]
    c_fast, off = parts.fit(cfg(*common, "backend=fast", "backend.liger=[]"))
    assert {"backend.varlen_attention=false", "backend.chunked_loss=false"} <= set(off), off
    assert c_fast.backend.fused_linear
    parts.check_parts(c_fast, base.config, torch.device("cpu"))  # nothing left on that lacks a feature
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    batch = {"input_ids": ids, "labels": ids}
    torch.manual_seed(4)
    logits_hf, loss_hf, g_hf = logits_and_grads(copy.deepcopy(base), cfg(*common), torch.device("cpu"), batch)
    with parts.around_cell(c_fast, base.config):
        torch.manual_seed(4)
        logits_fast, loss_fast, g_fast = logits_and_grads(base, c_fast, torch.device("cpu"), batch)
    adapted = [m for m in base.modules() if hasattr(m, "lorabench_proj")]
    assert adapted and all(m.forward.__func__ is fused._linear_forward for m in adapted)
    assert_close(logits_fast, logits_hf, 1e-10, "logits")
    assert loss_fast == pytest.approx(loss_hf, rel=1e-10)
    assert g_fast.keys() == g_hf.keys() and g_hf
    for n in g_hf:
        assert_close(g_fast[n], g_hf[n], 1e-10, n)


def test_flex_attention_computes_gemma2_s_soft_capped_attention_on_cpu(monkeypatch):
    """backend.flex_attention: Gemma-2's attention as flex attention (its CPU kernel runs the forward only) gives
    eager's logits, on packed rows (positions restart inside a row) through both of its layer kinds (one with a
    window shorter than a sample); without the cap the logits differ by far more, so the cap is applied."""
    monkeypatch.setattr(parts, "flex_runs_on", lambda device: True)
    # Uncompiled (flex attention's reference path; transformers compiles it and its masks): the same arithmetic,
    # without a minute of Inductor on two cores.
    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: fn if fn is not None else (lambda f: f))
    from transformers.integrations.flex_attention import WrappedFlexAttention
    monkeypatch.setattr(WrappedFlexAttention, "_instance", None)  # its uncompiled singleton dropped after the test
    cpu = torch.device("cpu")
    eager = build("gemma2", torch.float32).eval()
    with torch.no_grad():  # scores well past the cap of 2, so that it bites
        for layer in eager.model.layers:
            layer.self_attn.q_proj.weight.mul_(30)
    # The fast path's forward, lorabench.fast.fused's attention included (LoRA's B = 0: the base model's logits)
    c = fast_cfg("backend.flex_attention=true", "backend.varlen_attention=false", "backend.fused_add_norm=false",
                 f"lora.target_modules={targets('gemma2')}")
    flex = parts.apply(copy.deepcopy(eager), c, cpu, parts.Stage.BEFORE_LORA)
    flex = modeling.apply_lora(flex, c.lora, c.precision.name, False, c.backend.upcast_fp32)
    flex = parts.apply(flex, c, cpu, parts.Stage.AFTER_LORA).eval()
    from lorabench.fast import fused
    assert all(layer.self_attn.forward.__func__ is fused._attention_forward for layer in parts.decoder_layers(flex))
    assert flex.config._attn_implementation == "flex_attention" and eager.config._attn_implementation == "eager"
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    pos = torch.tensor([list(range(SEQ)), [*range(SEQ // 2), *range(SEQ - SEQ // 2)]])  # row 2: two samples
    with torch.no_grad():
        ref, out = (m(input_ids=ids, position_ids=pos).logits for m in (eager, flex))
        for layer in eager.model.layers:
            layer.self_attn.attn_logit_softcapping = None
        uncapped = eager(input_ids=ids, position_ids=pos).logits
    # float32 throughout: the two differ in summation order only (a few ulps of logits of order 1)
    assert (out - ref).abs().max() <= 1e-4 * ref.abs().max()
    assert (uncapped - ref).abs().max() > 100 * (out - ref).abs().max()


def test_flex_attention_leaves_attention_without_a_soft_cap_or_sinks_and_cells_off_cuda_as_they_are(monkeypatch):
    """Where flex attention trains (CUDA), Gemma-2's soft-capped attention goes to it, Mistral's plain attention
    stays; on the CPU (no flex backward there) every one stays. gpt-oss's sinks stay eager, and fit_parts says why
    (its LoRA gradients through flex leave the family GPU test's bound)."""
    cpu, c = torch.device("cpu"), fast_cfg("backend.flex_attention=true", "backend.varlen_attention=false")
    for model_type in ("mistral", "gemma2", "gpt_oss"):
        model = parts.apply(build(model_type, torch.float32), c, cpu, parts.Stage.BEFORE_LORA)
        assert model.config._attn_implementation == "eager"
    monkeypatch.setattr(parts, "flex_runs_on", lambda device: True)
    for model_type, flex in (("mistral", False), ("gemma2", True), ("gpt_oss", False)):
        model = parts.apply(build(model_type, torch.float32), c, cpu, parts.Stage.BEFORE_LORA)
        assert (model.config._attn_implementation == "flex_attention") == flex, model_type
    refusal = parts.PART["flex_attention"].lacks(parts.features(build("gpt_oss", torch.float32).config), c)
    assert refusal.off == {"flex_attention": False} and "gpt_oss's sinks" in refusal.reason


def test_a_part_the_architecture_lacks_is_refused_by_name_or_turned_off_and_recorded(tmp_path):
    """Through the entry point's cell: a Gemma-2 checkpoint (config.json and safetensors) under backend=fast
    with backend.fit_parts=false is skipped before its weights are read, with the one line naming the part
    (exit code 5); with fast's own fit_parts the cell trains with those parts off, and its result says which,
    why, and records the config that ran."""
    from transformers import AutoModelForCausalLM

    hf = arch_config("gemma2")
    hf.vocab_size = 32768  # past synthetic data's token floor (the data is built after the check: never here)
    AutoModelForCausalLM.from_config(hf).save_pretrained(tmp_path / "gemma2")
    # Synthetic rows within the checkpoint's positions: Gemma's tokenizer ships in no package (chat data would be
    # refused first, as failed).
    args = ["backend=fast", "backend.liger=[]", f"model.path={tmp_path / 'gemma2'}", "data=synthetic",
            f"seq_len={hf.max_position_embeddings}", "train.max_steps=2"]
    result = run_in_process([*args, "backend.fit_parts=false"], tmp_path / "refused")
    assert result.status.value == "skipped" and result.exit_code == 5, result.error
    assert result.error.startswith("backend=fast: varlen_attention is flash attention, without logit soft-capping")
    result = run_in_process(args, tmp_path / "fitted")
    assert result.ok, result.error
    off = result.model["parts_off"]
    assert list(off) == ["backend.varlen_attention=false", "backend.fused_add_norm=false"], off
    assert f"caps attention logits at {hf.attn_logit_softcapping:g}" in off["backend.varlen_attention=false"]
    assert "gemma2 has sandwich norms" in off["backend.fused_add_norm=false"]
    ran = result.config["backend"]
    assert ran["varlen_attention"] is False and ran["fused_add_norm"] is False and ran["fused_lora"] is True


HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None and importlib.util.find_spec("triton") is not None


@pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel not installed (pip install -e '.[fast]')")
@pytest.mark.parametrize("model_type", ["qwen3", "gemma2"])
def test_liger_s_rope_for_the_architecture_in_the_fused_attention_on_cpu(monkeypatch, model_type):
    """Liger's patch for the architecture puts its RoPE kernel in the architecture's module; the fused
    attention looks it up there (Triton's interpreter runs that kernel on CPU; Liger's other kernels do not
    run there). float32: Liger computes RoPE in fp32, round-off ~sqrt(n) x 2^-24 per sum of n <= 256 terms
    (1e-6), a few times that through 2 layers and the backward; 1e-4 of the norm leaves room for it and
    fails a missing norm, bias or soft-cap (1e-3 and more). Its module-level RoPE is put back after."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # before Triton's first import (it reads it then)
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    compare(model_type, ["lora.dropout=0"], ["lora.dropout=0", "backend.liger=[rope]"], torch.device("cpu"),
            torch.float32, 1e-4)
    module = importlib.import_module(parts.LIGER[model_type].module)
    assert module.apply_rotary_pos_emb is not liger_rotary_pos_emb


def test_liger_s_module_patches_for_the_architecture_are_undone_after_the_cell(tmp_path):
    """Liger's patch for Qwen3 replaces RoPE, Qwen3RMSNorm and Qwen3MLP in transformers' Qwen3 module for the
    process: the cell's scope puts back what it found (as if Liger's patch had run inside it)."""
    from transformers.models.qwen3 import modeling_qwen3 as mq

    arch_config("qwen3").save_pretrained(tmp_path)
    c = fast_cfg(f"model.path={tmp_path}", "backend.liger=[rope]")
    before = {a: getattr(mq, a) for a in parts.LIGER["qwen3"].attrs}
    assert parts.LIGER["qwen3"].function == "apply_liger_kernel_to_qwen3"
    with parts._liger_undone(c):
        for a in before:
            setattr(mq, a, object())
    assert {a: getattr(mq, a) for a in before} == before


@pytest.mark.parametrize("model_type", sorted(parts.LIGER))
def test_liger_table_names_what_transformers_has(model_type):
    """Each architecture's entry names its transformers module and the classes and RoPE there that Liger's
    patch replaces (what the cell's scope puts back), and Liger's function where Liger is installed."""
    patch = parts.LIGER[model_type]
    module = importlib.import_module(patch.module)
    assert all(hasattr(module, a) for a in patch.attrs if a != "CrossEntropyLoss"), patch
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    assert MODEL_FOR_CAUSAL_LM_MAPPING[type(arch_config(model_type))].__module__ == patch.module  # the model's own
    if HAS_LIGER:
        from liger_kernel.transformers import monkey_patch

        assert callable(getattr(monkey_patch, patch.function))


@pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel not installed (pip install -e '.[fast]')")
@pytest.mark.parametrize("model_type", sorted(parts.LIGER))
def test_each_architecture_gets_liger_s_own_patch(monkeypatch, model_type):
    """The patch applied is Liger's function for the model's architecture, with its gated-MLP keyword
    (geglu for Gemma), not Mistral's for everyone."""
    from liger_kernel.transformers import monkey_patch

    calls = []
    patch = parts.LIGER[model_type]
    monkeypatch.setattr(monkey_patch, patch.function, lambda **kw: calls.append(kw))
    model = build(model_type, torch.float32)
    parts.apply(model, fast_cfg("backend.liger=[rms_norm,swiglu]", "data.packing=false"), torch.device("cpu"),
                   parts.Stage.BEFORE_LORA)
    assert calls == [dict(model=model, rope=False, rms_norm=True, fused_linear_cross_entropy=False,
                          **{patch.mlp: True})]


# ---- GPU: Liger on, bf16 ------------------------------------------------------------------------------

SUPPORTED_WITH_LIGER = ["mistral", "llama", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "qwen3_moe", "mixtral",
                        "qwen3_5_text"]
PARTIAL_ROTARY = ("phi3", "qwen3_5_text")  # rotate part of each head (3/4, 1/4): Liger's RoPE rotates the whole
WITHOUT_LIGER = [t for t in ARCHS if t not in parts.LIGER]


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("model_type", SUPPORTED_WITH_LIGER)
def test_fast_path_computes_the_architecture_s_model_on_gpu(model_type):
    """bf16 weights and compute, every Liger op the architecture's patch has (Phi-3 and Qwen3.5 rotate part of each
    head: Liger's RoPE is left out for them), LoRA dropout 0 (the two paths' masks are different draws)."""
    if FAMILIES[model_type].linear_attention and importlib.util.find_spec("fla") is not None:
        pytest.skip("flash-linear-attention replaces transformers' PyTorch linear attention at import, and its "
                    "Triton kernels have no float64: no exact reference; uninstall it to run this test")
    ops = "[rms_norm,swiglu,fused_linear_cross_entropy]" if model_type in PARTIAL_ROTARY else \
        "[rms_norm,rope,swiglu,fused_linear_cross_entropy]"
    cuda = torch.device("cuda", 0)
    # fused_linear_cross_entropy returns no logits in training: the logits are compared with it off (below)
    for liger in (ops, ops.replace(",fused_linear_cross_entropy", "")):
        compare_gpu(model_type, cuda, liger)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("model_type", WITHOUT_LIGER)
def test_fast_path_computes_the_2026_families_models_on_gpu(model_type):
    """The families without a Liger patch: the parts that compute them (their adapted projections through the
    fused Function, the gated MLP's where it is Llama's, the loss in chunks by Liger's fused linear cross-entropy)
    in bf16, against hf in float64, as above."""
    if FAMILIES[model_type].linear_attention and importlib.util.find_spec("fla") is not None:
        pytest.skip("flash-linear-attention replaces transformers' PyTorch linear attention at import, and its "
                    "Triton kernels have no float64: no exact reference; uninstall it to run this test")
    compare_gpu(model_type, torch.device("cuda", 0), "[]")


@pytest.mark.gpu
@requires_cuda
def test_flex_attention_computes_gemma2_s_model_on_gpu():
    """backend.flex_attention (compiled flex attention, its backward included) against hf's eager attention."""
    compare_gpu("gemma2", torch.device("cuda", 0), "[rms_norm,rope,swiglu]", "backend.flex_attention=true")


def compare_gpu(model_type, device, liger, *extra, shape=None, fast_only=contextlib.nullcontext):
    """hf and fast in bf16 against hf in float64 on the same (bf16) weights, the exact model: the fast path's
    logits, loss and LoRA gradients are no further from it than twice hf's own bf16 error plus 2^-8 (one bf16
    rounding step) of the norm. Both round at 2^-8 per operation, in different places (Liger's kernels, the
    fused projections' epilogues) but not more often; a missing bias, norm, scale or soft-cap is an error of
    the model, not of rounding, and shows far above that. Where the quantity is ill-conditioned (a gate whose
    gradient is a small difference of large terms), the exact answer moves by more than hf's error when each
    weight moves by one bf16 rounding (2^-8): twice that movement bounds any bf16 computation of it as well.
    shape: config keys over the tiny config's; fast_only: a context the fast run alone runs in."""
    base = build(model_type, torch.bfloat16, device, **(shape or {}))
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3)).to(device)
    batch = {"input_ids": ids, "labels": ids}
    common = [f"lora.target_modules={targets(model_type)}", "lora.dropout=0", "precision=bf16",
              "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5"]
    c_hf = cfg(*common)
    c_fast = cfg(*common, "backend=fast", "data.packing=false", f"backend.liger={liger}",
                 *REFUSED.get(model_type, ("", []))[1], *extra)
    parts.check_parts(c_fast, base.config, device)
    exact = logits_and_grads(copy.deepcopy(base).double(), c_hf, device, batch)
    shaken = logits_and_grads(copy.deepcopy(base).double(), c_hf, device, batch, jitter=2**-8)
    hf = logits_and_grads(copy.deepcopy(base), c_hf, device, batch)
    with parts.around_cell(c_fast, base.config), fast_only():
        fast = logits_and_grads(base, c_fast, device, batch)
    pairs = [("loss", *(torch.tensor([r[1]]) for r in (exact, shaken, hf, fast)))]
    if fast[0] is not None:
        pairs.append(("logits", exact[0], shaken[0], hf[0], fast[0]))
    assert fast[2].keys() == exact[2].keys() and exact[2]
    pairs += [(n, exact[2][n], shaken[2][n], hf[2][n], fast[2][n]) for n in exact[2]]
    for what, ref, moved, a, b in pairs:
        err_moved, err_hf, err_fast = ((t.double() - ref).norm().item() / ref.norm().item() for t in (moved, a, b))
        assert err_fast <= 2 * max(err_hf, err_moved) + 2**-8, (what, err_fast, err_hf, err_moved)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs flash-linear-attention")
def test_fla_computes_qwen3_5_s_model_on_gpu(monkeypatch):
    """fast as it runs Qwen3.5 (Liger's RMSNorm, SwiGLU and fused loss; flash-linear-attention's gated delta rule,
    on a Hopper GPU under Triton 3.4.0-3.7.0 through backend.fla_on_hopper, and its kernels for the rest of each
    Gated DeltaNet layer, backend.fla_delta_net) against transformers' PyTorch rule in float64, hf's bf16 error from
    the same PyTorch rule: 128-wide key heads, as Qwen3.5's (the 128 tile), and 64-wide ones where the GPU is no
    Hopper."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from lorabench.fast import delta_rule

    fla_rule = getattr(modeling_qwen3_5, delta_rule.NAME)  # transformers took fla's kernel at import
    assert inspect.unwrap(fla_rule) is not fla_rule, "transformers did not take flash-linear-attention's rule"
    monkeypatch.setattr(modeling_qwen3_5, delta_rule.NAME, inspect.unwrap(fla_rule))  # the references: PyTorch's

    @contextlib.contextmanager
    def with_fla():
        monkeypatch.setattr(modeling_qwen3_5, delta_rule.NAME, fla_rule)
        yield
        monkeypatch.setattr(modeling_qwen3_5, delta_rule.NAME, inspect.unwrap(fla_rule))

    cuda = torch.device("cuda", 0)
    widths = [128] if torch.cuda.get_device_capability(cuda)[0] == 9 else [128, 64]
    for width in widths:
        compare_gpu("qwen3_5_text", cuda, "[rms_norm,swiglu,fused_linear_cross_entropy]",
                    shape={"linear_key_head_dim": width, "linear_value_head_dim": width},
                    fast_only=with_fla)


def test_compile_delta_rule_computes_qwen3_5_s_gated_delta_rule_through_one_compile_on_cpu():
    """backend.compile_delta_rule (on CUDA): each Gated DeltaNet layer calls transformers' chunked delta rule through
    torch.compile, the class and hf's model untouched. Here with dynamo's graph run as traced (the same operations in
    the same order): the loss and every LoRA gradient equal the reference's bit for bit, and the rule was traced."""
    from lorabench.fast import delta_rule

    graphs = []

    def traced(gm, example_inputs):  # torch.compile's backend: the traced graph's own forward
        graphs.append(gm)
        return gm.forward

    base = build("qwen3_5_text", torch.float32)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    batch = {"input_ids": ids, "labels": ids}
    c = cfg("lora.target_modules=[all-linear]", "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5")
    torch.manual_seed(4)
    _, loss_ref, g_ref = logits_and_grads(copy.deepcopy(base), c, torch.device("cpu"), batch)
    torch._dynamo.reset()
    layers = [m for m in base.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    assert delta_rule.patch(base, backend=traced) == len(layers) > 0
    torch.manual_seed(4)
    _, loss, g = logits_and_grads(base, c, torch.device("cpu"), batch)
    assert graphs, "the rule was not traced"
    rules = {m.forward.__func__.__globals__[delta_rule.NAME] for m in layers}
    reference = inspect.unwrap(type(layers[0]).forward).__globals__[delta_rule.NAME]
    assert len(rules) == 1 and reference not in rules
    assert loss == loss_ref and g.keys() == g_ref.keys()
    assert all(torch.equal(g[n], g_ref[n]) for n in g_ref), [n for n in g_ref if not torch.equal(g[n], g_ref[n])]


def reference_kernels(group_heads=torch.repeat_interleave):
    """fla's three functions as PyTorch computes them (lorabench.fast.delta_net.Kernels' signatures): the causal
    depthwise convolution of transformers' fallback, transformers' chunked rule with the key heads laid out for the
    value heads by `group_heads` (fla reads key head h // (value heads / key heads): repeat_interleave's layout),
    and the gated RMSNorm in float32 as transformers' Qwen3_5RMSNormGated casts it."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from lorabench.fast.delta_net import Kernels

    def conv(x, weight, bias, activation):
        y = F.conv1d(x.transpose(1, 2), weight[:, None], bias, padding=weight.shape[1] - 1, groups=weight.shape[0])
        return F.silu(y[..., :x.shape[1]]).transpose(1, 2)

    def rule(q, k, v, g, beta):
        group = v.shape[2] // q.shape[2]
        q, k = (group_heads(t, group, dim=2) for t in (q, k))
        return modeling_qwen3_5.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0]

    def norm(x, gate, weight, eps):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
                * F.silu(gate.float())).to(x.dtype)

    return Kernels(conv, rule, norm)


def test_fla_delta_net_computes_qwen3_5_s_linear_attention_layer_on_cpu():
    """backend.fla_delta_net (on CUDA, with fla's kernels): each Gated DeltaNet layer in the projection's layout, key
    heads shared by their value heads inside the rule, the norm and gate in one call. Here with PyTorch's versions of
    fla's functions, in float64 (each layer's gated norm in float32, as transformers casts it): the loss and every
    LoRA gradient (all-linear: the layer's own projections too) within 2^-16 of transformers' layer: 2^8 float32
    roundings (2^-24 each) of the norms, in another order, carried through the backward; key heads laid out per
    value head the other way round (torch.repeat: head h reads h mod 2, not h // 2) land far outside."""
    from lorabench.fast import delta_net

    base = build("qwen3_5_text", torch.float64)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    batch = {"input_ids": ids, "labels": ids}
    c = cfg("lora.target_modules=[all-linear]", "lora.dropout=0", "train.gradient_checkpointing=true",
            "train.checkpoint_fraction=0.5")
    _, loss_ref, g_ref = logits_and_grads(copy.deepcopy(base), c, torch.device("cpu"), batch)
    errors = []
    for layout in (torch.repeat_interleave, lambda t, n, dim: t.repeat(1, 1, n, 1)):
        model = copy.deepcopy(base)
        assert delta_net.patch(model, reference_kernels(layout)) == 3 == len(delta_net.gated_delta_nets(base))
        _, loss, g = logits_and_grads(model, c, torch.device("cpu"), batch)
        assert g.keys() == g_ref.keys() and any("in_proj_qkv" in n for n in g)
        errors.append(max([abs(loss - loss_ref) / abs(loss_ref)] + [
            ((g[n] - g_ref[n]).norm() / g_ref[n].norm()).item() for n in g_ref]))
    assert errors[0] <= 2**-16 < 2**-4 < errors[1], errors


def test_the_compiled_delta_rule_keeps_its_matmuls_in_float32_under_a_bf16_cell_s_autocast():
    """transformers' rule casts its inputs to float32, but a bf16 cell's autocast would run its matmuls in bf16: the
    compiled rule (compile_delta_rule) runs with autocast off, so under autocast it gives what the rule gives in
    float32 outside any autocast, bit for bit here, and not what the rule gives under autocast."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    from lorabench.fast import delta_rule

    rule = modeling_qwen3_5.torch_chunk_gated_delta_rule
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 128, 2, 32, generator=g).bfloat16() for _ in range(3))
    decay, beta = -torch.rand(1, 128, 2, generator=g), torch.rand(1, 128, 2, generator=g).bfloat16()
    args, kwargs = (q, k, v), {"g": decay, "beta": beta, "use_qk_l2norm_in_kernel": True}
    torch._dynamo.reset()
    compiled = torch.compile(delta_rule.in_float32(rule), backend=lambda gm, example_inputs: gm.forward)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, under_autocast = compiled(*args, **kwargs)[0], rule(*args, **kwargs)[0]
    in_float32 = rule(*args, **kwargs)[0]
    assert torch.equal(ours, in_float32) and not torch.equal(under_autocast, in_float32)
