"""An MoE model's expert weights in nf4 (precision.experts_nf4), dequantised one module at a time in its forward.

bitsandbytes quantises nn.Linear layers only, and transformers 5 keeps each MoE layer's experts as 3-D parameters of
one module, so a QLoRA cell otherwise holds them in bf16: gpt-oss-20b's 19.1B expert weights are 36 GiB, more than a
24 GB GPU before anything trains. Here each 3-D expert weight is quantised as bitsandbytes quantises any tensor
(bitsandbytes.functional.quantize_4bit: nf4 in blocks of 64 consecutive values of its last dimension, the blocks'
scales quantised again with double_quant): 0.5 + 1/64 bytes a weight, 9.2 GiB for gpt-oss-20b's experts.

Between forwards each expert weight is a parameter of its own shape and dtype that holds no memory; a forward
pre-hook on the experts module puts a parameter dequantised from the nf4 words in its place and a forward hook puts
the empty one back. The module's forward, transformers' expert kernels and PEFT's expert adapters (lora.experts: a
parametrisation whose `original` is that parameter) see a bf16 weight as before. A new parameter each forward, never
one whose data changes: what the forward saved for its backward (a weight its matmul needs) keeps its values until
that backward, as a bf16 layer's would. A recomputed layer dequantises again in its recompute: one more pass over its
weights per forward (gpt-oss-20b: 0.4 GB read and 1.6 GB written a layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

BLOCK = 64  # values a scale covers, bitsandbytes' default and QLoRA's


@dataclass
class Quantised:
    """One expert weight: its name in its module, its nf4 words and its scales."""

    key: str
    words: torch.Tensor  # uint8, two 4-bit codes a byte
    state: object  # bitsandbytes.functional.QuantState: scales, shape, dtype


def quantise(w: torch.Tensor, double_quant: bool) -> tuple[torch.Tensor, object]:
    from bitsandbytes import functional as bnbf

    return bnbf.quantize_4bit(w, blocksize=BLOCK, compress_statistics=double_quant, quant_type="nf4")


def expert_modules(model: nn.Module) -> list[tuple[str, nn.Module, list[str]]]:
    """Each module holding 3-D floating-point expert weights: its name, itself, and those weights' names."""
    found = []
    for name, module in model.named_modules():
        keys = [k for k, p in module._parameters.items() if p is not None and p.ndim == 3 and p.is_floating_point()]
        if keys and name.endswith("experts"):
            found.append((name, module, keys))
    return found


def quantise_experts(model: nn.Module, double_quant: bool = True, draw_std: float | None = None) -> int:
    """Every MoE layer's 3-D expert weights in nf4, dequantised around each forward of their module (see the
    module's docstring). Returns how many weights were quantised; raises if the model has none.
    draw_std: random weights, which the loader left undrawn (lorabench.builders.modeling.LaterWeight): each is drawn
    normal(0, draw_std) just before it is quantised, so that one expert weight at a time exists in bf16."""
    modules = expert_modules(model)
    if not modules:
        raise ValueError(f"precision.experts_nf4: {type(model).__name__} has no 3-D expert weights (not an MoE model "
                         "whose experts transformers stores as one module)")
    n = 0
    for _, module, keys in modules:
        held = []
        for key in keys:
            w = module._parameters[key].data
            if draw_std is not None:
                w = torch.empty(w.shape, dtype=w.dtype, device=w.device).normal_(0.0, draw_std)
            words, state = quantise(w, double_quant)
            del w
            module._parameters[key] = _empty(state.shape, state.dtype, words.device)
            held.append(Quantised(key, words, state))
            n += 1
        module.lorabench_nf4 = held
        module.register_forward_pre_hook(_dequantise)
        module.register_forward_hook(_release, always_call=True)
    return n


def _empty(shape, dtype: torch.dtype, device) -> nn.Parameter:
    """A frozen parameter of this shape and dtype holding one value (every index reads it): no memory to speak of."""
    one = torch.zeros(1, dtype=dtype, device=device)
    return nn.Parameter(one.as_strided(tuple(shape), [0] * len(shape)), requires_grad=False)


def _place(module: nn.Module, key: str, param: nn.Parameter) -> None:
    """param as the module's `key`: under a parametrisation (PEFT's expert adapters, while they run) as its
    original, else as the module's own parameter."""
    if nn.utils.parametrize.is_parametrized(module, key):
        module.parametrizations[key].original = param
    else:
        module._parameters[key] = param


def _dequantise(module, args) -> None:
    from bitsandbytes import functional as bnbf

    for q in module.lorabench_nf4:
        _place(module, q.key, nn.Parameter(bnbf.dequantize_4bit(q.words, q.state), requires_grad=False))


def _release(module, args, output) -> None:
    for q in module.lorabench_nf4:
        _place(module, q.key, _empty(q.state.shape, q.state.dtype, q.words.device))


def nf4_bytes(model: nn.Module) -> int:
    """Device bytes the quantised expert weights hold (words and scales)."""
    total = 0
    for _, module, _ in expert_modules(model):
        for q in getattr(module, "lorabench_nf4", []):
            total += q.words.numel() * q.words.element_size()
            total += q.state.absmax.numel() * q.state.absmax.element_size()
    return total
