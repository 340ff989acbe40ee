"""backend=fast in one place: its parts, what each needs, the check of those needs before a cell runs,
and the order in which the parts go into the model.

Each part is one BackendConfig key (the table PARTS, in the order the parts are applied). A part needs
  - architecture features it supports, read from the model's transformers config (`features`: the only
    place that reads them); where the architecture has one it lacks, the part is turned off for the cell
    (`fit`, backend.fit_parts: logged and recorded) or the cell is skipped (exit 5) with one line naming the
    part and the feature: the fast path is exact or refused, never a different model;
  - CUDA (`Cuda`): some parts are CUDA kernels with the same arithmetic in PyTorch elsewhere (FALLBACK),
    some only exist on CUDA and leave the model as it is elsewhere (ONLY), Liger's need it (REQUIRED);
  - other parts (`through`): a part that acts through another does nothing without it (logged).

"Exact" means: the same model as backend=hf computes, the same forward written by transformers for that
architecture, with only where the arithmetic happens changed. tests/fast/test_fast_arch.py holds each
architecture to it (fp32 on CPU; bf16 with Liger on a GPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import importlib
import importlib.util
import inspect
import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch

from lorabench.builders import data
from lorabench.core.config import Config
from lorabench.core.results import CellSkipped
from lorabench.fast import packed_attention
from lorabench.models.families import FAMILIES, Family

log = logging.getLogger(__name__)


# ---- the architecture's features, read from its transformers config ----------------------------------

@dataclass(frozen=True)
class Features:
    """What the fast path's parts ask of an architecture (see the predicates below)."""
    model_type: str
    qkv_bias: bool  # a bias on q, k and v (Qwen2)
    qk_norm: bool  # RMSNorm on q and k per head before RoPE (Qwen3, Gemma-3)
    sandwich_norms: bool  # norms after attention and MLP too, +1 norm offset, scaled embeddings (Gemma-2/3)
    attn_softcap: float | None  # attention logits soft-capped (Gemma-2 passes it to its attention)
    activation: str  # the gated MLP's activation: silu (SwiGLU), gelu_pytorch_tanh (GeGLU)
    fused_qkv: bool  # one qkv_proj and one gate_up_proj (Phi-3)
    moe: bool  # MLP of routed experts (Mixtral, Qwen3-MoE)
    rotary_fraction: float  # the share of head_dim that RoPE rotates (Phi-4-mini: 0.75)
    bidirectional: bool  # attention not causal
    resid_dropout: float  # dropout on the residual branches (Phi-3's resid_pdrop)
    head_dim: int
    attn_sinks: bool = False  # a learnt sink logit per head in the softmax (gpt-oss)
    linear_attention: bool = False  # layers whose state runs along the row (Qwen3.5's Gated DeltaNet)
    known: bool = True  # lorabench has a row for the family
    gated_mlp: bool = False  # its dense MLP is Llama's gated MLP
    linear_key_dim: int = 0  # the width of a linear-attention key head (Qwen3.5: 128)


def _model_type(hf) -> str:
    return getattr(hf, "model_type", "") or ""


def features(hf) -> Features:
    """What the fast path asks of the architecture that `hf` (a transformers PretrainedConfig) describes,
    from its Architecture (lorabench.models: the one reader of a config). A multimodal config (Gemma-3
    with its vision tower) keeps its own model_type, which no part computes: refused by name."""
    from lorabench.models import Architecture

    try:
        a = Architecture.from_hf_config(hf)
    except ValueError:  # transformers builds no causal LM of it: each part refuses it by that name
        return Features(model_type=_model_type(hf), qkv_bias=False, qk_norm=False, sandwich_norms=False,
                        attn_softcap=None, activation="", fused_qkv=False, moe=False, rotary_fraction=1.0,
                        bidirectional=False, resid_dropout=0.0, head_dim=0, known=False)
    return Features(model_type=_model_type(hf), qkv_bias=a.qkv_bias, qk_norm=a.qk_norm,
                    sandwich_norms=a.sandwich_norms, attn_softcap=a.attn_logit_softcap, activation=a.activation,
                    fused_qkv=a.fused_qkv, moe=a.num_experts > 0, rotary_fraction=a.partial_rotary_factor,
                    bidirectional=a.bidirectional, resid_dropout=a.residual_dropout, head_dim=a.head_dim,
                    attn_sinks=a.attn_sinks, linear_attention=a.linear_attention, known=a.known, gated_mlp=a.gated_mlp,
                    linear_key_dim=a.linear_heads[2] if a.linear_heads else 0)


def hf_config(c: Config):
    """The transformers config of the cell's model: model.path's config.json, else the one the
    random initialisation is built from (lorabench.models)."""
    from lorabench.models import hf_config as model_hf_config

    return model_hf_config(c.model)


# ---- Liger-Kernel's patch for each architecture ----------------------------------------------------------

@dataclass(frozen=True)
class LigerPatch:
    """liger_kernel.transformers.<function>, and what it replaces in transformers' <module> for the whole
    process (undone when the cell ends: a multirun's next cell, maybe backend=hf, runs in this process)."""
    function: str
    module: str
    attrs: tuple[str, ...]
    mlp: str = "swiglu"  # the keyword of its gated-MLP kernel: swiglu, or geglu (Gemma)


def _liger(f: Family) -> LigerPatch:
    """A family's Liger patch, from its row: RoPE, its RMSNorm class and its MLP (or experts) class replaced at
    module level (liger_kernel/transformers/monkey_patch.py, 0.8.5), and on the instance its norms, MLPs and
    forward (the fused loss)."""
    return LigerPatch(f.liger_function, f.module, ("apply_rotary_pos_emb", f"{f.prefix}RMSNorm",
                                                   f"{f.prefix}{f.liger_mlp_class}", *f.liger_extra), f.liger_mlp)


LIGER = {t: _liger(f) for t, f in FAMILIES.items() if f.liger_mlp}
# The activation each gated-MLP kernel computes (Liger's SwiGLU: silu; its GeGLU: tanh-approximated GELU).
LIGER_ACTIVATION = {"swiglu": ("silu", "swish"), "geglu": ("gelu_pytorch_tanh",)}


