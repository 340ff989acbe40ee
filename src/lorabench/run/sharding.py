"""train.parallel=fsdp: the cell's model sharded over its processes with PyTorch's FSDP2 (fully_shard), through
the HF Trainer's own FSDP support (accelerate's fsdp2_prepare_model does the wrapping).

Why FSDP2 through the Trainer and not DeepSpeed ZeRO-3: the cell already trains with the Trainer and
accelerate, which wrap each decoder layer with fully_shard from TrainingArguments(fsdp=...) alone; ZeRO-3
would add a package and a JSON config for the same sharding, and its 4-bit support goes through the same
bitsandbytes quant-storage trick. What is sharded: every parameter of each decoder layer (its own FSDP unit),
the embeddings (one), the output head (one: see gather_head_with_final_norm) and the rest with the root, each
split in dim 0 over the processes. The nf4 weights are stored as bf16 words (bnb_4bit_quant_storage,
lorabench.builders.modeling) so that they are a floating tensor FSDP can split and all-gather; their quantisation
constants stay whole on every process (bitsandbytes keeps them on the module). A layer's weights are gathered
before its forward, freed after it, and gathered again for its backward; the adapters' gradients are
reduce-scattered. Each process keeps 1/N of the weights and of the adapters' optimizer state between layers.

Arithmetic: nothing is cast by FSDP (MixedPrecisionPolicy() with no dtypes), and the forward runs under the
same autocast as in one process and under DDP, so the cell computes what its DDP twin computes, up to the
order of the sums; gradients are reduced in their own dtype (fp32 adapters). That autocast is ours
(`autocast`): accelerate wraps the model's forward in autocast for one process and DDP
(Accelerator.prepare_model) but not on its FSDP2 path (_prepare_fsdp2 leaves casting to the policy). Without
it the QLoRA recipe's fp32 norms hand fp32 activations to every layer, and attention, the adapters and the
head run in fp32 (bitsandbytes' 4-bit layers cast their input to bf16 and their product back): on 2 and 4
H200s, llama-3.3-70b's step took 14.3 s against 7.1 s in one process at the same batch per GPU
(docs/runs/2026-11-26_fsdp, first try).

Checkpoints: SHARDED_STATE_DICT with the adapters only (the Trainer's adapter_only): each process writes its
shards of the adapters and their optimizer state with torch.distributed.checkpoint, never the frozen base, and
a re-run loads them back (lorabench.run.loop's resume).

On CPU: accelerate 1.15 turns FSDP on only for accelerator devices (accelerate/state.py enables its
fsdp_plugin for MULTI_GPU, MULTI_XPU, ... and not MULTI_CPU), while FSDP2 itself runs on CPU processes over
gloo (torch 2.13). `enable_on_cpu` sets accelerate's state to FSDP there, so that the tests' CPU ranks run the
same wrapping, step and checkpoint code as CUDA ranks do.
"""

from __future__ import annotations

import contextlib
import logging

import torch

log = logging.getLogger(__name__)


def trainer_arguments(layer_class: str) -> dict:
    """TrainingArguments keys for an FSDP2 cell whose decoder layers are of class `layer_class`."""
    return dict(fsdp=True, fsdp_config={
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": [layer_class],  # one FSDP unit per decoder layer
        # Gathered again for the backward: only one layer's whole weights at a time (the point of sharding).
        "reshard_after_forward": True,
        "state_dict_type": "SHARDED_STATE_DICT",
        # Each process builds its model on its own device (lorabench.builders.modeling); accelerate skips its
        # meta-device loading for 4-bit weights anyway (fsdp_utils.fsdp2_prepare_model).
        "cpu_ram_efficient_loading": False,
    })


def set_mixed_precision(args) -> None:
    """FSDP2 casts nothing (see the module's docstring): the Trainer builds accelerate's plugin from
    args.fsdp_plugin_args, where a policy set beforehand wins over the bf16 one accelerate would choose
    (param_dtype and reduce_dtype bf16: the fp32 norms and adapters cast, gradients reduced in bf16)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if args.fsdp_plugin_args is not None:
        args.fsdp_plugin_args["mixed_precision_policy"] = MixedPrecisionPolicy()


def autocast(args, cache_enabled: bool | None = True) -> contextlib.AbstractContextManager:
    """The forward's autocast for a sharded cell (see the module's docstring): the cell's 16-bit dtype on
    its device, as accelerate gives one process and DDP; nothing for an unsharded or fp32 cell."""
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
    if not args.fsdp or dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=args.device.type, dtype=dtype, cache_enabled=cache_enabled)


def gather_head_with_final_norm(model) -> None:
    """Before the final norm's forward, the output head's FSDP unit gathered.

    accelerate means the final norm and the head to be one unit, gathered when the first of them runs
    (fsdp2_prepare_model's `fully_shard([final_norm, lm_head])`), but it looks for the norm among the
    children of `model.<base_model_prefix>`, which for a PEFT model is the CausalLM (children: `model` and
    `lm_head`): no norm, so the head is a unit of its own, gathered only when its forward is called.
    Liger's fused linear cross-entropy never calls it: it reads `lm_head.weight`, then a DTensor shard
    ("aten.mm.out got mixed torch.Tensor and DTensor", backend=fast on 2 and 4 H200s). Gathered here
    instead, it stays whole until the backward's end (FSDP's final callback reshards it), as accelerate's
    tail unit would (reshard_after_forward=False); for a head whose forward is called this only moves
    the same all-gather a norm earlier."""
    from torch.distributed.fsdp import FSDPModule

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head, norm = base.get_output_embeddings(), getattr(base.model, "norm", None)
    if head is None or norm is None:
        return

    def gather(module, args) -> None:
        if isinstance(head, FSDPModule):  # wrapped by the Trainer after this hook was registered
            head.unshard()

    norm.register_forward_pre_hook(gather)


def enable_on_cpu(trainer) -> None:
    """After the Trainer made its Accelerator: on CPU processes, accelerate's state set to FSDP with the
    plugin the Trainer would have passed (see the module's docstring). Nothing on CUDA."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if trainer.args.fsdp_plugin_args is None or getattr(state, "fsdp_plugin", None) is not None:
        return
    if state.distributed_type is not DistributedType.MULTI_CPU:
        raise RuntimeError(f"train.parallel=fsdp: accelerate did not turn FSDP on for {state.distributed_type}")
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    state.distributed_type = DistributedType.FSDP
    trainer.is_fsdp_enabled = True
    log.info("FSDP2 on CPU processes (gloo): accelerate's state set to FSDP")


def held_bytes(model) -> int:
    """Bytes of parameters this process holds: under FSDP its shards (a DTensor's local part), else
    every parameter whole. Between layers an FSDP rank holds about 1/N of the model's. Expert weights in nf4
    (precision.experts_nf4) count as their nf4 words and scales: between forwards their parameters hold none."""
    from torch.distributed.tensor import DTensor

    from lorabench.builders import experts_nf4

    local = (p.to_local() if isinstance(p, DTensor) else p for p in model.parameters())
    held = sum(t.numel() * t.element_size() for t in local if all(s > 0 for s in t.stride()))
    return held + experts_nf4.nf4_bytes(model)
