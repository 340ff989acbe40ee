"""Issue 19, sixth round: can SwiGLU ride in a GEMM's epilogue without the GEMM losing to cuBLAS?
At b48 x 512 rows (Mistral-7B's MLP, 4096 -> 14336), each alone, for several Triton tile shapes:
  forward   cuBLAS G = X Wg^T, U = X Wu^T, then Liger's SwiGLU H = silu(G) U; against one Triton
            kernel with two accumulators (G and U tiles from one X tile) whose epilogue writes G, U, H;
  backward  cuBLAS dH = dOut Wd, then Liger's SwiGLU backward (dG, dU over G, U); against one Triton
            GEMM whose epilogue reads G, U and writes dG, dU (dH never reaches memory);
and a plain Triton GEMM of each shape beside cuBLAS's, to see the GEMM's own rate.
  python docs/runs/scripts/2026-11-24_swiglu_gemm.py"""
import itertools

import torch

import cuda_timing as timing  # beside this script
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from lorabench.fast.kernels.grad import _tile  # the same tile order as lorabench's GEMM

M, H, FF = 48 * 512, 4096, 14336
dev, dt = "cuda", torch.bfloat16



def ms(fn, n=10):
    return timing.ms(fn, n, warmup=2)


@triton.jit
def _bwd_kernel(a_desc, b_desc, g_desc, u_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                GROUP: tl.constexpr, EPI: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr):
    """dH = A B (A [M, K], B [K, N]); EPI: dG, dU = SwiGLU's backward into g/u (in place), else store dH to g."""
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BM, BN, GROUP)
    om, on = pid_m * BM, pid_n * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES, warp_specialize=WS):
        acc = tl.dot(a_desc.load([om, k * BK]), b_desc.load([k * BK, on]), acc)
    if EPI:
        dh = acc.to(tl.bfloat16).to(tl.float32)  # dH rounded to bf16 as cuBLAS would write it
        g = g_desc.load([om, on]).to(tl.float32)
        u = u_desc.load([om, on]).to(tl.float32)
        sig = tl.sigmoid(g)
        silu = g * sig
        g_desc.store([om, on], (dh * (silu * (1 - sig) + sig) * u).to(tl.bfloat16))
        u_desc.store([om, on], (dh * silu).to(tl.bfloat16))
    else:
        g_desc.store([om, on], acc.to(tl.bfloat16))


@triton.jit
def _fwd_kernel(x_desc, wg_desc, wu_desc, g_desc, u_desc, h_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr, GROUP: tl.constexpr, DUAL: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr):
    """G = X Wg^T (and with DUAL: U = X Wu^T and H = silu(G) U, from the same X tiles)."""
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BM, BN, GROUP)
    om, on = pid_m * BM, pid_n * BN
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES, warp_specialize=WS):
        x = x_desc.load([om, k * BK])
        acc_g = tl.dot(x, wg_desc.load([on, k * BK]).T, acc_g)
        if DUAL:
            acc_u = tl.dot(x, wu_desc.load([on, k * BK]).T, acc_u)
    g = acc_g.to(tl.bfloat16)
    g_desc.store([om, on], g)
    if DUAL:
        u = acc_u.to(tl.bfloat16)
        u_desc.store([om, on], u)
        gf = g.to(tl.float32)
        h_desc.store([om, on], ((gf * tl.sigmoid(gf)).to(tl.bfloat16) * u).to(tl.bfloat16))  # Liger's rounding


def desc(t, block):
    return TensorDescriptor.from_tensor(t, list(block))


def bwd(dout, wd, g, u, cfg, epi):
    bm, bn, bk, stages, warps, ws = cfg
    grid = (triton.cdiv(M, bm) * triton.cdiv(FF, bn),)
    _bwd_kernel[grid](desc(dout, (bm, bk)), desc(wd, (bk, bn)), desc(g, (bm, bn)), desc(u, (bm, bn)), M, FF, H,
                      BM=bm, BN=bn, BK=bk, GROUP=8, EPI=epi, STAGES=stages, WS=ws, num_warps=warps)


