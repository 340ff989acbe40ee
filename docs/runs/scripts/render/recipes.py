"""The recipes users run and the checkpoints they bring now: LoRA on every linear layer of Mistral-7B and
Qwen3.5-9B (hybrid linear attention) within 22 GiB, each backend's best of a small search, on one H100; and the GPU
tests of the 2026 families (fast and hf in bf16 against hf in float64)."""
import re

from .runs import RUNS, bests, cell, command, commit, gpu, layout_name, link, md_table, ratio, software, tok

RECIPES = "2026-12-06_h100_recipes"  # one +experiment=tune sweep per backend and recipe, one GPU, in turn
FAMILY_TEST = "2026-12-06_h100_time_to_loss"  # the latest run of the 2026 families' GPU test (its gpu_tests.txt)
ROWS = (("Mistral-7B, LoRA r16 on every linear layer", "mistral-7b_all_linear"),
        ("Qwen3.5-9B, LoRA r16 on q/k/v/o", "qwen3.5-9b"))
BACKENDS = ("fast", "unsloth", "hf")


def recipe_rows() -> list[list]:
    rows = []
    for what, prefix in ROWS:
        b = {k: bests(f"{RECIPES}/{prefix}_{k}").get(k) for k in BACKENDS if (RUNS / RECIPES / f"{prefix}_{k}").is_dir()}
        assert not any(x.cut_short for x in b.values() if x), f"{prefix}: a search cut short"
        f = b["fast"]
        cells = []
        for k in BACKENDS:
            x = b.get(k)
            cells += [x.layout, f"{tok(x.cell):,.0f}", f"{x.cell.metrics['mem/peak_reserved_gib']:.1f}"] if x else \
                ["not measured", "-", "-"]
        over = [ratio(tok(f.cell) / tok(b[k].cell)) if b.get(k) else "-" for k in ("unsloth", "hf")]
        rows.append([what, *cells, f"{f.cell.metrics['perf/mfu_pct']:.1f}", *over])
    return rows


# a family test's failed assertion: (what, fast's error, hf's error[, the exact answer's movement under one rounding])
GRADIENT = re.compile(r"^E\s+AssertionError: \('([^']+)', ([\d.e-]+), ([\d.e-]+)(?:, ([\d.e-]+))?\)", re.M)


def family_tests(run: str = FAMILY_TEST) -> str:
    """The 2026 families' GPU test (`run`'s), from pytest's own summary: which failed, and the assertion each failed
    on."""
    text = (RUNS / run / "gpu_tests.txt").read_text()
    summary = re.findall(r"^(\d+ failed, )?(\d+) passed", text, re.M)[-1]
    failed = re.findall(r"^FAILED \S+\[(\w+)\]", text, re.M)
    why = GRADIENT.findall(text)
    line = f"{summary[1]} of {int(summary[1]) + len(failed)} families passed"
    for family, assertion in zip(failed, why):
        line += f"; {family} failed on one gradient, {gradient(*assertion)}"
    return line


def gradient(what: str, err_fast: str, err_hf: str, moved: str) -> str:
    """One GRADIENT assertion in words: the gradient, fast's and hf's error from float64 and the test's bound."""
    worst = max(float(err_hf), float(moved or 0))
    return (f"{what.split('layers.')[-1]}: fast {float(err_fast):.1%} from float64, hf {float(err_hf):.1%}, the bound "
            f"2 x {'max(hf, the movement) ' if moved else 'hf '}+ 2^-8 = {2 * worst + 2 ** -8:.1%}")


def recipes() -> str:
    one = bests(f"{RECIPES}/mistral-7b_all_linear_fast")["fast"].cell
    head = ["recipe", "fast's best", "tok/s", "GiB", "Unsloth's best", "tok/s", "GiB", "hf's best", "tok/s", "GiB",
            "fast MFU %", "fast over Unsloth", "fast over hf"]
    sweeps = [f"{RECIPES}/{p}_{k}" for _, p in ROWS for k in BACKENDS if (RUNS / RECIPES / f"{p}_{k}").is_dir()]
    return "\n\n".join([
        "## Every linear layer, and Qwen3.5's hybrid attention",
        "nf4 QLoRA, LoRA r16 (alpha 32), paged_adamw_8bit, fixed-length rows of 1,024 tokens, within 22 GiB "
        f"(`gpu=a10`) of one {gpu(one)}; each backend searched over at most 4 cells (batches 2, 4, 8, 16 and the "
        "layouts above), the backends one after the other on the same GPU. Mistral-7B's adapters are on q/k/v/o and "
        "the MLP's gate/up/down (QLoRA's recipe, dropout 0.05); Qwen3.5-9B's on q/k/v/o of its 8 full-attention "
        "layers, synthetic rows. Its 24 Gated DeltaNet layers ran transformers' PyTorch path in both backends: "
        "flash-linear-attention 0.6.0 refuses Hopper GPUs under Triton 3.6 (torch 2.11's), and lorabench says so "
        "before it builds the model. Unsloth on Qwen3.5 was not measured. Small searches: read the ratios as "
        "measured here, not as each backend's ceiling.",
        md_table(head, recipe_rows()),
        "```bash\n" + "\n".join(command(s) for s in sweeps) + "\n```",
        "The GPU test of the families added for 2026 (`pytest -m gpu tests/fast/test_fast_arch.py -k 2026_families`: "
        "each family's tiny model, fast and hf in bf16 against hf in float64, logits, loss and every LoRA gradient): "
        + family_tests() + f" ({link(FAMILY_TEST + '/gpu_tests.txt')}; the movement: how far the float64 answer moves "
        "when every weight moves by one bf16 rounding).",
        f"Run dir: {link(RECIPES)} (commit {commit(one)}; {software(one)}); how it ran: "
        + link(f"{RECIPES}/README.md") + ".",
        wide_r32()])


