"""The attention's LoRA projections in one autograd Function (backend.fused_lora).

What PEFT runs for each adapted projection of a decoder layer, forward: bitsandbytes' 4-bit matmul
(dequantise, GEMM), `result.clone()`, dropout of the input, the two thin adapter matmuls, a multiply
by the scale and an add; backward: the same again, plus autograd's sum of the input's gradient over
its consumers (q, k, v's base layers and adapters: six [tokens x 4096] adds per layer). Saved for the
backward, per projection: its dropped-out input (2 bytes per element) and its mask (1 byte).

`project` does one group of projections that read the same input (q, k and v; or o alone):
  forward   per projection i: Y_i = X W_i^T (W_i dequantised, not kept), and with an adapter
            X_d = dropout_i(X) (its mask kept, 1 byte/element), XA_i = s X_d A_i^T  [tokens x r] (s in
            the GEMM's alpha), Y_i += XA_i B_i^T inside the same cuBLAS call (addmm_: the add is its epilogue)
  backward  dX = sum_i dY_i W_i (GEMMs accumulating into one buffer: no separate adds);
            G_i = s dY_i B_i, dB_i = dY_i^T XA_i, dA_i = G_i^T X_d (X_d rebuilt from X and the mask),
            dX += mask/(1-p) * (G_i A_i); on CUDA dA_i and dB_i written in fp32 by their GEMMs
Saved: X once for the group, XA_i, and the masks as bool (1 byte/element), or with seeded dropout
(lorabench.fast.kernels.dropout, CUDA) only their seeds: at batch 16 x 512 tokens 64 (+ 3 x 32) MiB for
q, k, v against PEFT's 3 x (64 + 32) MiB. The adapters compute in the activations' dtype (bf16), as
PEFT's do under autocast, cast once in the forward and kept for the backward (with flat_optimizer: views
of one cast a step, lorabench.fast.flat_optim.LowCopy); their gradients are returned in the parameters' dtype
(fp32). Each multiply by s is a GEMM's alpha, applied before the product is rounded: PEFT rounds the
product, then multiplies. The same arithmetic up to bf16 rounding; every launch saved is host time on a
host-bound step (docs/fast-path.md, "When the host sets the pace").

The arithmetic is PEFT's; only where it happens changes. The LoRA parameters stay PEFT's own modules,
so saving, loading and merging adapters is unchanged.
"""

from __future__ import annotations

import functools
import itertools
import sys
import types
from dataclasses import dataclass

import torch
from torch import nn

from lorabench.fast import flat_optim


@dataclass(frozen=True)
class Projection:
    """One projection of a group: its base linear layer and, when LoRA adapts it, PEFT's layer."""
    base: nn.Module
    lora: nn.Module | None  # a peft LoraLayer (it holds lora_A, lora_B, scaling, lora_dropout)
    triton_dequant: bool = False  # nf4 on CUDA dequantised by lorabench.fast.kernels.nf4
    absmax_cache: bool = False  # ... with its fp32 block scales kept (nf4_kernels._absmax)
    triton_grad: bool = False  # dX as one Triton GEMM (lorabench.fast.kernels.grad) where it runs


def _adapter(lora: nn.Module) -> str:
    (name,) = lora.active_adapters  # checked in patch_attention: one active adapter
    return name


def _dropout_p(lora: nn.Module, training: bool) -> float:
    drop = lora.lora_dropout[_adapter(lora)]
    return float(drop.p) if training and isinstance(drop, nn.Dropout) else 0.0


