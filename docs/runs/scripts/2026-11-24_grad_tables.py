"""The sixth round's tables (in docs/runs/2026-11-24_grad/README.md), from the run dirs of docs/runs/2026-11-24_grad:

    python docs/runs/scripts/2026-11-24_grad_tables.py

The fifth round's table code (2026-11-24_lean_tables.py) over this round's leases: one table per device
call, seq 512, the whole GPU, nothing recomputed, LoRA dropout 0, fixed-length rows (h100e/a10: seq 1024
within 22 GiB, dropout 0.05). "new options" are this round's knobs; "x before" is over fast with both off
in the same lease, "x Unsloth" over the Unsloth cell of the same table.
"""
import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("lean_tables", HERE / "2026-11-24_lean_tables.py")
lean = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lean)
lean.RUNS = HERE.parent / "2026-11-24_grad"


def options(c) -> str:
    b = c["backend"]
    if b["name"] != "fast":
        return "-"
    on = [k for k in ("triton_input_grad", "swiglu_in_gemm") if b.get(k, False)]
    return " + ".join(on) if on else "none"


lean.options = options
LEASES = [
    ("H200: this round's two knobs, each alone and both", "h200e/auto", "79be06f"),
    ("H200: triton_input_grad on the attention's groups only (fast's default), profiled; Unsloth", "h200f/auto",
     "8d1f7b2"),
    ("H100: triton_input_grad on the attention's groups; Unsloth", "h100e/auto", "8d1f7b2"),
    ("H100: seq 1024 within 22 GiB (the fifth round's s1024 layout), LoRA dropout 0.05", "h100e/a10", "8d1f7b2"),
]

if __name__ == "__main__":
    print("\n\n".join(lean.table(*lease) for lease in LEASES))
    print()
    (r,) = [r for r in lean.load_cells(lean.RUNS / "h200f/auto") if "prof/step_ms" in r.metrics]
    # h200f ran before lorabench.measure.profile counted lorabench.fast.kernels.grad' GEMM as matmul: moved here from
    # elementwise, its per-step time read off the cell's profile.txt
    m = dict(r.metrics)
    text = (Path(r.dir) / "profile.txt").read_text()
    gemm_ms = float(next(line.split()[0] for line in text.splitlines() if "_sum_mm_kernel <-" in line))
    m["prof/matmul_ms"] += gemm_ms
    m["prof/elementwise_ms"] -= gemm_ms
    print(f"(_sum_mm_kernel, {gemm_ms:.1f} ms a step, counted as matmul)")
    cats = ("matmul", "elementwise", "attention", "dequant", "data", "optimizer", "loss", "idle")
    print("| profiled cell | step ms | " + " | ".join(cats) + " |\n|---|---|" + "---|" * len(cats))
    print(f"| h200f/auto: fast b48 | {m['prof/step_ms']:.0f} | " + " | ".join(f"{m[f'prof/{k}_ms']:.1f}" for k in cats)
          + " |")
    tflop = m["perf/model_tflops"] * m["prof/measured_step_ms"] / 1e3
    gemm = m["prof/matmul_ms"] + m["prof/attention_ms"]
    print(f"- h200f/auto: {tflop:.0f} TFLOP of model work per step, a {m['prof/measured_step_ms']:.0f} ms step "
          f"({m['perf/mfu_pct']:.1f}% MFU); 60% is a {tflop / (0.6 * r.gpu['peak_bf16_tflops']) * 1e3:.0f} ms step. "
          f"GEMMs and attention take {gemm:.0f} ms, everything else {m['prof/step_ms'] - gemm:.0f} ms, of which "
          f"SwiGLU, norms, adds and RoPE {m['prof/elementwise_ms']:.0f}, dequantisation {m['prof/dequant_ms']:.0f}, "
          f"idle {m['prof/idle_ms']:.0f}.")
    print("\n" + (lean.RUNS / "grad_shapes.txt").read_text())
