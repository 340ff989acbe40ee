"""Other models at seq 1024 within 22 GiB: each backend's best layout in one run per model, and fast over Unsloth's
best in every round the two ran one after the other on one GPU."""
import re
import statistics

from .runs import RUNS, cell, command, commit, gpu, layout_name, link, md_table, short_gpu, spread, tok

BESTS = "2026-11-27_bests"  # per model, fast, Unsloth and hf at their searched bests, 2-3 rounds on one GPU each
MODELS = {"llama": "Llama-3.1-8B", "qwen": "Qwen2.5-7B", "qwen3": "Qwen3-8B", "gemma": "Gemma-2-9B"}
BACKENDS = {"graphs": "fast", "unsloth": "unsloth", "hf": "hf"}  # the cells' names -> the backend they ran
# Every run since fast's decoder layers run as CUDA graphs that has fast and Unsloth's best in rounds: a round is
# <model>_<fast|graphs>_<round> and <model>_unsloth_<round>, one after the other in one GPU's list.
ROUND_RUNS = ("2026-11-27_bests", "2026-11-27_searched", "2026-11-27_each", "2026-11-27_packed",
              "2026-11-27_h100/h200x2", "2026-11-27_h100/h100", "2026-11-27_h100b", "2026-11-27_h100c",
              "2026-11-27_h100d", "2026-11-27_h100e")
ROUND = re.compile(r"^(llama|qwen|qwen3|gemma)_(?:fast|graphs)_((?:[a-z]\d_)?\d)$")


def bests_rounds(m: str) -> list[dict]:
    """[{backend: its cell}] per round of one model in BESTS (hf ran two rounds, fast and Unsloth two or three)."""
    rounds = []
    for k in (1, 2, 3):
        names = {b: f"{BESTS}/{m}_{name}_{k}" for name, b in BACKENDS.items()}
        here = {b: cell(n) for b, n in names.items() if (RUNS / n).is_dir()}
        if "fast" in here:
            rounds.append({b: r for b, r in here.items() if r.ok})
    return rounds


def model_row(m: str) -> list:
    rounds = bests_rounds(m)
    one = rounds[0]
    med = lambda b: statistics.median(tok(r[b]) for r in rounds if b in r)  # noqa: E731
    over = lambda b: spread([tok(r["fast"]) / tok(r[b]) for r in rounds if b in r])  # noqa: E731
    mfu = statistics.median(r["fast"].metrics["perf/mfu_pct"] for r in rounds)
    return [MODELS[m], layout_name(one["fast"]), f"{med('fast'):,.0f}", f"{mfu:.1f}", layout_name(one["unsloth"]),
            f"{med('unsloth'):,.0f}", layout_name(one["hf"]), f"{med('hf'):,.0f}", over("unsloth"), over("hf")]


def per_model() -> str:
    first = bests_rounds("llama")[0]["fast"]
    head = ["model", "fast's best", "tok/s", "MFU %", "Unsloth's best", "tok/s", "hf's best", "tok/s",
            "fast over Unsloth", "fast over hf"]
    cmds = [command(f"{BESTS}/{m}_{name}_1") for m in MODELS for name in BACKENDS]
    return "\n\n".join([
        "## Other models at seq 1024 within 22 GiB",
        "Each model's three backends at the best batch and layout of their earlier searches (`+experiment=tune` per "
        f"model and backend), run again side by side: one model per GPU of a 4 x {gpu(first)} machine, fast, Unsloth "
        "and hf one after the other in one list, then again in the reverse order, fast and Unsloth a third time where "
        "the list had time. Fixed-length rows, nf4, LoRA r16 on q/k/v/o, dropout 0.05, random weights. tok/s is the "
        "median over the rounds; a ratio is per round, between cells of that round, as lowest-highest (median).",
        md_table(head, [model_row(m) for m in MODELS]),
        "The first round's commands (`backend.cuda_graphs=true` is fast's default now; at this run's commit it was "
        "not):",
        "```bash\n" + "\n".join(cmds) + "\n```",
        f"Run dir: {link(BESTS)} (commit {commit(first)}); each cell's own command is its dir's "
        "`multirun.yaml`. The searches that found these layouts: "
        + ", ".join(link(r) for r in ("2026-11-25_models_search", "2026-11-26_four", "2026-11-26_flex")) + "."])


def rounds() -> dict[str, list[tuple[str, object, object]]]:
    """{model: [(run, fast's cell, Unsloth's cell)]} of every round of ROUND_RUNS whose two cells ended ok."""
    out = {}
    for run in ROUND_RUNS:
        for d in sorted((RUNS / run).iterdir()):
            m = ROUND.match(d.name)
            if not m or not (RUNS / run / f"{m[1]}_unsloth_{m[2]}").is_dir():
                continue
            f, u = cell(f"{run}/{d.name}"), cell(f"{run}/{m[1]}_unsloth_{m[2]}")
            if f.ok and u.ok:
                out.setdefault(MODELS[m[1]], []).append((run, f, u))
    return out


def rounds_row(model: str, pairs: list) -> list:
    x = [tok(f) / tok(u) for _, f, u in pairs]
    busy = lambda i: [p[i].metrics["gpu/util_mean_pct"] for p in pairs]  # noqa: E731
    gpus = sorted({short_gpu(f) for _, f, _ in pairs})
    return [model, len(x), ", ".join(gpus), f"{min(x):.2f}x", f"{statistics.median(x):.2f}x", f"{max(x):.2f}x",
            f"{min(busy(1)):.0f}-{max(busy(1)):.0f}", f"{min(busy(2)):.0f}-{max(busy(2)):.0f}"]


def spread_over_rounds() -> str:
    r = rounds()
    head = ["model", "rounds", "GPUs", "lowest", "median", "highest", "fast's GPU busy %", "Unsloth's GPU busy %"]
    runs = sorted({run.split("/")[0] for pairs in r.values() for run, _, _ in pairs})
    return "\n\n".join([
        "## fast over Unsloth's best, round by round",
        "One run's ratio is one draw: the same two cells give another on another machine, or on the same one an "
        "hour later. Every round since fast's decoder layers run as CUDA graphs, on H100s and H200s, within 22 GiB "
        "at seq 1024 on fixed-length rows, each backend at its searched best layout: fast's cell and Unsloth's one "
        "after the other on one GPU, the ratio between the two. The busy columns are the share of each cell's time "
        "its GPU was working (NVML's utilisation): where a cell's host falls behind, its GPU waits and its speed "
        "follows its host.",
        md_table(head, [rounds_row(m, r[m]) for m in MODELS.values() if m in r]),
        "From " + ", ".join(link(run) for run in runs) + " (a round is `<model>_fast_<round>` or `<model>_graphs_"
        "<round>` beside `<model>_unsloth_<round>`; the commits moved between runs: each README says what changed)."])
