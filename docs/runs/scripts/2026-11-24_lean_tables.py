"""The fifth round's tables (in docs/runs/2026-11-24_lean/README.md), from the run dirs of docs/runs/2026-11-24_lean:

    python docs/runs/scripts/2026-11-24_lean_tables.py

One table per device call (one lease, one GPU): every cell at seq 512, nothing recomputed on the whole GPU,
LoRA dropout 0, 2 DataLoader workers, fixed-length rows (h100p: ShareGPT packed for both, 22 GiB, dropout
0.05; s1024, s2048: 22 GiB, dropout 0.05). "at p50" = mean non-pad tokens per timed step / the median step
time. "x before" is over fast with the five new options off in the same lease, "x hf" and "x Unsloth" over
the hf and Unsloth cells of the same table.
"""

from pathlib import Path

from lorabench.core.results import load_cells

RUNS = Path(__file__).resolve().parents[1] / "2026-11-24_lean"
OPTIONS = ("lean_step", "fused_mlp", "triton_dequant", "norm_backward_grid", "fused_add_norm")
LEASES = [  # (title, sweep dir, the commit its cells ran)
    ("H200, the four first options one by one (the cell with all off failed at start: its name was too long "
     "for a file name)", "h200a/auto", "b1cd1bc"),
    ("H200, the four first options one by one, Unsloth", "h200b/auto", "3323559"),
    ("H200, with fused_add_norm (the five options), Unsloth", "h200c/auto", "da8ff86"),
    ("H200, absmax_cache", "h200d/auto", "38cf795"),
    ("H100, the five options, Unsloth", "h100/auto", "ce15cee"),
    ("H100, absmax_cache, Unsloth", "h100b/auto", "4167e64"),
    ("H100, ShareGPT packed for both, 22 GiB (A10's budget)", "h100p/sharegpt", "ce15cee"),
    ("H100, seq 1024, fixed-length rows, 22 GiB, LoRA dropout 0.05", "s1024/a10", "2775f75"),
    ("H100, seq 2048, fixed-length rows, 22 GiB, LoRA dropout 0.05 (the lease of s1024)", "s2048/a10", "2775f75"),
]


def options(c) -> str:
    b = c["backend"]
    if b["name"] != "fast":
        return "-"
    on = [o for o in OPTIONS if b.get(o, False)]
    text = "all five" if len(on) == len(OPTIONS) else "none" if not on else \
        "all but " + ", ".join(o for o in OPTIONS if o not in on) if len(on) >= 3 else ", ".join(on)
    return text + (", absmax_cache" if b.get("absmax_cache") else "")


def row(r) -> dict:
    m, c, tr = r.metrics, r.config, r.config["train"]
    recomputed = tr["checkpoint_fraction"] if tr["gradient_checkpointing"] else 0
    return {"backend": c["backend"]["name"], "batch": c["batch"], "options": options(c),
            "layout": f"b{c['batch']}, {recomputed:g} / {tr.get('offload_fraction', 0):g}",
            "profiled": "prof/step_ms" in m, "tok": m["perf/tokens_per_s"],
            "p50": m["count/tokens_nonpad"] / m["count/timed_steps"] / m["perf/step_time_p50_s"],
            "mfu": m["perf/mfu_pct"], "gib": m["mem/peak_reserved_gib"], "mhz": m.get("gpu/sm_clock_mean_mhz"),
            "usd": m.get("cost/usd_per_1m_tokens"), "metrics": m}


def cells(sweep: str) -> list[dict]:
    return [row(r) for r in load_cells(RUNS / sweep) if r.ok]


def table(title: str, sweep: str, commit: str) -> str:
    rows = sorted(cells(sweep), key=lambda r: -r["tok"])
    gpu = next(r for r in load_cells(RUNS / sweep) if r.ok).gpu["device_name"]
    before = next((r for r in rows if r["options"] == "none" and r["backend"] == "fast"), None)
    hf = next((r for r in rows if r["backend"] == "hf"), None)
    unsloth = next((r for r in rows if r["backend"] == "unsloth"), None)
    out = [f"**{title}** (runs/{RUNS.name}/{sweep}, at {commit}; {gpu})", "",
           "| backend | batch, recomputed / offloaded | new options | tok/s non-pad | at p50 | MFU % | SM MHz "
           "| peak resv GiB | $/1M tok | x before (p50) | x hf (p50) | x Unsloth (p50) |", "|---" * 12 + "|"]

    def x(r, ref, digits=2):
        return f"{r['tok'] / ref['tok']:.{digits}f} ({r['p50'] / ref['p50']:.{digits}f})" if ref and r is not ref \
            and r["backend"] == "fast" else "-"

    for r in rows:
        usd = "-" if r["usd"] is None else f"${r['usd']:.3f}"
        out.append(f"| {r['backend']} | {r['layout']}{', profiled' if r['profiled'] else ''} | {r['options']} | "
                   f"{r['tok']:,.0f} | {r['p50']:,.0f} | {r['mfu']:.1f} | {r['mhz']:,.0f} | {r['gib']:.2f} | {usd} | "
                   f"{x(r, before, 3)} | {x(r, hf)} | {x(r, unsloth)} |")
    return "\n".join(out)


