"""Training backends: what a cell changes in the model between building it and training it.

  hf       the seed's recipe as it is (nothing changed here)
  liger    + Liger-Kernel's fused Triton ops (liger_kernel.transformers, applied to this model)
  fast     + the parts lorabench.fast.parts lists (its PARTS: what each is, what it needs and the order
           they go in), each either computing the same model as hf or refused by name before the cell
           runs; with selective checkpointing and offloading (here)
  unsloth  Unsloth's loader, kernels and LoRA (FastLanguageModel), in a process of its own, when
           the package is installed; otherwise the cell is skipped

The work is the libraries': Liger's kernels, torch.compile, PyTorch's checkpointing, PEFT. This
module decides which of them a cell uses; lorabench.fast.parts applies the fast path's parts and undoes
what they patch when the cell ends (a multirun trains its next cell, maybe backend=hf, in the same process).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import torch

from lorabench.builders import modeling
from lorabench.core.config import QUANTISED, Backend, Config, DataKind, Precision, TrainConfig
from lorabench.core.results import CellSkipped
from lorabench.fast import offload as offloading
from lorabench.fast import parts

log = logging.getLogger(__name__)


def check(c: Config, device: torch.device) -> None:
    """Refuse a backend that cannot run here, before data or model are built (its options were
    checked with the other values: checks.check_values); the fast path's parts are checked against the
    model's architecture and the device in lorabench.fast.parts."""
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
    if parts.parts_on(c):
        parts.check_parts(c, parts.hf_config(c), device)


# Around a whole cell: what the fast path's parts change for the process, undone at the end.
module_patches = parts.around_cell
decoder_layers = parts.decoder_layers


def apply_checkpointing(model, train: TrainConfig, device: torch.device) -> tuple[int, int]:
    """Activation checkpointing of round(checkpoint_fraction x layers) decoder layers and host
    offloading of round(offload_fraction x layers) (lorabench.fast.offload.layer_plan says which); returns
    (recomputed, offloaded). The others keep their activations for the backward pass: memory spent
    to save their recomputation (a third of a layer's forward + backward FLOPs)."""
    layers = decoder_layers(model)
    recompute = round(train.checkpoint_fraction * len(layers)) if train.gradient_checkpointing else 0
    offload = min(round(train.offload_fraction * len(layers)), len(layers) - recompute)
    plan = offloading.layer_plan(len(layers), recompute, offload)
    for layer, how in zip(layers, plan):  # what lorabench.fast.graphs may capture
        layer.lorabench_kept = how == offloading.KEEP
    if recompute:
        # Non-reentrant: it works with frozen inputs and DDP, and it is what PyTorch recommends.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for layer, how in zip(layers, plan):
            layer.gradient_checkpointing = how == offloading.RECOMPUTE
    # On the model, for the cell's record of what went to host memory (lorabench.run.loop).
    model.lorabench_offloader = offloading.apply(layers, plan, device)
    model.lorabench_host_checkpoints = offloading.offload_checkpoints(layers, device) \
        if train.offload_checkpoints and recompute else None
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
    fused LoRA autograd for the adapted layers) and its activation checkpointing, for a head-to-head with the other
    backends.

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
        use_gradient_checkpointing=unsloth_checkpointing(c) if c.train.gradient_checkpointing else False,
        **({"unsloth_tiled_mlp": True} if c.backend.unsloth_tiled_mlp else {}))
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
    use_unsloth_packing(model, c)
    return model, c.model.path or "random_init", (checkpointed, 0)


def unsloth_varlen_kernel() -> str:
    """The attention Unsloth runs packed rows through, as its own flags say once it is imported
    (unsloth.utils.attention_dispatch.select_attention_backend and its SDPA branch): "flash-attn" where it found
    FlashAttention 2 (flash_attn_varlen_func over the samples' offsets); "xformers" (a BlockDiagonalCausalMask, where
    its device probe passed and torch's own route does not beat it); then torch's own route, on unless
    UNSLOTH_SDPA_PACKED_SEGMENTS=0: "torch varlen" (torch.nn.attention.varlen_attn, where this torch's has window_size
    and enable_gqa) or "sdpa per sample" (one SDPA call per run of samples of one length: exact, no varlen kernel);
    else "none": a dense [tokens x tokens] mask over the whole packed batch."""
    try:
        from unsloth.models import _utils
    except Exception:  # not installed, or no GPU for it to start on
        return "none"
    if getattr(_utils, "HAS_FLASH_ATTENTION", False):
        return "flash-attn"
    try:  # (the flag that counts: the import-time probe can turn a broken xformers off)
        dispatch = importlib.import_module("unsloth.utils.attention_dispatch")
    except Exception:  # Unsloth before attention_dispatch
        return "xformers" if getattr(_utils, "xformers", None) is not None else "none"
    native = getattr(dispatch, "_SDPA_PACKED_SEGMENTS", False)
    if getattr(dispatch, "HAS_XFORMERS", False) and not (native and getattr(dispatch, "_NATIVE_BEATS_XFORMERS", False)):
        return "xformers"
    if native:
        return "torch varlen" if getattr(dispatch, "_TORCH_VARLEN_ATTN", None) is not None else "sdpa per sample"
    return "none"


