"""Issue 19, fifth round: the step's base GEMMs at b48 x 512 rows (Mistral-7B), each alone, as lorabench
runs them (q, k, v apart; gate, up apart) and merged (q|k|v, gate|up in one GEMM), and with PyTorch's
TunableOp picking the cuBLASLt algorithm per shape. Prints TFLOP/s per shape and one step's GEMM time.
  python docs/runs/scripts/2026-11-24_gemm_shapes.py [--tunable]"""
import sys

import torch

import cuda_timing as timing  # beside this script

M, H, KV, FF = 48 * 512, 4096, 1024, 14336
dev, dt = "cuda", torch.bfloat16
if "--tunable" in sys.argv:
    torch.cuda.tunable.enable(True)
    torch.cuda.tunable.set_max_tuning_duration(100)



def ms(fn, n=20):
    return timing.ms(fn, n, warmup=3)


def fwd(n_out, k_in):
    x, w = torch.randn(M, k_in, device=dev, dtype=dt), torch.randn(n_out, k_in, device=dev, dtype=dt) / 64
    return ms(lambda: x @ w.t()), 2 * M * n_out * k_in


def bwd(n_out, k_in, acc=False):
    g, w = torch.randn(M, n_out, device=dev, dtype=dt), torch.randn(n_out, k_in, device=dev, dtype=dt) / 64
    out = torch.zeros(M, k_in, device=dev, dtype=dt)
    f = (lambda: out.addmm_(g, w)) if acc else (lambda: g @ w)
    return ms(f), 2 * M * n_out * k_in


rows = {
    "fwd q": fwd(H, H), "fwd k (v)": fwd(KV, H), "fwd q|k|v": fwd(H + 2 * KV, H), "fwd o": fwd(H, H),
    "fwd gate (up)": fwd(FF, H), "fwd gate|up": fwd(2 * FF, H), "fwd down": fwd(H, FF),
    "bwd q": bwd(H, H), "bwd k (v) +=": bwd(KV, H, True), "bwd q|k|v": bwd(H + 2 * KV, H), "bwd o": bwd(H, H),
    "bwd gate": bwd(FF, H), "bwd up +=": bwd(FF, H, True), "bwd gate|up": bwd(2 * FF, H), "bwd down": bwd(H, FF),
}
for name, (t, f) in rows.items():
    print(f"{name:14s} {t:7.3f} ms {f / t / 1e9:6.0f} TFLOP/s")
cat_ms = ms(lambda: torch.cat([torch.empty(M, H, device=dev, dtype=dt), torch.empty(M, KV, device=dev, dtype=dt),
                               torch.empty(M, KV, device=dev, dtype=dt)], 1))
apart = sum(rows[k][0] for k in ("fwd q", "fwd o", "fwd down", "bwd q", "bwd o", "bwd down")) + \
    2 * (rows["fwd k (v)"][0] + rows["bwd k (v) +="][0] + rows["fwd gate (up)"][0]) + rows["bwd gate"][0] + rows["bwd up +="][0]
merged = sum(rows[k][0] for k in ("fwd q|k|v", "fwd o", "fwd down", "bwd q|k|v", "bwd o", "bwd down", "fwd gate|up",
                                  "bwd gate|up"))
print(f"one layer's base GEMMs: apart {apart:.2f} ms, merged {merged:.2f} ms (+ a q|k|v gradient cat {cat_ms:.3f} ms)")
