"""Qwen3.5-9B within 22 GiB on one H100: fast with flash-linear-attention's kernels for its linear-attention layers
against hf with transformers' PyTorch rule, and the GPU tests of the 2026 families in the same run."""
import re
from pathlib import Path

from lorabench.core.results import CellResult

from .recipes import GRADIENT, gradient
from .runs import RUNS, bests, cell, command, commit, gpu, layout_name, link, md_table, ratio, software, tok
from .searched import searched_table

RUN = "2026-12-07_h100_qwen35"  # one list on one GPU: the GPU tests, then fast's and hf's two cells each
FLA = "2026-12-07b_h100_fla"  # fla against the PyTorch rule on the same GPU model, a later call


def gpu_tests() -> str:
    """The run's GPU tests from pytest's own summary: how many passed of how many, and each failure's test and the
    assertion it stopped at (for a gradient: fast's and hf's error from float64 and the bound)."""
    text = (RUNS / RUN / "gpu_tests.txt").read_text()
    failed, passed = (int(n) for n in re.findall(r"^(\d+) failed, (\d+) passed", text, re.M)[-1])
    names = re.findall(r"^FAILED \S+::(\w+(?:\[\w+\])?)", text, re.M)
    grads = GRADIENT.findall(text)
    failures = []
    for name in names:
        failures.append(f"`{name}`")
        if "[" in name and grads:  # a family's test: the gradient it stopped at
            failures[-1] += f" (the gradient of {gradient(*grads.pop(0))})"
    return f"{passed} of {passed + failed} passed; failed: " + "; ".join(failures)


def pytest_summary(path: str) -> str:
    """pytest's last summary line in a run dir's file ("1 passed, 108 deselected, 2 warnings in 189.57s")."""
    return re.findall(r"^=+ (.*(?:passed|failed).*) =+$", (RUNS / path).read_text(), re.M)[-1]


def fla_exactness() -> str:
    """fla's GPU exactness test as pytest summed it up: passed or failed, on which GPU."""
    summary = pytest_summary(f"{FLA}/fla_test.txt")
    counts, seconds = re.search(r"^(.*?(?:passed|failed))\b.* in ([\d.]+)s", summary).groups()
    ok = counts == "1 passed"
    gpu_name = (RUNS / FLA / "gpu_c1.csv").read_text().splitlines()[1].split(",")[1].strip()
    return ("fla's own exactness test (`test_fla_computes_qwen3_5_s_model_on_gpu`: fast with fla's kernels and hf "
            f"with the PyTorch rule, both in bf16, against hf in float64) {'passed' if ok else 'did not pass'} on an "
            f"{gpu_name} in a later call ({counts} in {float(seconds):.0f} s; {link(FLA + '/fla_test.txt')})")


def qwen35() -> str:
    one = bests(f"{RUN}/qwen3.5-9b_fast")["fast"].cell
    label = "Qwen3.5-9B, LoRA r16 on q/k/v/o of its 8 full-attention layers"
    return "\n\n".join([
        "## Qwen3.5's linear attention through flash-linear-attention",
        f"One {gpu(one)}, within 22 GiB (`gpu=a10`), seq 1024, nf4 QLoRA, synthetic rows; two cells a backend "
        "(batches 8 and 16 for fast, 2 and 4 for hf, the layouts each search put first). fast ran Qwen3.5's 24 Gated "
        "DeltaNet layers through flash-linear-attention 0.6.0 (`backend.fla_on_hopper`: fla refuses Hopper GPUs under "
        "Triton 3.6 for a 64-wide key tile that Qwen3.5's 128-wide key heads do not take); hf ran them through "
        "transformers' PyTorch rule, fla being refused there. In this run fla's test was stopped by its time limit; "
        + fla_exactness() + ". fast without fla is the row \"fast without flash-linear-attention\" of the section "
        "above.",
        searched_table(RUN, ((label, "qwen3.5-9b"),),
                       {"unsloth": "not measured: the list's time limit came before its cells finished"}),
        "```bash\n" + "\n".join(command(f"{RUN}/qwen3.5-9b_{b}") for b in ("fast", "hf")) + "\n```",
        "The GPU tests in the same run, fla set aside (`pytest -m gpu tests/fast/test_fast_arch.py "
        "tests/models/test_experts_nf4.py -k \"2026_families or flex or experts\"`: each 2026 family's tiny model, "
        "fast and hf in bf16 against hf in float64; Gemma-2's flex attention; gpt-oss's experts in nf4): "
        + gpu_tests() + f" ({link(RUN + '/gpu_tests.txt')}). gpt-oss's attention is eager in fast since; the "
        "experts' size was exactly the test's bound, 0.5 + 1/64 bytes a weight, which the test states since.",
        f"Run dir: {link(RUN)} (commit {commit(one)}; {software(one)}); how it ran: {link(RUN + '/README.md')}."])


