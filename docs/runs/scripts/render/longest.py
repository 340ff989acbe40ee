"""The longest row each backend trains at batch 1 within 22 GiB (Llama-3.1-8B, nf4, LoRA r16 on every linear
layer): fast's max-context search, Unsloth's with its tiled MLP (its backward fails) and single cells without it."""
from lorabench.core.results import load_searches

from .runs import RUNS, asked, cell, command, commit, failed, gpu, link, md_table, software, tok

LONG = "2026-12-07g_h100_longest_row_r32"  # fast's search, then Unsloth's, then Unsloth's cells by hand, one GPU
UNTILED = (49152, 65536, 72192, 76032)  # Unsloth's cells without its tiled MLP (llama-3.1-8b_unsloth_untiled_s<n>)
# +experiment=max_context turned Unsloth's fused LoRA kernels off after this run (they fail under its tiled MLP):
# Unsloth's commands keep them on, as they ran
FUSED_ON = " backend.unsloth_fused_lora=true"
PUBLISHED = 78_475  # Unsloth's published longest Llama-3.1-8B QLoRA row in a 24 GB card (its Llama 3.3 write-up)


def ceilings():
    """(fast's cell at its ceiling, Unsloth's longest row that trained, its shortest that ran out of memory)."""
    fast = load_searches(RUNS / LONG / "llama-3.1-8b_max_context_fast")[0].ceiling
    cells = _untiled()
    return (cell(f"{LONG}/llama-3.1-8b_max_context_fast/{fast.job}"),
            max(n for n, r in cells.items() if r.status == "ok"), min(n for n, r in cells.items() if r.status == "oom"))


def _untiled():
    """{seq_len: Unsloth's cell without its tiled MLP}."""
    return {n: cell(f"{LONG}/llama-3.1-8b_unsloth_untiled_s{n}") for n in UNTILED}


def longest() -> str:
    fast = load_searches(RUNS / LONG / "llama-3.1-8b_max_context_fast")[0].ceiling
    (f, lo, hi), cells = ceilings(), _untiled()
    rows = [["fast", fast.layout, f"{fast.longest_ok:,}", "-" if fast.shortest_oom is None else
             f"{fast.shortest_oom:,}", f"{tok(f):,.0f}", f"{f.metrics['mem/peak_reserved_gib']:.1f}",
             f"{f.metrics['perf/mfu_pct']:.1f}", fast.stop]]
    fits, oom = sorted(n for n in cells if n <= lo), sorted(n for n in cells if n >= hi)
    u = cells[lo]
    rows.append(["unsloth", "its checkpointing offloaded, its tiled MLP off", f"{lo:,}", f"{hi:,}",
                 f"{tok(u):,.0f}", f"{u.metrics['mem/peak_reserved_gib']:.1f}", f"{u.metrics['perf/mfu_pct']:.1f}",
                 f"single cells: {', '.join(f'{n:,}' for n in fits)} trained; "
                 + "; ".join(f"{n:,} out of memory (asked {asked(cells[n].error)} more)" for n in oom)])
    m = fast.memory
    parts = [("weights", "weights"), ("lora", "LoRA, its gradients and optimizer"), ("working", "one layer in its "
             "backward (its MLP in tiles of 4,096 tokens)"), ("logits", "the loss's logits (in chunks)"),
             ("slack", "allocator slack")]
    where = "; ".join(f"{label} {m[k]:.2f}" for k, label in parts) + f"; offloaded to host memory {m['host']:.1f}"
    x = fast.longest_ok / hi
    why = failed(f"{LONG}/llama-3.1-8b_max_context_unsloth").split(". ")[0]  # its first cell's error, first sentence
    return "\n\n".join([
        "## The longest row within 22 GiB",
        f"Llama-3.1-8B (nf4 QLoRA, LoRA r16 on every linear layer, paged_adamw_8bit, synthetic rows at batch 1, "
        f"2 timed steps a cell) within 22 GiB of one {gpu(f)}. fast: `+experiment=max_context`'s search from "
        "49,152 tokens up to the model's window, in its layout that saves the most memory (every layer recomputed "
        "with its input in host memory, its MLP in tiles, its loss in chunks). Unsloth: the same search with its "
        "offloaded checkpointing and its tiled MLP failed in its first backward, in Unsloth's tiled MLP "
        f"(`unsloth_zoo/tiled_mlp.py`): \"{why}\". Its fused LoRA MLP, which it runs at this LoRA "
        "dropout too, writes the input's gradient into its saved input, and in the tiled MLP's backward that input "
        "is a view of the row made with gradients off: the same error on a CPU from Unsloth's own two functions "
        f"({link(LONG + '/unsloth_tiled_mlp')}), at LoRA dropout 0.05 and 0 alike. Without its tiled MLP, single "
        "cells of the same workload bracket its longest row.",
        md_table(["backend", "layout", "longest that trained", "shortest out of memory", "tok/s there", "peak GiB",
                  "MFU %", "how it ended"], rows),
        f"fast's longest row over Unsloth's shortest that ran out of memory: at least {x:.2f}x (target 1.25x: "
        f"{'met' if x >= 1.25 else 'not met'}), against Unsloth without its tiled MLP, the part that failed (not "
        "against Unsloth's tiled MLP with its fused LoRA kernels off, which was not measured); and "
        f"{fast.longest_ok / PUBLISHED:.2f}x the {PUBLISHED:,} tokens Unsloth publishes for this model in 24 GB. "
        f"fast reached the model's window (131,072 tokens: Llama-3.1's max_position_embeddings), so its own "
        "ceiling lies above. Where fast's memory goes at 131,072 tokens, by the memory model (GiB, on the GPU "
        f"{m['device']:.2f} against {f.metrics['mem/peak_reserved_gib']:.2f} measured): {where}.",
        "```bash\n" + command(f"{LONG}/llama-3.1-8b_max_context_fast") + "\n"
        + command(f"{LONG}/llama-3.1-8b_max_context_unsloth") + FUSED_ON + "\n"
        + "\n".join(_cell_command(n) + FUSED_ON for n in UNTILED) + "\n```",
        f"Run dir: {link(LONG)} (commit {commit(f)}; {software(u)}); how it ran: {link(LONG + '/README.md')}."])


def _cell_command(n: int) -> str:
    """The command of one of Unsloth's single cells, from Hydra's record of its overrides (hydra.mode=RUN: one cell,
    not the experiment's search)."""
    import yaml

    task = yaml.safe_load((RUNS / LONG / f"llama-3.1-8b_unsloth_untiled_s{n}/.hydra/overrides.yaml").read_text())
    return "python train.py hydra.mode=RUN " + " ".join(task)