WIDE = "2026-12-07e_h100_qwen35_fused_r32"  # r32 on every linear layer at seq 4096: fast's and Unsloth's searches
WIDER = "2026-12-07f_h100_qwen35_r32_gemma4_oss"  # another machine: fast over the fractions between, then hf
PAIR = "2026-12-07g_h100_longest_row_r32"  # a third: each backend's best layout of the two searches, one cell each


def wide_r32() -> str:
    """LoRA r32 on every linear layer of Mistral-7B at rows of 4,096 tokens: fast's and Unsloth's searches of 3
    cells on one machine, fast's of 4 over more layouts and hf's of 3 on another, then each backend's best layout of
    those searches, one cell each, on a third."""
    runs = [("fast", WIDE, "fast"), ("unsloth", WIDE, "unsloth"), ("fast", WIDER, "fast_wide"), ("hf", WIDER, "hf")]
    b = [(k, run, bests(f"{run}/mistral-7b_all_linear_r32_4k_{s}")[k]) for k, run, s in runs]
    pair = [("fast", cell(f"{PAIR}/mistral-7b_all_linear_r32_4k_fast_b2")),
            ("unsloth", cell(f"{PAIR}/mistral-7b_all_linear_r32_4k_unsloth_b4"))]
    machine = {WIDE: "first", WIDER: "second"}
    rows = [[k, machine[run], x.layout, f"{tok(x.cell):,.0f}", f"{x.cell.metrics['mem/peak_reserved_gib']:.1f}",
             f"{x.cell.metrics['perf/mfu_pct']:.1f}", str(x.measured)] for k, run, x in b]
    rows += [[k, "third", layout_name(r), f"{tok(r):,.0f}", f"{r.metrics['mem/peak_reserved_gib']:.1f}",
              f"{r.metrics['perf/mfu_pct']:.1f}", "1"] for k, r in pair]
    (f1, u), (f2, hf), (f3, u3) = (b[0][2].cell, b[1][2].cell), (b[2][2].cell, b[3][2].cell), (pair[0][1], pair[1][1])
    x1, x2, x3 = tok(f1) / tok(u), tok(f2) / tok(hf), tok(f3) / tok(u3)
    met = lambda x, target: f"target {target}x: {'met' if x >= target else 'not met'}"  # noqa: E731
    return "\n\n".join([
        f"LoRA r32 (alpha 64) on every linear layer of Mistral-7B at rows of 4,096 tokens, within 22 GiB of an "
        f"{gpu(f1)}, on three machines of that model: on the first, fast's and then Unsloth's searches of 3 cells "
        "(batches 1, 2, 4); on the second, fast's search of 4 cells over batches 2 to 4 with 5/8 to all of its "
        "layers recomputed, then hf's of 3 (batches 1, 2, 4); on the third, the best layout each backend's search "
        "found (fast's of the second machine, Unsloth's of the first), one cell each, Unsloth's first.",
        md_table(["backend", "machine", "best", "tok/s", "GiB", "MFU %", "cells measured"], rows),
        f"fast over Unsloth, each at its search's best, on the third machine: {x3:.3f}x ({met(x3, 1.2)}); on the "
        f"first, where fast's search had not reached its best layout yet: {x1:.3f}x. fast over hf on the second: "
        f"{ratio(x2)} ({met(x2, 2.2)}). Small searches (3-4 cells a backend), not either backend's ceiling.",
        "```bash\n" + "\n".join([command(f"{run}/mistral-7b_all_linear_r32_4k_{s}") for _, run, s in runs]
                                 + [command(f"{PAIR}/mistral-7b_all_linear_r32_4k_{s}") for s in ("unsloth_b4", "fast_b2")])
        + "\n```",
        f"Run dirs: {link(WIDE)} (commit {commit(f1)}; {software(f1)}; how it ran: {link(WIDE + '/README.md')}), "
        f"{link(WIDER)} (commit {commit(f2)}; how it ran: {link(WIDER + '/README.md')}) and {link(PAIR)} (commit "
        f"{commit(f3)}; how it ran: {link(PAIR + '/README.md')})."])
