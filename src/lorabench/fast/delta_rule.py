"""Linear attention's chunked gated delta rule (Qwen3.5's Gated DeltaNet): flash-linear-attention's kernels on Hopper
GPUs where the package refuses them for a tile the model does not use, or transformers' PyTorch rule through
torch.compile.

flash-linear-attention (fla) 0.6.0 refuses its gated backward on Hopper GPUs under Triton 3.4.0 to 3.7.0 (fla #640:
Triton miscompiles chunk_bwd_dqkwg's dk at a 64-wide key tile; fla 0.6.0 raises at the first backward). On Hopper
the kernel's key tile is the key head's width rounded up to a power of two, at most 128: 64 only for heads 33 to 64
wide. Qwen3.5's 128-wide key heads take the 128 tile, which that Triton compiles right; `lift_hopper_refusal` lets
exactly those calls through and leaves fla's refusal to every call that would take the 64 tile.

Where flash-linear-attention does not compute it (not installed, or refusing the GPU: see
lorabench.run.checks.check_linear_attention_kernels), transformers runs its PyTorch reference,
torch_chunk_gated_delta_rule: q, k, v, the gates and beta in float32, chunks of 64 tokens, [64 x 64] decay and
UT-transform matrices per chunk and head, then a scan over the chunks; each of its ~40 elementwise steps reads and
writes a float32 tensor of [batch, heads, tokens, 64 or head_dim]. Compiled, the same function (transformers' own
code, the same operations) runs with those steps fused around its matmuls and its triangular solves, and the
backward recomputes the cheap elementwise parts instead of keeping them. It runs in float32 throughout, as the
function casts its inputs: under a bf16 cell's autocast its matmuls would run in bf16 (the reference's do), and
compiled so they moved one gate gradient of Qwen3.5 beyond the family test's bf16 bound on an H100. Its matmuls are
small (64 x head_dim per chunk and head): ~0.5 GFLOP a token over 24 layers, forward and backward.

The layer's forward stays transformers' (its code object), given a namespace in which that one name is the
compiled function: other models in the process, hf's among them, keep the reference.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import logging
import sys
import types

import torch

log = logging.getLogger(__name__)

NAME = "torch_chunk_gated_delta_rule"  # the module-level function the Gated DeltaNet forwards call


def fla_computes() -> bool:
    """transformers takes flash-linear-attention's kernel for the rule wherever the package imports."""
    return importlib.util.find_spec("fla") is not None


BAD_TILE = 64  # the key tile Triton 3.4.0-3.7.0 miscompiles on Hopper (fla #640)
LIFTED = "_lorabench_lifted"  # the mark on fla's chunk_bwd_dqkwg once wrapped


def key_tile(key_dim: int) -> int:
    """fla's key tile for chunk_bwd_dqkwg on a Hopper GPU: the key width's next power of two, 16 to 128."""
    return min(max(1 << max(key_dim - 1, 0).bit_length(), 16), 128)


def lift_hopper_refusal() -> bool:
    """fla's gated chunk_bwd_dqkwg without its Hopper refusal for calls whose key tile is not the miscompiled one
    (see the module's docstring); every other call meets the refusal as before. Returns whether fla was wrapped
    (False: fla is not installed or its layout is not 0.6.0's)."""
    try:
        import fla.ops.common.chunk_o as chunk_o
    except ImportError:
        return False
    original = getattr(chunk_o, "chunk_bwd_dqkwg", None)
    if original is None or not hasattr(chunk_o, "IS_NVIDIA_HOPPER"):
        return False
    if getattr(original, LIFTED, False):
        return True

    @functools.wraps(original)
    def dqkwg(q, k, *args, **kwargs):
        if key_tile(k.shape[-1]) == BAD_TILE or not chunk_o.IS_NVIDIA_HOPPER:
            return original(q, k, *args, **kwargs)
        # the refusal reads this flag when called, and nothing else in the call does (the tiles read the shared
        # memory, NUM_WARPS was set at import): off for this call only
        chunk_o.IS_NVIDIA_HOPPER = False
        try:
            return original(q, k, *args, **kwargs)
        finally:
            chunk_o.IS_NVIDIA_HOPPER = True

    setattr(dqkwg, LIFTED, True)
    chunk_o.chunk_bwd_dqkwg = dqkwg
    for name, module in list(sys.modules.items()):  # the rules' modules imported it by name (gated_delta_rule.chunk)
        if (name == "fla" or name.startswith("fla.")) and getattr(module, "chunk_bwd_dqkwg", None) is original:
            module.chunk_bwd_dqkwg = dqkwg
    return True


def in_float32(rule):
    """`rule` with autocast off: its float32 inputs stay float32 in its matmuls."""
    @functools.wraps(rule)
    def run(*args, **kwargs):
        with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            return rule(*args, **kwargs)
    return run


def _patchable(module) -> bool:
    forward = inspect.unwrap(type(module).forward)
    return (type(module).__name__.endswith("GatedDeltaNet") and NAME in forward.__code__.co_names
            and getattr(getattr(module, "conv1d", None), "_hf_hook", None) is None)


def patch(model, backend="inductor") -> int:
    """Each Gated DeltaNet layer of `model` computes the rule through one torch.compile of transformers'
    function (one per modeling module: Qwen3.5 and Qwen3.5-MoE each have theirs). `backend`: torch.compile's
    (the tests pass one that runs the traced graph as it is). Returns the number of layers patched.

    The forward is unwrapped from transformers' force_accelerate_hooks, which fires the hooks of an accelerate
    device map on conv1d; a layer whose conv1d has such a hook (weights offloaded by a device map) is left as it is."""
    compiled: dict[int, object] = {}
    n = 0
    # One graph per cell shape and grad mode (a recomputed layer's forward runs again in the backward): a
    # multirun's cells in one process would pass dynamo's 8 and fall back to the reference without a word.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    for module in model.modules():
        if not _patchable(module):
            continue
        forward = inspect.unwrap(type(module).forward)
        rule = forward.__globals__[NAME]
        if id(rule) not in compiled:
            # dynamic=False: every layer sees the cell's one shape (fixed-length rows), one graph for all of them
            compiled[id(rule)] = torch.compile(in_float32(rule), backend=backend, dynamic=False)
        namespace = dict(forward.__globals__)
        namespace[NAME] = compiled[id(rule)]
        own = types.FunctionType(forward.__code__, namespace, forward.__name__, forward.__defaults__,
                                 forward.__closure__)
        own.__kwdefaults__ = forward.__kwdefaults__
        module.forward = types.MethodType(own, module)
        n += 1
    return n