# ---- what each part lacks on an architecture ---------------------------------------------------------

@dataclass(frozen=True)
class Refusal:
    """Why a part cannot compute the architecture's model, and the backend values that leave it out."""
    reason: str
    off: dict  # {BackendConfig key: value}: {"fused_add_norm": False}, {"liger": ["rms_norm", ...]}

    @property
    def fix(self) -> str:
        show = lambda v: f"[{','.join(v)}]" if isinstance(v, list) else str(v).lower()  # noqa: E731
        return ", ".join(f"{_key_of(k)}={show(v)}" for k, v in self.off.items())


def _key_of(part: str) -> str:
    """The config key of a part: backend.<part>, except packing, a property of the data (data.packing)."""
    return "data.packing" if part == "packing" else f"backend.{part}"


def _turned_off(c: Config, off: dict) -> Config:
    """`c` with a Refusal's values applied: backend keys, and data.packing for the packing part."""
    data = dataclasses.replace(c.data, packing=off["packing"]) if "packing" in off else c.data
    return dataclasses.replace(c, data=data, backend=dataclasses.replace(
        c.backend, **{k: v for k, v in off.items() if k != "packing"}))


# The attentions (and gated MLPs) lorabench.fast.fused's forward computes as transformers writes them (q/k/v bias,
# QK-norm, fused qkv_proj, per-layer sliding windows, Gemma-2's soft-capping and query_pre_attn_scalar scaling).
ATTENTION = tuple(t for t, f in FAMILIES.items() if f.fused_attention)
# Decoder layers that are Mistral's (pre-norms, residual adds, nothing else): lorabench.fast.kernels.norm's
# layer forward computes them.
MISTRAL_LAYERS = tuple(t for t, f in FAMILIES.items() if f.mistral_layer)
# Decoder layers that are Qwen3.5's (Mistral's, the token mixer linear or full attention by layer): computed alike.
HYBRID_LAYERS = tuple(t for t, f in FAMILIES.items() if f.hybrid_layer)
# Dense MLPs that are Llama's gated MLP (gate, up, activation, down): lorabench.fast.fused computes them.
GATED_MLPS = tuple(t for t, f in FAMILIES.items() if f.gated_mlp)


def _liger_lacks(f: Features, c: Config) -> Refusal | None:
    ops = list(c.backend.liger)
    patch = LIGER.get(f.model_type)
    if patch is None:
        return Refusal(f"has no Liger patch for {f.model_type or 'this model'} (it has {', '.join(LIGER)})",
                       {"liger": []})
    without = lambda op: {"liger": [o for o in ops if o != op]}  # noqa: E731
    if "swiglu" in ops and f.moe and c.lora.experts:
        return Refusal(f"swiglu is Liger's experts kernel for {f.model_type}, which computes the experts' base "
                       "weights alone; lora.experts adds PEFT's adapters to them", without("swiglu"))
    if "rope" in ops and f.rotary_fraction < 1:
        return Refusal(f"rope rotates the whole head; {f.model_type} rotates {f.rotary_fraction:g} of it "
                       "(partial_rotary_factor)", without("rope"))
    if "swiglu" in ops and f.activation not in LIGER_ACTIVATION[patch.mlp]:
        return Refusal(f"swiglu is Liger's {patch.mlp} kernel for {f.model_type} "
                       f"({'/'.join(LIGER_ACTIVATION[patch.mlp])}); its MLP uses {f.activation}", without("swiglu"))
    return None


# The forwards lorabench.fast.fused and lorabench.fast.kernels.norm compute are those of this transformers release
# (the version pyproject.toml pins): tests/fast/test_fast_arch.py holds each family's copy to the installed
# forwards' source (COPIED) and numbers; another release may have other forwards.
FORWARDS_OF = "5.17.0"


def _forward_lacks(key: str, what: str) -> Refusal | None:
    import transformers

    if transformers.__version__ != FORWARDS_OF:
        return Refusal(f"computes transformers {FORWARDS_OF}'s {what}; transformers {transformers.__version__} "
                       "is installed", {key: False})
    return None


def copied_forwards() -> dict[str, str]:
    """{qualified name: sha256 of its source} of every transformers forward the fast path computes a copy of:
    each family's attention and gated MLP (lorabench.fast.fused), Mistral's and Qwen3.5's decoder layers
    (lorabench.fast.kernels.norm) and the Gated DeltaNet layer with its gated norm (lorabench.fast.delta_net), as the
    installed transformers has them."""
    import hashlib

    names = [f"{f.module}.{f.prefix}Attention.forward" for f in FAMILIES.values() if f.fused_attention]
    names += [f"{f.module}.{f.prefix}MLP.forward" for f in FAMILIES.values()
              if f.gated_mlp and hasattr(importlib.import_module(f.module), f"{f.prefix}MLP")]
    names += [f"{f.module}.{f.prefix}DecoderLayer.forward" for f in FAMILIES.values()
              if f.mistral_layer or f.hybrid_layer]
    names += [f"{f.module}.{f.prefix}{cls}.forward" for f in FAMILIES.values() if f.linear_attention
              for cls in ("GatedDeltaNet", "RMSNormGated")]  # lorabench.fast.delta_net
    out = {}
    for name in names:
        module, cls, fn = name.rsplit(".", 2)
        source = inspect.getsource(getattr(getattr(importlib.import_module(module), cls), fn))
        out[name] = hashlib.sha256(source.encode()).hexdigest()[:16]
    return out


def _attention_lacks(f: Features, c: Config) -> Refusal | None:
    if (version := _forward_lacks("fused_lora", "attention forwards")) is not None:
        return version
    if f.model_type not in ATTENTION:
        return Refusal(f"computes the attention of {'/'.join(ATTENTION)}; {f.model_type} is not among them",
                       {"fused_lora": False})
    if f.bidirectional:
        return Refusal(f"computes causal attention; this {f.model_type} attends both ways "
                       "(use_bidirectional_attention)", {"fused_lora": False})
    return None