UNSLOTH = "2026-12-07c_h100_qwen35_unsloth"  # three calls on H100s: Unsloth's search, fast profiled, fast's layer
SHARES = ("matmul", "elementwise", "dequant", "attention", "loss", "idle")


def _row(label: str, r) -> list[str]:
    """A cell's layout, tok/s and peak, and where its profiled steps' time went (lorabench.measure.profile)."""
    m = r.metrics
    prof = " / ".join(f"{m[f'prof/{k}_ms']:,.0f}" for k in SHARES) if "prof/step_ms" in m else "-"
    return [label, layout_name(r), f"{tok(r):,.0f}", f"{m['mem/peak_reserved_gib']:.1f}", prof]


def qwen35_unsloth() -> str:
    """Qwen3.5-9B: Unsloth's searched cells against fast's, each fast row one change from the one above."""
    unsloth = bests(f"{UNSLOTH}/qwen3.5-9b_unsloth")["unsloth"]
    plain, layer = cell(f"{UNSLOTH}/qwen3.5-9b_fast_profiled"), cell(f"{UNSLOTH}/qwen3.5-9b_fast_delta_net")
    compiled = [cell(f"{UNSLOTH}/qwen3.5-9b_fast_compiled/{i}") for i in (0, 1)]
    ok = [c for c in compiled if c.status.value == "ok"]
    cut = " (its search cut short)" if unsloth.cut_short else ""
    rows = [_row("Unsloth's best of its cells" + cut, unsloth.cell),
            _row("fast, flash-linear-attention's rule (`backend.fla_delta_net=false`)", plain),
            _row("fast, the whole Gated DeltaNet layer through fla's kernels (`backend.fla_delta_net`, on)", layer),
            *(_row("fast, the rule's path with each decoder layer through torch.compile (`backend.compile=true`)", c)
              for c in ok)]
    oom = [c for c in compiled if c.status.value == "oom"]
    head = ["Qwen3.5-9B, within 22 GiB, seq 1024", "batch, layout", "tok/s", "peak GiB",
            "ms a step: " + " / ".join(SHARES)]
    return "\n\n".join([
        "## Qwen3.5-9B against Unsloth",
        f"Three calls, each on one {gpu(layer)} (a fresh machine each, the same software), within 22 GiB "
        "(`gpu=a10`), seq 1024, nf4 QLoRA, LoRA r16 on q/k/v/o of its full-attention layers "
        f"({_trainable(unsloth.cell, layer)} trainable parameters in both), synthetic rows. Unsloth ran its own "
        "search (its checkpointing of every layer, batches "
        f"{', '.join(map(str, unsloth.cell.config['search']['batches']))}), cut short after {unsloth.measured} cells: "
        "each of its cells first compiles every decoder layer as one region. fast ran at the layout its search "
        f"found best ({layout_name(layer)}), two steps profiled, without and with "
        "the layer's other steps through fla's kernels (fla-core 0.6.0). The last column splits a profiled step's "
        "device time (lorabench.measure.profile).",
        md_table(head, rows),
        f"fast over Unsloth: {ratio(tok(layer) / tok(unsloth.cell))} (target 1.15x); through fla's layer kernels "
        f"{ratio(tok(layer) / tok(plain))} fast's rule-only path. torch.compile of each decoder layer on top of fast's "
        f"parts ran slower" + (f" and ran out of memory at b{oom[0].config['batch']}" if oom else "") + ". "
        + _fla_layer_test(),
        f"Run dir: {link(UNSLOTH)} (commits {commit(unsloth.cell)}, {commit(plain)}, {commit(layer)}; "
        f"{software(layer)}); how it ran: {link(UNSLOTH + '/README.md')}.",
        _one_machine_section()])


LIGER = "2026-12-07d_h100_qwen35_liger_packed"  # one machine: fast with Liger's patch, and Unsloth's cells beside


