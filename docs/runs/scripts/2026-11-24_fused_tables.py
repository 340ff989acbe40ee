"""The first four rounds' tables (each round's run dir README.md holds them), from the run dirs of
docs/runs/2026-11-24_h100_fused (first round: fused projections, seeded dropout), docs/runs/2026-11-24_h100_offload
(second: offloading) or docs/runs/2026-11-24_h100_varlen (third: packed rows' attention without a mask, the whole GPU) or
docs/runs/2026-11-24_flat (fourth: the flat optimizer, q/k/v's adapters sharing their thin GEMMs, H100 and H200):

    python docs/runs/scripts/2026-11-24_fused_tables.py [fused|offload|varlen|flat]

Per table: one GPU, one device call (same lease), same rows for every backend. "at p50" = mean non-pad
tokens per timed step / the median step time; ratios are to the hf cell of the same table.
"""

import sys
from pathlib import Path

from lorabench.core.results import load_cells

ROUND = sys.argv[1] if len(sys.argv) > 1 else "fused"
RUNS = Path(__file__).resolve().parents[1] / ("2026-11-24_flat" if ROUND == "flat" else f"2026-11-24_h100_{ROUND}")
OFFLOAD = ROUND in ("offload", "varlen", "flat")  # cells name their offloaded fraction and the host memory it took
VARLEN = ROUND in ("varlen", "flat")  # cells name their attention, LoRA dropout and DataLoader workers
FLAT = ROUND == "flat"  # fast cells without the flat optimizer say so
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
] if not VARLEN else [
    ("seq 512, the whole GPU, fixed-length rows: fast with the flat optimizer and without (H100)", ["whole/auto"]),
    ("seq 512, the whole GPU, LoRA dropout 0: q/k/v's adapters in shared thin GEMMs (now) and apart (the commit "
     "before, c069343), one lease (H100)", ["merged/before", "merged/auto"]),
    ("seq 512, the whole GPU: fast and Unsloth in one lease (H100)", ["unsloth/auto"]),
    ("seq 512, the whole GPU, LoRA dropout 0: fast and Unsloth in one lease (H200)", ["h200/auto", "h200p/auto"]),
    ("seq 512, ShareGPT packed for both, 22 GiB (H100)", ["packed/sharegpt"]),
] if FLAT else [
    ("seq 512, ShareGPT packed for both, LoRA dropout 0.05", ["packed/sharegpt"]),
    ("seq 512, ShareGPT packed for both, another lease", ["packed2/sharegpt"]),
    ("first try, a third lease (the varlen cells failed: torch 2.11's varlen_attn takes no enable_gqa)",
     ["first_try/sharegpt"]),
    ("seq 512, fixed-length rows, hf, fast and Unsloth in one lease", ["t512u/fixed"]),
    ("seq 512, fixed-length rows, the whole GPU: fast and Unsloth at LoRA dropout 0.05 and 0", ["whole/auto"]),
]


def row(r):
    m, c = r.metrics, r.config
    p50 = m["count/tokens_nonpad"] / m["count/timed_steps"] / m["perf/step_time_p50_s"]
    seeded = c["backend"].get("seeded_dropout") and c["backend"]["name"] == "fast"
    tr = c["train"]
    recomputed = tr["checkpoint_fraction"] if tr["gradient_checkpointing"] else 0
    cell = (f"b{c['batch']}, {recomputed:g} / {tr.get('offload_fraction', 0):g}" if OFFLOAD
            else f"b{c['batch']}, {tr['checkpoint_fraction']:g}")
    if VARLEN:
        packed = m.get("data/packed_rows")
        cell += ((", varlen attention" if c["backend"].get("varlen_attention") else ", SDPA + mask") if packed
                 and c["backend"]["name"] == "fast" else "")
        cell += f", dropout {c['lora']['dropout']:g}" if c["lora"]["dropout"] != 0.05 else ""
        cell += f", {c['data']['num_workers']} loader workers" if c["data"]["num_workers"] and not FLAT else ""
        flat = c["backend"].get("flat_optimizer", False)
        cell += ", per-tensor optimizer" if FLAT and c["backend"]["name"] == "fast" and not flat else ""
    return {"host": m.get("mem/host_offload_peak_gib"), "budget": "22 GiB (A10)" if r.choices["gpu"] == "a10" else "whole GPU",
            "backend": c["backend"]["name"] + (" (seeded dropout)" if seeded and c["lora"]["dropout"] and not OFFLOAD else ""),
            "cell": cell, "dropout": c["lora"]["dropout"],
            "tok": m["perf/tokens_per_s"], "p50": p50, "mfu": m["perf/mfu_pct"],
            "gib": m["mem/peak_reserved_gib"], "usd": m.get("cost/usd_per_1m_tokens")}