def _mlp_lacks(f: Features, c: Config) -> Refusal | None:
    if f.moe:
        return Refusal(f"computes dense gated MLPs; {f.model_type} routes tokens to experts (MoE)",
                       {"fused_mlp": False})
    if not f.gated_mlp:
        return Refusal(f"computes the gated MLPs of {'/'.join(GATED_MLPS)}; {f.model_type} is not among them",
                       {"fused_mlp": False})
    return None


def _linear_lacks(f: Features, c: Config) -> Refusal | None:
    if f.linear_attention:
        # Exact in float64; in bf16 on CUDA the LoRA gradient of Qwen3.5's Gated DeltaNet gate (in_proj_a, whose
        # output reaches the decay through softplus and exp) lands 2.2x as far from float64 as hf's, beyond the
        # family test's bound, and with this part off every gradient is within it (gate_grad_parts.txt in
        # docs/runs/2026-12-06_h100_time_to_loss_search).
        return Refusal(f"rounds the LoRA gradients of {f.model_type}'s linear-attention gates (softplus, then exp "
                       "into the decay) beyond bf16's bound on CUDA", {"fused_linear": False})
    return None


def _add_norm_lacks(f: Features, c: Config) -> Refusal | None:
    if (version := _forward_lacks("fused_add_norm", "decoder layer forward")) is not None:
        return version
    if f.sandwich_norms:
        return Refusal(f"computes Mistral's decoder layer ({'/'.join(MISTRAL_LAYERS)}); {f.model_type} has "
                       "sandwich norms", {"fused_add_norm": False})
    if f.model_type not in MISTRAL_LAYERS + HYBRID_LAYERS:
        return Refusal(f"computes Mistral's decoder layer ({'/'.join(MISTRAL_LAYERS)}) and Qwen3.5's "
                       f"({'/'.join(HYBRID_LAYERS)}); {f.model_type} is not among them", {"fused_add_norm": False})
    if f.resid_dropout:
        return Refusal(f"computes a decoder layer without residual dropout; {f.model_type} drops "
                       f"{f.resid_dropout:g} (resid_pdrop)", {"fused_add_norm": False})
    return None


def _packing_lacks(f: Features, c: Config) -> Refusal | None:
    if f.linear_attention:
        return Refusal(f"puts several samples in a row; {f.model_type}'s linear-attention layers carry a state along "
                       "the row, from one sample into the next", {"packing": False})
    return None


def _flex_lacks(f: Features, c: Config) -> Refusal | None:
    # Measured on an H100 (torch 2.11, docs/runs/2026-12-07_h100_qwen35/gpu_tests.txt): gpt-oss's tiny model through
    # flex attention, its sinks renormalised by the log-sum-exp, left a key projection's LoRA gradient beyond the
    # family GPU test's bound (twice hf's eager error plus 2^-8); Gemma-2's soft-cap in flex passes the same test.
    if f.attn_sinks:
        return Refusal(f"with {f.model_type}'s sinks leaves its key projections' LoRA gradients beyond bf16's bound on "
                       "CUDA; its attention stays eager", {"flex_attention": False})
    return None


def _varlen_lacks(f: Features, c: Config) -> Refusal | None:
    if not f.known or f.model_type not in ATTENTION:
        return Refusal(f"replaces the attention of {'/'.join(ATTENTION)}; {f.model_type} is not among them",
                       {"varlen_attention": False})
    if f.attn_sinks:
        return Refusal(f"is flash attention, without sink logits; {f.model_type} adds a learnt sink to each head's "
                       "softmax", {"varlen_attention": False})
    if f.attn_softcap is not None:
        return Refusal(f"is flash attention, without logit soft-capping; {f.model_type} caps attention "
                       f"logits at {f.attn_softcap:g}", {"varlen_attention": False})
    if f.bidirectional:
        return Refusal(f"is causal; this {f.model_type} attends both ways", {"varlen_attention": False})
    if f.head_dim > 256:
        return Refusal(f"is flash attention (head_dim <= 256); {f.model_type} has head_dim {f.head_dim}",
                       {"varlen_attention": False})
    return None


def _loss_lacks(f: Features, c: Config) -> Refusal | None:
    if not f.known:
        return Refusal(f"computes the loss of the causal LMs with a row in lorabench.models.families; {f.model_type} "
                       "has none", {"chunked_loss": False})
    return None


def _graphs_one_process(c: Config) -> Refusal | None:
    ranks = c.train.nproc * c.train.nnodes
    if ranks > 1:
        return Refusal(f"captures each decoder layer on one GPU (DDP's gradient hooks and FSDP's gathers are not "
                       f"captured); this cell runs {ranks} processes", {"cuda_graphs": False})
    return None


def _graphs_lacks(f: Features, c: Config) -> Refusal | None:
    if (processes := _graphs_one_process(c)) is not None:
        return processes
    if f.moe:
        return Refusal(f"captures layers of fixed shapes; {f.model_type} routes each batch's tokens to experts, "
                       "in groups whose sizes depend on the batch (MoE)", {"cuda_graphs": False})
    if c.backend.compile:
        return Refusal("captures each layer's eager forward and backward; backend.compile=true compiles them "
                       "(the two together are not built)", {"cuda_graphs": False})
    if c.train.offload_checkpoints or c.backend.tiled_mlp:
        return Refusal("captures layers recomputed by PyTorch's checkpoint; train.offload_checkpoints and "
                       "backend.tiled_mlp recompute in a backward of their own", {"cuda_graphs": False})
    return None


def _supports_all(f: Features, c: Config) -> Refusal | None:
    return None


# ---- the parts ---------------------------------------------------------------------------------------

class Cuda(enum.Enum):
    ANY = "runs anywhere"
    FALLBACK = "a CUDA kernel; elsewhere the same arithmetic in PyTorch"
    ONLY = "CUDA only; elsewhere the cell runs without it (the same model)"
    REQUIRED = "CUDA only (Triton kernels); refused elsewhere"


