"""What a training step holds on the GPU at its peak, by part, from the model's shape and the cell's layout
(which decoder layers keep, recompute or offload their activations), before any cell runs.

The searches start where this model says a cell fits and refit it on the peaks they measure
(lorabench.sweep.search for batch x layout, lorabench.sweep.context for the longest seq_len); the max-context report
shows its split beside the measured peak.

Per token of a row and per decoder layer (w: the compute dtype's bytes, 2 in bf16):
  kept        a layer that keeps what its backward needs: its input, q/k/v and the attention's output, the
              MLP's two [tokens x intermediate] tensors (Architecture.activation_width x w; on hf under QLoRA's
              upcast x 4: bitsandbytes' layers return the fp32 residual stream's dtype); under PEFT's LoRA
              layers (hf) with dropout, each adapted projection's dropped-out input and its mask (in_features
              x (4 + 1) under that upcast): on every linear layer (lora=all_linear) 6 x hidden + intermediate
              values more; without those copies (fast, no dropout), adapters on the MLP keep their
              inputs: the normed residual for gate/up, down's [tokens x intermediate] input, hidden + intermediate
              values more; Unsloth's fused LoRA kernels keep each dropout's mask instead (in_features bytes an
              adapted projection), o_proj's input (hidden: the attention's output made contiguous) and, where
              gate, up and down are all adapted, the MLP's input alone (hidden: the product is recomputed);
              a linear-attention layer (Qwen3.5's, through transformers' PyTorch rule) also the rule's float32
              chunks, measured (lorabench.models.census.delta_rule_bytes); `kept` is then the mean over the layers
  recomputed  a recomputed layer keeps its input: hidden x 4 bytes in QLoRA's fp32 residual stream (hf), x w
              in a bf16 one (fast, Unsloth); with offloaded checkpoints (train.offload_checkpoints, Unsloth's
              "unsloth") ~0 on the GPU, the input waits in pinned host memory
  offloaded   a layer whose saved activations wait in host memory (train.offload_fraction): ~0 on the GPU
Per MoE layer with LoRA on its experts (lora.experts), whatever the tokens: PEFT's adapters on the 3-D expert weights
make the weights plus the adapters' product, a new [experts x out x in] tensor at the compute dtype, each forward;
a layer that keeps its activations keeps it for its backward (gpt-oss-20b: 1.6 GB a layer, 38 GB over 24), the
layer in its backward holds it and its gradient. With the experts in nf4 (precision.experts_nf4) each forward
dequantises them into such a tensor, which the expert matmuls keep for their backward alike.
Per token, once:
  working     the layer in its backward (the one being recomputed, with checkpointing) holds its activations
              and their gradients: 2 x kept; with the MLP tiled (backend.tiled_mlp) its [tokens x
              intermediate] tensors for one tile of tokens only. Its attention's backward (flash attention,
              PyTorch's and Dao's alike) adds a float32 accumulator of the query gradient (q_dim x 4 bytes) and,
              where fewer key/value heads serve the query heads, key and value gradients at the query heads'
              width before they are summed (2 x q_dim x w): 32 KB a token on Llama-3.1-8B, 2 GiB at 65,536
  logits      the loss: hf's fp32 logits, log-softmax and both gradients, 4 x vocab x 4 bytes (2 MiB a token
              on Llama-3's 128,256 words: hf's context ends here first); Liger's fused linear cross-entropy
              (fast) one chunk of at most ce_chunk_mem x hidden values a token; Unsloth's fused loss
              4 x vocab bytes and the hidden states' fp32 gradient (4 x hidden) a token, in chunks of at most 1 GiB
              (UNSLOTH_LOSS_CAP), with their gradients formed in the forward: gone before the layers'
              backward, so the step holds the loss or the layer in its backward (`working`), the larger
  mask        transformers' SDPA on padded or packed rows (hf), and its eager attention on any: a [seq x seq]
              mask a row (1 GiB at 32,768 tokens, 16 GiB at 131,072). Attention itself (flash or
              memory-efficient SDPA, varlen flash, flex attention, Unsloth's kernels) keeps its output and one
              float per query and head: linear in seq_len, no [seq x seq] scores.
Per row and layer, where the attention is transformers' eager one (soft-capped logits or sinks, which SDPA cannot
compute, outside fast's flex attention for soft-caps; or model.attn_implementation=eager):
  scores      each head's [seq x seq] softmax, kept for the backward: 2 to 8 bytes a pair as the family computes
              it (lorabench.models.census.eager_scores_bytes, measured); the layer in its backward holds it twice
Fixed: the weights at their precision (embeddings and head in fp32 under QLoRA's upcast, at the compute dtype under
Unsloth, which casts its adapters alone), LoRA's adapters with their gradients and AdamW states, 0.5 GiB of
allocator slack.

Against the peak-memory lines measured at seq 512 on an H100 (Mistral-7B nf4, LoRA r16 q/k/v/o, dropout 0.05: hf
every layer recomputed 1.32 MB a token, fast 0.55 MB, Unsloth offloaded 0.24 MB) this gives 1.36, 0.54 and 0.21 MB.
Unsloth's peaks on packed rows, and with every layer kept on Gemma-2 (its soft-capped attention keeps scores without
flash-attn), are up to 30% over the estimate: not modelled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

GIB = 2**30
SLACK_GIB = 0.5  # the caching allocator's blocks between tensors
# unsloth_zoo's fused cross-entropy sizes its chunks for 16 bytes a logit (bf16 logits, their fp32 upcast, the saved
# log-softmax, the gradient) within min(4 GiB, free / 2); the loss counts 4 of them, as the measured peaks of its
# checkpointed cells fit (tests/sweep/test_memory.py): a chunk holds a quarter of the 4 GiB at most
UNSLOTH_LOSS_CAP = 4 * GIB * 4 / 16


@dataclass(frozen=True)
class Plan:
    """What a layout does with the decoder layers (a search's Layout carries one)."""

    recomputed: float = 0.0  # fraction of layers recomputed in the backward
    offloaded: float = 0.0  # fraction whose saved activations wait in host memory (train.offload_fraction)
    inputs_offloaded: bool = False  # the recomputed layers' inputs wait in host memory
    tile: int = 0  # tokens per tile of the MLP (backend.tiled_mlp), 0 = untiled


def plan_of(c) -> Plan:
    """The plan a composed cell's config asks for."""
    from lorabench.core.config import Backend

    t, b = c.train, c.backend
    r = t.checkpoint_fraction if t.gradient_checkpointing else 0.0
    if b.name is Backend.unsloth:  # its "unsloth" checkpointing offloads the checkpointed layers' inputs
        return Plan(r, 0.0, b.unsloth_offload and r > 0, 0)
    return Plan(r, t.offload_fraction, t.offload_checkpoints and r > 0, b.tiled_mlp)


@dataclass(frozen=True)
class TokenBytes:
    """Device bytes per token of a row (the module's docstring says what each holds)."""

    kept: float  # a layer that keeps its activations
    mlp: float  # of which the MLP's [tokens x intermediate] tensors (one tile of them with backend.tiled_mlp)
    recomputed: float  # a recomputed layer's input
    logits: float  # the loss's
    logits_cap: float | None = None  # bytes the loss holds at most (Unsloth's chunks), None: no cap
    mask: bool = False  # a [seq x seq] bool attention mask a row
    rule: float = 0.0  # a linear-attention layer's delta rule, through transformers' PyTorch path (in `kept`
    rule_share: float = 0.0  # at this share of the layers: `kept` is the mean over the layers)
    scores: float = 0.0  # eager attention: bytes a layer keeps per [query x key] pair of a row, all heads
    attention: float = 0.0  # the attention's backward: its float32 dq accumulator and GQA's expanded dk/dv
    # of `kept`: what the layer in its backward is not counted holding (the MLP adapters' inputs, hf's fp32 widening)
    kept_only: float = 0.0
    # the loss computes its gradient in the forward and frees its logits before the backward (Unsloth's fused
    # loss): the step holds it or the layer in its backward, never both
    loss_apart: bool = False


@dataclass(frozen=True)
class Breakdown:
    """Where the memory of one step goes at its peak, in GiB: on the GPU, and in pinned host memory (`host`)."""

    weights: float  # the base model at its precision, embeddings and head
    lora: float  # LoRA's adapters, their gradients and AdamW states
    kept: float  # activations of the layers that keep them
    inputs: float  # recomputed layers' inputs held on the GPU
    working: float  # the layer in its backward: its activations and their gradients
    logits: float  # the loss's logits
    mask: float  # the attention mask
    slack: float  # the allocator's
    host: float  # offloaded to host memory (not on the GPU)

    @property
    def device(self) -> float:
        return self.fixed + self.activations

    @property
    def fixed(self) -> float:
        return self.weights + self.lora + self.slack

    @property
    def activations(self) -> float:
        return self.kept + self.inputs + self.working + self.logits + self.mask

    def as_dict(self) -> dict:
        return {**asdict(self), "device": self.device}


LABELS = {"weights": "weights", "lora": "LoRA adapters + gradients + optimizer", "kept": "activations kept",
          "inputs": "recomputed layers' inputs on the GPU", "working": "the layer in its backward",
          "logits": "the loss's logits", "mask": "attention mask", "slack": "allocator slack",
          "host": "offloaded to host"}


@dataclass(frozen=True)
class MemoryModel:
    """A cell's memory model: its per-token bytes and fixed parts; `breakdown` at any plan, seq_len and batch."""

    layers: int
    tokens: TokenBytes
    weights_gib: float
    lora_gib: float
    experts_gib: float = 0.0  # every MoE layer's merged (lora.experts) or dequantised (experts_nf4) experts together
    expert_layers: int = 0  # the MoE layers they are spread over

    @classmethod
    def of(cls, c) -> "MemoryModel":
        from lorabench.models import architecture_of

        a = architecture_of(c.model)  # the checkpoint's shape with model.path
        # the merged (or dequantised) weights are at the compute dtype's width (16-bit in nf4 and int8 cells)
        merged = a.expert_params() * compute_width(c) if c.lora.experts or c.precision.experts_nf4 else 0.0
        return cls(a.layers, token_bytes_of(c, a), weights_gib_of(c, a), lora_gib_of(c, a), merged / GIB,
                   sum(a.moe_layers))

    @property
    def fixed_gib(self) -> float:
        return self.weights_gib + self.lora_gib + SLACK_GIB

    def breakdown(self, plan: Plan, seq_len: int, batch: int = 1) -> Breakdown:
        """GiB by part at `batch` rows of `seq_len` tokens under `plan`."""
        tb, n, tokens = self.tokens, self.layers, batch * seq_len
        kept_frac = max(0.0, 1.0 - plan.recomputed - plan.offloaded)
        per_layer = tb.kept - (tb.mlp if plan.tile else 0.0)  # tiled: the MLP's tensors recomputed tile by tile
        # the layer in its backward: its activations and their gradients, and a linear-attention layer's rule once
        # (the gradients of its float32 chunks are formed op by op, not held together: the H100's measured peaks of
        # Qwen3.5-9B fit once, not twice; tests/sweep/test_memory.py)
        # What a kept layer holds beyond that is left out of it too (the MLP adapters' inputs, hf's fp32 widening):
        # fast's and hf's measured peaks with every layer recomputed fit without them (tests/sweep/test_memory.py).
        layer = per_layer - tb.rule_share * tb.rule - tb.kept_only
        tile = tb.mlp * min(plan.tile, tokens) if plan.tile else 0.0
        inputs = n * plan.recomputed * tb.recomputed * tokens
        one_layer = self.experts_gib / max(self.expert_layers, 1)  # a layer's merged or dequantised experts
        scores = tb.scores * batch * seq_len**2  # one layer's eager softmax over the batch
        working = (2 * (layer * tokens + tile + scores) + (tb.rule + tb.attention) * tokens) / GIB + 2 * one_layer
        logits = min(tb.logits * tokens, tb.logits_cap or float("inf")) / GIB
        if tb.loss_apart:  # the peak holds the larger of the two: the loss counts what it adds beyond the layer
            logits = max(0.0, logits - working)
        return Breakdown(
            weights=self.weights_gib, lora=self.lora_gib,
            kept=(n * kept_frac * (per_layer * tokens + scores)) / GIB + kept_frac * self.experts_gib,
            inputs=0.0 if plan.inputs_offloaded else inputs / GIB,
            working=working, logits=logits,
            mask=batch * seq_len**2 / GIB if tb.mask else 0.0, slack=SLACK_GIB,
            host=(n * plan.offloaded * per_layer * tokens + (inputs if plan.inputs_offloaded else 0.0)) / GIB
            + plan.offloaded * self.experts_gib)

    def per_sample_gib(self, plan: Plan, seq_len: int) -> float:
        """What one more row of seq_len tokens adds (the batch search's memory per sample). A loss apart from the
        layer in its backward (Unsloth's) is left out: what it adds beyond that layer shrinks as rows are added
        (it stops at its cap, the layer grows), and the searches' batches are where the layer is the larger."""
        one = self.breakdown(plan, seq_len, 1)
        return one.activations - (one.logits if self.tokens.loss_apart else 0.0) - self.layout_gib(plan, seq_len)

    def layout_gib(self, plan: Plan, seq_len: int) -> float:
        """What the plan holds whatever the batch: the merged expert weights of the layers it keeps and of the layer
        in its backward (lora.experts, precision.experts_nf4), else 0."""
        return self.breakdown(plan, seq_len, 0).activations


def compute_width(c) -> int:
    """Bytes a value of the cell's compute dtype: 4 in fp32 cells, 2 in bf16 and the quantised ones."""
    from lorabench.core.config import Precision

    return 4 if c.precision.name is Precision.fp32 else 2


def token_bytes_of(c, a) -> TokenBytes:
    """c's per-token bytes on architecture `a` (the module's docstring)."""
    from lorabench.builders.data import packs
    from lorabench.core.config import QUANTISED, Backend, DataKind
    from lorabench.fast import delta_rule
    from lorabench.models import census

    b = c.backend
    w = compute_width(c)
    unsloth, hf_like = b.name is Backend.unsloth, b.name in (Backend.hf, Backend.liger)
    ff = a.experts_per_token * a.expert_intermediate if a.is_moe else a.intermediate
    # QLoRA's fp32 residual stream (hf: norms, embeddings and head upcast): bitsandbytes' 4- and 8-bit layers return
    # the input's dtype, so a kept layer's activations are fp32 too
    aw = 4 if hf_like and b.upcast_fp32 and c.precision.name in QUANTISED else w
    # PEFT's dropout copies are the adapters' inputs (hf); without them the MLP's adapted projections keep theirs
    peft_dropout = hf_like and c.lora.dropout > 0
    dropout = dropout_bytes(c, a, aw) if peft_dropout else 0.0
    adapters = 0.0 if dropout else mlp_adapter_inputs(c, a) * w
    if unsloth:  # its fused LoRA kernels: o_proj's contiguous input, the MLP's, each dropout's mask (a byte a value)
        adapters = (a.hidden + unsloth_mlp_inputs(c, a)) * w + (dropout_bytes(c, a, 0) if c.lora.dropout > 0 else 0.0)
    kept = a.activation_width() * aw + dropout + adapters
    # what the layer in its backward is not counted holding twice (the `working` estimate, 2 x a layer at the
    # compute dtype's width, fits the measured peaks without it: tests/sweep/test_memory.py)
    widening = a.activation_width() * (aw - w) + (dropout - dropout_bytes(c, a, w) if peft_dropout else 0.0)
    kept_only = adapters + widening
    # Qwen3.5's linear-attention layers through transformers' PyTorch rule keep its float32 chunks too (Unsloth
    # brings flash-linear-attention's kernels, and transformers takes them where the package is installed)
    pytorch_rule = a.linear_heads and not unsloth and not delta_rule.fla_computes()
    rule = census.delta_rule_bytes(a.linear_heads) if pytorch_rule else 0.0
    recomputed = a.hidden * (4 if b.upcast_fp32 and not unsloth else w)
    if "fused_linear_cross_entropy" in b.liger or (b.name is Backend.fast and b.chunked_loss):
        logits, cap = w * b.ce_chunk_mem * a.hidden, None
    elif unsloth:
        logits, cap = 4 * a.vocab + 4 * a.hidden, UNSLOTH_LOSS_CAP
    else:
        logits, cap = 4 * a.vocab * 4, None
    eager = eager_attention(c, a)
    # transformers builds a [seq x seq] mask for SDPA where a row has padding or several samples, for eager always
    mask = eager or (hf_like and c.model.attn_implementation == "sdpa"
                     and (c.data.kind is not DataKind.synthetic or packs(c)))
    # (a family without a row: transformers' generic eager attention, Llama's)
    scores = census.eager_scores_bytes(a.model_type if a.known else "llama") * a.heads if eager else 0.0
    share = a.linear_layers() / a.layers
    # flash attention's backward workspace (eager attention's is its scores, counted above)
    attention = 0.0 if eager else a.q_dim * (4 + (2 * w if a.kv_heads < a.heads else 0))
    return TokenBytes(kept + share * rule, 2 * ff * w, recomputed, logits, cap, mask, rule, share, scores, attention,
                      kept_only, loss_apart=unsloth)


def eager_attention(c, a) -> bool:
    """Whether the cell's attention is transformers' eager one: where asked, and where the architecture soft-caps its
    logits or has sinks (SDPA computes neither: lorabench.builders.modeling.attention_implementation), unless fast's
    flex attention computes the soft-cap (on CUDA, where the searches run) or Unsloth its own kernels. (Unsloth's
    soft-capped attention without flash-attn keeps its scores, less than transformers' eager one: Gemma-2's peaks with
    every layer kept are up to 30% over the estimate, with its checkpointing within 10%.)"""
    from lorabench.core.config import Backend

    b = c.backend
    capped = a.attn_logit_softcap is not None
    if b.name is Backend.unsloth or (b.name is Backend.fast and b.flex_attention and capped):
        return False
    return capped or a.attn_sinks or c.model.attn_implementation == "eager"


def lora_targets_of(c, a) -> tuple:
    """The projections' names LoRA adapts (lora=all_linear: every one the architecture has)."""
    targets = a.resolve_lora_targets(list(c.lora.target_modules))
    return a.lora_targets if targets == ("all-linear",) else targets


def dropout_bytes(c, a, w: int) -> float:
    """PEFT's LoRA dropout keeps, per adapted projection, its input dropped out (cast to the compute dtype) and
    the mask: in_features x (w + 1) bytes a token."""
    shapes = a.projections()
    return sum(shapes[t][0] for t in lora_targets_of(c, a) if t in shapes) * (w + 1)


def mlp_adapter_inputs(c, a) -> int:
    """Values a token that the MLP's adapters keep for their own backward beyond what its frozen projections keep:
    gate and up read one input, the normed residual (hidden), down the [tokens x intermediate] product of the two;
    a frozen projection's backward needs its weight only, an adapter's A gradient its input. (Where the attention's
    q/k/v/o are adapted, their inputs are among the layer's kept tensors already: activation_width.)"""
    targets, shapes = set(lora_targets_of(c, a)), a.projections()
    gate_up = next((shapes[t][0] for t in ("gate_proj", "up_proj", "gate_up_proj") if t in targets and t in shapes), 0)
    return gate_up + (shapes["down_proj"][0] if "down_proj" in targets and "down_proj" in shapes else 0)


def unsloth_mlp_inputs(c, a) -> int:
    """mlp_adapter_inputs under Unsloth: where LoRA adapts gate, up and down, its fused MLP keeps the MLP's input
    and recomputes the gated product in the backward (hidden values a token), else PEFT's layers keep theirs."""
    if {"gate_proj", "up_proj", "down_proj"} <= set(lora_targets_of(c, a)):
        return a.hidden
    return mlp_adapter_inputs(c, a)


def weights_gib_of(c, a) -> float:
    """The weights at their precision (nf4: 4 bits and one 8-bit scale per 64 weights under double quantisation; an
    MoE model's experts 2 bytes in nf4 and int8 cells, which bitsandbytes leaves unquantised, nf4 with
    precision.experts_nf4), embeddings and head (fp32 under QLoRA's upcast)."""
    from lorabench.core.config import QUANTISED, Backend, Precision

    p = c.precision.name
    linear = a.matmul_params() - a.hidden * a.vocab  # every layer's projections (all experts), not the head
    # int8: one fp32 scale per output row of in_features weights (the hidden width for most projections)
    per_param = {Precision.nf4: 0.5 + 1 / 64, Precision.int8: 1.0 + 4 / a.hidden, Precision.fp32: 4.0}.get(p, 2.0)
    experts = a.expert_params()
    expert_bytes = per_param if p not in QUANTISED or c.precision.experts_nf4 else 2.0
    linear_bytes = (linear - experts) * per_param + experts * expert_bytes
    # Unsloth casts only the adapters to fp32, its embeddings and head stay at the compute dtype
    upcast = c.backend.upcast_fp32 and c.backend.name is not Backend.unsloth
    embed_w = 4 if upcast and p in QUANTISED else (4 if p is Precision.fp32 else 2)
    embeddings = (1 if a.tied_embeddings else 2) * a.vocab * a.hidden
    return (linear_bytes + embeddings * embed_w) / GIB


def lora_gib_of(c, a) -> float:
    """LoRA's weights, gradients and AdamW states, 4 + 4 + 8 bytes a parameter, on every projection it adapts
    (lora=all_linear: all seven of a Llama layer's)."""
    return a.lora_params(lora_targets_of(c, a), c.lora.r, c.lora.experts) * (4 + 4 + 8) / GIB


def token_bytes(c) -> TokenBytes:
    return MemoryModel.of(c).tokens


def fixed_gib(c) -> float:
    """Memory that does not grow with batch or seq_len: weights, LoRA's states, slack (GiB)."""
    return MemoryModel.of(c).fixed_gib