def layout_of(r):
    tr = r.config["train"]
    if not tr["gradient_checkpointing"]:
        return f"b{r.config['batch']}, nothing recomputed"
    return f"b{r.config['batch']}, {tr['checkpoint_fraction']:g}" + (f" / {tr.get('offload_fraction', 0):g}" if OFFLOAD else "")


def table(title, dirs):
    cells = [r for d in dirs for r in load_cells(RUNS / d)]
    rows = [row(r) for r in cells if r.ok]
    for r, c in zip(rows, [c for c in cells if c.ok]):
        r["cell"] += " (c069343)" if "/before/" in c.dir else ""
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
        # Unsloth's best cell in this budget at the same LoRA dropout (the recipe equal on both sides)
        unsloth = {d: max((r for r in mine if r["backend"] == "unsloth" and r["dropout"] == d), key=lambda r: r["tok"],
                          default=None) for d in {r["dropout"] for r in mine}}
        best = {}
        for r in mine:  # each backend's best cell within this budget, the others below it
            best.setdefault(r["backend"], []).append(r)
        for name in sorted(best, key=lambda n: -max(r["tok"] for r in best[n])):
            for r in sorted(best[name], key=lambda r: -r["tok"]):
                un = unsloth[r["dropout"]]
                x_hf = f"{r['tok'] / hf['tok']:.2f} ({r['p50'] / hf['p50']:.2f})" if hf and budget.startswith("22") else "-"
                x_un = f"{r['tok'] / un['tok']:.2f} ({r['p50'] / un['p50']:.2f})" if un and r["backend"] != "unsloth" else "-"
                # the c069343 cell ran that commit's src/lorabench from another folder: it found no GPU catalog
                usd, mfu = ("-" if r[k] is None else f.format(r[k]) for k, f in (("usd", "${:.3f}"), ("mfu", "{:.1f}")))
                gib = f"{r['gib']:.2f} |" + (f" {r['host']:.2f} |" if r["host"] else " - |") * OFFLOAD
                out.append(f"| {budget} | {r['backend']} | {r['cell']} | {r['tok']:,.0f} | {r['p50']:,.0f} | "
                           f"{mfu} | {gib} {usd} | {x_hf} | {x_un} |")
    failed = [f"{r.config['backend']['name']} {layout_of(r)}: {r.status.value} at "
              f"{r.metrics.get('mem/peak_reserved_gib', 0):.2f} GiB reserved" for r in cells if not r.ok]
    if failed:
        out += ["", "Not measured: " + "; ".join(failed) + "."]
    return "\n".join(out)