class Stage(enum.Enum):
    CELL = "around the whole cell (around_cell)"
    DATA = "the batches (lorabench.builders.data)"
    BEFORE_LORA = "on the model before LoRA wraps its linear layers (apply)"
    LORA = "where LoRA wraps the model (lorabench.builders.modeling.apply_lora)"
    AFTER_LORA = "on the model after LoRA (apply)"
    KERNEL = "inside another part's kernels (lorabench.fast.fused)"
    TRAINER = "the Trainer's step (lorabench.measure.meter)"
    COMPILE = "after checkpointing (lorabench.run.backends.apply_compile)"


@dataclass(frozen=True)
class Part:
    """One BackendConfig key of the fast path and what it needs."""
    key: str
    what: str
    stage: Stage
    cuda: Cuda = Cuda.ANY
    through: tuple[str, ...] = ()  # the parts it acts through: with none of them on it does nothing
    lacks: Callable[[Features, Config], Refusal | None] = _supports_all
    apply: Callable | None = None  # (model, c, device, features) -> model, at BEFORE_LORA / AFTER_LORA
    # Why the part cannot run with the model sharded over processes (train.parallel=fsdp); "" = it can.
    unsharded: str = ""

    def reaches(self, c: Config) -> bool:
        """Whether one of the parts it acts through is on (a part without `through` acts on its own)."""
        return not self.through or any(PART[t].on(c) for t in self.through)

    def on(self, c: Config) -> bool:
        if self.key == "upcast_fp32":  # the part is its absence: bf16 norms and residual stream
            return not c.backend.upcast_fp32
        if self.key == "packing":  # a property of the data: data.packing, which backend=fast sets
            return c.data.packing
        if self.key == "ce_chunk_mem":  # 1 is Liger's own chunking
            return c.backend.ce_chunk_mem > 1
        if self.key == "tiled_mlp":  # tokens a tile; 0: off
            return c.backend.tiled_mlp > 0
        return bool(getattr(c.backend, self.key))


def decoder_layers(model):
    """The decoder layers of a (PEFT-wrapped) causal LM (lorabench.models.census finds them in any family)."""
    from lorabench.models.census import decoder_layers as layers_of

    return layers_of(model)


def varlen_runs(c: Config, device: torch.device) -> bool:
    """Whether the cell's packed rows go through varlen attention: the model's attention (_apply_varlen) and the
    collator's batches, which then say where each sample starts (TrainerParts.segments)."""
    return c.backend.varlen_attention and data.packs(c) and packed_attention.runs_on(device)


def _apply_varlen(model, c: Config, device: torch.device, f: Features):
    if varlen_runs(c, device):
        packed_attention.use(model)
        log.info("attention over packed rows: %s (varlen flash attention, no mask)", packed_attention.NAME)
    return model


def flex_runs_on(device: torch.device) -> bool:
    """PyTorch's flex attention trains on CUDA (its CPU kernel has no backward)."""
    return device.type == "cuda"


def _apply_flex(model, c: Config, device: torch.device, f: Features):
    if f.attn_softcap is None:
        log.info("backend.flex_attention acts on attention that soft-caps its logits; %s does not: its attention "
                 "stays %s", f.model_type, model.config._attn_implementation)
    elif flex_runs_on(device):
        # transformers' flex path: the soft-cap as score_mod, masks (causal, sliding window, packed samples from
        # position_ids) as a BlockMask; the kernel is compiled once per process.
        model.set_attn_implementation("flex_attention")
        log.info("attention with soft-capped logits (%g) as flex attention", f.attn_softcap)
    return model


def _apply_liger(model, c: Config, device: torch.device, f: Features):
    patch = LIGER[f.model_type]
    apply_patch = getattr(importlib.import_module("liger_kernel.transformers.monkey_patch"), patch.function)
    ops = set(c.backend.liger)
    apply_patch(model=model, rope="rope" in ops, rms_norm="rms_norm" in ops,
                fused_linear_cross_entropy="fused_linear_cross_entropy" in ops, **{patch.mlp: "swiglu" in ops})
    log.info("Liger-Kernel ops on the model (%s): %s", patch.function, sorted(ops))
    return model


def _kernels(c: Config) -> dict:
    return dict(triton_dequant=c.backend.triton_dequant, absmax_cache=c.backend.absmax_cache)


def _apply_fused_lora(model, c: Config, device: torch.device, f: Features):
    from lorabench.fast import fused

    # triton_input_grad: the attention's groups only; the MLP's input gradients (K = 2 x 14,336 for
    # gate/up) ran slower in lorabench.fast.kernels.grad than in cuBLAS (docs/runs/2026-11-24_grad/README.md)
    n = fused.patch_attention(decoder_layers(model), c.backend.seeded_dropout, softcap=f.attn_softcap is not None,
                              triton_grad=c.backend.triton_input_grad, **_kernels(c))
    log.info("fused LoRA projections in %d decoder layers", n)
    return model


def _apply_fused_mlp(model, c: Config, device: torch.device, f: Features):
    from lorabench.fast import fused

    n = fused.patch_mlp(decoder_layers(model), c.backend.seeded_dropout, c.backend.swiglu_in_gemm, **_kernels(c))
    log.info("fused MLP projections in %d decoder layers", n)
    return model


def _apply_chunked_loss(model, c: Config, device: torch.device, f: Features):
    from lorabench.fast import chunked_loss

    if PART["liger"].on(c) and "fused_linear_cross_entropy" in c.backend.liger and f.model_type in LIGER:
        log.info("backend.chunked_loss: Liger's patch computes %s's loss in chunks already", f.model_type)
        return model
    if getattr(model.config, "output_router_logits", False):
        raise ValueError(f"backend.chunked_loss computes the cross-entropy alone; this {f.model_type} adds its "
                         "router's auxiliary loss (output_router_logits=true): use backend.chunked_loss=false")
    chunked_loss.patch(model)
    log.info("the loss from the hidden states in chunks: no full-vocabulary logits held")
    return model


def _apply_fused_linear(model, c: Config, device: torch.device, f: Features):
    from lorabench.fast import fused

    n = fused.patch_linears(decoder_layers(model), c.backend.seeded_dropout, **_kernels(c))
    log.info("%d other adapted linear layers through the fused projection", n)
    return model