def fwd(x, wg, wu, g, u, h, cfg, dual):
    bm, bn, bk, stages, warps, ws = cfg
    grid = (triton.cdiv(M, bm) * triton.cdiv(FF, bn),)
    _fwd_kernel[grid](desc(x, (bm, bk)), desc(wg, (bn, bk)), desc(wu, (bn, bk)), desc(g, (bm, bn)), desc(u, (bm, bn)),
                      desc(h, (bm, bn)), M, FF, H, BM=bm, BN=bn, BK=bk, GROUP=8, DUAL=dual, STAGES=stages, WS=ws,
                      num_warps=warps)


def main():
    from liger_kernel.ops.swiglu import swiglu_backward, swiglu_forward

    torch.manual_seed(0)
    x, dout = torch.randn(M, H, device=dev, dtype=dt), torch.randn(M, H, device=dev, dtype=dt)
    wg, wu = (torch.randn(FF, H, device=dev, dtype=dt) / 64 for _ in range(2))
    wd = torch.randn(H, FF, device=dev, dtype=dt) / 64
    g0, u0 = x @ wg.t(), x @ wu.t()
    f1 = 2 * M * H * FF
    print(torch.cuda.get_device_name(), "triton", triton.__version__)
    t_g = ms(lambda: x @ wg.t())
    t_fwd = ms(lambda: swiglu_forward(x @ wg.t(), x @ wu.t()))
    print(f"cuBLAS X Wg^T {t_g:.3f} ms ({f1 / t_g / 1e9:.0f} TFLOP/s); G, U, Liger SwiGLU: {t_fwd:.3f} ms")
    t_dh = ms(lambda: dout @ wd)

    def unfused_bwd():
        g, u = g0.clone(), u0.clone()
        swiglu_backward(g, u, dout @ wd)
    t_copy = ms(lambda: (g0.clone(), u0.clone()))
    t_bwd = ms(unfused_bwd) - t_copy
    print(f"cuBLAS dOut Wd {t_dh:.3f} ms ({f1 / t_dh / 1e9:.0f} TFLOP/s); dH, Liger SwiGLU backward: {t_bwd:.3f} ms")
    ref_h = swiglu_forward(g0, u0)[2]
    ref_dg, ref_du = g0.clone(), u0.clone()
    ref_dg, ref_du = swiglu_backward(ref_dg, ref_du, dout @ wd)
    configs = [c for c in itertools.product((128,), (128, 256), (64,), (3, 4), (8,), (False, True))]
    configs += [(128, 128, 64, 4, 4, False), (256, 128, 64, 3, 8, False), (128, 128, 128, 3, 8, False)]
    for cfg in configs:
        out = []
        try:
            g, u, h = (torch.empty(M, FF, device=dev, dtype=dt) for _ in range(3))
            t = ms(lambda: fwd(x, wg, wu, g, u, h, cfg, False))
            out.append(f"plain X Wg^T {t:.3f} ({f1 / t / 1e9:.0f} TF)")
            t = ms(lambda: fwd(x, wg, wu, g, u, h, cfg, True))
            err = float((h - ref_h).abs().max())
            out.append(f"dual+SwiGLU {t:.3f} (vs {t_fwd:.3f}; |dH| {err:.2g})")
        except Exception as e:  # a tile shape this GPU cannot hold: say so and go on
            out.append(f"fwd: {type(e).__name__} {str(e).splitlines()[0][:80]}")
        try:
            g, u = torch.empty(M, FF, device=dev, dtype=dt), torch.empty(M, FF, device=dev, dtype=dt)
            t = ms(lambda: bwd(dout, wd, g, u, cfg, False))
            out.append(f"plain dOut Wd {t:.3f} ({f1 / t / 1e9:.0f} TF)")

            def fused_bwd():
                g.copy_(g0)
                u.copy_(u0)
                bwd(dout, wd, g, u, cfg, True)
            t = ms(fused_bwd) - t_copy  # the two copies ~ the clone pair timed alone
            err = max(float((g - ref_dg).abs().max()), float((u - ref_du).abs().max()))
            out.append(f"bwd+SwiGLU {t:.3f} (vs {t_bwd:.3f}; |d| {err:.2g})")
        except Exception as e:
            out.append(f"bwd: {type(e).__name__} {str(e).splitlines()[0][:80]}")
        print(cfg, "; ".join(out), flush=True)


if __name__ == "__main__":
    main()