def varlen_effects() -> str:
    """The third round's comparisons, each from cells of one lease, and one across leases (labelled)."""
    rows = {d: {(r["backend"], r["cell"]): r for r in map(row, filter(lambda c: c.ok, load_cells(RUNS / d)))}
            for d in ("packed/sharegpt", "packed2/sharegpt", "first_try/sharegpt", "whole/auto")}
    mask, varlen = (rows["packed/sharegpt"][("fast", f"b16, 0.25 / 0.25, {a}")] for a in ("SDPA + mask", "varlen attention"))
    best = [rows[d][("fast", "b24, 0.375 / 0.25, varlen attention")] for d in ("packed/sharegpt", "packed2/sharegpt")]
    hf = [r for d in ("packed/sharegpt", "packed2/sharegpt", "first_try/sharegpt") for (b, _), r in rows[d].items() if b == "hf"]
    hf += [r for r in map(row, filter(lambda c: c.ok, load_cells(RUNS.parent / "2026-11-24_h100_offload/t512/sharegpt")))
           if r["backend"] == "hf"]
    w = rows["whole/auto"]
    w0, w2, d0 = (w[("fast", f"b32, 0 / 0{x}")] for x in ("", ", 2 loader workers", ", dropout 0, 2 loader workers"))
    return "\n".join([
        f"- Same lease, same layout (fast b16, 0.25 / 0.25, packed ShareGPT): varlen attention {varlen['tok'] / mask['tok'] - 1:+.1%} "
        f"tokens/s, {varlen['gib'] - mask['gib']:+.2f} GiB reserved, against SDPA with the mask.",
        f"- Across leases (labelled: hf's seed cell moves from lease to lease): the slower of fast's two best packed "
        f"cells at p50 ({min(r['p50'] for r in best):,.0f}) over the fastest hf packed cell at p50 of any lease "
        f"({max(r['p50'] for r in hf):,.0f}, {len(hf)} leases): {min(r['p50'] for r in best) / max(r['p50'] for r in hf):.2f}x.",
        f"- Whole GPU, same lease: the DataLoader in 2 worker processes {w2['tok'] / w0['tok'] - 1:+.1%} tokens/s; "
        f"LoRA dropout 0 instead of 0.05 {d0['tok'] / w2['tok'] - 1:+.1%}.",
    ])


def flat_effects() -> str:
    """The fourth round's comparisons, each from cells of one lease, and one across leases (labelled)."""
    def cells(d, runs=RUNS):
        return {(r["backend"], r["cell"]): r for r in map(row, filter(lambda c: c.ok, load_cells(runs / d)))}

    whole, packed = cells("whole/auto"), cells("packed/sharegpt")
    per, flat = whole[("fast", "b32, 0 / 0, per-tensor optimizer")], whole[("fast", "b32, 0 / 0")]
    best = "b24, 0.375 / 0.25, varlen attention"
    pper, pflat = packed[("fast", best + ", per-tensor optimizer")], packed[("fast", best)]
    apart, shared = cells("merged/before")[("fast", "b32, 0 / 0, dropout 0")], cells("merged/auto")[("fast", "b32, 0 / 0, dropout 0")]
    hw = load_cells(RUNS / "merged/hardware")[0]
    earlier = RUNS.parent / "2026-11-24_h100_varlen"
    hf = [r for d in ("packed/sharegpt", "packed2/sharegpt", "first_try/sharegpt") for (b, _), r in cells(d, earlier).items()
          if b == "hf"] + [r for (b, _), r in cells("t512/sharegpt", RUNS.parent / "2026-11-24_h100_offload").items()
                           if b == "hf"] + [packed[("hf", "b8, 1 / 0")]]
    gemm = hw.metrics["hw/gemm_t16384_tflops"]
    return "\n".join([
        f"- Same lease, whole GPU (b32, nothing recomputed, dropout 0.05): the flat optimizer {flat['tok'] / per['tok'] - 1:+.1%} "
        f"tokens/s ({flat['p50'] / per['p50'] - 1:+.1%} at p50).",
        f"- Same lease, 22 GiB, packed ShareGPT (fast's best layout): the flat optimizer {pflat['tok'] / pper['tok'] - 1:+.1%} "
        f"tokens/s, {pflat['gib'] - pper['gib']:+.2f} GiB reserved.",
        f"- Same lease, whole GPU, dropout 0: q/k/v's adapters in shared thin GEMMs {shared['tok'] / apart['tok'] - 1:+.1%} "
        f"tokens/s ({shared['p50'] / apart['p50'] - 1:+.1%} at p50) against the commit before.",
        f"- Across leases (labelled: hf's seed cell moves from lease to lease): fast's best packed cell of this round at p50 "
        f"({pflat['p50']:,.0f}) over the fastest hf packed cell at p50 of any lease ({max(r['p50'] for r in hf):,.0f}, "
        f"{len(hf)} leases): {pflat['p50'] / max(r['p50'] for r in hf):.2f}x.",
        f"- The step's GEMM shapes alone (merged/hardware: `bench.py suite=hardware`, 16,384 rows, each shape for 2 s, "
        f"the H100 at its {hw.metrics['gpu/power_limit_w']:.0f} W limit {hw.metrics['gpu/power_capped_frac']:.0%} of the time, "
        f"SM clock {hw.metrics['gpu/sm_clock_mean_mhz']:,.0f} MHz on average): {gemm:.0f} TFLOP/s, "
        f"{gemm / hw.gpu['peak_bf16_tflops']:.1%} of the datasheet's {hw.gpu['peak_bf16_tflops']:.0f}. 60% MFU asks the whole step "
        f"for {0.6 * hw.gpu['peak_bf16_tflops'] / gemm:.1%} of what its GEMMs reach alone.",
    ])


