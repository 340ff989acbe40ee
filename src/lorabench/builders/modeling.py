"""Tokenizer, base model and LoRA adapter: the builders train.py and bench.py share.

The base model comes from `model.path` (real safetensors weights) or, when that is null, from a
random initialisation made directly on the target device: the model group's architecture without a
multi-GB download, which gives valid speed and memory figures (not quality). Quantised cells go
through transformers' own bitsandbytes loader in both cases, so random and real weights are
quantised by the same code.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

import torch

from lorabench.core.config import QUANTISED, Config, LoraConfig, ModelConfig, Precision
from lorabench.models import Architecture, architecture_of, hf_config, tokenizers

log = logging.getLogger(__name__)

# Precision -> dtype of the weights that stay unquantised (and of the 4/8-bit compute).
WEIGHT_DTYPE = {
    Precision.nf4: torch.bfloat16,
    Precision.int8: torch.bfloat16,
    Precision.bf16: torch.bfloat16,
    Precision.fp16: torch.float16,
    Precision.fp32: torch.float32,
}
# transformers 5's MoE layers (Qwen3-MoE, Mixtral): experts.gate_up_proj [E, 2f, h], experts.down_proj [E, h, f].
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def build_tokenizer(model_cfg: ModelConfig):
    """The model's real tokenizer, offline (lorabench.models.tokenizers): a Mistral model's from the
    file shipped inside the mistral-common wheel, Llama-3's, Qwen's and Phi-4's from the BPE ranks
    their packages ship; None where none ships (chat data is refused then, lorabench.builders.data, and
    synthetic rows run at the model's vocabulary).

    Not LlamaTokenizer(vocab_file=...): in transformers 5 that silently yields a 3-token
    vocabulary. MistralCommonBackend wraps mistral-common's own encoder and chat template.
    """
    arch = architecture_of(model_cfg)
    path = tokenizers.tokenizer_file(model_cfg, arch)
    if path is None:
        return None
    name = tokenizers.tokenizer_name(model_cfg, arch)
    if name in tokenizers.BPE:
        return tokenizers.build_bpe(name, path)
    if name == tokenizers.CHECKPOINT:  # the checkpoint's own (a GGUF's): its vocabulary, specials and chat template
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path.parent), padding_side="right")
    from transformers.tokenization_mistral_common import MistralCommonBackend

    # mode="finetuning" lets a conversation end with the assistant's turn (serving mode refuses it).
    return MistralCommonBackend(tokenizer_path=str(path), mode="finetuning", padding_side="right")


def tokenizer_file(model_cfg: ModelConfig) -> Path | None:
    """The file the model's tokenizer is read from (model.tokenizer, or the architecture's own: see
    lorabench.models.tokenizers), None when it has none offline."""
    return tokenizers.tokenizer_file(model_cfg, architecture_of(model_cfg))


def save_fast_tokenizer(model_cfg: ModelConfig, directory: Path, stand_in: bool = False) -> bool:
    """The model's tokenizer as a `tokenizers` tokenizer.json in `directory`, for loaders that read a
    tokenizer from a model's folder with AutoTokenizer (Unsloth's). A SentencePiece model's vocabulary
    and merges are extracted from its file, so it encodes text as build_tokenizer does. A model with none
    offline gets, with `stand_in` (data=synthetic: rows of random ids, no text to encode), stand_in_tokenizer.
    Returns whether it did."""
    from transformers import LlamaTokenizer
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    why = no_folder_tokenizer(model_cfg)
    if why is not None and stand_in:
        stand_in_tokenizer(model_cfg).save_pretrained(directory)
        return True
    if why is not None:
        raise ValueError(f"model={model_cfg.name}: no tokenizer to save for a loader that reads a folder ({why})")
    arch = architecture_of(model_cfg)
    path = tokenizers.tokenizer_file(model_cfg, arch)
    if tokenizers.tokenizer_name(model_cfg, arch) in tokenizers.BPE:
        build_tokenizer(model_cfg).save_pretrained(directory)
        return False
    spm = SentencePieceExtractor(str(path)).extract(None)
    LlamaTokenizer(vocab=spm["vocab"], merges=spm["merges"]).save_pretrained(directory)
    return False


def stand_in_tokenizer(model_cfg: ModelConfig):
    """A tokenizer with the model's vocabulary size and special-token ids and no text in it: one word per id
    ("<id_17>"), bos/eos/pad at the ids of the model's config; where the config names no pad, "<pad>" is its
    last id, distinct from eos, as real tokenizers ship one (Mistral-Nemo's Tekken has "<pad>"): a pad equal
    to eos is what Unsloth's loader repairs (unsloth_zoo.pad_token.fix_pad_token), by adding a token where
    none fits, which resizes the embeddings. So a loader that needs a tokenizer beside the weights loads the
    model unchanged: nothing added to the vocabulary, no embedding resized. For rows of random ids only
    (data=synthetic): it encodes no text."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    hf = hf_config(model_cfg)
    eos = hf.eos_token_id  # Llama-3.1 lists three: a tokenizer has one eos, the first (the others stay words)
    ids = {"bos_token": hf.bos_token_id, "eos_token": eos[0] if isinstance(eos, (list, tuple)) else eos}
    ids["pad_token"] = hf.pad_token_id if hf.pad_token_id is not None else hf.vocab_size - 1
    names = {i: f"<{k.removesuffix('_token')}>" for k, i in ids.items() if i is not None}
    vocab = {names.get(i, f"<id_{i}>"): i for i in range(hf.vocab_size)}
    words = Tokenizer(models.WordLevel(vocab, unk_token=names.get(0, "<id_0>")))
    return PreTrainedTokenizerFast(tokenizer_object=words, **{k: names[i] for k, i in ids.items() if i is not None})


def no_folder_tokenizer(model_cfg: ModelConfig) -> str | None:
    """Why this model's tokenizer cannot be saved as a tokenizer.json (save_fast_tokenizer), or None: none
    ships offline, or it is Tekken (mistral-common's own format)."""
    arch = architecture_of(model_cfg)
    path = tokenizers.tokenizer_file(model_cfg, arch)
    if path is None:
        return tokenizers.reason(model_cfg, arch)
    return "Tekken is read by mistral-common only" if path.suffix == ".json" else None


def quantization_config(precision: Precision, double_quant: bool, sharded: bool = False):
    """bitsandbytes' config for a quantised precision (None otherwise). sharded (train.parallel=fsdp): the
    packed 4-bit weights stored as bf16 words, 2 bytes = 4 weights, instead of uint8, so that FSDP can
    split and all-gather them as a floating tensor; the same bits, dequantised the same way."""
    from transformers import BitsAndBytesConfig

    if precision is Precision.nf4:
        storage = {"bnb_4bit_quant_storage": torch.bfloat16} if sharded else {}
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_use_double_quant=double_quant,
                                  bnb_4bit_compute_dtype=torch.bfloat16, **storage)
    if precision is Precision.int8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return None


