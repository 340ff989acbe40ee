"""A model's shapes as transformers builds it, for a family whose row has no formula of its own.

The checkpoint's config is built on the meta device (no memory: 0.2-0.6 s for a 35-70B model) by the class
AutoModelForCausalLM picks for it, and its decoder layers are read: every nn.Linear (name, in, out, bias),
every 3-D expert weight, the width of each layer's softmax attention and the state of its linear attention.
lorabench.models.architecture counts parameters, FLOPs and LoRA targets from this census, so a family without
a row (or with a row but no formula: hybrid layers, per-layer head sizes, attention sinks) is measured as
what it is, not as a Llama with its numbers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerCensus:
    linear: tuple  # (name inside the layer, in, out, has bias) of each nn.Linear the layer computes with
    experts: tuple  # (name inside the layer, experts, rows, cols) of each 3-D expert weight
    attention: int  # heads x head_dim of its softmax attention (o_proj's input); 0: it has none
    linear_state: int  # its linear attention's state per token: value heads x key dim x value dim (0: none)
    odd_linear: tuple = ()  # nn.Linear subclasses with a forward of their own (Llama-4's router): never adapted


@dataclass(frozen=True)
class Census:
    model_class: str  # what AutoModelForCausalLM builds for the config
    layers: tuple  # LayerCensus per decoder layer
    head: tuple  # (in, out) of the output head
    embed_params: int  # the input embeddings (every per-layer embedding table too)
    total_params: int  # every parameter, once (tied head and embeddings counted once)

    @classmethod
    def from_dict(cls, d: dict) -> "Census":
        """From asdict() after a JSON round trip: lists back to tuples."""
        def layer(x):
            return LayerCensus(**{k: tuple(tuple(i) for i in v) if isinstance(v, list) else v for k, v in x.items()})
        return cls(d["model_class"], tuple(layer(x) for x in d["layers"]), tuple(d["head"]), d["embed_params"],
                   d["total_params"])


class NotACausalLM(ValueError):
    """transformers builds no text-only causal LM for this config (a vision-language model, an encoder)."""


def causal_lm_class(cfg) -> str:
    """The class AutoModelForCausalLM builds for `cfg`, from its mapping (nothing is built); NotACausalLM in one
    line where it builds none, or builds a vision-language model (Gemma 4's, Mistral 3's checkpoints)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(cfg.model_type)
    if name is None:
        raise NotACausalLM(f"model_type={cfg.model_type!r}: transformers builds no causal LM for it (it is not in "
                           "AutoModelForCausalLM's mapping); lorabench trains text-only causal LMs")
    if not name.endswith("ForCausalLM"):
        raise NotACausalLM(f"model_type={cfg.model_type!r} is built as {name} (a vision-language model): give its "
                           "text model's config (its text_config's model_type) to train the language model alone")
    return name


def take(cfg) -> Census:
    """The census of `cfg` (a transformers PretrainedConfig), built once per distinct config. A config that another
    library hands out in a wrapper of its own (Unsloth's proxy around Gemma 4's text config) is rebuilt as the class
    transformers registers for its model_type."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = type(cfg) if hasattr(type(cfg), "from_dict") else CONFIG_MAPPING[cfg.model_type]
    return _take(cfg.to_json_string(use_diff=False), cls)


@functools.lru_cache(maxsize=16)
def _take(config_json: str, config_class) -> Census:
    import json

    import torch
    from transformers import AutoModelForCausalLM

    cfg = config_class.from_dict(json.loads(config_json))
    causal_lm_class(cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    name = type(model).__name__
    layers = tuple(_layer(layer) for layer in decoder_layers(model))
    head = model.get_output_embeddings()
    embeds = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    seen, total = set(), 0
    for p in model.parameters():  # tied weights are one parameter: counted once
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return Census(name, layers, (head.in_features, head.out_features), embeds, total)


def decoder_layers(model):
    """The decoder layers of a causal LM (PEFT-wrapped or not): model.model.layers in the Llama lineage, else the
    longest ModuleList of one block class (GPT-2's transformer.h, GPT-NeoX's gpt_neox.layers)."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(base, "model", None), "layers", None)
    if isinstance(layers, torch.nn.ModuleList):
        return layers
    stacks = [m for m in base.modules() if isinstance(m, torch.nn.ModuleList) and len(m)
              and len({type(x) for x in m}) == 1]
    if not stacks:
        raise NotACausalLM(f"{type(base).__name__} has no stack of decoder layers (a ModuleList of one block class)")
    return max(stacks, key=len)


