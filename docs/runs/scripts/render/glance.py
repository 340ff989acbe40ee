"""README's "Results at a glance": one row per model and seq_len, fast's best against Unsloth's and hf's, from the
same run dirs as docs/results.md's first and third sections."""
import statistics

from . import models, qwen35, reference
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


def behind() -> str:
    """fast's narrowest lead over Unsloth: Qwen3.5-9B, fast's and Unsloth's cells on one machine."""
    fast, unsloth = qwen35.one_machine()
    return (f"Narrowest lead: on Qwen3.5-9B (hybrid linear attention, seq 1024, within 22 GiB, {short_gpu(fast)}) "
            f"fast's {tok(fast):,.0f} tok/s is {tok(fast) / tok(unsloth):.2f}x Unsloth's {tok(unsloth):,.0f}, which "
            "compiles each decoder layer whole ([docs/results.md](docs/results.md#qwen35-9b-against-unsloth)).")


def glance() -> str:
    head = ["model", "seq", "fast tok/s", "x Unsloth's best", "x hf's best", "fast MFU", "GPU"]
    return HEADER + "\n\n" + md_table(head, mistral_rows() + model_rows()) + "\n\n" + behind()