def _apply_tiled_mlp(model, c: Config, device: torch.device, f: Features):
    from lorabench.fast import tiled

    n = tiled.patch_mlps(decoder_layers(model), c.backend.tiled_mlp)
    log.info("the MLP in tiles of %d tokens in %d decoder layers", c.backend.tiled_mlp, n)
    return model


def _apply_add_norm(model, c: Config, device: torch.device, f: Features):
    from lorabench.fast.kernels import norm as norm_kernels

    n = norm_kernels.patch_add_norm(decoder_layers(model), hybrid=f.model_type in HYBRID_LAYERS)
    log.info("the attention's residual add inside the post-attention RMSNorm in %d decoder layers", n)
    return model


def _fla_lacks(f: Features, c: Config) -> Refusal | None:
    from lorabench.fast import delta_rule

    if f.linear_attention and delta_rule.key_tile(f.linear_key_dim) == delta_rule.BAD_TILE:
        return Refusal("lets fla's gated backward through on Hopper where its key tile is not the miscompiled "
                       f"64-wide one; {f.model_type}'s {f.linear_key_dim}-wide key heads take that tile",
                       {"fla_on_hopper": False})
    return None


def _apply_fla(model, c: Config, device: torch.device, f: Features):
    from lorabench.fast import delta_rule

    if f.linear_attention and device.type == "cuda" and delta_rule.lift_hopper_refusal():
        log.info("flash-linear-attention computes %s's gated delta rule, its Hopper refusal lifted for the %d-wide "
                 "key tile", f.model_type, delta_rule.key_tile(f.linear_key_dim))
    return model


def _delta_net_lacks(f: Features, c: Config) -> Refusal | None:
    return _forward_lacks("fla_delta_net", "Gated DeltaNet layer forward") if f.linear_attention else None


def _apply_delta_net(model, c: Config, device: torch.device, f: Features):
    from lorabench.fast import delta_net, delta_rule

    if not f.linear_attention or device.type != "cuda":
        return model
    if not delta_rule.fla_computes():
        log.info("backend.fla_delta_net: flash-linear-attention is not installed (pip install fla-core); %s's "
                 "linear-attention layers stay transformers' own", f.model_type)
    else:
        n = delta_net.patch(model)
        log.info("%d Gated DeltaNet layers with flash-linear-attention's causal convolution, grouped value heads and "
                 "gated RMSNorm", n)
    return model


def _apply_delta_rule(model, c: Config, device: torch.device, f: Features):
    from lorabench.fast import delta_rule

    if not f.linear_attention or device.type != "cuda":
        return model
    if delta_rule.fla_computes():
        log.info("backend.compile_delta_rule: flash-linear-attention computes %s's gated delta rule; left to it",
                 f.model_type)
        return model
    n = delta_rule.patch(model)
    log.warning("the gated delta rule of %d linear-attention layers through torch.compile: its bf16 LoRA gradients "
                "are not held within the family GPU test's bound (docs/fast-path.md)", n)
    return model


FUSED = ("fused_lora", "fused_mlp", "fused_linear")
# lorabench.fast.fused reads each projection's 4-bit weight and its quant state itself, and keeps references to
# them (absmax_cache, saved for the backward); under FSDP2 a layer's weights are a gathered copy per forward
# whose quant state bitsandbytes' own Linear4bit restores on each call and lorabench.fast.fused does not.
READS_WEIGHTS = "reads each projection's 4-bit weight and quant state itself (lorabench.fast.fused), not FSDP's " \
                "gathered copy"
