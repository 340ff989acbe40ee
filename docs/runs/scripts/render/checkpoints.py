"""The checkpoints users bring now, on one H100: Qwen3.5-9B within 22 GiB (fast with its linear-attention rule
compiled and without, hf, Unsloth), Gemma-4-31B and gpt-oss-20b (its experts adapted) on the whole GPU, which fast
part moves Qwen3.5's gate gradients."""
import json

from .qwen35 import pytest_summary
from .recipes import family_tests
from .runs import RUNS, bests, cell, command, commit, failed, gpu, link, md_table, ratio, software, tok

RUN = "2026-12-06_h100_checkpoints"  # one list of sweeps on one GPU, in turn (scripts/2026-12-06_one_gpu.sh)


def _gib(r) -> str:
    return f"{r.metrics['mem/peak_reserved_gib']:.1f}"


def _failed(sweep: str) -> str:
    return failed(f"{RUN}/{sweep}")


def _row(label: str, r, hf) -> list:
    return [label, f"{tok(r):,.0f}", _gib(r), f"{r.metrics['perf/mfu_pct']:.1f}",
            ratio(tok(r) / tok(hf)) if hf is not None else "-"]


def qwen35() -> str:
    fast, hf = bests(f"{RUN}/qwen3.5-9b_fast")["fast"], bests(f"{RUN}/qwen3.5-9b_hf")["hf"]
    eager = cell(f"{RUN}/qwen3.5-9b_fast_rule_eager")
    rows = [_row(f"fast, the delta rule compiled (`backend.compile_delta_rule=true`): best {fast.layout}", fast.cell,
                 hf.cell),
            _row("fast without flash-linear-attention (the rule as transformers runs it): b16 ckpt 1, fast's best "
                 "layout in the earlier search", eager, hf.cell),
            _row(f"hf: best {hf.layout}", hf.cell, hf.cell),
            ["Unsloth: refused before its model by lorabench's check (above): " + _failed("qwen3.5-9b_unsloth"),
             "-", "-", "-", "-"]]
    return md_table(["Qwen3.5-9B", "tok/s", "GiB", "MFU %", "over hf"], rows)


def whole_gpu() -> str:
    fast, hf = bests(f"{RUN}/gemma-4-31b_fast")["fast"], bests(f"{RUN}/gemma-4-31b_hf")["hf"]
    rows = [["Gemma-4-31B, LoRA r16 on q/k/v/o", f"{fast.layout}: {tok(fast.cell):,.0f} tok/s, {_gib(fast.cell)} GiB",
             f"{hf.layout}: {tok(hf.cell):,.0f} tok/s, {_gib(hf.cell)} GiB", ratio(tok(fast.cell) / tok(hf.cell)),
             "failed in lorabench's reading of the config Unsloth wraps (above): " + _failed("gemma-4-31b_unsloth")],
            ["gpt-oss-20b, LoRA r16 on q/k/v/o and every expert (`lora.experts=true`)", _failed("gpt-oss-20b_fast"),
             _failed("gpt-oss-20b_hf"), "-", "not run (lorabench runs Unsloth without expert adapters)"]]
    return md_table(["model", "fast's best", "hf's best", "fast over hf", "Unsloth"], rows)


BUDGET = "2026-12-07f_h100_qwen35_r32_gemma4_oss"  # Gemma-4-31B and gpt-oss-20b within 22 GiB, each backend in turn


def within_budget() -> str:
    """Gemma-4-31B and gpt-oss-20b within 22 GiB: fast's, hf's and Unsloth's searches of at most 3 cells."""
    fast = bests(f"{BUDGET}/gemma-4-31b_fast")["fast"]
    m = fast.cell.config["model"]
    embed_gib = m["vocab_size"] * m["hidden_size"] * 4 / 2**30  # the embedding (tied head) in fp32
    why = lambda s: failed(f"{BUDGET}/{s}")  # noqa: E731
    rows = [["Gemma-4-31B, LoRA r16 on q/k/v/o", f"{fast.layout}: {tok(fast.cell):,.0f} tok/s, {_gib(fast.cell)} GiB",
             why("gemma-4-31b_hf"), why("gemma-4-31b_unsloth")],
            ["gpt-oss-20b, LoRA r16 on q/k/v/o and every expert, experts in nf4", why("gpt-oss-20b_nf4_experts_fast"),
             why("gpt-oss-20b_nf4_experts_hf"), "(its experts bf16, no expert adapters) " + why("gpt-oss-20b_unsloth")]]
    return "\n\n".join([
        f"Both within 22 GiB (`gpu=a10`) on another {gpu(fast.cell)}, each backend's search of at most 3 cells in "
        "turn (batches 1, 2, 4; hf and Unsloth with every layer recomputed, fast with half or all), gpt-oss-20b's "
        "experts in nf4 (`precision.experts_nf4`) and adapted (`lora.experts`) in fast and hf.",
        md_table(["model", "fast's best", "hf", "Unsloth"], rows),
        f"On Gemma-4-31B only fast trained within the budget. hf's cells asked for the size of its "
        f"{m['vocab_size']:,} x {m['hidden_size']:,} embedding (tied to the head) in fp32, {embed_gib:.2f} GiB, which "
        "PEFT's QLoRA upcast casts to fp32. Unsloth's cells, Gemma-4's and gpt-oss's, never reached Unsloth: "
        "lorabench built the whole random model in bf16 on the GPU to save it for Unsloth's loader (Gemma-4-31B: "
        f"{fast.cell.model['base_matmul'] * 2 / 2**30:.0f} GiB of matmul weights alone), past the budget; it is now "
        "drawn and saved one weight at a time (tests/run/test_backends.py). gpt-oss-20b's fast and hf cells stopped "
        "before a weight was placed: transformers' loader reserved one block for every weight, counting the experts "
        "drawn later at bf16, above the budget (the loader no longer reserves it; tests/models/test_experts_nf4.py). "
        "The family GPU test of gpt-oss and its experts in nf4 on this machine: "
        + pytest_summary(f"{BUDGET}/oss_tests.txt").split(",")[0] + f" ({link(BUDGET + '/oss_tests.txt')}).",
        "```bash\n" + "\n".join(command(f"{BUDGET}/{s}") for s in (
            "gemma-4-31b_fast", "gemma-4-31b_hf", "gemma-4-31b_unsloth", "gpt-oss-20b_nf4_experts_fast",
            "gpt-oss-20b_nf4_experts_hf", "gpt-oss-20b_unsloth")) + "\n```",
        f"Run dir: {link(BUDGET)} (commit {commit(fast.cell)}); how it ran: {link(BUDGET + '/README.md')}."])