def _dropout(x: torch.Tensor, p: float, seeded: bool, slot: torch.Tensor | None = None):
    """(dropout(x), the key that replays its mask): with `seeded` on CUDA a seed
    (lorabench.fast.kernels.dropout: no mask kept), else torch's bool mask (1 byte per element). `slot`: the
    projection's seed in device memory (lorabench.fast.graphs: drawn again on the device before each step)."""
    if seeded and x.is_cuda:
        from lorabench.fast.kernels import dropout as dropout_kernels

        # From the CPU generator: no device sync, and activation checkpointing restores its state
        # before recomputing a layer, so the recomputed forward draws the same seed.
        seed = slot if slot is not None else int(torch.randint(2**31 - 1, (1,)))
        return dropout_kernels.dropout(x, seed, p), seed
    return torch.native_dropout(x, p, True)


def _is_seed(key) -> bool:
    """A seed (an int, or an int64 slot in device memory), not a bool mask."""
    return isinstance(key, int) or key.dtype == torch.int64


def _replay(x: torch.Tensor, key, p: float) -> torch.Tensor:
    """dropout(x) again, with the mask that `key` (a seed or a bool mask) names."""
    if _is_seed(key):
        from lorabench.fast.kernels import dropout as dropout_kernels

        return dropout_kernels.dropout(x, key, p)
    return torch.ops.aten.native_dropout_backward(x, key, 1 / (1 - p))


def _add_dropped(acc: torch.Tensor, g: torch.Tensor, key, p: float) -> None:
    """acc += dropout(g) with the mask that `key` names."""
    if _is_seed(key):
        from lorabench.fast.kernels import dropout as dropout_kernels

        dropout_kernels.add_dropped(acc, g, key, p)
    else:
        acc.add_(torch.ops.aten.native_dropout_backward(g, key, 1 / (1 - p)))


def _weight(proj: Projection, dtype: torch.dtype) -> torch.Tensor:
    """The base layer's weight [out x in] in `dtype`, dequantised when it is 4-bit (a temporary)."""
    w = proj.base.weight
    state = getattr(w, "quant_state", None)
    if state is None:
        return w.to(dtype)
    if proj.triton_dequant:
        from lorabench.fast.kernels import nf4 as nf4_kernels

        if nf4_kernels.runs(w, state):
            return nf4_kernels.dequantize(w.data, state, proj.absmax_cache).to(dtype)
    import bitsandbytes.functional as bnbf

    return bnbf.dequantize_4bit(w.data, state).to(dtype)


def _base(x2: torch.Tensor, proj: Projection, dtype: torch.dtype) -> torch.Tensor:
    """X W^T, + b where the base layer has a (frozen) bias, as F.linear adds it (Qwen2's q/k/v)."""
    bias = proj.base.bias
    w = _weight(proj, dtype).t()
    return x2 @ w if bias is None else torch.addmm(bias.to(dtype), x2, w)


def _merges(group: tuple[Projection, ...], ps: tuple[float, ...]) -> bool:
    """Whether the group's adapters share their thin GEMMs: every projection adapted, none with dropout
    (with dropout each reads its own dropped-out input)."""
    return len(group) > 1 and all(proj.lora is not None for proj in group) and not any(ps)