def random_init(model_cfg: ModelConfig, device: torch.device, dtype: torch.dtype):
    """The model's architecture with random weights, drawn directly on the device (no CPU round
    trip: 7.25B bf16 values take seconds on a GPU, minutes on a CPU)."""
    from transformers import AutoModelForCausalLM

    config = hf_config(model_cfg)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                attn_implementation=attention_implementation(model_cfg, config))


def attention_implementation(model_cfg: ModelConfig, config) -> str:
    """model.attn_implementation, except where it would compute another model or not build: transformers' SDPA
    path has no soft-cap, so an architecture that soft-caps its attention logits (Gemma-2: tanh(x / 50) * 50)
    runs eager instead (conf/model/gemma-2-9b.yaml says eager itself; this covers a checkpoint given by
    model.path with another model group's default, sdpa); a model class without an SDPA path (gpt-oss: its
    sink logits) runs eager too. The fast path may replace it later (flex attention on CUDA).
    config: the model's transformers config (hf_config), which the caller has built already."""
    asked = model_cfg.attn_implementation
    arch = Architecture.from_hf_config(config)
    if asked == "sdpa" and arch.attn_logit_softcap is not None:
        log.warning("model.attn_implementation=sdpa ignores %s's attention soft-cap (%g): eager attention instead",
                    model_cfg.name, arch.attn_logit_softcap)
        return "eager"
    if asked == "sdpa" and arch.census is not None and not _class_supports_sdpa(arch.census.model_class):
        log.warning("model.attn_implementation=sdpa: %s (%s) has no SDPA path in transformers: eager attention "
                    "instead", model_cfg.name, arch.census.model_class)
        return "eager"
    return asked