# In the order they are applied (within a stage, top first). Each part's `what` is the one description of
# its backend key: BackendConfig and conf/backend/fast.yaml point here, docs/fast-path.md's table is made
# from it (tests/test_docs.py).
PARTS = (
    Part("expandable_segments", "PyTorch's caching allocator with expandable segments for the cell: a segment "
         "grows in place instead of a new one being cut, so less memory sits reserved between blocks (and a "
         "memory budget, gpu.memory_gib, counts reserved memory)", Stage.CELL, Cuda.ONLY),
    Part("norm_backward_grid", "Liger's RMSNorm where its weight is frozen (QLoRA): its backward launched with one "
         "program per 4 rows instead of one per SM, its forward and backward without Liger's per-call wrappers; "
         "the same kernels and arithmetic (lorabench.fast.kernels.norm)", Stage.CELL, Cuda.FALLBACK,
         through=("liger",)),
    Part("lean_launch", "every Triton kernel (Liger's, lorabench's) launched past most of JITFunction.run's per-call "
         "host work once its compiled kernel is known: the same kernels on the same arguments, fewer host "
         "microseconds a launch (lorabench.fast.lean_launch)", Stage.CELL, Cuda.ONLY),
    Part("packing", "samples packed into full seq_len rows where the data has padding (data.packing, which "
         "backend=fast sets; lorabench.builders.data)", Stage.DATA, lacks=_packing_lacks),
    Part("varlen_attention", "packed rows' attention as PyTorch's variable-length flash attention, told where each "
         "sample starts, instead of SDPA with a block-diagonal mask: no mask, and keys and values keep their heads "
         "instead of being repeated to the query heads' count (lorabench.fast.packed_attention)",
         Stage.BEFORE_LORA, Cuda.ONLY, lacks=_varlen_lacks, apply=_apply_varlen),
    Part("flex_attention", "soft-capped attention (Gemma-2) as PyTorch's flex attention, the cap a score_mod inside "
         "its kernel: one float per query and head kept for the backward, where transformers' eager attention (SDPA "
         "cannot cap) keeps a [seq x seq] softmax a head", Stage.BEFORE_LORA, Cuda.ONLY, lacks=_flex_lacks,
         apply=_apply_flex),
    Part("liger", "Liger-Kernel's RMSNorm, RoPE, gated MLP (swiglu: SwiGLU, or GeGLU on Gemma) and fused linear "
         "cross-entropy (the loss chunk by chunk from the last hidden states: no logits tensor), through Liger's "
         "patch for the architecture (LIGER)", Stage.BEFORE_LORA, Cuda.REQUIRED, lacks=_liger_lacks,
         apply=_apply_liger),
    Part("chunked_loss", "the loss from the last hidden states in chunks of rows, for a family without Liger's "
         "patch: each chunk's logits, loss and logits' gradient at once, no full-vocabulary logits held (Liger's "
         "fused linear cross-entropy on CUDA, the same chunks in PyTorch elsewhere; lorabench.fast.chunked_loss)",
         Stage.BEFORE_LORA, lacks=_loss_lacks, apply=_apply_chunked_loss),
    Part("ce_chunk_mem", "Liger's fused linear cross-entropy in larger chunks (its chunk_mem_const: each chunk's "
         "logits at most this many x [tokens x hidden] elements, 1 its own): fewer, fuller input-gradient GEMMs on a "
         "large vocabulary, e.g. Llama-3's 128,256-word head at 4,096 tokens in 4 chunks of 1,024 rows at 8 instead "
         "of 32 of 128", Stage.CELL, Cuda.ONLY, through=("liger",)),
    Part("loss_on_device", "Liger's fused linear cross-entropy without its two waits for the device a step (the "
         "labelled tokens counted on the host before the head's first chunk, the upstream gradient compared with "
         "1.0 on the host in the backward): the same chunks and kernels, the count and the scale kept on the device, "
         "so the GPU no longer idles while the host launches the head, then the backward "
         "(lorabench.fast.kernels.loss)", Stage.CELL, Cuda.ONLY, through=("liger",)),
    Part("upcast_fp32", "(false) norms, embeddings and output head kept in bf16 instead of QLoRA's fp32 upcast "
         "(prepare_model_for_kbit_training): a bf16 residual stream, no cast back to bf16 before each linear layer; "
         "the LoRA adapters stay fp32 either way (lorabench.builders.modeling.apply_lora)", Stage.LORA),
    Part("fused_lora", "each layer's q/k/v and o projections with their LoRA adapters in one autograd Function per "
         "group: the adapter's scale and add inside the base GEMM's epilogue, q/k/v's input saved once, its "
         "gradient summed by cuBLAS; PEFT's arithmetic (lorabench.fast.fused)", Stage.AFTER_LORA,
         lacks=_attention_lacks, apply=_apply_fused_lora, unsharded=READS_WEIGHTS),
    Part("fused_mlp", "the MLP's gate/up and down projections through the same Function: gate and up's input "
         "gradient summed by cuBLAS, one [tokens x hidden] add less per layer (lorabench.fast.fused)",
         Stage.AFTER_LORA, lacks=_mlp_lacks, apply=_apply_fused_mlp, unsharded=READS_WEIGHTS),
    Part("fused_linear", "every other adapted linear layer, in any family (gpt-oss's and Gemma-4's attention, a "
         "family without a row...), through the same Function one projection at a time: PEFT's arithmetic without "
         "its clone of the base output, dropout's mask drawn again from a seed (lorabench.fast.fused)",
         Stage.AFTER_LORA, lacks=_linear_lacks, apply=_apply_fused_linear, unsharded=READS_WEIGHTS),
    Part("tiled_mlp", "the MLP over a long row in tiles of this many tokens, its intermediates recomputed tile by "
         "tile in the backward: one tile's gate, up and product held instead of the whole row's (one more forward "
         "of the MLP; lorabench.fast.tiled)", Stage.AFTER_LORA, apply=_apply_tiled_mlp),
    Part("fused_add_norm", "the attention's residual add inside the next RMSNorm (Liger's fused add + RMSNorm "
         "on CUDA): 3 passes over the residual stream less per layer, in Mistral's decoder layer and Qwen3.5's (its "
         "linear- or full-attention mixer; lorabench.fast.kernels.norm)",
         Stage.AFTER_LORA, Cuda.FALLBACK, lacks=_add_norm_lacks, apply=_apply_add_norm),
    Part("fla_on_hopper", "flash-linear-attention's gated delta rule (Qwen3.5's linear attention, where fla is "
         "installed) on a Hopper GPU under Triton 3.4.0-3.7.0, which fla 0.6.0 refuses for one miscompiled tile (fla "
         "#640: its backward's 64-wide key tile): let through where the model's key heads take another (Qwen3.5's "
         "128-wide ones), refused as before where they take that one (lorabench.fast.delta_rule)", Stage.AFTER_LORA,
         Cuda.ONLY, lacks=_fla_lacks, apply=_apply_fla),
    Part("fla_delta_net", "the rest of a linear-attention layer (Qwen3.5's Gated DeltaNet) through "
         "flash-linear-attention's kernels too, where it is installed: the causal convolution with its SiLU in one "
         "kernel in the projection's [tokens, channels] layout (no transposed copies), queries and keys shared by "
         "their value heads inside the rule (no repeated copies), the gated RMSNorm in one kernel; the projections, "
         "decay and beta transformers' own (lorabench.fast.delta_net)", Stage.AFTER_LORA, Cuda.ONLY,
         lacks=_delta_net_lacks, apply=_apply_delta_net),
    Part("compile_delta_rule", "the chunked gated delta rule of linear-attention layers (Qwen3.5's Gated "
         "DeltaNet) where flash-linear-attention does not compute it: transformers' PyTorch function through "
         "torch.compile, the same operations with its elementwise steps fused around the matmuls and recomputed in "
         "the backward instead of kept, in float32 throughout as the function casts its inputs (autocast would run "
         "its matmuls in bf16; lorabench.fast.delta_rule)", Stage.AFTER_LORA, Cuda.ONLY,
         apply=_apply_delta_rule),
    Part("seeded_dropout", "LoRA dropout's masks drawn from a seed and drawn again in the backward, none kept (a "
         "bool mask is 1 byte per element: 32 MiB per projection at 16 x 512 tokens of 4,096 features; "
         "lorabench.fast.kernels.dropout)", Stage.KERNEL, Cuda.FALLBACK, through=FUSED),
    Part("triton_dequant", "nf4 weights dequantised by one Triton kernel, bit for bit bitsandbytes', the double "
         "quantisation of their block scales undone in the same launch (lorabench.fast.kernels.nf4)", Stage.KERNEL,
         Cuda.FALLBACK, through=FUSED),
    Part("absmax_cache", "triton_dequant's block scales dequantised once and kept in fp32 (the weights are "
         "frozen): 4 bytes per 64 weights, 0.44 GB on Mistral-7B, for two gathers per weight less in its kernel",
         Stage.KERNEL, Cuda.FALLBACK, through=("triton_dequant",)),
    Part("triton_input_grad", "the attention's input gradients in fused_lora's backward (q, k and v's summed with "
         "their adapters' terms; o's) as one Triton GEMM each, dX written once, where its output fills the GPU with "
         "8 waves of tiles, e.g. 12,288 tokens of Mistral's 4,096 features on 132 SMs (else cuBLAS's, faster there: "
         "grad.fills); the MLP's stay cuBLAS's "
         "(lorabench.fast.kernels.grad)", Stage.KERNEL, Cuda.FALLBACK, through=("fused_lora",)),
    Part("swiglu_in_gemm", "SwiGLU's backward in the epilogue of the down projection's input-gradient GEMM, where "
         "down has no adapter (with Liger's SwiGLU): dH never reaches memory (lorabench.fast.kernels.grad)",
         Stage.KERNEL, Cuda.ONLY, through=("fused_mlp",)),
    Part("flat_optimizer", "the LoRA adapters updated as one flat tensor: the same arithmetic, one launch a step "
         "instead of one per adapter tensor (256 at r16 on q/k/v/o), each followed by a device sync in "
         "bitsandbytes' 8-bit optimizers (lorabench.fast.flat_optim)", Stage.TRAINER,
         unsharded="makes the adapters views of one flat tensor; FSDP2 holds each as a DTensor shard of its own"),
    Part("lean_step", "the Trainer's per-step host work on the model cut: zero_grad clears only the trainable "
         "parameters, train() walks the modules only when the mode changes; nothing the model computes changes "
         "(lorabench.run.trainer.lean_step)", Stage.TRAINER),
    Part("cuda_graphs", "each kept or recomputed decoder layer's forward and backward captured once as CUDA graphs "
         "and replayed at every step: two launches per layer instead of each kernel's from Python. Needs fixed "
         "shapes (fixed-length rows, or packed rows with varlen_attention) and no mask that reads the batch; one "
         "process, no MoE, no backend.compile (lorabench.fast.graphs)",
         Stage.TRAINER, Cuda.ONLY, through=("fused_lora",), lacks=_graphs_lacks),
    Part("gc_every", "Python's cyclic garbage collector off while training, its two young generations collected "
         "as every Nth step begins (inside that step's time), never a full collection mid-training "
         "(lorabench.measure.meter.StepMeter)", Stage.TRAINER),
    Part("compile", "torch.compile of each decoder layer, fusing the elementwise work between the matmuls "
         "(lorabench.run.backends.apply_compile)", Stage.COMPILE,
         unsharded="compiles each decoder layer before the Trainer wraps it in FSDP2; that order is not checked"),
)


