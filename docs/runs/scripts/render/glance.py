"""README's "Results at a glance": one row per model and seq_len, fast's best against Unsloth's and hf's, from the
same run dirs as docs/results.md's first and third sections."""
import statistics

from . import longest, models, qwen35, reference
from .runs import bests, md_table, short_gpu, tok

HEADER = ("Non-pad tokens/s of QLoRA fine-tuning (nf4, LoRA r16 on q/k/v/o) within 22 GiB, an A10's memory, on "
          "fixed-length rows. Each backend runs at the best batch and layout of its own search (`+experiment=tune`); "
          "the three backends of a row ran in one run on the same GPU. Other models: the median over that run's "
          "rounds. Every table, its command and its run dir: [docs/results.md](docs/results.md).")


def mistral_rows() -> list[list]:
    rows = []
    for seq in reference.SEQS:
        b = bests(f"{reference.EACH}/fixed_s{seq}")
        f = b["fast"].cell
        rows.append(["Mistral-7B", seq, f"{tok(f):,.0f}", f"{tok(f) / tok(b['unsloth'].cell):.2f}x",
                     f"{tok(f) / tok(b['hf'].cell):.2f}x", f"{f.metrics['perf/mfu_pct']:.0f}%", short_gpu(f)])
    return rows


def over(rounds: list[dict], backend: str) -> float:
    """fast over a backend's best: the median of the rounds' ratios, each between cells of one round."""
    return statistics.median(tok(r["fast"]) / tok(r[backend]) for r in rounds if backend in r)


def model_rows() -> list[list]:
    rows = []
    for m, name in models.MODELS.items():
        rounds = models.bests_rounds(m)
        f = [r["fast"] for r in rounds]
        rows.append([name, f[0].config["seq_len"], f"{statistics.median(tok(r) for r in f):,.0f}",
                     f"{over(rounds, 'unsloth'):.2f}x", f"{over(rounds, 'hf'):.2f}x",
                     f"{statistics.median(r.metrics['perf/mfu_pct'] for r in f):.0f}%", short_gpu(f[0])])
    return rows


def behind(rows: list[list]) -> str:
    """fast's lead over Unsloth on Qwen3.5-9B (fast's and Unsloth's cells on one machine), and whether it is the
    narrowest of the glance's rows (theirs: column 4, "1.13x")."""
    fast, unsloth = qwen35.one_machine()
    x = tok(fast) / tok(unsloth)
    name, least = min(((f"{r[0]}'s at seq {r[1]}", float(r[3].rstrip("x"))) for r in rows), key=lambda p: p[1])
    return (("Narrowest lead" if x <= least else "Hybrid linear attention") + ": on Qwen3.5-9B (seq 1024, within "
            f"22 GiB, {short_gpu(fast)}) fast's {tok(fast):,.0f} tok/s is {x:.3f}x Unsloth's {tok(unsloth):,.0f}, "
            "which compiles each decoder layer whole ([docs/results.md](docs/results.md#qwen35-9b-against-unsloth))"
            + ("." if x <= least else f"; the narrowest lead above is {name}, {least:.2f}x."))


def long_rows() -> str:
    """fast's longest Llama-3.1-8B row within 22 GiB beside Unsloth's bracket (render/longest.py's cells)."""
    f, lo, hi = longest.ceilings()
    return (f"Long rows: on Llama-3.1-8B (LoRA on every linear layer, within 22 GiB, {short_gpu(f)}) fast trains "
            f"{f.config['seq_len']:,} tokens a row, the model's window, at {tok(f):,.0f} tok/s; Unsloth {lo:,} "
            f"({hi:,} ran out of memory) without its tiled MLP, which fails in its backward "
            "([docs/results.md](docs/results.md#the-longest-row-within-22-gib)).")


def glance() -> str:
    head = ["model", "seq", "fast tok/s", "x Unsloth's best", "x hf's best", "fast MFU", "GPU"]
    rows = mistral_rows() + model_rows()
    return HEADER + "\n\n" + md_table(head, rows) + "\n\n" + behind(rows) + " " + long_rows()
