"""The checks a cell's values must pass before anything is built.

Ranges of single values live in the schemas' __post_init__ (lorabench.core.config) and run when the
config becomes dataclasses. Here: what spans groups or looks at the file system, in two parts.
`check_values` needs no device, so a multirun's preflight (lorabench.sweep.callbacks) runs it on every cell
before the first model is built, and every cell runs it again first thing. `check_device` needs the
device the cell runs on (the launching host of a SLURM sweep may have no GPU).
"""

from __future__ import annotations

import functools
import math
import os
import stat
from pathlib import Path

from lorabench.builders.data import packs
from lorabench.builders.modeling import tokenizer_file
from lorabench.core.config import (
    BNB_OPTIMIZERS,
    QUANTISED,
    Backend,
    BenchConfig,
    Config,
    DataKind,
    ModelConfig,
    OptimizerName,
    Precision,
    Suite,
)
from lorabench.measure.loggers import logger_problems
from lorabench.models import Architecture, architecture_of, gguf, tokenizers


def check_values(c: Config) -> None:
    """Every check of a cell's values that needs no device; raises ValueError/FileNotFoundError
    naming the key, the bad value and what is accepted (every problem found, one after another)."""
    found = value_problems(c)
    if len(found) == 1:
        raise found[0]
    if found:
        raise ValueError("; ".join(str(e) for e in found))


def value_problems(c: Config) -> list[Exception]:
    """What check_values finds, each check on its own: a multirun's preflight lists them all."""
    found: list[Exception] = logger_problems(c.logger)  # the trackers' settings and environment variables
    checks = [check_batch, check_backend, check_run, check_data_path, check_quality]
    try:  # model.path first: the architecture's checks read its config.json
        check_model_path(c.model)
        arch = architecture_of(c.model)  # the checkpoint's shape with model.path, else the model group's
        checks = [functools.partial(check, arch=arch) for check in (check_shapes, check_targets, check_vocab)] + checks
    except (ValueError, FileNotFoundError) as e:
        found.append(e)
    for check in checks:
        try:
            check(c)
        except (ValueError, FileNotFoundError) as e:
            found.append(e)
    return found


def check_shapes(c: Config, arch: Architecture) -> None:
    """The checkpoint's shape with model.path, else the model group's."""
    if c.lora.r > arch.hidden:
        raise ValueError(f"lora.r={c.lora.r} is larger than the model's hidden size "
                         f"({arch.hidden}); a rank above it adds parameters and no capacity")
    if c.seq_len > arch.max_positions:
        raise ValueError(window_problem(c, arch))
    fitted = c.backend.name is Backend.fast and c.backend.fit_parts  # (the fast path turns packing off itself)
    if packs(c) and arch.linear_attention and not fitted:
        raise ValueError(f"data.packing=true: model={c.model.name} ({arch.model_type}) has linear-attention layers, "
                         "whose state would run from one packed sample into the next; use data.packing=false")



def window_problem(c: Config, arch: Architecture) -> str:
    """seq_len past the model's window, in one line: a checkpoint's window is its config.json's (a longer one needs
    a checkpoint made for it); a randomly initialised model's is the model option's, which the user may extend:
    its speed and memory at that length are real, only its positions are untrained (as all its weights are)."""
    if c.model.path:
        return (f"seq_len={c.seq_len} exceeds {c.model.path}'s max_position_embeddings={arch.max_positions} (its "
                "config.json): train at most that, or use a checkpoint made for a longer context")
    return (f"seq_len={c.seq_len} exceeds model.max_position_embeddings={arch.max_positions} of model={c.model.name}: "
            f"train at most that, or extend the window with model.max_position_embeddings={c.seq_len} (fine for this "
            "randomly initialised model: speed and memory at that length are measured the same)")


