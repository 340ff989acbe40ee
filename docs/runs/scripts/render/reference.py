"""Mistral-7B, the reference recipe: each backend's best of one search, within 22 GiB and on the whole GPU."""
from .runs import bests, command, commit, gpu, link, md_table, ratio, software, tok

EACH = "2026-11-27_each"  # one +experiment=tune sweep per seq_len, one seq_len per GPU of a 4 x H200 machine
SEQS = (512, 1024, 2048)
WHOLE = ("2026-11-27_packed/whole_s1024", "2026-11-27_h100b/whole_s1024")  # gpu=auto: fast and Unsloth searched


def cut(b) -> str:
    """A search that stopped before it was done: its best is the fastest cell so far, and the page says so."""
    return f" ({b.backend}'s search cut short: {b.cut_short})" if b.cut_short else ""


def fixed_rows() -> list[list]:
    rows = []
    for seq in SEQS:
        b = bests(f"{EACH}/fixed_s{seq}")
        f, u, h = b["fast"], b["unsloth"], b["hf"]
        rows.append([seq, f.layout, f"{tok(f.cell):,.0f}", f"{f.cell.metrics['perf/mfu_pct']:.1f}",
                     f"{f.cell.metrics['mem/peak_reserved_gib']:.1f}", u.layout, f"{tok(u.cell):,.0f}", h.layout,
                     f"{tok(h.cell):,.0f}", ratio(tok(f.cell) / tok(u.cell)) + cut(u),
                     ratio(tok(f.cell) / tok(h.cell)) + cut(h)])
    return rows


def reference() -> str:
    one = bests(f"{EACH}/fixed_s512")["fast"].cell
    head = ["seq", "fast's best", "tok/s", "MFU %", "peak GiB", "Unsloth's best", "tok/s", "hf's best", "tok/s",
            "fast over Unsloth", "fast over hf"]
    return "\n\n".join([
        "## Mistral-7B within 22 GiB: fast, Unsloth and hf, each at its best",
        "Mistral-7B-v0.3, nf4 QLoRA, LoRA r16 on q/k/v/o with dropout 0.05, paged_adamw_8bit, fixed-length rows of "
        f"`seq` tokens, within 22 GiB (`gpu=a10`) of one {gpu(one)}. Per seq_len one sweep searched each backend's "
        "batch and layout (how many decoder layers are recomputed, and offloaded, in the backward), at most 10 "
        "measured cells each, the three backends one after the other on the same GPU. A layout reads `b8 ckpt 0 "
        "offload 0`: batch 8, no layer recomputed, none offloaded (`ckpt 1`: every layer recomputed, the seed "
        "recipe's way).",
        md_table(head, fixed_rows()),
        "The commands, one per seq_len (each a sweep of its own; the three ran at once, one per GPU):",
        "```bash\n" + "\n".join(command(f"{EACH}/fixed_s{s}") for s in SEQS) + "\n```",
        f"Run dirs: {', '.join(link(f'{EACH}/fixed_s{s}') for s in SEQS)} (commit {commit(one)}; "
        f"{software(one)}). Each sweep's own report, its `results.md`, lists every cell the searches tried and why "
        "each stopped. How the run was made: " + link(f"{EACH}/README.md") + "."])


def whole_rows() -> list[list]:
    rows = []
    for sweep in WHOLE:
        b = bests(sweep)
        f, u = b["fast"], b["unsloth"]
        fm, um = f.cell.metrics, u.cell.metrics
        rows.append([gpu(f.cell), f.cell.config["seq_len"], f.layout, f"{tok(f.cell):,.0f}",
                     f"{fm['perf/mfu_pct']:.1f}", f"{fm['mem/peak_reserved_gib']:.1f}", u.layout,
                     f"{tok(u.cell):,.0f}", f"{um['mem/peak_reserved_gib']:.1f}",
                     ratio(tok(f.cell) / tok(u.cell)) + cut(f) + cut(u), link(sweep)])
    return rows


def whole() -> str:
    head = ["GPU", "seq", "fast's best", "tok/s", "MFU %", "peak GiB", "Unsloth's best", "tok/s", "peak GiB",
            "fast over Unsloth", "run dir"]
    return "\n\n".join([
        "## Mistral-7B on the whole GPU",
        "The same recipe with the GPU's whole memory (`gpu=auto`), fast's and Unsloth's searches in one sweep on one "
        "GPU; hf was not searched on the whole GPU.",
        md_table(head, whole_rows()),
        "```bash\n" + "\n".join(command(s) for s in WHOLE) + "\n```",
        "Commits: " + ", ".join(f"{commit(bests(s)['fast'].cell)} ({s.split('/')[0]})" for s in WHOLE) + "."])