def _class_supports_sdpa(model_class: str) -> bool:
    import transformers

    return bool(getattr(getattr(transformers, model_class, None), "_supports_sdpa", True))


class RandomWeight:
    """One weight drawn only when transformers' loader reads it (`w[...]`, as it reads a safetensors
    slice). The loader quantises each weight as it arrives, so the device holds the quantised model
    plus one bf16 weight (0.47 GB: Llama-3.3-70B's largest, 28,672 x 8,192) instead of a bf16 copy of
    the whole model beside it (141 GB for 70.6B parameters: more than an H200's 141 GB with the rest)."""

    def __init__(self, shape: torch.Size, dtype: torch.dtype, device: torch.device, fill: float | None, std: float):
        self.shape, self.dtype, self.device, self.fill, self.std = shape, dtype, device, fill, std

    def get_shape(self) -> list[int]:
        return list(self.shape)

    def __getitem__(self, index) -> torch.Tensor:
        w = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        return w.fill_(self.fill) if self.fill is not None else w.normal_(0.0, self.std)


class LaterWeight(RandomWeight):
    """A weight the loader sets as one value at every index (no memory), drawn later, one at a time: the expert
    weights precision.experts_nf4 quantises as it draws them (lorabench.builders.experts_nf4)."""

    def __getitem__(self, index) -> torch.Tensor:
        return torch.zeros(1, dtype=self.dtype, device=self.device).expand(tuple(self.shape))


def random_state_dict(skeleton, device: torch.device, later: bool = False) -> dict[str, RandomWeight]:
    """Every persistent weight of `skeleton` (the model built on the meta device: shapes, no memory),
    drawn as transformers' own initialisation does: matrices, embeddings and experts normal(0,
    initializer_range), biases 0, norm weights 1 (0 where the norm scales by 1 + w: Gemma-2/3, Qwen3.5), any
    other vector (a linear attention's decay and step biases, gpt-oss's sinks, Gemma 4's layer scalars) 1.
    later: the 3-D expert weights are left to be drawn later (LaterWeight)."""
    std = getattr(skeleton.config, "initializer_range", 0.02)
    weights, seen = {}, set()
    for name, p in skeleton.state_dict(keep_vars=True).items():
        if id(p) in seen:  # tied to a weight already listed (lm_head to the embeddings): the loader ties it
            continue
        seen.add(id(p))
        fill = None if p.ndim >= 2 else 0.0 if name.endswith("bias") else vector_fill(skeleton, name)
        kind = LaterWeight if later and p.ndim == 3 and ".experts." in f".{name}" else RandomWeight
        weights[name] = kind(p.shape, p.dtype, device, fill, std)
    return weights


class NoRoom(OSError):
    """The disk holds less than the weights to save (said before any weight is drawn)."""