def check_targets(c: Config, arch: Architecture) -> None:
    arch.resolve_lora_targets(c.lora.target_modules)  # a name the architecture lacks: one line
    check_experts_nf4(c, arch)
    if not c.lora.experts:
        return
    if not arch.is_moe:
        raise ValueError(f"lora.experts=true: model={c.model.name} ({arch.model_type}) has no experts; use "
                         "lora.experts=false")
    if c.lora.dropout:
        # PEFT's wrapper of a 3-D parameter adds B @ A to the weight: there is no input to drop out.
        raise ValueError(f"lora.experts=true with lora.dropout={c.lora.dropout:g}: PEFT adapts the experts' "
                         "3-D weights, not their inputs, and takes no dropout there; use lora.dropout=0")
    if c.backend.name not in (Backend.hf, Backend.fast) or c.train.sharded:
        # Unsloth's expert kernels and FSDP's units were not checked against PEFT's wrapper (fast leaves the
        # experts to it: lorabench.fast.parts turns Liger's experts kernel off).
        raise ValueError(f"lora.experts=true runs with backend=hf or fast, in one process or DDP (got backend="
                         f"{c.backend.name.value}{', train.parallel=fsdp' if c.train.sharded else ''})")


def check_experts_nf4(c: Config, arch: Architecture) -> None:
    """precision.experts_nf4 quantises the experts of the model lorabench builds (lorabench.builders.experts_nf4)."""
    if not c.precision.experts_nf4:
        return
    if not arch.is_moe:
        raise ValueError(f"precision.experts_nf4=true: model={c.model.name} ({arch.model_type}) has no experts; use "
                         "precision.experts_nf4=false")
    ranks = c.train.nproc * c.train.nnodes
    if c.backend.name is Backend.unsloth or ranks > 1:
        # Unsloth loads the model itself; DDP broadcasts and FSDP shards the parameters this replaces around each
        # forward, neither checked with them.
        raise ValueError("precision.experts_nf4=true runs with backend=hf or fast in one process (got backend="
                         f"{c.backend.name.value}" + (f", {ranks} processes" if ranks > 1 else "") + ")")


def check_batch(c: Config) -> None:
    if c.data.max_samples is not None and c.data.max_samples < c.batch * c.train.nproc and not packs(c):
        # Fewer samples than one step takes: every step would hold data.max_samples samples and the
        # cell would be labelled with a batch it never ran.
        raise ValueError(f"data.max_samples={c.data.max_samples} is fewer than one step's samples (batch={c.batch}"
                         + (f" x train.nproc={c.train.nproc}" if c.train.nproc > 1 else "")
                         + f"); use data.max_samples >= {c.batch * c.train.nproc} or a smaller batch")


def check_quality(c: Config) -> None:
    """Evaluations need held-out text: synthetic rows are random ids, with nothing to learn and nothing to hold out."""
    if c.quality.on and c.data.kind is DataKind.synthetic:
        raise ValueError("quality.eval_every > 0 with data=synthetic: random token ids have no held-out text to "
                         "evaluate on; use data=sharegpt, tiny_instruct, jsonl or hf")


def check_run(c: Config) -> None:
    """Values the libraries take only later, after the model is built: the seeds (numpy's, which the
    Trainer seeds too, takes [0, 2**32 - 1])."""
    for key, seed in (("train.seed", c.train.seed), ("data.seed", c.data.seed)):
        if not 0 <= seed < 2**32:
            raise ValueError(f"{key} must be in [0, 2**32 - 1], got {seed}")


def check_vocab(c: Config, arch: Architecture) -> None:
    """The data's token ids against the model: synthetic rows draw below its vocabulary; text data
    needs the model's tokenizer offline (refused in one line for a model without one), and a randomly
    initialised model (model.path null) must embed every id of a mistral-common tokenizer. (A checkpoint's
    own config.json sets its vocabulary.) Names a missing tokenizer file too."""
    path = tokenizer_file(c.model)
    if c.data.kind is DataKind.synthetic:  # ids drawn below the architecture's vocabulary (lorabench.builders.data)
        return
    if path is None:
        raise ValueError(f"data={c.data.kind.value}: {tokenizers.reason(c.model, arch)}")
    if c.model.path is not None or tokenizers.tokenizer_name(c.model, arch) in (*tokenizers.BPE,
                                                                                 tokenizers.CHECKPOINT):
        return
    words = tokenizer_words(str(path))
    if c.model.vocab_size < words:
        raise ValueError(f"model.vocab_size={c.model.vocab_size} is smaller than the tokenizer's {words} tokens "
                         f"(model.tokenizer={c.model.tokenizer}): ids past it would have no embedding; use "
                         f"model.vocab_size >= {words}")