class _Projections(torch.autograd.Function):
    """Y_i = X W_i^T + s_i dropout_i(X) A_i^T B_i^T for the projections of one group.

    Without dropout the adapters of q, k and v share their thin GEMMs (`_merges`): XA = X [A_q; A_k; A_v]^T
    reads X once instead of three times, and in the backward dA = G^T X and dX += G [A_q; A_k; A_v] with
    G = [G_q, G_k, G_v] read X and write dX once each: at 32 x 512 tokens ~1 GB less traffic per layer."""

    @staticmethod
    def forward(ctx, x, group, ps, seeded, *adapters):
        dtype = x.dtype
        x2 = x.reshape(-1, x.shape[-1])
        merged = _merges(group, ps)
        # The adapters in the activations' dtype, cast once here and kept for the backward (a bf16 copy of
        # LoRA r16 weighs 128 KiB per 4,096-wide tensor), or views of flat_optim's copy cast once a step.
        lows = [flat_optim.low(t, dtype) for t in adapters]
        if merged:
            xa_all = x2 @ torch.cat(lows[0::2]).t()  # [tokens x sum of r]
            xa_parts = iter(xa_all.split([a.shape[0] for a in lows[0::2]], dim=1))
        ys, xas, keys = [], [], []
        k = 0
        for proj, p in zip(group, ps):
            y = _base(x2, proj, dtype)
            if proj.lora is not None:
                a, b, s = lows[k], lows[k + 1], proj.lora.scaling[_adapter(proj.lora)]
                k += 2
                if merged:  # a column block of XA (cuBLAS reads it with its row stride); s in the add
                    y.addmm_(next(xa_parts), b.t(), alpha=s)
                else:  # XA scaled in its GEMM (s X_d A^T), kept so: dB = dY^T (s XA) needs no multiply
                    xd, key = _dropout(x2, p, seeded, getattr(proj.lora, "lorabench_seed", None)) if p > 0 \
                        else (x2, None)
                    xa = _scaled_mm(xd, a.t(), s)
                    del xd
                    xas.append(xa)
                    keys.append(key)
                    y.addmm_(xa, b.t())
            ys.append(y)  # [tokens x out]: `project` gives it the input's shape, outside the Function
        ctx.group, ctx.ps, ctx.shape, ctx.merged = group, ps, x.shape, merged
        ctx.dtypes = [t.dtype for t in adapters]  # the gradients' (the parameters')
        # Seeds (and None) stay on ctx as they are, bool masks go through save_for_backward.
        masks = [k for k in keys if k is not None and not _is_seed(k)]
        ctx.keys = [k if k is None or _is_seed(k) else "mask" for k in keys]
        # X is kept only for the adapters' gradients: a group without adapters (the MLP's, where LoRA
        # adapts q/k/v/o only) keeps nothing, as bitsandbytes' 4-bit matmul keeps nothing.
        ctx.save_for_backward(x2 if adapters else None, *lows, *([xa_all] if merged else xas), *masks)
        return tuple(ys)

    @staticmethod
    def backward(ctx, *dys):
        x2, *rest = ctx.saved_tensors
        n_ad = 2 * sum(proj.lora is not None for proj in ctx.group)
        adapters = rest[:n_ad]
        dys = [dy.reshape(-1, dy.shape[-1]) for dy in dys]
        if ctx.merged:
            grads, terms, dropped = _merged_adapter_grads(ctx.group, dys, x2, adapters, rest[n_ad])
        else:
            xas, masks = rest[n_ad:n_ad + n_ad // 2], iter(rest[n_ad + n_ad // 2:])
            keys = [next(masks) if k == "mask" else k for k in ctx.keys]
            grads, terms, dropped = _adapter_grads(ctx.group, ctx.ps, dys, x2, adapters, xas, keys)
        grads = [g.to(dtype) for g, dtype in zip(grads, ctx.dtypes)]  # no-ops where they are fp32 already
        dx = None
        if ctx.needs_input_grad[0]:
            dx = _input_grad(ctx.group, dys, terms)
            for g, a, key, p in dropped:  # dX += mask/(1-p) * (G_i A_i): dropout's mask, not a GEMM's
                _add_dropped(dx, g @ a, key, p)
        return (None if dx is None else dx.view(ctx.shape), None, None, None, *grads)


def _input_grad(group, dys, terms) -> torch.Tensor:
    """dX = sum_i dY_i W_i + sum_j G_j A_j (`terms`: the adapters' (G, A) without dropout): one Triton
    GEMM with triton_input_grad (lorabench.fast.kernels.grad), else cuBLAS accumulating into dX (beta=1)."""
    dtype = dys[0].dtype
    pairs = itertools.chain(((dy, _weight(proj, dtype)) for proj, dy in zip(group, dys)), terms)
    if group[0].triton_grad and dys[0].is_cuda:
        from lorabench.fast.kernels import grad as grad_kernels  # Triton: imported on CUDA only

        pairs = list(pairs)  # the kernel reads every dequantised weight at once
        if grad_kernels.runs(pairs):
            return grad_kernels.input_grad(pairs)
    dx = None
    for a, b in pairs:  # cuBLAS: one dequantised weight alive at a time
        dx = a @ b if dx is None else dx.addmm_(a, b)
    return dx


def _adapter_grads(group, ps, dys, x2, adapters, xas, keys):
    """dA_i, dB_i of each adapter on its own; with them the (G_i, A_i) whose product dX gets, apart
    (`dropped`, with its mask's key and p) where dropout sits between them."""
    grads, terms, dropped, k = [], [], [], 0
    for proj, p, dy in zip(group, ps, dys):
        if proj.lora is None:
            continue
        a, b = adapters[k], adapters[k + 1]
        xa, key = xas[k // 2], keys[k // 2]
        k += 2
        g = _scaled_mm(dy, b, proj.lora.scaling[_adapter(proj.lora)])  # [tokens x r]
        db = _mm32(dy.t(), xa)  # xa holds s X_d A^T
        da = _mm32(g.t(), x2 if key is None else _replay(x2, key, p))
        if key is None:
            terms.append((g, a))
        else:
            dropped.append((g, a, key, p))
        grads += [da, db]
    return grads, terms, dropped


def _scaled_mm(a: torch.Tensor, b: torch.Tensor, s: float) -> torch.Tensor:
    """s (a @ b) with the scale in the GEMM (its alpha) rather than a multiply launched after it. With beta=0
    addmm ignores its input (torch's documentation: nan and inf in it are not propagated)."""
    return torch.addmm(a.new_empty(()), a, b, beta=0, alpha=s)


def _mm32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for an adapter's gradient: on CUDA from bf16/fp16 inputs written in fp32 (the parameters' dtype
    under QLoRA) by the GEMM itself (out_dtype: one rounding, no cast launched after it); elsewhere in the
    inputs' dtype, cast to the parameter's at the end of the backward."""
    if a.is_cuda and a.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(a, b, out_dtype=torch.float32)
    return a @ b


def _merged_adapter_grads(group, dys, x2, adapters, xa_all):
    """dA_i, dB_i of adapters that share their thin GEMMs (see _Projections), and their dX term."""
    a_all = torch.cat(adapters[0::2])  # [sum of r x in]
    parts = xa_all.split([a.shape[0] for a in adapters[0::2]], dim=1)
    gs, dbs = [], []
    for proj, dy, b, xa in zip(group, dys, adapters[1::2], parts):
        s = proj.lora.scaling[_adapter(proj.lora)]
        gs.append(_scaled_mm(dy, b, s))  # [tokens x r]
        dbs.append(_scaled_mm(dy.t(), xa, s))
    g_all = torch.cat(gs, dim=1)
    das = (g_all.t() @ x2).split([g.shape[1] for g in gs])
    return [t for da, db in zip(das, dbs) for t in (da, db)], [(g_all, a_all)], []


def project(x: torch.Tensor, group: tuple[Projection, ...], training: bool,
            seeded: bool = False) -> tuple[torch.Tensor, ...]:
    """The outputs of one group of projections of `x` (see the module's docstring)."""
    ps, adapters = [], []
    for proj in group:
        if proj.lora is None:
            ps.append(0.0)
            continue
        name = _adapter(proj.lora)
        ps.append(_dropout_p(proj.lora, training))
        adapters += [proj.lora.lora_A[name].weight, proj.lora.lora_B[name].weight]
    # Under autocast the GEMMs run in its dtype (bf16), as PEFT's and bitsandbytes' would, also when the
    # residual stream is fp32 (QLoRA's upcast); inside, autocast is off and the Function keeps that dtype.
    if torch.is_autocast_enabled(x.device.type):
        x = x.to(torch.get_autocast_dtype(x.device.type))
    with torch.autocast(x.device.type, enabled=False):
        ys = _Projections.apply(x, group, tuple(ps), seeded, *adapters)
    # Reshaped here, not inside the Function: a view made inside it could not be written in place by the model
    # (Llama-4 scales its queries in place), while autograd handles in-place writes to views made outside.
    return tuple(y.view(*x.shape[:-1], -1) for y in ys)


def _split(module: nn.Module, **kernels: bool) -> Projection:
    """The Projection of one linear layer; `kernels` are Projection's kernel switches."""
    from peft.tuners.lora import LoraLayer

    if not isinstance(module, LoraLayer):
        proj = Projection(base=module, lora=None, **kernels)
    elif len(module.active_adapters) != 1 or module.use_dora[_adapter(module)] or module.merged:
        raise ValueError("backend.fused_lora: a projection with several, DoRA or merged adapters")
    else:
        proj = Projection(base=module.get_base_layer(), lora=module, **kernels)
    check_base(proj.base)
    return proj


def check_base(base: nn.Module) -> None:
    """Refuse base layers the Function cannot run: 8-bit (bitsandbytes' int8 matmul), or with a bias that
    trains (the Function returns no gradient for it; LoRA's bias="none" leaves biases frozen)."""
    if type(base).__name__ == "Linear8bitLt":
        raise ValueError(f"backend.fused_lora runs nf4, bf16, fp16 or fp32 base layers, not "
                         f"{type(base).__name__}: use backend.fused_lora=false with precision=int8")
    if getattr(base, "bias", None) is not None and base.bias.requires_grad:
        raise ValueError("backend.fused_lora runs base layers whose bias is frozen; this one trains its bias: "
                         "use backend.fused_lora=false with it")


def _qkv(self, hidden_states) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [batch, seq, heads, head_dim] from their projections, or cut from Phi-3's one qkv_proj."""
    shape = (*hidden_states.shape[:-1], -1, self.head_dim)
    out = project(hidden_states, self.lorabench_qkv, self.training, self.lorabench_seeded)
    if len(out) == 1:  # [q | k | v] along the features, as Phi3Attention cuts them
        q_size, kv_size = self.config.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        out = (out[0][..., :q_size], out[0][..., q_size:q_size + kv_size], out[0][..., q_size + kv_size:])
    return tuple(t.view(shape) for t in out)


def _attention_forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                       **kwargs):
    """The attention forward of transformers 5 (Mistral, Llama, Qwen2/3, Mixtral, Qwen3-MoE, Phi-3,
    Gemma-2/3: lorabench.fast.parts.ATTENTION) with its projections through `project`: their biases inside it,
    QK-norm per head before RoPE where the layer has q_norm/k_norm, each layer's sliding window and scaling,
    Gemma-2's soft-capping. RoPE and the eager attention are the architecture module's own (Liger's RoPE
    where its patch put it there), looked up per call as transformers' forward does."""
    arch = sys.modules[type(self).__module__]
    input_shape = hidden_states.shape[:-1]
    q, k, v = _qkv(self, hidden_states)
    if hasattr(self, "q_norm"):  # Qwen3, Gemma-3: RMSNorm over each head's features
        q, k = self.q_norm(q), self.k_norm(k)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    cos, sin = position_embeddings
    q, k = arch.apply_rotary_pos_emb(q, k, cos, sin)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, self.layer_idx)
    attention = arch.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                           arch.eager_attention_forward)
    # A window per layer (Qwen2/3, Gemma: self.sliding_window, None on global layers), else the config's
    # (Mistral, Mixtral, Phi-3); Llama passes none (its config has none).
    window = self.sliding_window if hasattr(self, "sliding_window") else getattr(self.config, "sliding_window", None)
    if self.lorabench_softcap:
        kwargs["softcap"] = self.attn_logit_softcapping
    out, weights = attention(self, q, k, v, attention_mask, dropout=self.attention_dropout if self.training else 0.0,
                             scaling=self.scaling, sliding_window=window, **kwargs)
    out = out.reshape(*input_shape, -1).contiguous()
    (out,) = project(out, self.lorabench_o, self.training, self.lorabench_seeded)
    return out, weights