def _one_machine_cells() -> list[tuple[str, CellResult]]:
    """The Qwen3.5-9B cells of the calls made back to back on one machine, labelled, Unsloth's first."""
    return ([("Unsloth", cell(f"{LIGER}/qwen3.5-9b_unsloth_b{b}")) for b in (8, 16)]
            + [("fast + Liger, two steps profiled", cell(f"{LIGER}/qwen3.5-9b_fast_liger"))]
            + [("fast + Liger", cell(f"{LIGER}/qwen3.5-9b_fast_liger_b{b}")) for b in (16, 24)])


def one_machine(cells: list[tuple[str, CellResult]] | None = None) -> tuple[CellResult, CellResult]:
    """fast's and Unsloth's fastest of one machine's cells (the latest run's unless given)."""
    cells = cells or [(label, r) for label, r in _refined_cells() if r.ok]
    fastest = lambda who: max((r for label, r in cells if label.startswith(who)), key=tok)  # noqa: E731
    return fastest("fast"), fastest("Unsloth")


def _one_machine_section() -> str:
    cells = _one_machine_cells()
    profiled = cells[2][1]
    fast, unsloth = one_machine(cells)
    head = ["one machine, five calls", "batch, layout", "tok/s", "peak GiB", "ms a step: " + " / ".join(SHARES)]
    return "\n\n".join([
        f"Then, on one {gpu(fast)} in calls made back to back (the same machine, the same software), fast with "
        "Liger's own patch for Qwen3.5 as well (`apply_liger_kernel_to_qwen3_5`: its RMSNorm with the weight as "
        "1 + w in float32, SwiGLU, the fused linear cross-entropy; Liger's RoPE off, a quarter of each head rotating), "
        "beside Unsloth's cells at its search's layout. " + _liger_test(),
        md_table(head, [_row(label, r) for label, r in cells]),
        f"fast over Unsloth on one machine, each at its fastest of these cells: {ratio(tok(fast) / tok(unsloth))} "
        f"(fast {layout_name(fast)}, Unsloth {layout_name(unsloth)}; target 1.15x). Liger's patch took fast from "
        f"{tok(cell(f'{UNSLOTH}/qwen3.5-9b_fast_delta_net')):,.0f} to {tok(profiled):,.0f} tok/s at b16 (the first "
        "run's machine and this one, the same GPU model). Run dir: "
        f"{link(LIGER)} (commits {commit(profiled)}, {commit(fast)}); how it ran: {link(LIGER + '/README.md')}.",
        _fused_section()])


def _liger_test() -> str:
    summary = pytest_summary(f"{LIGER}/q35_tests.txt")
    return (f"fla's exactness test, which runs fast with Liger's kernels too, on this machine: {summary.split(',')[0]} "
            f"({link(LIGER + '/q35_tests.txt')}).")


def _trainable(*cells) -> str:
    counts = {r.model["trainable"] for r in cells}
    assert len(counts) == 1, f"different recipes: {counts} trainable parameters"
    return f"{counts.pop():,}"


def _fla_layer_test() -> str:
    summary = pytest_summary(f"{UNSLOTH}/fla_test.txt")
    return (f"fla's exactness test with fla_delta_net in the fast run (`test_fla_computes_qwen3_5_s_model_on_gpu`) on "
            f"the same call's GPU: {summary.split(',')[0]} ({link(UNSLOTH + '/fla_test.txt')}).")


FUSED = "2026-12-07e_h100_qwen35_fused_r32"  # one machine: fast's MLP and norms fused, in four layouts; Unsloth b16


def _fused_cells() -> list[tuple[str, CellResult]]:
    """The latest machine's Qwen3.5-9B cells, Unsloth's first, fast's by how many layers it recomputes."""
    fast = sorted((cell(p.relative_to(RUNS).as_posix()) for p in (RUNS / FUSED).glob("qwen3.5-9b_fast_*")),
                  key=lambda r: (-r.config["train"]["checkpoint_fraction"], r.config["batch"]))
    return [("Unsloth", cell(f"{FUSED}/qwen3.5-9b_unsloth_b16"))] + [("fast", r) for r in fast]


def _fused_row(label: str, r: CellResult) -> list[str]:
    if r.ok:
        return _row(label, r)
    m = r.metrics
    return [label, layout_name(r), r.status.value, f"{m['mem/peak_reserved_gib']:.1f}", "-"]


