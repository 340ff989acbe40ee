"""The checks a cell's values must pass before anything is built.

Ranges of single values live in the schemas' __post_init__ (lorabench.config) and run when the
config becomes dataclasses. Here: what spans groups or looks at the file system, in two parts.
`check_values` needs no device, so a multirun's preflight (lorabench.sweep) runs it on every cell
before the first model is built, and every cell runs it again first thing. `check_device` needs the
device the cell runs on (the launching host of a SLURM sweep may have no GPU).
"""

from __future__ import annotations

import os
from pathlib import Path

from lorabench.config import (BNB_OPTIMIZERS, QUANTISED, Backend, Config, DataKind, ModelConfig, OptimizerName,
                              Precision)
from lorabench.models import Architecture, architecture_of, tokenizers
from lorabench.modeling import tokenizer_file


def check_values(c: Config) -> None:
    """Every check of a cell's values that needs no device; raises ValueError/FileNotFoundError
    naming the key, the bad value and what is accepted."""
    check_model_path(c.model)  # first: the checks below read its config.json
    arch = architecture_of(c.model)  # the checkpoint's shape with model.path, else the model group's
    if c.lora.r > arch.hidden:
        raise ValueError(f"lora.r={c.lora.r} is larger than the model's hidden size "
                         f"({arch.hidden}); a rank above it adds parameters and no capacity")
    if c.seq_len > arch.max_positions:
        raise ValueError(f"seq_len={c.seq_len} exceeds model.max_position_embeddings={arch.max_positions} "
                         f"of model={c.model.name}")
    arch.resolve_lora_targets(c.lora.target_modules)  # a name the architecture lacks: one line
    if c.data.kind is DataKind.synthetic and c.data.packing:
        raise ValueError("data.packing=true with data=synthetic: synthetic rows are already exactly seq_len "
                         "tokens, there is nothing to pack")
    b = c.backend
    if b.name is Backend.unsloth and (b.liger or b.pack or b.compile or b.fused_lora or b.fused_mlp
                                      or b.fused_add_norm or b.varlen_attention or not b.upcast_fp32):
        raise ValueError("backend=unsloth is Unsloth's recipe as it is: backend.liger=[], backend.pack=false, "
                         "backend.compile=false, backend.fused_lora=false, backend.fused_mlp=false, "
                         "backend.fused_add_norm=false, "
                         "backend.varlen_attention=false and "
                         f"backend.upcast_fp32=true (got liger={list(b.liger)}, pack={b.pack}, compile={b.compile}, "
                         f"fused_lora={b.fused_lora}, fused_mlp={b.fused_mlp}, fused_add_norm={b.fused_add_norm}, "
                         f"varlen_attention={b.varlen_attention}, "
                         f"upcast_fp32={b.upcast_fp32})")
    if b.name is Backend.unsloth and c.train.offload_fraction:
        raise ValueError(f"train.offload_fraction={c.train.offload_fraction:g} is lorabench's offloading; "
                         "backend=unsloth runs its own (it offloads its checkpointed layers' inputs): use 0 with it")
    for knob, on in (("fused_lora", b.fused_lora), ("fused_mlp", b.fused_mlp)):
        if on and c.precision.name is Precision.int8:
            raise ValueError(f"backend.{knob}=true runs 4-bit and 16/32-bit base layers, not precision=int8 "
                             f"(bitsandbytes' 8-bit matmul): use backend.{knob}=false with it")
    if b.flat_optimizer and c.optimizer.name is OptimizerName.adafactor:
        raise ValueError("backend.flat_optimizer=true with optimizer=adafactor: Adafactor factors each matrix's "
                         "second moment by rows and columns, a flat tensor would change that; use "
                         "backend.flat_optimizer=false with it")
    check_data_path(c)
    if tokenizer_file(c.model) is None and c.data.kind is not DataKind.synthetic:  # (names a missing file too)
        raise ValueError(f"data={c.data.kind.value}: {tokenizers.reason(c.model, arch)}")


def _offline(var: str) -> bool:
    return os.environ.get(var, "1") == "1"  # train.py sets the hub variables to 1 unless given


