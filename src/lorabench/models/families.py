"""One row per model family: everything lorabench knows of a transformers model_type, in one place.

Every consumer derives what it needs from a row: the Architecture (lorabench.models.architecture) reads
the facts that a config.json leaves implicit, the fast path (lorabench.fast.parts) which of its parts
compute the family's layers and which Liger patch it has, the tokenizer table (lorabench.models.tokenizers)
which tokenizer ships offline at which vocabulary, and the tests a tiny random checkpoint with the family's
features visible. Adding a family is one row here, checked against transformers' own modeling code by
tests/models/test_families.py and tests/fast/test_fast_arch.py.

A model_type without a row still trains with backend=hf: `family(model_type)` then gives an unknown row,
whose facts come from the checkpoint alone (its config and its modules, lorabench.models.census), no fast
part computes it, and every cell of it says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

# transformers' RMSNorm models give their norm weights an offset of 1 (Gemma) or none; the fields below say
# what the modeling code does and its config.json does not: a config key decides everything else.


@dataclass(frozen=True)
class Family:
    model_type: str
    prefix: str  # transformers' class-name prefix: Gemma3 for gemma3_text (Gemma3Attention, Gemma3MLP...)
    # ---- what the modeling code does that config.json does not say
    qkv_bias: bool | None = None  # a bias on q, k and v hard-coded (Qwen2); None: the config's attention_bias
    o_bias_follows_config: bool = False  # attention_bias puts a bias on o too (Llama), not only on q/k/v
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma-3)
    sandwich_norms: bool = False  # post-attention and post-MLP norms besides the two pre-norms (Gemma)
    norm_plus_one: bool = False  # RMSNorm weights used as (1 + w), initialised at 0 (Gemma-2/3, Qwen3.5)
    scaled_embeddings: bool = False  # embeddings multiplied by sqrt(hidden) (Gemma)
    fused: bool = False  # one qkv_proj and one gate_up_proj (Phi-3)
    attn_softcap: bool = False  # the attention soft-caps its logits (Gemma-2; Gemma-3's config has the key, unused)
    attn_sinks: bool = False  # a learnt sink logit per head joins the softmax (gpt-oss)
    linear_attention: bool = False  # some layers are linear attention, a state carried along the row (Qwen3.5)
    # ---- the fast path (lorabench.fast.parts)
    fused_attention: bool = False  # lorabench.fast.fused computes its attention forward exactly (Llama's lineage)
    gated_mlp: bool = False  # its MLP is Llama's gated MLP (gate, up, act, down), which lorabench.fast.fused computes
    mistral_layer: bool = False  # its decoder layer is Mistral's: pre-norms and residual adds, nothing else
    hybrid_layer: bool = False  # Qwen3.5's: Mistral's, its token mixer linear or full attention by layer (block_type)
    liger_mlp: str | None = None  # the keyword of Liger's gated-MLP kernel for it (swiglu, geglu); None: no patch
    liger_mlp_class: str = "MLP"  # the class Liger's patch replaces: MLP, or Experts (MoE)
    liger_extra: tuple[str, ...] = ()  # other module attributes its patch replaces (Mistral's CrossEntropyLoss)
    liger_model: str = ""  # Liger's name for it, where not the model_type (apply_liger_kernel_to_qwen3_5)
    # ---- tokenizers that ship offline, by vocabulary size (lorabench.models.tokenizers names them)
    tokenizers: Mapping[int, str] = field(default_factory=dict)
    no_tokenizer: str = ""  # why none ships, where that is known
    # ---- a tiny random checkpoint for the tests: config.json keys that make the family's features visible at
    # hidden 64 and 2 decoder layers (a window shorter than a 16-token sample, soft-caps at 2, head_dim that is
    # not hidden / heads, experts)
    tiny: Mapping = field(default_factory=dict)
    # The Architecture's numbers from lorabench.models.architecture's formulas (Llama's layer and its variants,
    # held to the published sizes), else from the model as transformers builds it (lorabench.models.census).
    formula: bool = False
    known: bool = True  # False for a model_type without a row

    @property
    def module(self) -> str:
        """transformers' modeling module of the family (gemma3_text's is gemma3's)."""
        name = self.model_type.removesuffix("_text")
        return f"transformers.models.{name}.modeling_{name}"

    @property
    def liger_function(self) -> str | None:
        return f"apply_liger_kernel_to_{self.liger_model or self.model_type}" if self.liger_mlp else None