def _fused_section() -> str:
    cells = _fused_cells()
    fast, unsloth = one_machine([(label, r) for label, r in cells if r.ok])
    x = tok(fast) / tok(unsloth)
    kept = round(32 * (1 - fast.config["train"]["checkpoint_fraction"]))
    summary = pytest_summary(f"{FUSED}/q35_fused_tests.txt").split(",")[0]
    head = ["one machine, three calls", "batch, layout", "tok/s", "peak GiB", "ms a step: " + " / ".join(SHARES)]
    return "\n\n".join([
        f"Then, on another {gpu(fast)} (three calls back to back), fast with Liger's SwiGLU kept in its MLP "
        "(Qwen3.5's MLP class had run SiLU and the product in PyTorch) and each decoder layer's residual add taken "
        "into the next RMSNorm (`fused_add_norm`), in four layouts: every layer recomputed, and the last 4, 8 and 12 "
        "of the 32 layers kept (`train.checkpoint_fraction`), beside Unsloth b16, its fastest layout on the first "
        f"machine. fla's exactness test, which runs fast as it runs Qwen3.5, on this machine: {summary} "
        f"({link(FUSED + '/q35_fused_tests.txt')}).",
        md_table(head, [_fused_row(label, r) for label, r in cells]),
        f"fast over Unsloth on this machine, each at its fastest: {x:.3f}x (fast {layout_name(fast)}, {kept} layers "
        f"kept; Unsloth {layout_name(unsloth)}; target 1.15x: {'met' if x >= 1.15 else 'not met'}). Run dir: "
        f"{link(FUSED)} (commit {commit(fast)}); how it ran: {link(FUSED + '/README.md')}.",
        _refined_section()])


REFINED = "2026-12-07f_h100_qwen35_r32_gemma4_oss"  # one machine: fast's search of 8 cells, then Unsloth's search


def _refined_cells() -> list[tuple[str, CellResult]]:
    """Unsloth's and fast's searched cells on the latest machine, each search's in the order it ran them."""
    def ran(sweep: str) -> list[CellResult]:
        return sorted((cell(p.parent.relative_to(RUNS).as_posix()) for p in (RUNS / REFINED / sweep).glob(
            "[0-9]*/metrics.json")), key=lambda r: int(Path(r.dir).name))
    return ([("Unsloth", r) for r in ran("qwen3.5-9b_unsloth_search")]
            + [("fast", r) for r in ran("qwen3.5-9b_fast_refined")])


def _refined_section() -> str:
    fast, unsloth = one_machine()
    b = {k: bests(f"{REFINED}/qwen3.5-9b_{s}")[k] for k, s in (("fast", "fast_refined"), ("unsloth", "unsloth_search"))}
    x = tok(fast) / tok(unsloth)
    best_ever = max((tok(r), r) for r in (unsloth, cell(f"{FUSED}/qwen3.5-9b_unsloth_b16")))[1]
    head = ["one machine, four calls", "batch, layout", "tok/s", "peak GiB", "ms a step: " + " / ".join(SHARES)]
    return "\n\n".join([
        f"Then, on a third {gpu(fast)} (calls back to back), each backend searched on the same machine: fast over "
        f"half and all of its layers recomputed with the fractions between left to refine "
        f"(`search.refine_layouts`, {b['fast'].measured} cells, batches "
        f"{', '.join(map(str, fast.config['search']['batches']))}), then Unsloth from b16 up (its checkpointing off "
        f"was skipped before any cell, estimated over twice the budget; {b['unsloth'].measured} cell measured "
        f"before the sweep's deadline: each of its cells first compiles every decoder layer).",
        md_table(head, [_fused_row(label, r) for label, r in _refined_cells()]),
        f"fast over Unsloth on this machine, each at its searched best: {x:.3f}x (fast {layout_name(fast)}, Unsloth "
        f"{layout_name(unsloth)}; target 1.15x: {'met' if x >= 1.15 else 'not met'}). Over Unsloth's fastest cell "
        f"on either of the last two machines ({layout_name(best_ever)}, {tok(best_ever):,.0f} tok/s): "
        f"{tok(fast) / tok(best_ever):.3f}x. Run dir: {link(REFINED)} (commit {commit(fast)}); how it ran: "
        f"{link(REFINED + '/README.md')}."])