PART = {part.key: part for part in PARTS}


# ---- before a cell: the check; while building the model: the parts in order ------------------------------

def parts_on(c: Config) -> list[Part]:
    return [p for p in PARTS if p.on(c)]


def _triton_interpreter() -> bool:
    # Triton's interpreter runs kernels on CPU tensors (slowly): the tests use it for the ops it supports.
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_sharded(c: Config) -> None:
    """With several processes: refuse a part that cannot run so (CellSkipped, exit 5), by name, before any
    process starts: cuda_graphs (with backend.fit_parts each process turns it off instead: `fit`), and with the
    model sharded (train.parallel=fsdp) each part whose `unsharded` says why."""
    graphs = _graphs_one_process(c) if c.backend.cuda_graphs and not c.backend.fit_parts else None
    if graphs is not None:
        raise CellSkipped(f"backend={c.backend.name.value}: cuda_graphs {graphs.reason} (use {graphs.fix})")
    if not c.train.sharded:
        return
    for part in parts_on(c):
        if part.unsharded:
            raise CellSkipped(f"backend={c.backend.name.value}: {part.key} {part.unsharded}; it cannot run with "
                              f"train.parallel=fsdp (use train.parallel=ddp, or backend.{part.key}=false)")


def fit(c: Config) -> tuple[Config, dict[str, str]]:
    """backend.fit_parts: each part this architecture (or this cell: cuda_graphs with several processes or with
    backend.compile) lacks a feature for is turned off (its Refusal's values) instead of the cell refused; the model
    computed is hf's either way, only slower where a part is off.
    Returns the config the cell runs with and {the setting applied: why}, each logged, for the result."""
    if not c.backend.fit_parts or not parts_on(c):
        return c, {}
    f, off = features(hf_config(c)), {}
    while (hit := next(((p, r) for p in parts_on(c) if (r := p.lacks(f, c)) is not None), None)) is not None:
        part, refusal = hit
        c = _turned_off(c, refusal.off)
        off[refusal.fix] = f"{part.key} {refusal.reason}"
        log.info("backend.fit_parts: %s (%s %s)", refusal.fix, part.key, refusal.reason)
    return c, off


def check_parts(c: Config, hf, device: torch.device) -> None:
    """Before the model is built: refuse a part that cannot compute this architecture's model (CellSkipped:
    status skipped, exit 5, one line naming the part and the feature it lacks; on any device, as the same
    cell would be on any other), then one that needs CUDA or a package missing here (RuntimeError); log
    the parts that have nothing to act through."""
    check_sharded(c)
    name, f, on = c.backend.name.value, features(hf), parts_on(c)
    for part in on:
        refusal = part.lacks(f, c)
        if refusal is not None:
            raise CellSkipped(f"backend={name}: {part.key} {refusal.reason} (use backend=hf, or {refusal.fix})")
    for part in on:
        if part.cuda is Cuda.REQUIRED and device.type != "cuda" and not _triton_interpreter():
            raise RuntimeError(f"backend={name} uses Liger-Kernel's Triton kernels (backend.liger="
                               f"{list(c.backend.liger)}), which need a CUDA GPU; on CPU use backend=hf or "
                               "backend.liger=[]")
        if part.key == "liger" and importlib.util.find_spec("liger_kernel") is None:
            raise RuntimeError(f"backend={name} needs Liger-Kernel: pip install liger-kernel "
                               f"(or backend.liger=[] to run without its kernels)")
        if not part.reaches(c):
            log.info("backend.%s acts through %s, none of them on: it does nothing here", part.key,
                     "/".join(part.through))


