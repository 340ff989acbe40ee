"""The facts of a decoder architecture that lorabench's consumers need, in one place.

`Architecture.from_hf_config(cfg)` is the one function that reads a transformers config (a
checkpoint's config.json, or the one lorabench.models.hf_config builds from conf/model/<name>.yaml);
the FLOP count and MFU (lorabench.measure.metrics), the checks and the host-memory estimate
(lorabench.run.checks), synthetic data (lorabench.builders.data), the tokenizer and LoRA targets
(lorabench.builders.modeling) and bench.py's GEMM shapes read the numbers derived here and assume no
family or shape of their own.

What the config classes leave implicit is in the family's row (lorabench.models.families): Qwen2's
q/k/v bias (hard-coded True, no config key), Qwen3's and Gemma-3's RMSNorm on q and k, Gemma's sandwich
norms, (1 + w) norm weights and sqrt(hidden) embedding scale, Phi-3's fused qkv_proj and gate_up_proj.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from lorabench.models import census
from lorabench.models.census import Census
from lorabench.models.families import Family, family

# Config keys of the number of experts a token runs through, as each family names it (Qwen, Mixtral, gpt-oss,
# Llama-4, DeepSeek: num_experts_per_tok; Gemma 4: top_k_experts).
TOP_K = ("num_experts_per_tok", "top_k_experts", "moe_topk")
# Layer kinds of a config's layer_types whose attention is not quadratic in the sample's length.
LINEAR_KINDS = ("linear_attention",)
LINEAR_HEADS = ("linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim", "linear_value_head_dim")

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
FUSED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True)
class Architecture:
    model_type: str
    hidden: int
    intermediate: int  # the dense MLP's width (an MoE model's dense layers, if any)
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_positions: int
    tied_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sandwich_norms: bool
    norm_offset: float  # RMSNorm scales by (norm_offset + w): 1 for Gemma, 0 elsewhere
    embed_scale: float  # embeddings multiplied by this: sqrt(hidden) for Gemma
    attn_logit_softcap: float | None
    final_logit_softcap: float | None
    windows: tuple  # per layer: its sliding attention window in tokens, None = full causal attention
    activation: str
    fused_qkv: bool
    fused_gate_up: bool
    num_experts: int  # 0: a dense model
    experts_per_token: int
    expert_intermediate: int
    moe_layers: tuple  # per layer: True where the MLP is the experts (an MoE model may keep dense layers)
    partial_rotary_factor: float
    rope_theta: float
    lora_targets: tuple  # the names of the nn.Linear projections LoRA can target
    bidirectional: bool = False  # attention not causal (a config's use_bidirectional_attention)
    residual_dropout: float = 0.0  # dropout on the residual branches (Phi-3's resid_pdrop)
    attn_sinks: bool = False  # a learnt sink logit per head in the softmax (gpt-oss)
    linear_attention: bool = False  # some layers carry a state along the row (Qwen3.5's Gated DeltaNet)
    # a linear-attention layer's (value heads, key heads, key dim, value dim), () without one
    linear_heads: tuple = ()
    gated_mlp: bool = False  # its dense MLP is Llama's gated MLP (the family's row)
    offline_tokenizer: str | None = None  # the family's tokenizer that ships offline at this vocabulary
    no_tokenizer: str = ""  # why none ships, where the family's row knows
    known: bool = True  # lorabench has a row for the family (lorabench.models.families)
    # A family without a formula: its shapes as transformers builds it (lorabench.models.census), from which
    # the counts below are taken instead of the formulas.
    census: Census | None = None

    @classmethod
    def from_hf_config(cls, cfg) -> "Architecture":
        """The one reader of a transformers PretrainedConfig (a multimodal one whose causal LM is its text model,
        as Qwen3.5's, gives its text model's; one built as a vision-language model is refused: NotACausalLM)."""
        census.causal_lm_class(cfg)
        cfg = cfg.get_text_config()
        fam = family(cfg.model_type)
        if not fam.formula:
            return cls._measured(cfg, fam)
        hidden, heads, layers = cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers
        bias = bool(getattr(cfg, "attention_bias", False))  # Llama: q, k, v and o; Qwen3: q, k, v
        experts = getattr(cfg, "num_experts", None) or 0  # Mixtral maps num_experts to num_local_experts
        sliding, types = getattr(cfg, "sliding_window", None), getattr(cfg, "layer_types", None)
        windows = tuple(sliding if t == "sliding_attention" else None for t in types) if types \
            else (sliding,) * layers  # Mistral, Mixtral, Phi-3: one window (or none) for every layer
        rope = getattr(cfg, "rope_parameters", None) or {}
        rope = rope.get("full_attention", rope)  # Gemma-3: one rope per layer type; the global layers'
        fused = fam.fused
        if experts:
            dense_only = set(getattr(cfg, "mlp_only_layers", None) or [])
            step = getattr(cfg, "decoder_sparse_step", 1) or 1
            moe = tuple(i not in dense_only and (i + 1) % step == 0 for i in range(layers))
        else:
            moe = (False,) * layers
        targets = FUSED if fused else ATTENTION + (MLP if not all(moe) else ())
        return cls(
            model_type=cfg.model_type, hidden=hidden, intermediate=cfg.intermediate_size, layers=layers,
            heads=heads, kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or hidden // heads, vocab=cfg.vocab_size,
            max_positions=cfg.max_position_embeddings,
            tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            qkv_bias=fam.qkv_bias if fam.qkv_bias is not None else bias,
            o_bias=bias and fam.o_bias_follows_config, mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            qk_norm=fam.qk_norm, sandwich_norms=fam.sandwich_norms,
            norm_offset=1.0 if fam.norm_plus_one else 0.0,
            embed_scale=math.sqrt(hidden) if fam.scaled_embeddings else 1.0,
            attn_logit_softcap=getattr(cfg, "attn_logit_softcapping", None) if fam.attn_softcap else None,
            final_logit_softcap=getattr(cfg, "final_logit_softcapping", None),
            windows=windows, activation=getattr(cfg, "hidden_activation", None) or cfg.hidden_act,
            fused_qkv=fused, fused_gate_up=fused, num_experts=experts,
            experts_per_token=getattr(cfg, "num_experts_per_tok", 0) if experts else 0,
            expert_intermediate=(getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size)
            if experts else 0,
            moe_layers=moe, partial_rotary_factor=float(rope.get("partial_rotary_factor", 1.0)),
            rope_theta=float(rope.get("rope_theta", 0.0)), lora_targets=targets,
            bidirectional=bool(getattr(cfg, "use_bidirectional_attention", False)),
            residual_dropout=float(getattr(cfg, "resid_pdrop", 0.0) or 0.0), **_row_facts(fam, cfg.vocab_size))

    @classmethod
    def _measured(cls, cfg, fam: Family) -> "Architecture":
        """A family without a formula: its counts from the model transformers builds (census), its other facts
        from the config's keys as the families of 2025-26 name them, its row's where it has one."""
        c = census.take(cfg)
        hidden, heads, n = cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers
        experts = max((e[1] for layer in c.layers for e in layer.experts), default=0)
        top_k = next((v for k in TOP_K if (v := _key(cfg, k))), 0) if experts else 0
        expert_width = _key(cfg, "moe_intermediate_size") or _key(cfg, "intermediate_size") or 0
        rope = _key(cfg, "rope_parameters") or {}
        rope = rope.get("full_attention", rope)
        q_bias = any(b for layer in c.layers for name, _, _, b in layer.linear if name.endswith("q_proj"))
        return cls(
            model_type=cfg.model_type, hidden=hidden, intermediate=_key(cfg, "intermediate_size") or 0, layers=n,
            heads=heads, kv_heads=_key(cfg, "num_key_value_heads") or heads,
            head_dim=_key(cfg, "head_dim") or hidden // heads, vocab=cfg.vocab_size,
            max_positions=_key(cfg, "max_position_embeddings") or 0,
            tied_embeddings=bool(_key(cfg, "tie_word_embeddings")), qkv_bias=q_bias, o_bias=False,
            mlp_bias=bool(_key(cfg, "mlp_bias")), qk_norm=fam.qk_norm, sandwich_norms=fam.sandwich_norms,
            norm_offset=1.0 if fam.norm_plus_one else 0.0,
            embed_scale=math.sqrt(hidden) if fam.scaled_embeddings else 1.0,
            attn_logit_softcap=_key(cfg, "attn_logit_softcapping"),
            final_logit_softcap=_key(cfg, "final_logit_softcapping"), windows=_windows(cfg, n),
            activation=_key(cfg, "hidden_activation") or _key(cfg, "hidden_act") or "",
            fused_qkv=False, fused_gate_up=False, num_experts=experts, experts_per_token=top_k,
            expert_intermediate=expert_width if experts else 0, moe_layers=tuple(bool(x.experts) for x in c.layers),
            partial_rotary_factor=float(rope.get("partial_rotary_factor", 1.0)),
            rope_theta=float(rope.get("rope_theta", 0.0) or 0.0), lora_targets=_adaptable(c, experts),
            bidirectional=bool(_key(cfg, "use_bidirectional_attention")),
            residual_dropout=float(_key(cfg, "resid_pdrop") or 0.0),
            attn_sinks=fam.attn_sinks, known=fam.known, census=c, **_row_facts(fam, cfg.vocab_size),
            linear_heads=tuple(_key(cfg, k) for k in LINEAR_HEADS) if fam.linear_attention else ())

    @classmethod
    def from_dict(cls, d: dict) -> "Architecture":
        """From asdict() after a JSON round trip (a DDP rank's file): lists back to tuples."""
        d = {**d, "census": Census.from_dict(d["census"]) if d.get("census") else None}
        return cls(**{f.name: tuple(d[f.name]) if isinstance(d.get(f.name), list) else d.get(f.name, f.default)
                      for f in fields(cls)})

    # ------------------------------------------------------------------ shapes
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def projections(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear projection of a decoder layer, by module name (a measured family's:
        the first layer that has it; its count per layer from layer_counts)."""
        if self.census is not None:
            out = {}
            for layer in self.census.layers:
                for name, i, o, _ in layer.linear:
                    out.setdefault(name.rsplit(".", 1)[-1], (i, o))
            return out
        h, q, kv, ff = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "qkv_proj": (h, q + 2 * kv), "gate_proj": (h, ff), "up_proj": (h, ff), "down_proj": (ff, h),
                "gate_up_proj": (h, 2 * ff)}

    def resolve_lora_targets(self, requested) -> tuple:
        """The module names LoRA wraps for lora.target_modules: names of this architecture's
        projections as they are; where q/k/v (gate/up) are one fused layer (Phi-3), the three (two)
        names asked for together give the fused one. Any other name: ValueError in one line. all-linear: a
        measured family's every adaptable linear layer by name (routers and scalar gates left out: PEFT's own
        all-linear would adapt them, and Llama-4's router, an nn.Linear returning a tuple, breaks under it)."""
        requested = list(requested)
        if requested == ["all-linear"]:
            return self.lora_targets if self.census is not None else ("all-linear",)
        out = []
        for fused, parts in (("qkv_proj", ATTENTION[:3]), ("gate_up_proj", MLP[:2])):
            asked = [n for n in parts if n in requested]
            if self.fused_qkv and asked:
                if len(asked) < len(parts):
                    raise ValueError(f"lora.target_modules={requested}: model_type={self.model_type} has one fused "
                                     f"{fused} for {'/'.join(parts)}: name all of them, or {fused}, or none")
                out.append(fused)
        for name in requested:
            if name in out or (self.fused_qkv and name in ATTENTION[:3] + MLP[:2]):
                continue
            if name not in self.lora_targets:
                raise ValueError(f"lora.target_modules={requested}: {name!r} is not a linear layer of "
                                 f"model_type={self.model_type}; use any of {list(self.lora_targets)} or [all-linear]")
            out.append(name)
        return tuple(out)

    def layer_counts(self, name: str) -> int:
        """In how many decoder layers the nn.Linear `name` exists (an MoE layer's MLP has none)."""
        if self.census is not None:
            return sum(any(n.rsplit(".", 1)[-1] == name for n, *_ in layer.linear) for layer in self.census.layers)
        return sum(not m for m in self.moe_layers) if name in MLP + ("gate_up_proj",) else self.layers

    def lora_params(self, targets, r: int, experts: bool = False) -> int:
        """Trainable parameters of rank-r adapters on `targets`: r x (in + out) per projection and layer;
        with `experts` (lora.experts) also one adapter per expert on its gate/up [2f x h] and down [h x f]
        weights, r x (2h + 3f) an expert, as PEFT's target_parameters makes them."""
        if self.census is not None:
            mods = sum(r * (i + o) for layer in self.census.layers for n, i, o, _ in layer.linear
                       if n.rsplit(".", 1)[-1] in targets)
            # PEFT's target_parameters: A [E*r x in], B [out x E*r] per 3-D weight [E, out, in] (either layout)
            on = sum(r * e * (a + b) for layer in self.census.layers for _, e, a, b in layer.experts)
            return mods + (on if experts else 0)
        shapes = self.projections()
        on_experts = sum(self.moe_layers) * self.num_experts * r * (2 * self.hidden + 3 * self.expert_intermediate)
        return sum(r * sum(shapes[t]) * self.layer_counts(t) for t in targets) + (on_experts if experts else 0)

    # ------------------------------------------------------------------ parameter counts
    def matmul_params(self, active: bool = False) -> int:
        """Weights that multiply each token's activations: every decoder layer's projections (an MoE
        layer's router and its experts: all of them, or with `active` the top-k each token runs
        through) and the output head; embeddings are a lookup, not counted."""
        if self.census is not None:
            share = self.experts_per_token / self.num_experts if active and self.is_moe else 1.0
            linear = sum(i * o for layer in self.census.layers for _, i, o, _ in layer.linear + layer.odd_linear)
            return int(linear + share * self.expert_params() + self.census.head[0] * self.census.head[1])
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        attention = 2 * h * q + 2 * h * kv
        dense = 3 * h * self.intermediate  # gate, up and down (SwiGLU / GeGLU)
        n_moe = sum(self.moe_layers)
        experts = self.experts_per_token if active else self.num_experts
        moe = h * self.num_experts + experts * 3 * h * self.expert_intermediate
        return self.layers * attention + (self.layers - n_moe) * dense + n_moe * moe + h * self.vocab

    def expert_params(self) -> int:
        """An MoE model's expert weights, every expert of every MoE layer (0 for a dense model). transformers 5
        stores them as 3-D parameters, which bitsandbytes does not quantise: they stay 16-bit in nf4 and int8
        cells (lorabench.builders.modeling.experts_set_aside)."""
        if self.census is not None:
            return sum(e * a * b for layer in self.census.layers for _, e, a, b in layer.experts)
        return sum(self.moe_layers) * self.num_experts * 3 * self.hidden * self.expert_intermediate

    def total_params(self, active: bool = False) -> int:
        """Every parameter, as a checkpoint's size is quoted: matmul weights, embeddings (once when
        tied to the head), biases and norm weights; with `active` an MoE model's top-k experts only
        (its "activated" size)."""
        if self.census is not None:
            idle = self.expert_params() * (1 - self.experts_per_token / self.num_experts) if self.is_moe else 0
            return int(self.census.total_params - (idle if active else 0))
        h = self.hidden
        embed = 0 if self.tied_embeddings else self.vocab * h
        bias = self.layers * ((self.q_dim + 2 * self.kv_dim) * self.qkv_bias + h * self.o_bias)
        bias += self.layers * self.mlp_bias * (2 * self.intermediate + h)
        norms = self.layers * ((4 if self.sandwich_norms else 2) * h + 2 * self.head_dim * self.qk_norm) + h
        return self.matmul_params(active) + embed + bias + norms

    # ------------------------------------------------------------------ FLOPs
    def attention_flops(self, sum_len_sq: float, tokens: float) -> float:
        """Attention's score and value products over a batch, forward and backward: 12 x heads x
        head_dim per (query, key) pair, each query counted against every key of its sample (the
        usual convention, causality not halved) or, in a sliding-window layer, against at most
        `window` keys. From sum(l^2) and sum(l) over the samples, a windowed layer's pairs are
        min(sum l^2, window x sum l): exact when every sample is on one side of the window (fixed
        rows are), an upper bound otherwise.

        A measured family's layers each at their own width (heads x head_dim of its softmax attention: Gemma 4's
        global layers are wider than its local ones); a linear-attention layer (window 0: Qwen3.5's Gated
        DeltaNet) has no pairs but a state of value heads x key dim x value dim per token, written and read once
        per token forward (2 + 2 FLOPs per element) and twice backward: 12 x state per token. The chunked
        kernel's intra-chunk products are left out (64-token chunks: under a tenth of that at these widths)."""
        def pairs(w):
            return sum_len_sq if w is None else min(sum_len_sq, w * tokens)

        if self.census is None:
            return 12 * self.heads * self.head_dim * sum(pairs(w) for w in self.windows)
        quadratic = sum(layer.attention * pairs(w) for layer, w in zip(self.census.layers, self.windows) if w != 0)
        return 12 * quadratic + 12 * tokens * sum(layer.linear_state for layer in self.census.layers)

    def flops_per_token(self, seq_len: int, lora_params: int = 0) -> float:
        """Model FLOPs of one training token in full rows of seq_len tokens (lorabench.measure.metrics'
        convention: 4 per frozen active weight, 6 per adapter weight, plus attention)."""
        attention = self.attention_flops(seq_len**2, seq_len) / seq_len
        return 4 * self.matmul_params(active=True) + 6 * lora_params + attention

    def gemm_shapes(self) -> list[tuple[int, int, int]]:
        """(in, out, times per step) of the base products one training step runs on every token:
        each layer's projections (an MoE layer's active experts as k products of the expert's
        shape: its FLOPs, not its smaller per-expert row counts) and the output head once. A measured
        family: each distinct linear shape with how many layers run it, its experts at their active share."""
        if self.census is not None:
            count = {}
            for layer in self.census.layers:
                for _, i, o, _ in layer.linear:
                    count[(i, o)] = count.get((i, o), 0) + 1
                for _, e, a, b in layer.experts:
                    count[(b, a)] = count.get((b, a), 0) + self.experts_per_token
            return [(i, o, t) for (i, o), t in count.items()] + [self.census.head + (1,)]
        p, n_moe = self.projections(), sum(self.moe_layers)
        attn = [p["qkv_proj"] + (1,)] if self.fused_qkv else [p["q_proj"] + (1,), p["k_proj"] + (2,)]
        shapes = [(i, o, t * self.layers) for i, o, t in attn] + [p["o_proj"] + (self.layers,)]
        dense = self.layers - n_moe
        if dense:
            up = [p["gate_up_proj"] + (dense,)] if self.fused_gate_up else [p["gate_proj"] + (2 * dense,)]
            shapes += up + [p["down_proj"] + (dense,)]
        if n_moe:
            h, f, k = self.hidden, self.expert_intermediate, self.experts_per_token
            shapes += [(h, f, 2 * k * n_moe), (f, h, k * n_moe)]
        return shapes + [(self.hidden, self.vocab, 1)]

    def linear_layers(self) -> int:
        """Decoder layers whose attention is linear (their window 0: no attention over pairs)."""
        return sum(w == 0 for w in self.windows)

    def activation_width(self) -> int:
        """Values per token that a decoder layer keeps for its backward pass, about: its input, the
        attention's q/k/v and output (4 x hidden) and the MLP's two intermediates (an MoE layer's
        for each of its top-k experts). A measured family: the widest layer's linear outputs (the inputs of
        the projections after them), top-k experts' at their width."""
        if self.census is not None:
            def kept(layer):
                return self.hidden + sum(o for _, _, o, _ in layer.linear) + sum(
                    self.experts_per_token * min(a, b) * 2 for _, _, a, b in layer.experts)
            return max(kept(layer) for layer in self.census.layers)
        ff = self.experts_per_token * self.expert_intermediate if self.is_moe else self.intermediate
        return 4 * self.hidden + 2 * ff


def _row_facts(fam: Family, vocab: int) -> dict:
    """What the family's row says of a model at this vocabulary, carried by its Architecture."""
    return dict(linear_attention=fam.linear_attention, gated_mlp=fam.gated_mlp,
                offline_tokenizer=fam.tokenizers.get(vocab), no_tokenizer=fam.no_tokenizer)


def _key(cfg, name: str):
    """A config key, or None where the config lacks it, or raises on reading it (Gemma 4's head_dim differs per
    layer: reading it raises)."""
    try:
        return getattr(cfg, name, None)
    except Exception:
        return None


def _windows(cfg, layers: int) -> tuple:
    """Per layer: the keys a query attends to at most (sliding window, Llama-4's attention chunk), None for
    every earlier key of its sample, 0 for a linear-attention layer (no attention over pairs)."""
    types = _key(cfg, "layer_types")
    sliding = _key(cfg, "sliding_window") if _key(cfg, "use_sliding_window") is not False else None
    if not types:
        return (sliding,) * layers
    kinds = {"sliding_attention": sliding, "chunked_attention": _key(cfg, "attention_chunk_size"),
             **{k: 0 for k in LINEAR_KINDS}}
    return tuple(kinds.get(t) for t in types)


def _adaptable(c: Census, experts: int) -> tuple:
    """The names of a decoder layer's linear layers LoRA adapts under their own name ('q_proj'...), in the order
    the model holds them: every plain nn.Linear but a router (named router or gate, out_features = the number of
    experts: Gemma 4's router.proj) or a scalar gate (out_features 1: Qwen3.5-MoE's shared_expert_gate), which
    carry routing, not features."""
    def routing(name: str, out: int) -> bool:
        leaf = name.rsplit(".", 1)[-1]
        return out == 1 or (experts and out == experts and ("router" in name or leaf.endswith("gate")))

    names = {}
    for layer in c.layers:
        for name, _, out, _ in layer.linear:
            if not routing(name, out):
                names.setdefault(name.rsplit(".", 1)[-1], None)
    return tuple(names)
