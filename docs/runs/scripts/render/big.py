"""Llama-3.3-70B nf4: one cell per backend on one H200, and sharded over one, two and four H200s (FSDP)."""
from lorabench.core.results import load_cells

from .runs import RUNS, cell, command, commit, gpu, link, md_table, tok

ONE = "2026-11-25_models_search/llama-3.3-70b"  # hf and fast, one cell each, the whole GPU, not searched
FSDP = {"fast": "2026-11-26_fsdp/llama-3.3-70b_fast", "hf": "2026-11-26_fsdp/llama-3.3-70b"}  # two sweeps
H100 = "2026-11-27_h100b/whole_s1024/0"  # any H100 80GB cell: the memory its driver reports


def one_gpu() -> str:
    cells = load_cells(RUNS / ONE)
    room = cell(H100).metrics["mem/device_total_gib"]
    rows = [[r.config["backend"]["name"], f"{tok(r):,.0f}", f"{r.metrics['perf/mfu_pct']:.1f}",
             f"{r.metrics['mem/peak_reserved_gib']:.1f}", "yes" if r.metrics["mem/peak_reserved_gib"] < room else "no"]
            for r in cells]
    c = cells[0]
    return "\n\n".join([
        f"On one {gpu(c)}, seq {c.config['seq_len']}, batch {c.config['batch']}, every layer recomputed, fixed-length "
        "rows: one cell per backend at the same layout, not searched.",
        md_table(["backend", "tok/s", "MFU %", "peak GiB", f"fits an H100 80GB ({room:.1f} GiB)"], rows),
        f"```bash\n{command(ONE)}\n```",
        f"Run dir: {link(ONE)} (commit {commit(c)}); its `projection.md` projects both cells onto other GPUs."])


def sharded_rows() -> list[list]:
    rows = []
    for backend, sweep in FSDP.items():
        cells = [r for r in load_cells(RUNS / sweep) if r.ok and r.config["backend"]["name"] == backend]
        one = next(r for r in cells if r.config["train"]["nproc"] == 1)
        for r in sorted(cells, key=lambda r: r.config["train"]["nproc"]):
            n = r.config["train"]["nproc"]
            rows.append([backend, n, f"{tok(r):,.0f}", f"{tok(r) / n:,.0f}", f"{100 * tok(r) / (n * tok(one)):.0f}%",
                         f"{r.metrics['mem/peak_reserved_gib']:.1f}", f"{r.metrics['perf/mfu_pct']:.1f}"])
    return rows


def sharded() -> str:
    c = next(r for r in load_cells(RUNS / FSDP["fast"]) if r.ok)
    return "\n\n".join([
        f"On one {c.env['gpu_name']}, then sharded over two and four of one machine (NVLink; "
        f"`train.parallel=fsdp`), seq {c.config['seq_len']}, batch {c.config['batch']} per GPU, every layer "
        "recomputed, fused AdamW. fast runs without the parts that cannot run sharded (`fused_lora`, `fused_mlp`, "
        "`flat_optimizer`). Efficiency is tok/s over N times the one-GPU cell's; peak GiB is the largest rank's. The "
        "two backends come from two sweeps on the same kind of machine (fast's cells of the first failed before a "
        "fix), not one run.",
        md_table(["backend", "GPUs", "tok/s", "per GPU", "efficiency", "peak GiB", "MFU %"], sharded_rows()),
        "```bash\n" + "\n".join(command(s) for s in FSDP.values()) + "\n```",
        "Run dirs: " + ", ".join(f"{link(s)} (commit {commit(next(r for r in load_cells(RUNS / s) if r.ok))})"
                                 for s in FSDP.values()) + "."])


def big() -> str:
    return "\n\n".join(["## Llama-3.3-70B on one GPU and on four", one_gpu(), sharded()])
