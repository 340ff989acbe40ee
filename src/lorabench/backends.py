"""Training backends: what a cell changes in the model between building it and training it.

  hf       the seed's recipe as it is (nothing changed here)
  liger    + Liger-Kernel's fused Triton ops (liger_kernel.transformers, applied to this model)
  fast     + the parts lorabench.fastpath lists (its PARTS: what each is, what it needs and the order
           they go in), each either computing the same model as hf or refused by name before the cell
           runs; with selective checkpointing and offloading (here)
  unsloth  Unsloth's loader, kernels and LoRA (FastLanguageModel), in a process of its own, when
           the package is installed; otherwise the cell is skipped

The work is the libraries': Liger's kernels, torch.compile, PyTorch's checkpointing, PEFT. This
module decides which of them a cell uses; lorabench.fastpath applies the fast path's parts and undoes
what they patch when the cell ends (a multirun trains its next cell, maybe backend=hf, in the same process).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from lorabench import fastpath, modeling
from lorabench import offload as offloading
from lorabench.config import QUANTISED, Backend, Config, DataKind, Precision, TrainConfig
from lorabench.results import CellSkipped

log = logging.getLogger(__name__)


def check(c: Config, device: torch.device) -> None:
    """Refuse a backend that cannot run here, before data or model are built (its options were
    checked with the other values: checks.check_values); the fast path's parts are checked against the
    model's architecture and the device in lorabench.fastpath."""
    if c.backend.name is Backend.unsloth:
        if importlib.util.find_spec("unsloth") is None:
            raise CellSkipped("backend=unsloth: the unsloth package is not installed (pip install unsloth, "
                              "CUDA only); this cell is skipped, the others of the sweep run")
        # data=synthetic reads no text: a model without a tokenizer offline gets a stand-in for the loader
        why = None if c.model.path or c.data.kind is DataKind.synthetic else modeling.no_folder_tokenizer(c.model)
        if why is not None:  # before a random initialisation of many GB is drawn and saved for it
            raise CellSkipped(f"backend=unsloth: Unsloth's loader reads a tokenizer from the model's folder and "
                              f"model={c.model.name} has none to save there ({why}); give model.path, a checkpoint "
                              "with its tokenizer, or use backend=hf or fast")
        if device.type != "cuda":
            raise RuntimeError("backend=unsloth needs a CUDA GPU (Unsloth's kernels are Triton); on CPU use backend=hf")
    if fastpath.parts_on(c):
        fastpath.check_parts(c, fastpath.hf_config(c), device)


# Around a whole cell: what the fast path's parts change for the process, undone at the end.
module_patches = fastpath.around_cell
decoder_layers = fastpath.decoder_layers


def apply_checkpointing(model, train: TrainConfig, device: torch.device) -> tuple[int, int]:
    """Activation checkpointing of round(checkpoint_fraction x layers) decoder layers and host
    offloading of round(offload_fraction x layers) (lorabench.offload.layer_plan says which); returns
    (recomputed, offloaded). The others keep their activations for the backward pass: memory spent
    to save their recomputation (a third of a layer's forward + backward FLOPs)."""
    layers = decoder_layers(model)
    recompute = round(train.checkpoint_fraction * len(layers)) if train.gradient_checkpointing else 0
    offload = min(round(train.offload_fraction * len(layers)), len(layers) - recompute)
    plan = offloading.layer_plan(len(layers), recompute, offload)
    for layer, how in zip(layers, plan):  # what lorabench.graphs may capture
        layer.lorabench_kept = how == offloading.KEEP
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
    # A directory of this process's own: cells of other processes (one per GPU) may save the same model at once.
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model = modeling.random_init(c.model, device, torch.bfloat16)
    model.save_pretrained(tmp)
    del model
    torch.cuda.empty_cache()
    if modeling.save_fast_tokenizer(c.model, tmp, stand_in=c.data.kind is DataKind.synthetic):
        log.info("model=%s has no tokenizer offline: Unsloth's loader gets a stand-in with its vocabulary size and "
                 "special ids (modeling.stand_in_tokenizer; data=synthetic encodes no text)", c.model.name)
    try:
        tmp.replace(path)  # complete or absent: a killed save leaves only the .tmp dir
    except OSError:
        if not (path / "config.json").is_file():
            raise
        shutil.rmtree(tmp)  # another process saved the same initialisation first (same seed: same weights)
    return path
