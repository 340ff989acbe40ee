"""Issue 19, sixth round: what one decoder layer spends besides its base GEMMs, at b48 x 512 rows
(Mistral-7B, LoRA r16 on q/k/v/o, dropout 0), each piece alone, as lorabench.fast.fused runs it and in
other forms: the adapters' thin GEMMs (forward and backward), the attention kernels PyTorch has
(cuDNN, flash, memory-efficient; dense and varlen), and Liger's SwiGLU for scale.
Prints ms, the bytes each piece must move and the bandwidth that makes, and the sum for 32 layers.
  python docs/runs/scripts/2026-11-24_layer_parts.py [--batch 48] [--seq 512]"""
import argparse

import torch

import cuda_timing as timing  # beside this script
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=48)
p.add_argument("--seq", type=int, default=512)
args = p.parse_args()
B, S, H, KV, FF, R, D = args.batch, args.seq, 4096, 1024, 14336, 16, 128
T = B * S
dev, dt = "cuda", torch.bfloat16
torch.manual_seed(0)



def ms(fn, n=20):
    return timing.ms(fn, n, warmup=3)


def rnd(*shape, scale=1.0):
    return torch.randn(*shape, device=dev, dtype=dt) * scale


rows = []


def row(name, fn, nbytes, group):
    t = ms(fn)
    rows.append((group, name, t, nbytes))
    print(f"{group:10s} {name:42s} {t:7.3f} ms {nbytes / t / 1e6:7.0f} GB/s", flush=True)
    return t


e = 2  # bytes per bf16 element
x, xo = rnd(T, H), rnd(T, H)
a_qkv, a_o = rnd(3 * R, H, scale=0.01), rnd(R, H, scale=0.01)
b_q, b_k, b_v, b_o = rnd(H, R, scale=0.01), rnd(KV, R, scale=0.01), rnd(KV, R, scale=0.01), rnd(H, R, scale=0.01)
y_q, y_k, y_v, y_o = rnd(T, H), rnd(T, KV), rnd(T, KV), rnd(T, H)
dy_q, dy_k, dy_v, dy_o = rnd(T, H), rnd(T, KV), rnd(T, KV), rnd(T, H)
xa_all, xa_o = x @ a_qkv.t(), xo @ a_o.t()
xa_q, xa_k, xa_v = xa_all.split(R, dim=1)
g_all, g_o = rnd(T, 3 * R), rnd(T, R)
dx = rnd(T, H)

# as lorabench.fast.fused runs them (merged q/k/v adapters: dropout 0)
row("XA = X [A_q;A_k;A_v]^T", lambda: x @ a_qkv.t(), T * H * e, "lora fwd")
row("Y_q += s XA_q B_q^T (addmm_)", lambda: y_q.addmm_(xa_q, b_q.t(), alpha=2.0), 2 * T * H * e, "lora fwd")
row("Y_k += s XA_k B_k^T (addmm_)", lambda: y_k.addmm_(xa_k, b_k.t(), alpha=2.0), 2 * T * KV * e, "lora fwd")
row("Y_v += (addmm_)", lambda: y_v.addmm_(xa_v, b_v.t(), alpha=2.0), 2 * T * KV * e, "lora fwd")
row("XA_o = X_o A_o^T", lambda: xo @ a_o.t(), T * H * e, "lora fwd")
row("Y_o += (addmm_)", lambda: y_o.addmm_(xa_o, b_o.t(), alpha=2.0), 2 * T * H * e, "lora fwd")
row("G_q = s dY_q B_q", lambda: (dy_q @ b_q).mul_(2.0), T * H * e, "lora bwd")
row("G_k = s dY_k B_k", lambda: (dy_k @ b_k).mul_(2.0), T * KV * e, "lora bwd")
row("G_v", lambda: (dy_v @ b_v).mul_(2.0), T * KV * e, "lora bwd")
row("dB_q = s dY_q^T XA_q", lambda: (dy_q.t() @ xa_q).mul_(2.0), T * H * e, "lora bwd")
row("dB_k = s dY_k^T XA_k", lambda: (dy_k.t() @ xa_k).mul_(2.0), T * KV * e, "lora bwd")
row("dB_v", lambda: (dy_v.t() @ xa_v).mul_(2.0), T * KV * e, "lora bwd")
row("cat G_q,G_k,G_v", lambda: torch.cat([g_all[:, :R], g_all[:, R:2 * R], g_all[:, 2 * R:]], 1), 0, "lora bwd")
row("dA = G^T X", lambda: g_all.t() @ x, T * H * e, "lora bwd")
row("dX += G [A_q;A_k;A_v] (addmm_)", lambda: dx.addmm_(g_all, a_qkv), 2 * T * H * e, "lora bwd")
row("G_o = s dY_o B_o", lambda: (dy_o @ b_o).mul_(2.0), T * H * e, "lora bwd")
row("dB_o = s dY_o^T XA_o", lambda: (dy_o.t() @ xa_o).mul_(2.0), T * H * e, "lora bwd")
row("dA_o = G_o^T X_o", lambda: g_o.t() @ xo, T * H * e, "lora bwd")
row("dX_o += G_o A_o (addmm_)", lambda: dx.addmm_(g_o, a_o), 2 * T * H * e, "lora bwd")
# the same updates by a Triton kernel (lora_add_kernel.py beside this script; in src/lorabench/lora_kernels.py
# when this ran, moved here as lorabench does not use it), for a few tile shapes
try:
    import sys
    from pathlib import Path

    import triton

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import lora_add_kernel as lk

    def tri_add(y, xa, b, bm, bn, warps):
        m, n = y.shape
        lk._lora_add_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm))](
            y, xa, b, m, n, xa.shape[1], y.stride(0), xa.stride(0), b.stride(0), b.stride(1), 2.0, BM=bm, BN=bn,
            BR=max(16, triton.next_power_of_2(xa.shape[1])), num_warps=warps)

    for bm, bn, warps in ((64, 256, 4), (64, 256, 8), (128, 128, 4), (128, 128, 8), (32, 512, 4), (128, 256, 8)):
        row(f"triton Y_q += ({bm}x{bn}, {warps} warps)", lambda: tri_add(y_q, xa_q, b_q, bm, bn, warps),
            2 * T * H * e, "triton")
        row(f"triton dX += G A ({bm}x{bn}, {warps} warps)", lambda: tri_add(dx, g_all, a_qkv.t(), bm, bn, warps),
            2 * T * H * e, "triton")
    y_ref = y_q.clone().addmm_(xa_q, b_q.t(), alpha=2.0)
    y_tri = lk.lora_add_(y_q.clone(), xa_q, b_q, 2.0)
    print(f"triton     lora_add_ vs addmm_: max |diff| {float((y_tri - y_ref).abs().max()):.3g}, "
          f"equal bits {bool((y_tri == y_ref).float().mean() > 0.99)} ({float((y_tri == y_ref).float().mean()):.4f})")