def profile_lines() -> str:
    """Where the profiled cells' steps go, ms per step, and what the GPU waited for."""
    cats = ("matmul", "elementwise", "attention", "dequant", "data", "optimizer", "loss", "idle")
    out = ["| profiled cell | step ms | " + " | ".join(cats) + " |", "|---|---|" + "---|" * len(cats)]
    idle = []
    for sweep in ("h200b/auto", "h200d/auto", "h100/auto", "h100b/auto"):
        for r in load_cells(RUNS / sweep):
            m = r.metrics
            if "prof/step_ms" not in m:
                continue
            name = f"{sweep}: fast b{r.config['batch']}, {options(r.config)}"
            out.append(f"| {name} | {m['prof/step_ms']:.0f} | " + " | ".join(f"{m[f'prof/{k}_ms']:.1f}" for k in cats)
                       + " |")
            text = (Path(r.dir) / "profile.txt").read_text().split("\nidle:\n")[1].split("\n\n")[0]
            idle.append(f"- {name}: idle " + "; ".join(" ".join(line.split()) for line in text.splitlines()[:3]))
    return "\n".join(out + [""] + idle)


def mfu_line(sweep: str) -> str:
    """What 60% MFU would take, from the profiled cell of `sweep`."""
    (r,) = [r for r in load_cells(RUNS / sweep) if "prof/step_ms" in r.metrics]
    m, peak = r.metrics, r.gpu["peak_bf16_tflops"]
    tflop = m["perf/model_tflops"] * m["prof/measured_step_ms"] / 1e3
    at60 = tflop / (0.6 * peak) * 1e3
    gemm = m["prof/matmul_ms"] + m["prof/attention_ms"]
    return (f"- {sweep}: {tflop:.0f} TFLOP of model work per step, a {m['prof/measured_step_ms']:.0f} ms step "
            f"({m['perf/mfu_pct']:.1f}% MFU); 60% is a {at60:.0f} ms step. GEMMs and attention take {gemm:.0f} ms, "
            f"everything else {m['prof/step_ms'] - gemm:.0f} ms, of which SwiGLU, norms, adds and RoPE "
            f"{m['prof/elementwise_ms']:.0f}, dequantisation {m['prof/dequant_ms']:.0f}, idle {m['prof/idle_ms']:.0f}.")


def effects() -> str:
    """Each option's effect: the same lease, fast b48 (H200) or b40 (H100), with it and without it."""
    def find(sweep, opts, batch=None):
        return next(r for r in cells(sweep) if r["options"] == opts and r["backend"] == "fast"
                    and not r["profiled"] and (batch is None or r["batch"] == batch))

    def pct(a, b):
        return f"{a['tok'] / b['tok'] - 1:+.1%} ({a['p50'] / b['p50'] - 1:+.1%} at p50)"

    a, b, c, d = "h200a/auto", "h200b/auto", "h200c/auto", "h200d/auto"
    five = "all five"
    lines = [
        f"- lean_step (h200a): {pct(find(a, 'all but fused_add_norm'), find(a, 'all but lean_step, fused_add_norm'))}",
        f"- fused_mlp (h200a): {pct(find(a, 'all but fused_add_norm'), find(a, 'all but fused_mlp, fused_add_norm'))}",
        f"- triton_dequant (h200b): the four first options against all but it: "
        f"{pct(next(r for r in cells(b) if r['profiled']), find(b, 'all but triton_dequant, fused_add_norm'))}",
        f"- norm_backward_grid (h200b): the four first options against all but it: "
        f"{pct(next(r for r in cells(b) if r['profiled']), find(b, 'all but norm_backward_grid, fused_add_norm'))}",
        f"- fused_add_norm (h200c): {pct(find(c, five), find(c, 'all but fused_add_norm'))}",
        f"- absmax_cache (h200d, H200): {pct(find(d, five + ', absmax_cache', 48), find(d, five))}; "
        f"(h100b, H100): {pct(find('h100b/auto', five + ', absmax_cache'), find('h100b/auto', five))}",
        f"- All five against none, same lease: H200 b48 (h200c) {pct(find(c, five), find(c, 'none'))}; "
        f"H100 b40 (h100) {pct(find('h100/auto', five), find('h100/auto', 'none'))}; "
        f"H100 packed 22 GiB (h100p) {pct(find('h100p/sharegpt', five), find('h100p/sharegpt', 'none'))}",
    ]
    # Across leases (labelled: hf's seed cell moves from lease to lease): fast's packed cell over the fastest
    # hf packed cell at p50 that any lease gave (the rounds before and this one).
    hf = [r for d in ("2026-11-24_h100_varlen/packed/sharegpt", "2026-11-24_h100_varlen/packed2/sharegpt",
                      "2026-11-24_h100_varlen/first_try/sharegpt", "2026-11-24_h100_offload/t512/sharegpt",
                      "2026-11-24_flat/packed/sharegpt", "2026-11-24_lean/h100p/sharegpt")
          for r in map(row, filter(lambda c: c.ok, load_cells(RUNS.parent / d))) if r["backend"] == "hf"]
    fast = find("h100p/sharegpt", five)
    lines.append(f"- Across leases (labelled): fast's packed 22 GiB cell at p50 ({fast['p50']:,.0f}) over the fastest hf "
                 f"packed cell at p50 of any lease ({max(r['p50'] for r in hf):,.0f}, {len(hf)} leases): "
                 f"{fast['p50'] / max(r['p50'] for r in hf):.2f}x")
    return "\n".join(lines)


if __name__ == "__main__":
    print("\n\n".join(table(*lease) for lease in LEASES))
    print("\n" + effects() + "\n")
    print(profile_lines() + "\n")
    for sweep in ("h200d/auto", "h100b/auto"):
        print(mfu_line(sweep))
    gemm = (RUNS / "gemm_shapes.txt").read_text().split("\n---tunable")[0].splitlines()[-1]
    print(f"\n- The step's base GEMMs of one layer at b48 x 512 rows, alone (gemm_shapes.txt): {gemm}")