@functools.lru_cache(maxsize=4)  # a preflight checks every cell with the same file: read it once (0.1 s)
def tokenizer_words(path: str) -> int:
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(path).instruct_tokenizer.tokenizer.n_words


def check_backend(c: Config) -> None:
    b = c.backend
    if b.name is Backend.unsloth and (b.liger or b.compile or b.fused_lora or b.fused_mlp
                                      or b.fused_add_norm or b.varlen_attention or b.flex_attention
                                      or not b.upcast_fp32):
        raise ValueError("backend=unsloth is Unsloth's recipe as it is: backend.liger=[], "
                         "backend.compile=false, backend.fused_lora=false, backend.fused_mlp=false, "
                         "backend.fused_add_norm=false, "
                         "backend.varlen_attention=false, backend.flex_attention=false and "
                         f"backend.upcast_fp32=true (got liger={list(b.liger)}, compile={b.compile}, "
                         f"fused_lora={b.fused_lora}, fused_mlp={b.fused_mlp}, fused_add_norm={b.fused_add_norm}, "
                         f"varlen_attention={b.varlen_attention}, flex_attention={b.flex_attention}, "
                         f"upcast_fp32={b.upcast_fp32})")
    if b.name is Backend.unsloth and (c.train.offload_checkpoints or b.tiled_mlp):
        raise ValueError(f"train.offload_checkpoints={str(c.train.offload_checkpoints).lower()} and backend.tiled_mlp="
                         f"{b.tiled_mlp} are lorabench's; backend=unsloth offloads its checkpointed layers' inputs "
                         "itself (backend.unsloth_offload=true): use false and 0 with it")
    if b.name is Backend.unsloth and not b.unsloth_fused_lora and c.lora.dropout == 0:
        raise ValueError("backend.unsloth_fused_lora=false with lora.dropout=0: Unsloth turns its fused LoRA kernels "
                         "off only where the adapters have dropout (UNSLOTH_FUSED_LORA_DROPOUT=0); give lora.dropout "
                         "> 0 or keep them on")
    if b.name is Backend.unsloth and b.unsloth_fused_lora and c.lora.dropout > 0 \
            and os.environ.get("UNSLOTH_FUSED_LORA_DROPOUT", "1") == "0":
        raise ValueError("UNSLOTH_FUSED_LORA_DROPOUT=0 is set here, which turns Unsloth's fused LoRA kernels off "
                         "while backend.unsloth_fused_lora=true says they are on: unset it, or say "
                         "backend.unsloth_fused_lora=false (the cell then records it)")
    if b.name is Backend.unsloth and c.train.offload_fraction:
        raise ValueError(f"train.offload_fraction={c.train.offload_fraction:g} is lorabench's offloading; "
                         "backend=unsloth runs its own (it offloads its checkpointed layers' inputs): use 0 with it")
    if c.train.sharded and b.name is Backend.unsloth:
        raise ValueError("train.parallel=fsdp with backend=unsloth: Unsloth trains on one GPU in a process of its "
                         "own; use backend=hf or backend=fast with it, or train.parallel=ddp")
    if c.train.sharded and c.precision.name is Precision.int8:
        # bitsandbytes' int8 weights are integer tensors, which FSDP cannot split; nf4 has a float storage.
        raise ValueError("train.parallel=fsdp with precision=int8: FSDP shards floating tensors and LLM.int8() "
                         "weights are int8; use precision=nf4 (stored as bf16 words) or bf16, or train.parallel=ddp")
    if c.train.sharded and c.optimizer.name in BNB_OPTIMIZERS:
        # Measured on CPU ranks: bitsandbytes' update op "got mixed torch.Tensor and DTensor".
        raise ValueError(f"train.parallel=fsdp with optimizer={c.optimizer.name.value}: bitsandbytes' optimizers "
                         "update plain tensors and FSDP2 holds each adapter as a DTensor shard; use "
                         "optimizer=adamw_torch_fused (the adapters' fp32 state is split over the GPUs) or "
                         "train.parallel=ddp")
    for knob, on in (("fused_lora", b.fused_lora), ("fused_mlp", b.fused_mlp)):
        if on and c.precision.name is Precision.int8:
            raise ValueError(f"backend.{knob}=true runs 4-bit and 16/32-bit base layers, not precision=int8 "
                             f"(bitsandbytes' 8-bit matmul): use backend.{knob}=false with it")
    if b.flat_optimizer and c.optimizer.name is OptimizerName.adafactor:
        raise ValueError("backend.flat_optimizer=true with optimizer=adafactor: Adafactor factors each matrix's "
                         "second moment by rows and columns, a flat tensor would change that; use "
                         "backend.flat_optimizer=false with it")