def check_model_path(m: ModelConfig) -> None:
    """model.path: a local directory of safetensors (unless asked otherwise) with readable headers,
    so a truncated or corrupt download fails here, naming the file, not deep inside the loader; or,
    online, a hub id."""
    if not m.path:
        return
    local = Path(m.path).expanduser()
    if local.is_file():
        raise ValueError(f"model.path={m.path!r} is a file; it must be a model directory (config.json and "
                         "*.safetensors), e.g. the folder a download made")
    if not local.exists():
        if _offline("HF_HUB_OFFLINE"):
            raise FileNotFoundError(f"model.path={m.path!r}: no such directory, and the hub is off "
                                    "(HF_HUB_OFFLINE=1; set HF_HUB_OFFLINE=0 to download a hub id)")
        reach_hub(m.path, "model", "HF_HUB_OFFLINE")
        return
    tensors = sorted(local.glob("*.safetensors"))
    if not tensors:
        others = sorted(p.name for p in local.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        if m.safetensors_only or not others:
            raise FileNotFoundError(
                f"model.path={m.path!r}: no *.safetensors file"
                + (f" (found {others}: pickled weights can run code; model.safetensors_only=false "
                   "loads them anyway)" if others else ""))
        return
    from safetensors import safe_open

    for f in tensors:
        try:
            # Opening parses the header and checks that its tensors cover the file exactly:
            # a truncated or overwritten file fails here.
            with safe_open(str(f), framework="pt"):
                pass
        except Exception as e:
            raise ValueError(f"model.path={m.path!r}: {f.name} is not a readable safetensors file "
                             f"({f.stat().st_size:,} bytes): {e}") from None


def check_data_path(c: Config) -> None:
    """data.path of the kind the data option reads: a file for jsonl, a save_to_disk directory
    (or, online, a hub id) for hf."""
    d = c.data
    if d.kind not in (DataKind.jsonl, DataKind.hf) or not d.path:
        return
    p = Path(d.path).expanduser()
    if d.kind is DataKind.jsonl:
        if p.is_dir():
            raise ValueError(f"data.path={d.path!r} is a directory; data=jsonl reads one file of JSON lines "
                             "(for a datasets save_to_disk directory use data=hf)")
        if not p.is_file():
            raise FileNotFoundError(f"data.path={d.path!r}: no such file")
    elif p.is_file():
        raise ValueError(f"data.path={d.path!r} is a file; data=hf reads a datasets save_to_disk directory "
                         "(for a file of JSON lines use data=jsonl)")
    elif not p.exists() and _offline("HF_DATASETS_OFFLINE"):
        raise FileNotFoundError(f"data.path={d.path!r}: no such directory, and datasets are offline "
                                "(HF_DATASETS_OFFLINE=1; set it to 0 to download a hub dataset)")
    elif not p.exists():
        reach_hub(d.path, "dataset", "HF_DATASETS_OFFLINE")


def reach_hub(repo_id: str, kind: str, switch: str) -> None:
    """With offline mode turned off, one request (10 s at most) that the hub knows this id, so a
    machine without network fails here in one line, not after the loaders' retries (77 s measured)."""
    import huggingface_hub

    info = huggingface_hub.model_info if kind == "model" else huggingface_hub.dataset_info
    try:
        info(repo_id, timeout=10)
    except Exception as e:  # no network, no such repo, no access: each says why in its first line
        key = "model.path" if kind == "model" else "data.path"
        raise ValueError(f"{key}={repo_id!r}: not a local directory, and the hub ({switch}=0 is set) did not answer "
                         f"for this {kind} id: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}") from None


def check_device(c: Config, device) -> None:
    """What cannot run on this device (a torch.device), before any model is built."""
    check_precision(c.precision.name, device)
    if device.type != "cuda" and c.optimizer.name in BNB_OPTIMIZERS:
        raise RuntimeError(f"optimizer={c.optimizer.name.value} is a bitsandbytes CUDA optimizer; "
                           "on CPU use optimizer=adamw_torch, adamw_torch_fused or adafactor.")
    if device.type == "cpu":
        check_host_memory(c)


def host_memory_need(c: Config) -> dict[str, float]:
    """A lower bound of what a CPU cell holds in host memory at once, in bytes: the weights, the
    adapters' gradients and AdamW states, the logits and their gradient (fp32 in the loss), and each
    layer's activations kept for the backward pass (Architecture.activation_width per token; only
    the layer inputs under checkpointing), all from the model's real shape (model.path's config.json). What the
    kernels add on top (attention scores, temporaries) is left out, so a cell under this bound can
    still run out: the watchdog (lorabench.guard) catches that one."""
    a = architecture_of(c.model)
    h, layers, tokens = a.hidden, a.layers, c.batch * c.seq_len
    width = 2 if c.precision.name is Precision.bf16 else 4
    params = a.total_params()  # every weight, embeddings included (once when tied to the head)
    lora = a.lora_params(_linear_targets(a, c.lora.target_modules), c.lora.r)
    per_layer = (h if c.train.gradient_checkpointing else a.activation_width()) * tokens * width
    return {"weights": params * width + lora * (4 + 4 + 8), "logits": 2 * tokens * a.vocab * 4,
            "activations": layers * per_layer}


def _linear_targets(a: Architecture, requested) -> tuple:
    targets = a.resolve_lora_targets(requested)
    return a.lora_targets if targets == ("all-linear",) else targets


def check_host_memory(c: Config) -> None:
    """Refuse (status oom) a CPU cell whose lower-bound need exceeds the memory the host has available."""
    import psutil

    from lorabench.guard import GIB, HostMemoryExceeded

    need = host_memory_need(c)
    total, available = sum(need.values()), psutil.virtual_memory().available
    limit = c.train.host_memory_limit_gib  # on the process's whole resident memory, what it holds now included
    room = min(available, limit * GIB - psutil.Process().memory_info().rss) if limit is not None else available
    if total > room:
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in need.items())
        where = f"{room / GIB:.1f} GiB " + ("allowed (train.host_memory_limit_gib)" if room < available else
                                             "available on this host")
        raise HostMemoryExceeded(f"host memory: this cell needs at least {total / GIB:.1f} GiB ({parts}) and "
                                 f"{where}; lower batch (now {c.batch}) or seq_len (now {c.seq_len})")


def check_precision(precision: Precision, device) -> None:
    if device.type == "cuda":
        return
    if precision in QUANTISED:
        raise RuntimeError(f"precision={precision.value} needs a CUDA GPU: bitsandbytes' CPU path is a slow "
                           "fallback whose numbers mean nothing for sizing a GPU. On CPU use "
                           "precision=fp32 or precision=bf16.")
    if precision is Precision.fp16:
        raise RuntimeError("precision=fp16 needs a CUDA GPU (fp16 loss scaling is not supported on "
                           "CPU); on CPU use precision=fp32 or precision=bf16.")