def patch_attention(layers, seeded_dropout: bool, softcap: bool = False, **kernels: bool) -> int:
    """Route each decoder layer's attention projections through `project`; returns how many layers.
    softcap: pass the layer's attn_logit_softcapping to its attention (Gemma-2's forward does).
    `kernels`: Projection's switches (triton_dequant, absmax_cache, triton_grad)."""
    split = functools.partial(_split, **kernels)
    for layer in layers:
        attn = layer.self_attn
        attn.lorabench_seeded, attn.lorabench_softcap = seeded_dropout, softcap
        names = ("qkv_proj",) if hasattr(attn, "qkv_proj") else ("q_proj", "k_proj", "v_proj")
        attn.lorabench_qkv = tuple(split(getattr(attn, n)) for n in names)
        attn.lorabench_o = (split(attn.o_proj),)
        attn.forward = types.MethodType(_attention_forward, attn)
    return len(layers)


def _mlp_forward(self, x):
    """The gated MLP's forward (Mistral's SwiGLU, Gemma's GeGLU, or Liger's kernels for them) with gate/up
    and down through `project`; Phi-3's one gate_up_proj cut in halves as Phi3MLP cuts it; with
    swiglu_in_gemm on CUDA, SwiGLU and down through _SwiGLUDown."""
    gate_up = project(x, self.lorabench_gate_up, self.training, self.lorabench_seeded)
    gate, up = gate_up[0].chunk(2, dim=-1) if len(gate_up) == 1 else gate_up
    if self.lorabench_swiglu_gemm and gate.is_cuda:
        with torch.autocast(gate.device.type, enabled=False):
            return _SwiGLUDown.apply(gate, up, self.lorabench_down[0])
    (out,) = project(self.lorabench_act(gate, up), self.lorabench_down, self.training, self.lorabench_seeded)
    return out