def save_random_weights(model_cfg: ModelConfig, device: torch.device, path: Path, shard_gib: float = 2.0) -> None:
    """The model's random weights (random_state_dict's draws, in its order, each drawn on `device` and moved to host
    memory) saved as safetensors shards of at most shard_gib with their index, and its config: what a loader that
    reads only a directory takes. One weight is on the device at a time, so a model larger than a cell's budget
    (Gemma-4-31B: 57 GiB in bf16, within 22) is saved within it."""
    import json

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config(model_cfg), dtype=torch.bfloat16)
    weights = random_state_dict(skeleton, device)
    shards, size, total = [[]], 0, 0  # names per shard, laid out from the shapes before any draw
    for name, w in weights.items():
        nbytes = w.shape.numel() * w.dtype.itemsize
        if shards[-1] and size + nbytes > shard_gib * 2**30:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size, total = size + nbytes, total + nbytes
    free = shutil.disk_usage(path).free
    if total > free:  # found out before minutes of drawing and writing, not at the last shard
        raise NoRoom(f"the random weights of model={model_cfg.name} take {total / 2**30:.1f} GiB in bf16 and {path} "
                     f"has {free / 2**30:.1f} GiB free")
    files = ["model.safetensors"] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for names, file in zip(shards, files):
        save_file({n: weights[n][...].to("cpu") for n in names}, str(path / file), metadata={"format": "pt"})
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": {n: f for ns, f in zip(shards, files) for n in ns}}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    skeleton.config.save_pretrained(path)
    if skeleton.can_generate():  # as save_pretrained writes it: loaders read it beside the config
        skeleton.generation_config.save_pretrained(path)


def vector_fill(model, name: str) -> float:
    """The value a 1-D weight starts at: 0 for a norm that scales by (1 + w) (its forward says so), else 1."""
    import inspect

    module = model.get_submodule(name.rpartition(".")[0])
    if "Norm" not in type(module).__name__:
        return 1.0
    source = inspect.getsource(type(module).forward).replace(" ", "")
    return 0.0 if "(1.0+self.weight" in source or "(1+self.weight" in source else 1.0


@contextlib.contextmanager
def allocator_warmup_off(off: bool = True):
    """Load without transformers' allocator warmup (caching_allocator_warmup), which reserves one block of every
    weight's bytes on the GPU before the first is loaded. It counts the experts drawn later (LaterWeight) at their
    bf16 size, 38 GiB on gpt-oss-20b for weights that end as 10 in nf4, and caps the block at the device's memory,
    not at an emulated budget (gpu=a10 on an H100): the block alone runs such a cell out of memory, and on a whole
    GPU it stays reserved, counted in the cell's peak. Without it the weights are placed one at a time."""
    from transformers import modeling_utils

    warmup = modeling_utils.caching_allocator_warmup
    if off:
        modeling_utils.caching_allocator_warmup = lambda *args, **kwargs: None
    try:
        yield
    finally:
        modeling_utils.caching_allocator_warmup = warmup


def build_model(cfg: Config, device: torch.device, sharded: bool = False):
    """Base model at the cell's precision on `device` (cfg: a training cell's or bench.py's config).
    Returns (model, weights) where weights says where the weights came from ("random_init" or the
    path). sharded: for FSDP (train.parallel=fsdp), nf4 stored as bf16 words (quantization_config)."""
    from transformers import AutoModelForCausalLM

    precision = cfg.precision.name
    dtype = WEIGHT_DTYPE[precision]
    quant = quantization_config(precision, cfg.precision.double_quant, sharded)
    # device_map pins every weight to this cell's device (one full copy per rank under DDP; under FSDP
    # too until the Trainer's fully_shard keeps each rank's 1/N of it: the load's peak is the whole model).
    device_map = {"": device}

    if cfg.model.path:
        local = Path(cfg.model.path).expanduser()  # (checks.check_values vetted it)
        model = AutoModelForCausalLM.from_pretrained(
            str(local) if local.exists() else cfg.model.path,
            dtype=dtype, quantization_config=quant, device_map=device_map,
            attn_implementation=attention_implementation(cfg.model, hf_config(cfg.model)),
            use_safetensors=cfg.model.safetensors_only or None, trust_remote_code=cfg.model.trust_remote_code,
        )
        weights = cfg.model.path
    else:
        if quant is None:
            model = random_init(cfg.model, device, dtype)
        else:
            # Random weights through transformers' loader, one at a time, so they are quantised
            # exactly as a checkpoint's would be and never all in bf16 at once (RandomWeight).
            with torch.device("meta"):
                skeleton = AutoModelForCausalLM.from_config(hf_config(cfg.model), dtype=dtype)
            later = cfg.precision.experts_nf4  # the experts drawn as they are quantised, never all in bf16
            with allocator_warmup_off(later):
                model = type(skeleton).from_pretrained(
                    None, config=skeleton.config, state_dict=random_state_dict(skeleton, device, later), dtype=dtype,
                    quantization_config=quant, device_map=device_map,
                    attn_implementation=attention_implementation(cfg.model, skeleton.config))
        weights = "random_init"
    if cfg.precision.experts_nf4:
        from lorabench.builders import experts_nf4

        std = getattr(model.config, "initializer_range", 0.02) if weights == "random_init" else None
        experts_nf4.quantise_experts(model, cfg.precision.double_quant, draw_std=std)
    model.config.use_cache = False
    return model, weights


