"""Training backends: what a cell changes in the model between building it and training it.

  hf       the seed's recipe as it is (nothing changed here)
  liger    + Liger-Kernel's fused Triton ops (liger_kernel.transformers, applied to this model)
  fast     + bf16 norms/residual stream, packing (lorabench.data.packs), selective checkpointing
  unsloth  Unsloth's own loader, when the package is installed; otherwise the cell is skipped

The work is the libraries': Liger's kernels, torch.compile, PyTorch's checkpointing, PEFT. This
module only decides which of them a cell uses, and undoes Liger's module-level patches when the
cell ends (a multirun trains its next cell, maybe backend=hf, in the same process).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging

import torch

from lorabench.config import Backend, Config, TrainConfig

log = logging.getLogger(__name__)

# What apply_liger_kernel_to_mistral replaces at module level in transformers' Mistral code (RoPE is a
# module function every attention layer looks up per call, so it cannot be patched per instance).
_MISTRAL_MODULE_ATTRS = ("apply_rotary_pos_emb", "MistralRMSNorm", "MistralMLP", "CrossEntropyLoss")


def check(c: Config, device: torch.device) -> None:
    """Refuse a backend that cannot run here, before data or model are built."""
    from lorabench.cell import CellSkipped

    if c.backend.name is Backend.unsloth:
        if importlib.util.find_spec("unsloth") is None:
            raise CellSkipped("backend=unsloth: the unsloth package is not installed (pip install unsloth, "
                              "CUDA only); this cell is skipped, the others of the sweep run")
        raise CellSkipped("backend=unsloth: unsloth is installed, but lorabench does not drive it yet: Unsloth "
                          "loads and patches the model through its own FastLanguageModel.from_pretrained, "
                          "which needs a checkpoint on disk, not lorabench's random initialisation")
    if c.backend.liger and device.type != "cuda" and not _triton_interpreter():
        raise RuntimeError(f"backend={c.backend.name.value} uses Liger-Kernel's Triton kernels "
                           f"(backend.liger={list(c.backend.liger)}), which need a CUDA GPU; on CPU use "
                           "backend=hf or backend.liger=[]")
    if c.backend.liger and importlib.util.find_spec("liger_kernel") is None:
        raise RuntimeError(f"backend={c.backend.name.value} needs Liger-Kernel: pip install liger-kernel "
                           f"(or backend.liger=[] to run without its kernels)")


def _triton_interpreter() -> bool:
    # Triton's interpreter runs kernels on CPU tensors (slowly): the tests use it for the ops it supports.
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


@contextlib.contextmanager
def module_patches(c: Config):
    """Around a whole cell: Liger's module-level replacements in transformers' Mistral code, undone
    at the end, whatever happened."""
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


def apply_checkpointing(model, train: TrainConfig) -> int:
    """Activation checkpointing of the first round(fraction x layers) decoder layers; returns how
    many. The others keep their activations for the backward pass: memory spent to save their
    recomputation (a third of a layer's forward + backward FLOPs)."""
    if not train.gradient_checkpointing:
        return 0
    # Non-reentrant: it works with frozen inputs and DDP, and it is what PyTorch recommends.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = decoder_layers(model)
    n = round(train.checkpoint_fraction * len(layers))
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i < n
    return n


def apply_compile(model, c: Config):
    """torch.compile each decoder layer: one graph for all 32 (same code, same shapes), fusing the
    elementwise work between the matmuls; bitsandbytes' 4-bit matmul stays an opaque custom op."""
    if c.backend.compile:
        for layer in decoder_layers(model):
            layer.compile()
    return model