except ImportError as err:
    print("triton", err)
# other forms of the same products
row("alt: dB_q as (XA_q^T dY_q)^T", lambda: (xa_q.t() @ dy_q).t(), T * H * e, "alt")
row("alt: dA as (X^T G)^T", lambda: (x.t() @ g_all).t(), T * H * e, "alt")
row("alt: G_q and dB_q from [dY_q] one pass? (two GEMMs)", lambda: (dy_q @ b_q, dy_q.t() @ xa_q), 2 * T * H * e, "alt")
xk, wk = rnd(T, H + 3 * R), rnd(H, H + 3 * R)
row("alt: Y_q = [X|XA] [W_q|sB_q]^T (K + 48)", lambda: xk @ wk.t(), 2 * T * H * e, "alt")
row("alt: [X|XA] cat", lambda: torch.cat([x, xa_all], 1), 2 * T * H * e, "alt")
row("ref: copy of X (read + write)", lambda: x.clone(), 2 * T * H * e, "ref")
row("ref: base GEMM X W_q^T", lambda: x @ dy_q[:H].t(), 2 * T * H * e, "ref")

# attention: [B, heads, S, 128], causal, 32 query heads over 8 key/value heads
q, k, v = rnd(B, 32, S, D).requires_grad_(), rnd(B, 8, S, D).requires_grad_(), rnd(B, 8, S, D).requires_grad_()
do = rnd(B, 32, S, D)
attn_bytes = (2 * B * 32 * S * D + 2 * B * 8 * S * D) * e
for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                      ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
    try:
        with sdpa_kernel([backend]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(do)
            row(f"sdpa {name} fwd", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                attn_bytes, "attention")
            row(f"sdpa {name} fwd+bwd", lambda: F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True).backward(do), 3 * attn_bytes, "attention")
    except RuntimeError as err:
        print(f"attention  sdpa {name}: {str(err).splitlines()[0][:100]}")
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    try:
        kr, vr = (t.detach().repeat_interleave(4, dim=1).requires_grad_() for t in (k, v))
        row("sdpa cudnn, k/v repeated to 32 heads, fwd+bwd", lambda: F.scaled_dot_product_attention(
            q, kr, vr, is_causal=True).backward(do), 3 * attn_bytes, "attention")
    except RuntimeError as err:
        print(f"attention  cudnn repeated: {str(err).splitlines()[0][:100]}")
qf, kf, vf = (t.detach().transpose(1, 2).reshape(T, t.shape[1], D).requires_grad_() for t in (q, k, v))
cu = torch.arange(0, T + 1, S, device=dev, dtype=torch.int32)
dof = do.transpose(1, 2).reshape(T, 32, D)


def varlen_flash():
    out = torch.ops.aten._flash_attention_forward(qf, kf, vf, cu, cu, S, S, 0.0, True, False)[0]
    out.backward(dof)


def varlen_cudnn():
    out = torch.ops.aten._cudnn_attention_forward(qf, kf, vf, None, cu, cu, S, S, True, 0.0, True)[0]
    out.backward(dof)


for name, fn in (("varlen flash (packed rows)", varlen_flash), ("varlen cudnn (packed rows)", varlen_cudnn)):
    try:
        row(f"{name} fwd+bwd", fn, 3 * attn_bytes, "attention")
    except RuntimeError as err:
        print(f"attention  {name}: {str(err).splitlines()[0][:100]}")
# the same numbers? (cuDNN and flash, dense, against each other)
with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    got = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
print(f"attention  cudnn vs flash: max |diff| {float((got - ref).abs().max()):.4g}")

try:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    g_in, u_in = rnd(T, FF).requires_grad_(), rnd(T, FF).requires_grad_()
    dh = rnd(T, FF)
    row("Liger SwiGLU fwd", lambda: LigerSiLUMulFunction.apply(g_in, u_in), 3 * T * FF * e, "swiglu")
    row("Liger SwiGLU fwd+bwd", lambda: LigerSiLUMulFunction.apply(g_in, u_in).backward(dh), 8 * T * FF * e,
        "swiglu")
except ImportError:
    pass

for group in ("lora fwd", "lora bwd"):
    t = sum(r[2] for r in rows if r[0] == group)
    print(f"{group}: {t:.3f} ms a layer, {32 * t:.1f} ms for 32 layers")
print(torch.cuda.get_device_name(), torch.__version__, "cuDNN", torch.backends.cudnn.version())