def missing_varlen_kernel() -> str:
    """Why Unsloth found no varlen kernel, in words a user acts on. xformers' C++ kernels load only under the
    torch they were compiled against (its cpp_lib.json names it; PyPI's 0.0.35 wheel: torch 2.10.0), and
    Unsloth then turns it off with one printed line; flash-attn ships no wheel on PyPI, only its source."""
    if os.environ.get("UNSLOTH_SDPA_PACKED_SEGMENTS", "1").lower() in ("0", "false", "no", "off"):
        return "UNSLOTH_SDPA_PACKED_SEGMENTS turns Unsloth's packed SDPA route off: unset it"
    spec = importlib.util.find_spec("xformers")
    if spec is None or not spec.submodule_search_locations:
        return "install xformers built for this torch, or flash-attn"
    try:
        built = json.loads((Path(next(iter(spec.submodule_search_locations))) / "cpp_lib.json").read_text())
        built = built["version"]["torch"]
    except (OSError, ValueError, KeyError, TypeError):
        built = "a torch it does not name"
    return (f"xformers is installed, but its kernels were built for torch {built} and this is torch "
            f"{torch.__version__}: install the xformers built for this torch, or flash-attn")


def unsloth_rows(c: Config) -> tuple[Config, dict]:
    """backend=unsloth: the attention Unsloth has here for packed rows, for the cell's record (metrics.json: model.
    unsloth_varlen_kernel, model.unsloth_packing), and the rows it trains on: packed rows go through Unsloth's own
    padding-free path wherever it has a route that is not a dense mask (unsloth_varlen_kernel); with none its rows
    are padded (data.packing=false, recorded), since a dense mask holds 2 x (batch x seq_len)^2 bytes (512 MiB at
    8 x 2,048 tokens, 32 GiB at one row of 131,072) and attends through it."""
    if c.backend.name is not Backend.unsloth:
        return c, {}
    from lorabench.builders.data import packs

    kernel = unsloth_varlen_kernel()
    note = {"unsloth_varlen_kernel": kernel, "unsloth_packing": packs(c) and kernel != "none"}
    if packs(c) and kernel == "none":
        why = (f"Unsloth has no varlen attention kernel here ({missing_varlen_kernel()}): its rows are padded, not "
               "packed, and its ratios are labelled 'Unsloth without its varlen kernel'")
        log.info("backend=unsloth: %s", why)
        note["unsloth_packing_off"] = why
        c = replace(c, data=replace(c.data, packing=False))
    return c, note


def use_unsloth_packing(model, c: Config) -> None:
    """Packed rows through Unsloth's padding-free path, as its trainer sets it up (unsloth.utils.packing.
    enable_sample_packing): each batch one row with every sample's length (packed_seq_lengths, from
    lorabench.builders.data.PackedCollator), and the model marked to take a row longer than max_seq_length (batch
    rows laid end to end), which Unsloth would otherwise cut."""
    from lorabench.builders.data import packs

    if not packs(c):
        return
    try:
        from unsloth.utils.packing import mark_allow_overlength
    except ImportError:  # an Unsloth before its packing module: packed_seq_lengths alone lets a long row through
        return
    mark_allow_overlength(model)


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
    tmp.mkdir(parents=True)
    try:
        modeling.save_random_weights(c.model, device, tmp)
    except modeling.NoRoom as e:
        shutil.rmtree(tmp)
        raise RuntimeError(f"backend=unsloth loads from a directory: {e}; give data.cache_dir a disk with room, or "
                           "model.path a saved checkpoint") from None
    if device.type == "cuda":  # the draws are not the cell's: its peak is the loader's and the steps'
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
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