def apply_lora(model, lora: LoraConfig, precision: Precision, gradient_checkpointing: bool, upcast_fp32: bool = True):
    """Freeze the base model and wrap it with LoRA adapters (PEFT)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model, prepare_model_for_kbit_training

    if precision in QUANTISED and upcast_fp32:
        # The QLoRA recipe: norms and the output head in fp32, input grads on for checkpointing.
        with experts_set_aside(model):
            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=gradient_checkpointing,
                gradient_checkpointing_kwargs={"use_reentrant": False})
    # The architecture's own names: q/k/v asked for on Phi-3's fused qkv_proj land on it (checks refused the rest).
    arch = Architecture.from_hf_config(model.config)
    targets = arch.resolve_lora_targets(lora.target_modules)
    # lora.experts: every MoE layer's 3-D expert weights (checks refused it on a dense model).
    experts = expert_weights(arch) if lora.experts else None
    peft_cfg = PeftLoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none", task_type="CAUSAL_LM",
        target_modules="all-linear" if list(targets) == ["all-linear"] else list(targets),
        target_parameters=experts)
    try:
        # autocast_adapter_dtype (PEFT's default) keeps the adapters in fp32 under bf16/fp16 weights.
        with targets_as_named():
            return get_peft_model(model, peft_cfg)
    except ValueError as e:
        if "not found in the base model" in str(e) or "Target modules" in str(e):
            raise ValueError(f"lora.target_modules={list(targets)}: {e}") from e
        raise


def expert_weights(arch: Architecture) -> list[str]:
    """The 3-D expert weights LoRA adapts with lora.experts, by their name inside a decoder layer: transformers 5's
    MoE layers hold experts.gate_up_proj and experts.down_proj (under mlp. in Qwen-MoE and Mixtral, feed_forward.
    in Llama-4, the layer itself in Gemma 4)."""
    if arch.census is None:
        return [f"experts.{w}" for w in EXPERT_WEIGHTS]
    return sorted({name for layer in arch.census.layers for name, *_ in layer.experts})


@contextlib.contextmanager
def targets_as_named():
    """PEFT rewrites the LoRA targets of MoE families whose layers changed from transformers 4 to 5 (Qwen-MoE,
    Mixtral, DeepSeek, GLM-MoE: gate_proj/up_proj/down_proj become the 3-D experts, at twice the rank on
    gate_up_proj, and the dense and shared MLPs lose their adapters), so that adapters trained on transformers 4
    load. lorabench names targets in the built model's own (transformers 5) names: that rewrite is skipped while
    the adapters are made, and the model gets what the cell asked for."""
    from peft.utils import transformers_weight_conversion as conversion

    original = conversion.convert_peft_config_for_transformers
    conversion.convert_peft_config_for_transformers = lambda *args, **kwargs: None
    try:
        yield
    finally:
        conversion.convert_peft_config_for_transformers = original


@contextlib.contextmanager
def experts_set_aside(model):
    """An MoE model's frozen expert weights out of the model while PEFT's QLoRA upcast runs, then back as they were.

    bitsandbytes quantises nn.Linear layers only, and transformers 5 stores each MoE layer's experts as
    3-D parameters of one module: in an nf4 or int8 cell they load in bf16. prepare_model_for_kbit_training
    casts every 16-bit parameter that is not a 4-bit one to fp32, meant for norms, and the experts with them, one
    after the other: gpt-oss-20b's 19.1B expert weights would pass 38 GB in bf16 on their way to 76 GB in fp32 (an
    80 GB GPU runs out before its last layer), Qwen3-30B-A3B's 29.0B 116 GB, and the grouped GEMMs would run in
    fp32. transformers' expert kernels cast their input to the weights' dtype (integrations/moe.py), so the fp32
    norms' output meets bf16 experts as it meets bf16 layers. The experts come back frozen, the same tensors."""
    from lorabench.builders.experts_nf4 import expert_modules

    aside = [(module, key, module._parameters.pop(key)) for _, module, keys in expert_modules(model) for key in keys]
    try:
        yield
    finally:
        for module, key, p in aside:
            p.requires_grad_(False)  # as PEFT freezes every base parameter
            module._parameters[key] = p