BENCH_DTYPES = ("bf16", "fp16", "tf32", "fp32")  # lorabench.bench.DTYPES' keys


def bench_problems(c: BenchConfig) -> list[Exception]:
    """bench.py's suite values, checked before a suite runs (each one line naming its key)."""
    found: list[Exception] = logger_problems(c.logger)

    def need(ok: bool, message: str) -> None:
        if not ok:
            found.append(ValueError(message))

    h, inf, con = c.hardware, c.inference, c.consistency
    lists = (("hardware.sizes", h.sizes), ("hardware.tokens", h.tokens), ("inference.batches", inf.batches))
    for key, values in lists:
        need(bool(values) and all(v > 0 for v in values), f"{key} must be a non-empty list of integers > 0, got "
                                                          f"{list(values)}")
    need(set(h.dtypes) <= set(BENCH_DTYPES) and bool(h.dtypes),
         f"hardware.dtypes={list(h.dtypes)}: use a non-empty list of {list(BENCH_DTYPES)}")
    for key in ("copy_mib", "elementwise_mib", "host_mib", "rep_ms"):
        need(getattr(h, key) > 0, f"hardware.{key} must be > 0, got {getattr(h, key)}")
    need(h.warmup_ms >= 0, f"hardware.warmup_ms must be >= 0, got {h.warmup_ms}")
    for key in ("prompt_len", "new_tokens", "repeats"):
        need(getattr(inf, key) > 0, f"inference.{key} must be > 0, got {getattr(inf, key)}")
    for kind, tolerances in (("relative", con.relative), ("absolute", con.absolute)):
        for key, tol in tolerances.items():
            need(math.isfinite(tol) and tol >= 0, f"consistency.{kind}.{key} must be a finite number >= 0, "
                                                  f"got {tol!r}")
    need(0 <= c.seed < 2**32, f"seed must be in [0, 2**32 - 1], got {c.seed}")
    if c.suite in (Suite.loading, Suite.inference) or (c.suite is Suite.hardware and c.model.path):
        try:  # (the hardware suite's step GEMMs are model.path's shapes)
            check_model_path(c.model)
        except (ValueError, FileNotFoundError) as e:
            found.append(e)
        else:
            if c.suite is Suite.inference:  # the positions of the model loaded: model.path's config.json
                positions, tokens = architecture_of(c.model).max_positions, inf.prompt_len + inf.new_tokens
                key = f"{c.model.path}'s max_position_embeddings" if c.model.path else "model.max_position_embeddings"
                need(tokens <= positions, f"inference.prompt_len + inference.new_tokens = {tokens} exceeds "
                                          f"{key}={positions}")
    return found


def _offline(var: str) -> bool:
    return os.environ.get(var, "1") == "1"  # train.py sets the hub variables to 1 unless given