class _SwiGLUDown(torch.autograd.Function):
    """down(silu(G) U) for a down projection without an adapter (backend.swiglu_in_gemm).

    Forward: Liger's SwiGLU kernel, then the GEMM; G and U are kept (as Liger's Function keeps them).
    Backward: dH = dOut W_down and SwiGLU's backward in one Triton GEMM (lorabench.fast.kernels.grad): its
    epilogue writes dG and dU over G and U, so dH never reaches memory."""

    @staticmethod
    def forward(ctx, gate, up, proj):
        from liger_kernel.ops.swiglu import swiglu_forward

        _, _, h = swiglu_forward(gate, up)
        ctx.save_for_backward(gate, up)
        ctx.proj = proj
        h2 = h.reshape(-1, h.shape[-1])
        return (h2 @ _weight(proj, h.dtype).t()).view(*h.shape[:-1], -1)

    @staticmethod
    def backward(ctx, dout):
        from liger_kernel.ops.swiglu import swiglu_backward

        from lorabench.fast.kernels import grad as grad_kernels

        gate, up = ctx.saved_tensors
        g2, u2 = gate.view(-1, gate.shape[-1]), up.view(-1, up.shape[-1])
        pair = (dout.reshape(-1, dout.shape[-1]), _weight(ctx.proj, dout.dtype))
        if grad_kernels.runs([pair], (g2, u2)):
            grad_kernels.input_grad([pair], swiglu=(g2, u2))
        else:
            swiglu_backward(g2, u2, pair[0] @ pair[1])
        return gate, up, None


