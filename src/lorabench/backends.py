"""Training backends: what a cell changes in the model between building it and training it.

  hf       the seed's recipe as it is (nothing changed here)
  liger    + Liger-Kernel's fused Triton ops (liger_kernel.transformers, applied to this model)
  fast     + bf16 norms/residual stream, packing (lorabench.data.packs), selective checkpointing,
           the attention's LoRA projections fused (lorabench.fused), packed rows' attention without a
           mask (lorabench.packed_attention)
  unsloth  Unsloth's loader, kernels and LoRA (FastLanguageModel), in a process of its own, when
           the package is installed; otherwise the cell is skipped

The work is the libraries': Liger's kernels, torch.compile, PyTorch's checkpointing, PEFT. This
module only decides which of them a cell uses, and undoes Liger's module-level patches when the
cell ends (a multirun trains its next cell, maybe backend=hf, in the same process).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from lorabench import data, modeling, packed_attention
from lorabench import offload as offloading
from lorabench.config import QUANTISED, Backend, Config, Precision, TrainConfig
from lorabench.results import CellSkipped

log = logging.getLogger(__name__)

# What apply_liger_kernel_to_mistral replaces at module level in transformers' Mistral code (RoPE is a
# module function every attention layer looks up per call, so it cannot be patched per instance).
_MISTRAL_MODULE_ATTRS = ("apply_rotary_pos_emb", "MistralRMSNorm", "MistralMLP", "CrossEntropyLoss")


def check(c: Config, device: torch.device) -> None:
    """Refuse a backend that cannot run here, before data or model are built (its options were
    checked with the other values: checks.check_values)."""
    if c.backend.name is Backend.unsloth:
        if importlib.util.find_spec("unsloth") is None:
            raise CellSkipped("backend=unsloth: the unsloth package is not installed (pip install unsloth, "
                              "CUDA only); this cell is skipped, the others of the sweep run")
        if device.type != "cuda":
            raise RuntimeError("backend=unsloth needs a CUDA GPU (Unsloth's kernels are Triton); on CPU use backend=hf")
    if c.backend.liger and device.type != "cuda" and not _triton_interpreter():
        raise RuntimeError(f"backend={c.backend.name.value} uses Liger-Kernel's Triton kernels "
                           f"(backend.liger={list(c.backend.liger)}), which need a CUDA GPU; on CPU use "
                           "backend=hf or backend.liger=[]")
    if c.backend.liger and importlib.util.find_spec("liger_kernel") is None:
        raise RuntimeError(f"backend={c.backend.name.value} needs Liger-Kernel: pip install liger-kernel "
                           f"(or backend.liger=[] to run without its kernels)")


def _triton_interpreter() -> bool:
    # Triton's interpreter runs kernels on CPU tensors (slowly): the tests use it for the ops it supports.
    return os.environ.get("TRITON_INTERPRET") == "1"


@contextlib.contextmanager
def module_patches(c: Config):
    """Around a whole cell: the allocator's settings, Liger's module-level replacements in
    transformers' Mistral code and lorabench's launch of Liger's RMSNorm backward, undone at the end,
    whatever happened."""
    from lorabench import norm_kernels

    with _allocator(c), _liger_patches(c), \
            norm_kernels.frozen_weight_grid(c.backend.norm_backward_grid and "rms_norm" in c.backend.liger):
        yield


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


@contextlib.contextmanager
def _liger_patches(c: Config):
    if not c.backend.liger:
        yield
        return
    from transformers.models.mistral import modeling_mistral

    saved = {a: getattr(modeling_mistral, a, None) for a in _MISTRAL_MODULE_ATTRS}
    try:
        yield
    finally:
        for a, v in saved.items():
            if v is not None:
                setattr(modeling_mistral, a, v)


def apply_varlen_attention(model, c: Config, device: torch.device):
    """Packed rows' attention without a mask (lorabench.packed_attention), where the rows are packed
    and PyTorch's flash attention runs (CUDA); elsewhere the model keeps model.attn_implementation."""
    if c.backend.varlen_attention and data.packs(c) and packed_attention.runs_on(device):
        packed_attention.use(model)
        log.info("attention over packed rows: %s (varlen flash attention, no mask)", packed_attention.NAME)
    return model


def apply_kernels(model, c: Config):
    """Liger's ops on this model instance (before LoRA wraps its linear layers)."""
    if not c.backend.liger:
        return model
    from liger_kernel.transformers import apply_liger_kernel_to_mistral

    ops = set(c.backend.liger)
    apply_liger_kernel_to_mistral(model=model, rope="rope" in ops, rms_norm="rms_norm" in ops,
                                  swiglu="swiglu" in ops,
                                  fused_linear_cross_entropy="fused_linear_cross_entropy" in ops)
    log.info("Liger-Kernel ops on the model: %s", sorted(ops))
    return model


