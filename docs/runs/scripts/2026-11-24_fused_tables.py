"""docs/performance.md's issue-19 tables, from the run dirs of docs/runs/2026-11-24_h100_fused (first
round: fused projections, seeded dropout) or docs/runs/2026-11-24_h100_offload (second: offloading):

    python docs/runs/scripts/2026-11-24_fused_tables.py [fused|offload]

Per table: one GPU, one device call (same lease), same rows for every backend. "at p50" = mean non-pad
tokens per timed step / the median step time; ratios are to the hf cell of the same table.
"""

import sys
from pathlib import Path

from lorabench.results import load_cells

ROUND = sys.argv[1] if len(sys.argv) > 1 else "fused"
RUNS = Path(__file__).resolve().parents[1] / f"2026-11-24_h100_{ROUND}"
OFFLOAD = ROUND == "offload"  # cells name their offloaded fraction and the host memory it took
TABLES = [  # (title, sweep dirs)
    ("seq 512, fixed-length rows, LoRA dropout 0.05 (the seed's recipe)", ["t512/a10", "t512/auto"]),
    ("seq 512, fixed-length rows, LoRA dropout 0 (Unsloth's default)", ["t512d0/a10", "t512d0/auto"]),
    ("seq 512, ShareGPT packed for both, LoRA dropout 0.05", ["sharegpt/sharegpt"]),
    ("seq 1024, fixed-length rows, LoRA dropout 0.05", ["long/s1024"]),
    ("seq 2048, fixed-length rows, LoRA dropout 0.05", ["long/s2048"]),
] if not OFFLOAD else [
    ("seq 512, fixed-length rows, LoRA dropout 0.05 (the seed's recipe)", ["t512/fixed"]),
    ("seq 512, ShareGPT packed for both, LoRA dropout 0.05", ["t512/sharegpt"]),
    ("seq 1024, fixed-length rows, LoRA dropout 0.05", ["long/s1024"]),
    ("seq 2048, fixed-length rows, LoRA dropout 0.05", ["long/s2048"]),
    ("seq 1024, fast with offloading beside Unsloth", ["unsloth/s1024"]),
    ("seq 2048, fast with offloading beside Unsloth", ["unsloth/s2048"]),
    ("probe2: seq 2048, expandable segments on (fast's default now)", ["probe2/s2048", "probe2/no_recompute"]),
    ("probe: seq 2048, before expandable segments and one copy per buffer (commit 30702a7)", ["probe/s2048"]),
]


def row(r):
    m, c = r.metrics, r.config
    p50 = m["count/tokens_nonpad"] / m["count/timed_steps"] / m["perf/step_time_p50_s"]
    seeded = c["backend"].get("seeded_dropout") and c["backend"]["name"] == "fast"
    tr = c["train"]
    recomputed = tr["checkpoint_fraction"] if tr["gradient_checkpointing"] else 0
    cell = (f"b{c['batch']}, {recomputed:g} / {tr.get('offload_fraction', 0):g}" if OFFLOAD
            else f"b{c['batch']}, {tr['checkpoint_fraction']:g}")
    return {"host": m.get("mem/host_offload_peak_gib"), "budget": "22 GiB (A10)" if r.choices["gpu"] == "a10" else "whole GPU",
            "backend": c["backend"]["name"] + (" (seeded dropout)" if seeded and c["lora"]["dropout"] and not OFFLOAD else ""),
            "cell": cell,
            "tok": m["perf/tokens_per_s"], "p50": p50, "mfu": m["perf/mfu_pct"],
            "gib": m["mem/peak_reserved_gib"], "usd": m["cost/usd_per_1m_tokens"]}


def layout_of(r):
    tr = r.config["train"]
    if not tr["gradient_checkpointing"]:
        return f"b{r.config['batch']}, nothing recomputed"
    return f"b{r.config['batch']}, {tr['checkpoint_fraction']:g}" + (f" / {tr.get('offload_fraction', 0):g}" if OFFLOAD else "")


def table(title, dirs):
    cells = [r for d in dirs for r in load_cells(RUNS / d)]
    rows = [row(r) for r in cells if r.ok]
    layout, host = ("batch, recomputed / offloaded fraction", " host GiB |") if OFFLOAD else ("batch, ckpt fraction", "")
    out = [f"**{title}** ({', '.join(f'runs/{RUNS.name}/' + d for d in dirs)}; "
           f"{cells[0].env['gpu']['name'] if cells[0].env.get('gpu') else cells[0].gpu['device_name']})", "",
           f"| budget | backend | {layout} | tok/s non-pad | at p50 | MFU % | peak resv GiB |{host} $/1M tok | x hf (p50) | x Unsloth (p50) |",
           "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if OFFLOAD else "")]
    for budget in ("22 GiB (A10)", "whole GPU"):
        mine = [r for r in rows if r["budget"] == budget]
        if not mine:
            continue
        hf = next((r for r in rows if r["backend"] == "hf"), None)
        un = max((r for r in mine if r["backend"] == "unsloth"), key=lambda r: r["tok"], default=None)
        best = {}
        for r in mine:  # each backend's best cell within this budget, the others below it
            best.setdefault(r["backend"], []).append(r)
        for name in sorted(best, key=lambda n: -max(r["tok"] for r in best[n])):
            for r in sorted(best[name], key=lambda r: -r["tok"]):
                x_hf = f"{r['tok'] / hf['tok']:.2f} ({r['p50'] / hf['p50']:.2f})" if hf and budget.startswith("22") else "-"
                x_un = f"{r['tok'] / un['tok']:.2f} ({r['p50'] / un['p50']:.2f})" if un and r["backend"] != "unsloth" else "-"
                gib = f"{r['gib']:.2f} |" + (f" {r['host']:.2f} |" if r["host"] else " - |") * OFFLOAD
                out.append(f"| {budget} | {r['backend']} | {r['cell']} | {r['tok']:,.0f} | {r['p50']:,.0f} | "
                           f"{r['mfu']:.1f} | {gib} ${r['usd']:.3f} | {x_hf} | {x_un} |")
    failed = [f"{r.config['backend']['name']} {layout_of(r)}: {r.status.value} at "
              f"{r.metrics.get('mem/peak_reserved_gib', 0):.2f} GiB reserved" for r in cells if not r.ok]
    if failed:
        out += ["", "Not measured: " + "; ".join(failed) + "."]
    return "\n".join(out)


if __name__ == "__main__":
    print("\n\n".join(table(t, d) for t, d in TABLES))
    if OFFLOAD:
        sys.exit()
    # the profiled cells (fast's best on the whole GPU): where a step's time goes, ms per step
    cats = ("matmul", "elementwise", "attention", "dequant", "data", "optimizer", "loss", "idle")
    print("\n| profiled cell | step ms | " + " | ".join(cats) + " |\n|---|---|" + "---|" * len(cats))
    for d in ("t512/auto", "t512d0/auto"):
        for r in load_cells(RUNS / d):
            m = r.metrics
            if "prof/step_ms" in m:
                print(f"| {d}: {row(r)['backend']} {row(r)['cell']} | {m['prof/step_ms']:.0f} | "
                      + " | ".join(f"{m[f'prof/{k}_ms']:.1f}" for k in cats) + " |")