def acts(key: str, c: Config, device: torch.device) -> bool:
    """Whether the part `key` acts in this cell: on, with one of the parts it acts through on, and on CUDA where
    it is CUDA only (Cuda.ONLY: elsewhere the cell runs without it, the same model)."""
    part = PART[key]
    return part.on(c) and part.reaches(c) and (part.cuda is not Cuda.ONLY or device.type == "cuda")


@dataclass(frozen=True)
class TrainerParts:
    """The Stage.TRAINER parts as lorabench.run.loop hands them to the Trainer
    (lorabench.run.trainer.MeasuredTrainer) and its
    step meter (lorabench.measure.meter.StepMeter): each one where it acts in this cell (`acts`)."""
    flat_optimizer: bool
    lean_step: bool
    cuda_graphs: bool  # the decoder layers captured; the collator then gives packed batches one shape
    gc_every: int  # 0: Python's own collector schedule
    segments: bool  # varlen attention on packed rows: the collator says where each sample starts


def trainer_parts(c: Config, device: torch.device) -> TrainerParts:
    return TrainerParts(flat_optimizer=acts("flat_optimizer", c, device), lean_step=acts("lean_step", c, device),
                        cuda_graphs=acts("cuda_graphs", c, device), gc_every=c.backend.gc_every,
                        segments=varlen_runs(c, device))


def apply(model, c: Config, device: torch.device, stage: Stage):
    """The parts of `stage` (BEFORE_LORA or AFTER_LORA) that are on, in PARTS' order."""
    f = features(model.config)
    for part in PARTS:
        if part.stage is stage and part.apply is not None and part.on(c):
            model = part.apply(model, c, device, f)
    return model


# ---- around a cell: what the parts change for the whole process, undone after -----------------------------

@contextlib.contextmanager
def around_cell(c: Config, hf=None):
    """The allocator's settings, Liger's module-level replacements in transformers' code for the cell's
    architecture (`hf`, its transformers config: by default the cell's model's), lorabench's launch of
    Liger's RMSNorm backward and of every Triton kernel (lean_launch); undone at the end, whatever happened
    (a multirun trains its next cell, maybe backend=hf, in the same process)."""
    from lorabench.fast import lean_launch
    from lorabench.fast.kernels import norm as norm_kernels

    lean = c.backend.lean_launch and torch.cuda.is_available() and importlib.util.find_spec("triton") is not None
    with _allocator(c), _liger_undone(c, hf), _loss_head(c), lean_launch.patched(lean), \
            norm_kernels.frozen_weight_grid(c.backend.norm_backward_grid and "rms_norm" in c.backend.liger):
        yield


@contextlib.contextmanager
def _loss_head(c: Config):
    """Liger's fused linear cross-entropy as the cell asks: in chunks of backend.ce_chunk_mem (its
    chunk_mem_const), and with backend.loss_on_device on CUDA without its host round trips
    (lorabench.fast.kernels.loss). Every architecture's Liger forward reaches it through
    liger_kernel.transformers.functional's liger_fused_linear_cross_entropy (0.8.5's loss_utils looks it up
    there on each call), which takes the knob but is never given it by those forwards."""
    on_device = c.backend.loss_on_device and torch.cuda.is_available()
    if "fused_linear_cross_entropy" not in c.backend.liger or (c.backend.ce_chunk_mem == 1 and not on_device):
        yield
        return
    functional = importlib.import_module("liger_kernel.transformers.functional")
    original = functional.liger_fused_linear_cross_entropy
    asked = f"backend.ce_chunk_mem={c.backend.ce_chunk_mem} backend.loss_on_device={str(on_device).lower()}"
    if "chunk_mem_const" not in inspect.signature(original).parameters:
        raise RuntimeError(f"{asked}: this liger-kernel's fused linear cross-entropy takes no chunk_mem_const "
                           "(0.8.5's does); use backend.ce_chunk_mem=1 backend.loss_on_device=false")
    loss = original
    if on_device:
        from lorabench.fast.kernels import loss as loss_kernels

        if (differs := loss_kernels.kernel_differs()) is not None:
            raise RuntimeError(f"{asked}: {differs}; use backend.loss_on_device=false")
        loss = functools.partial(loss_kernels.fused_linear_cross_entropy, liger=original)
    # wraps: loss_utils keeps the keywords that the original's signature (__wrapped__) names
    functional.liger_fused_linear_cross_entropy = functools.wraps(original)(
        functools.partial(loss, chunk_mem_const=c.backend.ce_chunk_mem))
    try:
        yield
    finally:
        functional.liger_fused_linear_cross_entropy = original


@contextlib.contextmanager
def _allocator(c: Config):
    if not (c.backend.expandable_segments and torch.cuda.is_available()):
        yield
        return
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    try:
        yield
    finally:  # the next cell of a multirun (maybe hf) gets the allocator as PyTorch sets it
        torch.cuda.empty_cache()
        torch.cuda.memory._set_allocator_settings("expandable_segments:False")


def _liger_patch(c: Config, hf) -> LigerPatch | None:
    if not c.backend.liger:
        return None
    try:
        return LIGER.get(features(hf if hf is not None else hf_config(c)).model_type)
    except (OSError, ValueError):  # no readable config: the cell fails its checks before Liger goes in
        return None


@contextlib.contextmanager
def _liger_undone(c: Config, hf=None):
    patch = _liger_patch(c, hf)
    if patch is None:
        yield
        return
    module = importlib.import_module(patch.module)
    saved = {a: getattr(module, a) for a in patch.attrs if hasattr(module, a)}
    try:
        yield
    finally:
        for a in patch.attrs:
            if a in saved:
                setattr(module, a, saved[a])
            elif hasattr(module, a):  # one Liger added (CrossEntropyLoss where transformers has none)
                delattr(module, a)