def decoder_layers(model):
    """The decoder layers of a (PEFT-wrapped) Mistral model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model.layers


def apply_checkpointing(model, train: TrainConfig, device: torch.device) -> tuple[int, int]:
    """Activation checkpointing of round(checkpoint_fraction x layers) decoder layers and host
    offloading of round(offload_fraction x layers) (lorabench.offload.layer_plan says which); returns
    (recomputed, offloaded). The others keep their activations for the backward pass: memory spent
    to save their recomputation (a third of a layer's forward + backward FLOPs)."""
    layers = decoder_layers(model)
    recompute = round(train.checkpoint_fraction * len(layers)) if train.gradient_checkpointing else 0
    offload = min(round(train.offload_fraction * len(layers)), len(layers) - recompute)
    plan = offloading.layer_plan(len(layers), recompute, offload)
    if recompute:
        # Non-reentrant: it works with frozen inputs and DDP, and it is what PyTorch recommends.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for layer, how in zip(layers, plan):
            layer.gradient_checkpointing = how == offloading.RECOMPUTE
    # On the model, for the cell's record of what went to host memory (lorabench.loop).
    model.lorabench_offloader = offloading.apply(layers, plan, device)
    if model.lorabench_offloader is not None:
        log.info("decoder layers, bottom first (r recomputed, o offloaded to host memory, k kept): %s",
                 "".join(how[0] for how in plan))
    return recompute, offload


def apply_fused_lora(model, c: Config):
    """The attention's LoRA projections, and with fused_mlp the MLP's, through lorabench.fused (after
    PEFT has wrapped them); with fused_add_norm the layer's forward from lorabench.norm_kernels."""
    from lorabench import fused

    b, layers = c.backend, decoder_layers(model)
    kernels = dict(triton_dequant=b.triton_dequant, absmax_cache=b.absmax_cache)
    if b.fused_lora:
        # triton_input_grad: the attention's groups only; the MLP's input gradients (K = 2 x 14,336 for
        # gate/up) ran slower in lorabench.grad_kernels than in cuBLAS (docs/performance.md, sixth round)
        n = fused.patch_attention(layers, b.seeded_dropout, triton_grad=b.triton_input_grad, **kernels)
        log.info("fused LoRA projections in %d decoder layers", n)
    if b.fused_mlp:
        n = fused.patch_mlp(layers, b.seeded_dropout, b.swiglu_in_gemm, **kernels)
        log.info("fused MLP projections in %d decoder layers", n)
    if b.fused_add_norm:
        from lorabench import norm_kernels

        n = norm_kernels.patch_add_norm(layers)
        log.info("the attention's residual add inside the post-attention RMSNorm in %d decoder layers", n)
    return model


def apply_compile(model, c: Config):
    """torch.compile each decoder layer: one graph for all 32 (same code, same shapes), fusing the
    elementwise work between the matmuls; bitsandbytes' 4-bit matmul stays an opaque custom op."""
    if c.backend.compile:
        for layer in decoder_layers(model):
            layer.compile()
    return model


def build_unsloth(c: Config, device: torch.device):
    """(model, weights, (checkpointed layers, 0 offloaded)) through Unsloth's FastLanguageModel: its loader (the
    same bitsandbytes quantisation), its patched Mistral (Triton RMSNorm, RoPE and cross-entropy, its
    fused LoRA autograd for the adapted layers) and its activation checkpointing, for a head-to-head with the other backends.

    Unsloth loads from a directory: model.path, or this model's random initialisation saved once
    to the cache (14.5 GB for Mistral-7B in bf16). It patches transformers' classes for the whole
    process, so train.py runs an unsloth cell in a process of its own (see train_and_measure)."""
    import unsloth  # noqa: F401  (first: it patches transformers, peft and trl as they are imported)
    from unsloth import FastLanguageModel

    p = c.precision.name
    source = c.model.path or str(saved_random_init(c, device))
    model, _ = FastLanguageModel.from_pretrained(
        model_name=source, max_seq_length=c.seq_len, dtype=modeling.WEIGHT_DTYPE[p],
        load_in_4bit=p is Precision.nf4, load_in_8bit=p is Precision.int8,
        load_in_16bit=p not in QUANTISED, full_finetuning=False,
        quantization_config=modeling.quantization_config(p, c.precision.double_quant),
        device_map={"": device}, local_files_only=True, random_state=c.train.seed,
        use_gradient_checkpointing=unsloth_checkpointing(c) if c.train.gradient_checkpointing else False)
    n_layers = model.config.num_hidden_layers
    checkpointed = round(c.train.checkpoint_fraction * n_layers) if c.train.gradient_checkpointing else 0
    targets = list(c.lora.target_modules)
    model = FastLanguageModel.get_peft_model(
        model, r=c.lora.r, lora_alpha=c.lora.alpha, lora_dropout=c.lora.dropout, bias="none",
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        # "unsloth": Unsloth's checkpointing (activations offloaded to host memory between passes);
        # checkpoint_skip_layers keeps the activations of that many layers, as checkpoint_fraction < 1.
        use_gradient_checkpointing=unsloth_checkpointing(c) if checkpointed else False,
        checkpoint_skip_layers=n_layers - checkpointed if checkpointed else 0,
        random_state=c.train.seed, max_seq_length=c.seq_len)
    return model, c.model.path or "random_init", (checkpointed, 0)


def unsloth_checkpointing(c: Config) -> str | bool:
    """Unsloth's use_gradient_checkpointing: "unsloth" offloads the checkpointed layers' inputs to host
    memory, True is its plain (HF) checkpointing (backend.unsloth_offload)."""
    return "unsloth" if c.backend.unsloth_offload else True


def saved_random_init(c: Config, device: torch.device) -> Path:
    """This model's random initialisation (bf16, seeded by train.seed) with the tokenizer, saved in
    the cache once, for loaders that only read a directory."""
    spec = json.dumps({**asdict(c.model), "seed": c.train.seed}, sort_keys=True, default=str)
    path = Path(os.path.expanduser(c.data.cache_dir)) / "random_init" / \
        f"{c.model.name}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    if (path / "config.json").is_file():
        log.info("random initialisation from the cache: %s", path)
        return path
    log.info("saving the random initialisation (bf16) to %s for Unsloth's loader", path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = modeling.random_init(c.model, device, torch.bfloat16)
    model.save_pretrained(tmp)
    del model
    torch.cuda.empty_cache()
    modeling.save_fast_tokenizer(c.model, tmp)
    tmp.replace(path)  # complete or absent: a killed save leaves only the .tmp dir
    return path