def check_model_path(m: ModelConfig) -> None:
    """model.path: a local directory of safetensors (unless asked otherwise) with readable headers,
    so a truncated or corrupt download fails here, naming the file, not deep inside the loader; or,
    online, a hub id."""
    if m.path is not None and not m.path.strip():  # e.g. model.path=$CKPT with CKPT unset
        raise ValueError(f"model.path={m.path!r} is empty: give a model directory, or model.path=null for a "
                         "randomly initialised model of the model option's shape")
    if not m.path and m.gguf and (why := gguf.problem(m.gguf)):  # (converted when the cell starts: resolve_gguf)
        raise FileNotFoundError(why)
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
        reach_hub(m.path, "model", "HF_HUB_OFFLINE=0")
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
        if p.exists() and not p.is_file():  # /dev/null, a FIFO, a socket: no records to sample, or a hang
            kind = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
                    stat.S_IFSOCK: "a socket"}.get(stat.S_IFMT(p.stat().st_mode), "not a regular file")
            raise ValueError(f"data.path={d.path!r} is {kind}; data=jsonl reads a regular file of JSON lines")
        if not p.is_file():
            raise FileNotFoundError(f"data.path={d.path!r}: no such file")
        if p.stat().st_size == 0:
            raise ValueError(f"data.path={d.path!r} is empty (0 bytes); data=jsonl needs at least one record")
    elif p.is_file():
        raise ValueError(f"data.path={d.path!r} is a file; data=hf reads a datasets save_to_disk directory "
                         "(for a file of JSON lines use data=jsonl)")
    elif not p.exists() and (off := [v for v in DATASET_SWITCHES if _offline(v)]):
        # datasets downloads through huggingface_hub: both must be on (train.py sets each to 1 unless given)
        raise FileNotFoundError(f"data.path={d.path!r}: no such directory, and datasets are offline ("
                                + ", ".join(f"{v}=1" for v in off) + "); set HF_HUB_OFFLINE=0 and "
                                "HF_DATASETS_OFFLINE=0 to download a hub dataset")
    elif not p.exists():
        reach_hub(d.path, "dataset", " and ".join(f"{v}=0" for v in DATASET_SWITCHES))


DATASET_SWITCHES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")  # what a hub dataset's download needs at 0


def reach_hub(repo_id: str, kind: str, switch: str) -> None:
    """With offline mode turned off, one request (10 s at most) that the hub knows this id, so a
    machine without network fails here in one line, not after the loaders' retries (77 s measured)."""
    import huggingface_hub
    from huggingface_hub.errors import OfflineModeIsEnabled

    info = huggingface_hub.model_info if kind == "model" else huggingface_hub.dataset_info
    key = "model.path" if kind == "model" else "data.path"
    try:
        info(repo_id, timeout=10)
    except OfflineModeIsEnabled:  # the hub library read HF_HUB_OFFLINE=1 at its import
        raise ValueError(f"{key}={repo_id!r}: not a local directory, and huggingface_hub is offline (it read "
                         f"HF_HUB_OFFLINE=1 when it was imported); set {switch} before the command") from None
    except Exception as e:  # no network, no such repo, no access: each says why in its first line
        raise ValueError(f"{key}={repo_id!r}: not a local directory, and the hub ({switch} set) did not answer "
                         f"for this {kind} id: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}") from None


def check_device(c: Config, device) -> None:
    """What cannot run on this device (a torch.device), before any model is built."""
    check_precision(c.precision.name, device)
    if device.type != "cuda" and c.optimizer.name in BNB_OPTIMIZERS:
        raise RuntimeError(f"optimizer={c.optimizer.name.value} is a bitsandbytes CUDA optimizer; "
                           "on CPU use optimizer=adamw_torch, adamw_torch_fused or adafactor.")
    if device.type != "cuda" and c.train.memory_snapshot:
        raise RuntimeError("train.memory_snapshot=true records PyTorch's CUDA allocator; this cell runs on "
                           f"{device.type}: use train.memory_snapshot=false")
    check_model_on(c, device, architecture_of(c.model))