# The shape of every family's tiny random checkpoint (the tests', and the census's measurements of one layer's
# attention); each family adds the keys that make its features visible (Family.tiny).
TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, vocab_size=512)
WINDOW = 6  # tokens: shorter than the tests' 16-token samples, so the window changes which keys a query sees
TWO_KINDS = ["sliding_attention", "full_attention"]  # the two layers of a tiny checkpoint, one of each kind
MISTRAL_TOKENIZERS = {32768: "mistral_instruct_tokenizer_240323.model.v3", 131072: "tekken_240718.json"}
QWEN25_TOKENIZERS = {152064: "qwen2.5", 151936: "qwen2.5"}
GEMMA = "Gemma's SentencePiece model ships in no registry package"
QWEN35 = "Qwen3.5's 248k-id tokenizer ships in no registry package"
OLMO = "OLMo's tokenizer ships in no registry package"
# Qwen3.5's hybrid stack at 4 layers: three Gated DeltaNet layers, then a gated full-attention one
QWEN35_TINY = dict(num_hidden_layers=4, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                   linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                   tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                                    "mrope_section": [2, 1, 1], "mrope_interleaved": True})
MISTRAL_LIKE = dict(fused_attention=True, gated_mlp=True, mistral_layer=True, liger_mlp="swiglu", formula=True)