# The MLP classes Liger's patches bind onto a model's MLPs (liger_kernel 0.8.5, monkey_patch._patch_swiglu_module
# rebinds forward and _get_name), each down(silu(gate) * up): Mistral's and most families' class, Phi-3's (one
# gate_up_proj) and Qwen3-MoE's, which Qwen3.5's and Qwen3-Next's dense MLPs take too.
LIGER_SWIGLU = ("LigerSwiGLUMLP", "LigerPhi3SwiGLUMLP", "LigerQwen3MoeSwiGLUMLP")


def _activation(mlp: nn.Module):
    """act(gate) * up as the MLP computes it: Liger's SwiGLU or GeGLU kernel where Liger's patch put it in
    the MLP's forward (it rebinds forward and _get_name on the instance), else the model's activation
    (act_fn; Phi-3's activation_fn) and a multiply (Phi-3 multiplies up * act(gate): the same product)."""
    name = mlp._get_name()
    if name in LIGER_SWIGLU:
        from liger_kernel.transformers.swiglu import _swiglu_dispatch

        return _swiglu_dispatch
    if name == "LigerGEGLUMLP":
        from liger_kernel.ops import LigerGELUMulFunction

        return LigerGELUMulFunction.apply
    act = mlp.act_fn if hasattr(mlp, "act_fn") else mlp.activation_fn
    return lambda gate, up: act(gate) * up