def _layer(layer) -> LayerCensus:
    import torch

    linear, odd, experts = [], [], []
    attention = state = 0
    for name, m in layer.named_modules():
        if isinstance(m, torch.nn.Linear):
            row = (name, m.in_features, m.out_features, m.bias is not None)
            (linear if type(m) is torch.nn.Linear else odd).append(row)
            if name.endswith("o_proj") and "attn" in name:
                attention = m.in_features
        if name.endswith("experts"):
            experts += [(f"{name}.{pname}", *p.shape) for pname, p in m.named_parameters(recurse=False) if p.ndim == 3]
        # A linear-attention mixer (Qwen3.5's Gated DeltaNet): its recurrent state per token and head.
        if hasattr(m, "head_k_dim") and hasattr(m, "head_v_dim") and hasattr(m, "num_v_heads"):
            state = m.num_v_heads * m.head_k_dim * m.head_v_dim
    return LayerCensus(tuple(linear), tuple(experts), attention, state, tuple(odd))


def saved_bytes(run) -> int:
    """Bytes of the tensors autograd saves for the backward while `run()` runs: a tensor saved twice, or a view of
    one, is held once, by its storage."""
    import torch

    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(kept.values())


@functools.lru_cache(maxsize=8)
def delta_rule_bytes(heads: tuple) -> float:
    """Bytes a token of transformers' PyTorch chunked gated delta rule (Qwen3.5's linear attention, where
    flash-linear-attention does not compute it) keeps for its backward under a bf16 cell's autocast: q, k and v in
    float32, each chunk's [64 x 64] decay and UT-transform matrices per head, the solved values and keys, the
    recurrent state at each chunk's start. Measured, not written out: the saved tensors of one row of 128 tokens on
    the CPU (the same per token at any length: everything it keeps is per chunk of 64 tokens), for `heads` =
    (value heads, key heads, key dim, value dim) as Architecture.linear_heads holds them."""
    import torch
    from transformers.models.qwen3_5 import modeling_qwen3_5

    v_heads, _, k_dim, v_dim = heads
    tokens, g = 128, torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, tokens, v_heads, k_dim, generator=g).bfloat16().requires_grad_() for _ in range(2))
    v = torch.randn(1, tokens, v_heads, v_dim, generator=g).bfloat16().requires_grad_()
    decay = (-torch.rand(1, tokens, v_heads, generator=g)).requires_grad_()
    beta = torch.rand(1, tokens, v_heads, generator=g).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kept = saved_bytes(lambda: modeling_qwen3_5.torch_chunk_gated_delta_rule(
            q, k, v, g=decay, beta=beta, use_qk_l2norm_in_kernel=True))
    return kept / tokens


@functools.lru_cache(maxsize=16)
def eager_scores_bytes(model_type: str) -> float:
    """Bytes transformers' eager attention of a family with a row keeps for its backward per head and [query x key]
    pair of one row in one layer (it keeps each head's [seq x seq] softmax: in float32 with a bf16 copy where the
    family's softmax runs in float32, the soft-capped scores too where it caps them). Measured, not written out: the
    saved tensors of the family's tiny bf16 model (lorabench.models.families.TINY_SHAPE) at rows of 16, 32 and 48
    tokens on the CPU; their second difference is the part quadratic in the row's length (weights and per-token
    tensors cancel), spread over the layers' heads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from lorabench.models.families import FAMILIES, TINY_SHAPE

    cfg = AutoConfig.for_model(model_type, **{**TINY_SHAPE, **FAMILIES[model_type].tiny})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="eager").train()
    saved = [saved_bytes(lambda: model(input_ids=torch.arange(seq).remainder(cfg.vocab_size)[None]))
             for seq in (16, 32, 48)]
    quadratic = (saved[2] - 2 * saved[1] + saved[0]) / 2 / 16**2  # B(s) = c + a s + b s^2: 2 b 16^2
    return quadratic / (cfg.num_hidden_layers * cfg.num_attention_heads)