def idle_lines(sweep: Path, top: int = 3) -> str:
    """The largest idle contributors of the profiled cell of `sweep` (from its profile.txt)."""
    (r,) = [r for r in load_cells(sweep) if "prof/step_ms" in r.metrics]
    text = (Path(r.dir) / "profile.txt").read_text().split("\nidle:\n")[1].split("\n\n")[0]
    return "; ".join(" ".join(line.split()) for line in text.splitlines()[:top])


def mfu_budget(sweep: Path) -> str:
    """What 60% MFU leaves for the rest of a step, from the profiled whole-GPU cell of `sweep`."""
    (r,) = [r for r in load_cells(sweep) if "prof/step_ms" in r.metrics]
    m = r.metrics
    peak = r.gpu["peak_bf16_tflops"]
    tflop = m["perf/model_tflops"] * m["prof/measured_step_ms"] / 1e3  # model FLOPs of one step
    gemm = m["prof/matmul_ms"] + m["prof/attention_ms"]
    at60 = tflop / (0.6 * peak) * 1e3
    return (f"{sweep.parent.parent.name}/{sweep.parent.name}/{sweep.name}: {row(r)['backend']} {row(r)['cell']}, "
            f"{m['perf/mfu_pct']:.1f}% MFU: {tflop:.0f} TFLOP of model work per step; GEMMs and attention "
            f"{gemm:.0f} ms of a {m['prof/step_ms']:.0f} ms step, so even with nothing else the MFU would be "
            f"{tflop / gemm * 1e3 / peak:.0%}. 60% MFU is a {at60:.0f} ms step: {at60 - gemm:.0f} ms left for "
            f"everything else, which takes {m['prof/step_ms'] - gemm:.0f} ms now.")


if __name__ == "__main__":
    print("\n\n".join(table(t, d) for t, d in TABLES))
    if OFFLOAD and not VARLEN:
        sys.exit()
    if FLAT:  # 60% MFU, from this round's profiles of fast's best whole-GPU cells
        print("\n" + flat_effects() + "\n")
        for d in ("merged/auto", "h200p/auto"):
            print(f"- {mfu_budget(RUNS / d)} Idle, by what the GPU waited for: {idle_lines(RUNS / d)}.")
    elif VARLEN:  # 60% MFU, from the second round's profile of fast's best whole-GPU cell
        print("\n" + varlen_effects() + "\n\n" + mfu_budget(RUNS.parent / "2026-11-24_h100_offload/profile/auto"))
    # the profiled cells (first round: fast's best on the whole GPU; third: the best packed 22 GiB cell):
    # where a step's time goes, ms per step
    cats = ("matmul", "elementwise", "attention", "dequant", "data", "optimizer", "loss", "idle")
    print("\n| profiled cell | step ms | " + " | ".join(cats) + " |\n|---|---|" + "---|" * len(cats))
    for d in ("merged/auto", "h200p/auto") if FLAT else ("packed2/profile",) if VARLEN else ("t512/auto", "t512d0/auto"):
        for r in load_cells(RUNS / d):
            m = r.metrics
            if "prof/step_ms" in m:
                print(f"| {d}: {row(r)['backend']} {row(r)['cell']} | {m['prof/step_ms']:.0f} | "
                      + " | ".join(f"{m[f'prof/{k}_ms']:.1f}" for k in cats) + " |")