def count_params(model) -> dict:
    """Parameter counts that the FLOPs formula needs, from the built model itself.

    base_matmul: weights of every linear layer of the base model, output head included, embeddings
    excluded (a lookup, not a matmul); an MoE layer's experts (3-D parameters in transformers 5)
    and router included. Quantised layers store packed values, so they are counted from their
    logical shapes. active_matmul: the same with each MoE layer's experts at the share a token runs
    through (top-k of n), what a token costs. trainable: the adapter parameters; trainable_active: those
    a token runs through (lora.experts: each expert's adapters at the experts' share). experts_unquantised:
    the expert weights stored as floats (all of them in transformers 5, in nf4 and int8 cells too).
    lora_modules / lora_expert_weights: how many linear layers and 3-D expert weights carry adapters.
    """
    from torch import nn

    arch = Architecture.from_hf_config(model.config)
    share = arch.experts_per_token / arch.num_experts if arch.is_moe else 1.0
    base_matmul = active = unquantised = 0.0
    for name, mod in model.named_modules():
        if "lora_" not in name and isinstance(mod, nn.Linear):  # bitsandbytes' Linear4bit/Linear8bitLt subclass it
            base_matmul += mod.in_features * mod.out_features
            active += mod.in_features * mod.out_features
    for name, p in model.named_parameters():
        if "lora_" in name:
            continue
        if p.ndim == 3 and ".experts." in name:  # [experts, out, in] (or [experts, in, out]): every expert
            base_matmul += p.numel()
            active += p.numel() * share
            unquantised += p.numel() if p.is_floating_point() else 0  # (bitsandbytes leaves them so)
        elif p.ndim == 2 and arch.is_moe and p.shape[0] == arch.num_experts and _is_router(name):
            base_matmul += p.numel()  # a router that is a bare weight [experts, hidden]: every token, every expert
            active += p.numel()
    lora = lora_active = 0.0
    for name, p in model.named_parameters():
        if p.requires_grad:
            lora += p.numel()
            # lora.experts: an expert's adapter works on the tokens routed to it, top-k of n
            lora_active += p.numel() * (share if ".experts." in name else 1.0)
    adapted = [m for m in model.modules() if hasattr(m, "lora_A")]  # PEFT's LoRA layers and 3-D weight wrappers
    return {"base_matmul": int(base_matmul), "active_matmul": int(active), "trainable": int(lora),
            "trainable_active": int(lora_active), "experts_unquantised": int(unquantised),
            "lora_modules": sum(not hasattr(m, "parameter_name") for m in adapted),
            "lora_expert_weights": sum(hasattr(m, "parameter_name") for m in adapted)}


def _is_router(name: str) -> bool:
    """A router's weight by its module's name (Qwen-MoE's and DeepSeek's mlp.gate, gpt-oss's mlp.router)."""
    module = name.rsplit(".", 1)[0]
    return module.endswith(("gate", "router"))