def check_model_on(c: Config, device, arch: Architecture) -> None:
    """What the model (`arch`, the checkpoint's with model.path) needs of this device: the host memory a CPU cell
    holds; kernels that compute its layers right."""
    if device.type == "cpu":
        check_host_memory(c, arch)
    check_linear_attention_kernels(c, device, arch)


UNSLOTH_FLA_MARK = "_UNSLOTH_VENDORED_FLA"  # unsloth_zoo.temporary_patches.fla_vendor's mark on its `fla` module


def check_linear_attention_kernels(c: Config, device, arch: Architecture) -> None:
    """flash-linear-attention (fla), once importable, replaces transformers' PyTorch path for Qwen3.5's linear
    attention. On a Hopper GPU (sm_90) under Triton 3.4.0 to 3.7.0 its gated backward gives wrong values, so fla
    (0.6.0) refuses it unless TileLang takes that kernel, and only at the first backward, after the model is built:
    said here, before. Unsloth's cells import Unsloth's own copy of fla (unsloth_zoo's, registered as `fla` and marked
    so), which on Hopper steps that kernel down from the miscompiled tile itself: left to it. fast's fla_on_hopper lets
    fla through where the model's key heads do not take that tile (lorabench.fast.delta_rule)."""
    if device.type != "cuda" or not arch.linear_attention:
        return
    from lorabench.fast import delta_rule

    if (c.backend.name is Backend.fast and c.backend.fla_on_hopper
            and delta_rule.key_tile(arch.linear_heads[2]) != delta_rule.BAD_TILE):
        return
    import importlib.metadata
    import importlib.util
    import sys

    import torch
    if (importlib.util.find_spec("fla") is None or importlib.util.find_spec("tilelang") is not None
            or getattr(sys.modules.get("fla"), UNSLOTH_FLA_MARK, False) is True
            or torch.cuda.get_device_capability(device)[0] != 9):
        return
    triton = importlib.metadata.version("triton")
    if (3, 4, 0) <= tuple(int(p) for p in triton.split(".")[:3] if p.isdigit()) < (3, 7, 1):
        raise RuntimeError(f"model={c.model.name}: flash-linear-attention (fla) is installed and refuses this Hopper "
                           f"GPU under Triton {triton} (3.4.0 to 3.7.0: wrong gated gradients); uninstall "
                           "flash-linear-attention / fla-core (transformers then runs its PyTorch path), install "
                           "tilelang, or upgrade Triton")


def host_memory_need(c: Config, a: Architecture) -> dict[str, float]:
    """A lower bound of what a CPU cell holds in host memory at once, in bytes: the weights, the
    adapters' gradients and AdamW states, the logits and their gradient (fp32 in the loss), and each
    layer's activations kept for the backward pass (Architecture.activation_width per token; only
    the layer inputs under checkpointing), all from the model's real shape (model.path's config.json). What the
    kernels add on top (attention scores, temporaries) is left out, so a cell under this bound can
    still run out: the watchdog (lorabench.run.guard) catches that one."""
    h, layers, tokens = a.hidden, a.layers, c.batch * c.seq_len
    width = 2 if c.precision.name is Precision.bf16 else 4
    params = a.total_params()  # every weight, embeddings included (once when tied to the head)
    lora = a.lora_params(_linear_targets(a, c.lora.target_modules), c.lora.r, c.lora.experts)
    per_layer = (h if c.train.gradient_checkpointing else a.activation_width()) * tokens * width
    return {"weights": params * width + lora * (4 + 4 + 8), "logits": 2 * tokens * a.vocab * 4,
            "activations": layers * per_layer}


def _linear_targets(a: Architecture, requested) -> tuple:
    targets = a.resolve_lora_targets(requested)
    return a.lora_targets if targets == ("all-linear",) else targets


def check_host_memory(c: Config, arch: Architecture) -> None:
    """Refuse (status oom) a CPU cell whose lower-bound need exceeds the memory the host has available."""
    import psutil

    from lorabench.run.guard import GIB, HostMemoryExceeded

    need = host_memory_need(c, arch)
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