def gate_parts() -> str:
    """Per fast variant of the Qwen3.5 gradient check (scripts/gate_grad_parts.py): how many LoRA gradients leave
    the family test's bound 2 max(hf, moved) + 2^-8, and the worst one's share of it."""
    rows = json.loads((RUNS / RUN / "gate_grad_parts.json").read_text())
    moved, hf = rows.pop("moved"), rows["hf"]
    bound = {n: 2 * max(hf[n], moved[n]) + 2 ** -8 for n in hf}
    out = []
    for name, e in rows.items():
        over = sum(e[n] > bound[n] for n in bound)
        out.append([name, f"{over} of {len(bound)}", f"{max(e[n] / bound[n] for n in bound):.2f}"])
    return md_table(["variant (the delta rule compiled in every fast row)", "gradients beyond the bound",
                     "worst / bound"], out)


def checkpoints() -> str:
    one = bests(f"{RUN}/qwen3.5-9b_hf")["hf"].cell
    sweeps = ["qwen3.5-9b_fast", "qwen3.5-9b_hf", "qwen3.5-9b_fast_rule_eager", "qwen3.5-9b_unsloth",
              "gemma-4-31b_fast", "gemma-4-31b_hf", "gemma-4-31b_unsloth", "gpt-oss-20b_fast", "gpt-oss-20b_hf"]
    return "\n\n".join([
        "## Qwen3.5, Gemma 4 and gpt-oss",
        f"One {gpu(one)}, each backend's search in turn (at most 4 cells at seq 1024; nf4 QLoRA, LoRA r16, "
        "paged_adamw_8bit, synthetic rows). Qwen3.5-9B within 22 GiB (`gpu=a10`), its adapters on q/k/v/o of its 8 "
        "full-attention layers; its 24 Gated DeltaNet layers ran transformers' PyTorch rule (flash-linear-attention "
        "refuses Hopper GPUs under Triton 3.6), which `compile_delta_rule` runs through torch.compile. That part is "
        "off in `fast`: with it (compiled under the cell's autocast, its matmuls in bf16; it now keeps them in "
        "float32), the family GPU test failed on one gate gradient (below). Unsloth was refused by "
        "lorabench's own check, which took the copy of flash-linear-attention that Unsloth carries (and patches for "
        "Hopper) for the package that refuses; that copy is now left to Unsloth.",
        qwen35(),
        "Gemma-4-31B and gpt-oss-20b on the whole GPU (`gpu=auto`, at most 3 cells): gpt-oss's experts stay bf16 "
        "under nf4 (bitsandbytes quantises linear layers, and transformers holds the experts as 3-D tensors). "
        "Unsloth's Gemma-4 cells failed in lorabench's census of the model, on the proxy in which Unsloth hands out "
        "Gemma 4's text config (it has no from_dict); such a config is now read as its model_type's class. "
        "gpt-oss-20b's cells ran out of memory for two reasons found here and fixed after: hf's QLoRA upcast cast "
        "the bf16 experts to fp32 one after the other before they were cast back (every hf cell stopped at the same "
        "allocation, one layer's gate/up experts in fp32), and the memory model left out the merged expert "
        "weights (the experts plus their adapters' product) that PEFT's adapters keep in every layer that is not "
        "recomputed, so both searches began with no layer recomputed.",
        whole_gpu(),
        "The family GPU test (`pytest -m gpu tests/fast/test_fast_arch.py -k 2026_families`, the delta rule "
        f"compiled): {family_tests(RUN)} ({link(RUN + '/gpu_tests.txt')}). The same gradients with each fast part "
        "off in turn (`python docs/runs/scripts/gate_grad_parts.py qwen3_5_text`):",
        gate_parts(),
        "```bash\n" + "\n".join(command(f"{RUN}/{s}") for s in sweeps) + "\n```",
        f"Run dir: {link(RUN)} (commit {commit(one)}; {software(one)}); how it ran: {link(RUN + '/README.md')}.",
        within_budget()])