FAMILIES: Mapping[str, Family] = MappingProxyType({f.model_type: f for f in (
    Family("mistral", "Mistral", **MISTRAL_LIKE, liger_extra=("CrossEntropyLoss",), tokenizers=MISTRAL_TOKENIZERS,
           tiny=dict(head_dim=16, sliding_window=WINDOW)),
    Family("llama", "Llama", **MISTRAL_LIKE, o_bias_follows_config=True, tokenizers={128256: "llama3"},
           tiny=dict(head_dim=16, rope_parameters={
               "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    Family("qwen2", "Qwen2", **MISTRAL_LIKE, qkv_bias=True, tokenizers=QWEN25_TOKENIZERS,
           tiny=dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),  # no head_dim key
    Family("qwen3", "Qwen3", **MISTRAL_LIKE, qk_norm=True, tokenizers={151936: "qwen3"},
           tiny=dict(head_dim=32)),  # head_dim != hidden / heads
    Family("qwen3_moe", "Qwen3Moe", **MISTRAL_LIKE, qk_norm=True, liger_mlp_class="Experts",
           tokenizers={151936: "qwen3"},
           tiny=dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)),
    Family("mixtral", "Mixtral", **MISTRAL_LIKE, liger_mlp_class="Experts",
           tiny=dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2)),
    Family("gemma2", "Gemma2", sandwich_norms=True, norm_plus_one=True, scaled_embeddings=True, attn_softcap=True,
           fused_attention=True, gated_mlp=True,
           liger_mlp="geglu", no_tokenizer=GEMMA, formula=True,
           tiny=dict(head_dim=16, sliding_window=WINDOW, layer_types=TWO_KINDS, attn_logit_softcapping=2.0,
                     final_logit_softcapping=2.0, query_pre_attn_scalar=24)),
    Family("gemma3_text", "Gemma3", qk_norm=True, sandwich_norms=True, norm_plus_one=True, scaled_embeddings=True,
           fused_attention=True, gated_mlp=True, liger_mlp="geglu", no_tokenizer=GEMMA, formula=True,
           tiny=dict(head_dim=16, sliding_window=WINDOW, layer_types=TWO_KINDS, final_logit_softcapping=2.0,
                     query_pre_attn_scalar=24)),
    Family("phi3", "Phi3", **MISTRAL_LIKE, fused=True, tokenizers={100352: "phi4"},
           tiny=dict(pad_token_id=0, partial_rotary_factor=0.75)),
    # ---- the families of 2026: numbers measured on the built model (census), no fast attention of their own yet
    Family("qwen3_5_text", "Qwen3_5", qk_norm=True, norm_plus_one=True, linear_attention=True, gated_mlp=True,
           hybrid_layer=True, liger_mlp="swiglu", liger_model="qwen3_5", no_tokenizer=QWEN35, tiny=dict(QWEN35_TINY)),
    Family("qwen3_5_moe_text", "Qwen3_5Moe", qk_norm=True, norm_plus_one=True, linear_attention=True,
           no_tokenizer=QWEN35, tiny=dict(QWEN35_TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                          shared_expert_intermediate_size=32)),
    Family("gemma4_text", "Gemma4", qk_norm=True, sandwich_norms=True, scaled_embeddings=True, no_tokenizer=GEMMA,
           # the 26B-A4B's layer: a dense MLP and experts side by side; global layers with twice the head_dim
           # and keys that are the values (no v_proj)
           tiny=dict(num_hidden_layers=4, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                     attention_k_eq_v=True, hidden_size_per_layer_input=0, sliding_window=WINDOW,
                     final_logit_softcapping=2.0, layer_types=["sliding_attention"] * 3 + ["full_attention"],
                     enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                     rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                      "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                         "rope_theta": 1000000.0}})),
    Family("gpt_oss", "GptOss", attn_sinks=True, no_tokenizer="gpt-oss's o200k_harmony ships in no registry package",
           tiny=dict(head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                     sliding_window=WINDOW)),
    Family("olmo3", "Olmo3", qk_norm=True, gated_mlp=True, no_tokenizer=OLMO,
           tiny=dict(num_hidden_layers=4, sliding_window=WINDOW)),  # 3 sliding layers, then a full one
    Family("olmo2", "Olmo2", qk_norm=True, gated_mlp=True, no_tokenizer=OLMO),
    # Llama's attention and MLP, with muP's multipliers on the embeddings, residual branches and logits
    Family("granite", "Granite", fused_attention=True, gated_mlp=True,
           no_tokenizer="Granite's tokenizer ships in no registry package",
           tiny=dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                     logits_scaling=16.0, tie_word_embeddings=True)),
    Family("ministral3", "Ministral3", gated_mlp=True, mistral_layer=True,
           no_tokenizer="Ministral 3's Tekken ships in no registry package",
           # yarn from 4 positions: a 16-token sample's queries are scaled by 1 + 0.1 ln(1 + floor(position / 4))
           tiny=dict(head_dim=16, rope_parameters={
               "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 4,
               "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
               "llama_4_scaling_beta": 0.1})),
    Family("llama4_text", "Llama4", no_tokenizer="Llama 4's tokenizer ships in no registry package",
           # Maverick's layout: dense and MoE layers in turn; chunked attention on the RoPE layers, NoPE every 4th
           tiny=dict(num_hidden_layers=4, head_dim=16, intermediate_size=32, intermediate_size_mlp=128,
                     num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                     attention_chunk_size=WINDOW)),
    Family("smollm3", "SmolLM3", gated_mlp=True, mistral_layer=True,
           no_tokenizer="SmolLM3's tokenizer ships in no registry package",
           tiny=dict(num_hidden_layers=4, tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
)})

def family(model_type: str) -> Family:
    """The row of `model_type`, or GENERIC (with that model_type) when lorabench has none."""
    row = FAMILIES.get(model_type)
    return row if row is not None else Family(model_type, "", known=False)
