"""Qwen3.5's Gated DeltaNet layer with flash-linear-attention's fused kernels around its gated delta rule.

transformers' layer (modeling_qwen3_5.Qwen3_5GatedDeltaNet.forward) computes, per token of a [batch, tokens] row:
the projections in_proj_qkv (keys, queries and values: 2 x 2,048 + 4,096 channels on Qwen3.5-9B), in_proj_z (the
output gate), in_proj_b and in_proj_a (one beta and one decay per value head); a causal depthwise convolution of
width 4 with SiLU over the qkv channels; the chunked gated delta rule; an RMSNorm of each value head's output gated
by SiLU(z); out_proj. Around the rule it runs each step as PyTorch ops: the convolution in the [batch, channels,
tokens] layout (a transposed copy of the row each way), queries and keys repeated to the value heads' count (two
copies), the gated norm in float32 (five passes over the output): each a pass over a [tokens x channels] tensor in
memory, forward, recomputed and backward, beside the layer's matmuls.

Here the same layer computes the same function with fla's kernels: its causal convolution with SiLU in one Triton
kernel, forward and backward, in the [batch, tokens, channels] layout the projection writes; the rule with queries
and keys shared across the value heads of a group inside the kernel (fla's grouped value attention: value head h
reads key head h // (value heads / key heads), as repeat_interleave lays them out); the RMSNorm, its weight and the
SiLU gate in one kernel, in float32 inside. The projections, the decay and beta are transformers' own, unchanged.

A call with a cache (generation) or with packed rows' offsets runs transformers' forward as it is.
"""

from __future__ import annotations

import inspect
import types
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F


class Kernels(NamedTuple):
    """fla's three functions, in the signatures this layer calls them with."""
    conv: Callable  # (x [B, T, C], weight [C, W], bias, activation) -> y [B, T, C]
    rule: Callable  # (q, k [B, T, H, K], v [B, T, HV, V], g, beta [B, T, HV]) -> o [B, T, HV, V]
    norm: Callable  # (x [N, V], gate [N, V], weight [V], eps) -> y [N, V]


def fla_kernels() -> Kernels:
    from fla.modules.causal_conv1d import causal_conv1d
    from fla.modules.norm.fused_norm_gate import rms_norm_gated
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return Kernels(
        conv=lambda x, weight, bias, activation: causal_conv1d(x, weight, bias, activation=activation)[0],
        rule=lambda q, k, v, g, beta: chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)[0],
        norm=lambda x, gate, weight, eps: rms_norm_gated(x, gate, weight, None, activation="silu", eps=eps))


def forward(self, hidden_states: torch.Tensor, cache_params=None, attention_mask: torch.Tensor | None = None,
            **kwargs) -> torch.Tensor:
    """Qwen3_5GatedDeltaNet.forward for training rows (no cache, no packed offsets), through `self._lorabench_kernels`."""
    if cache_params is not None or kwargs.get("cu_seq_lens_q") is not None:
        return self._lorabench_forward(hidden_states, cache_params=cache_params, attention_mask=attention_mask,
                                       **kwargs)
    k = self._lorabench_kernels
    if attention_mask is not None:  # a padded row's pad tokens zeroed, as transformers' apply_mask_to_padding_states
        hidden_states = (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)
    batch, seq_len, _ = hidden_states.shape
    mixed_qkv = k.conv(self.in_proj_qkv(hidden_states), self.conv1d.weight.squeeze(1), self.conv1d.bias,
                       self.activation)
    query, key, value = torch.split(mixed_qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(batch, seq_len, -1, self.head_k_dim)
    key = key.reshape(batch, seq_len, -1, self.head_k_dim)
    value = value.reshape(batch, seq_len, -1, self.head_v_dim)
    z = self.in_proj_z(hidden_states)
    beta = self.in_proj_b(hidden_states).sigmoid()
    # transformers' decay, in float32 (from an fp16 model, exp(A_log) alone could overflow)
    g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(hidden_states).float() + self.dt_bias)
    out = k.rule(query, key, value, g, beta)  # key heads shared by their value heads inside the rule
    out = k.norm(out.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim), self.norm.weight,
                 self.norm.variance_epsilon)
    return self.out_proj(out.reshape(batch, seq_len, -1))


def gated_delta_nets(model) -> list:
    """The model's Gated DeltaNet layers whose forward is transformers' own (Qwen3.5's and Qwen3.5-MoE's)."""
    return [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")
            and hasattr(m, "in_proj_qkv") and hasattr(m, "conv1d") and hasattr(m, "norm")]


def patch(model, kernels: Kernels | None = None) -> int:
    """Each Gated DeltaNet layer of `model` runs `forward` with `kernels` (fla's by default); other instances of the
    class (hf's models in the same process) keep transformers' forward. Returns the number of layers patched."""
    kernels = kernels or fla_kernels()
    layers = gated_delta_nets(model)
    for layer in layers:
        # transformers' forward, unwrapped from force_accelerate_hooks (no device map hooks on a fast cell's model)
        layer._lorabench_forward = types.MethodType(inspect.unwrap(type(layer).forward), layer)
        layer._lorabench_kernels = kernels
        layer.forward = types.MethodType(forward, layer)
    return len(layers)