def patch_mlp(layers, seeded_dropout: bool, swiglu_in_gemm: bool = False, **kernels: bool) -> int:
    """Route each decoder layer's MLP projections through `project` (backend.fused_mlp): gate and up
    read one input, so dX = dG W_gate + dU W_up is summed by cuBLAS (beta=1) instead of by autograd,
    one [tokens x 4096] add less per layer; with triton_dequant their nf4 weights go through
    lorabench.fast.kernels.nf4. Without adapters on them nothing is kept for the backward but what
    bitsandbytes' matmul keeps (the 4-bit weight). With swiglu_in_gemm, where the MLP runs Liger's
    SwiGLU and down has no adapter, SwiGLU and down go through _SwiGLUDown."""
    split = functools.partial(_split, **kernels)
    for layer in layers:
        mlp = layer.mlp
        mlp.lorabench_seeded, mlp.lorabench_act = seeded_dropout, _activation(mlp)
        names = ("gate_up_proj",) if hasattr(mlp, "gate_up_proj") else ("gate_proj", "up_proj")
        mlp.lorabench_gate_up = tuple(split(getattr(mlp, n)) for n in names)
        mlp.lorabench_down = (split(mlp.down_proj),)
        down = mlp.lorabench_down[0]
        mlp.lorabench_swiglu_gemm = (swiglu_in_gemm and down.lora is None and down.base.bias is None
                                     and mlp._get_name() in LIGER_SWIGLU)
        mlp.forward = types.MethodType(_mlp_forward, mlp)
    return len(layers)


def _linear_forward(self, x, *args, **kwargs):
    """A PEFT LoRA layer's forward through `project`, the projection alone in its group."""
    (out,) = project(x, self.lorabench_proj, self.training, self.lorabench_seeded)
    return out


def patch_linears(layers, seeded_dropout: bool, **kernels: bool) -> int:
    """Every adapted linear layer of the decoder layers through `project`, one projection a group
    (backend.fused_linear): the same arithmetic as PEFT's LoRA layer on any family, without its clone of
    the base output and with dropout's mask drawn again from a seed in the backward. Layers that
    patch_attention or patch_mlp group are not called any more; their LoRA modules are patched alike and
    never run. Returns how many layers were patched (PEFT's wrappers of 3-D expert weights are not)."""
    from peft.tuners.lora import LoraLayer

    split = functools.partial(_split, **kernels)
    n = 0
    for layer in layers:
        for module in layer.modules():
            if isinstance(module, LoraLayer) and isinstance(module.get_base_layer(), nn.Linear):
                module.lorabench_proj, module.lorabench_seeded = (split(module),), seeded_dropout
                module.forward = types.MethodType(_linear_forward, module)
                n += 1
    return n
