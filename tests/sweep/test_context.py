"""lorabench.sweep.context: the max-context search as a pure function over a GPU whose OOM threshold is known, and
the space +experiment=max_context gives each backend."""

import json

import pytest
from conftest import compose_cfg
from omegaconf import OmegaConf

from lorabench.sweep.context import ContextSpace, max_context
from lorabench.sweep.search import Layout, Measured

LAYOUT = Layout("ckpt 1 offload 0 +inputs to host", (), (1, 1, 0), 0.0)


class LongGpu:
    """peak = fixed + per_token x seq + quadratic x seq^2 (GiB); a cell over the budget runs out of memory; tok/s
    falls with the row (attention's quadratic work)."""

    def __init__(self, budget=22.0, fixed=6.0, per_token=2.0e-4, quadratic=0.0):
        self.budget, self.fixed, self.per_token, self.quadratic = budget, fixed, per_token, quadratic
        self.calls = []  # (seq, status)

    def peak(self, seq):
        return self.fixed + self.per_token * seq + self.quadratic * seq**2

    def longest(self, multiple=1):
        """The true ceiling: the longest multiple of `multiple` tokens that fits."""
        lo, hi = 0, 10**7
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.peak(mid) <= self.budget else (lo, mid)
        return lo // multiple * multiple

    def measure(self, layout, seq):
        status = "oom" if self.peak(seq) > self.budget else "ok"
        self.calls.append((seq, status))
        tok = 3000.0 / (1 + seq / 65536) if status == "ok" else None
        return Measured(status, tok, min(self.peak(seq), self.budget), job=len(self.calls) - 1)


def space(gpu, error=1.0, **kw):
    """The search's view: the memory model `error` times the true per-token part."""
    def estimate(seq):
        return gpu.fixed + error * (gpu.per_token * seq + gpu.quadratic * seq**2)

    return ContextSpace(LAYOUT, kw.pop("min_seq", 1024), kw.pop("max_seq", 131072), gpu.budget, estimate, gpu.fixed,
                        breakdown=lambda seq: {"device": estimate(seq)}, **kw)


@pytest.mark.parametrize("error", [1.0, 0.6, 1.5, 2.0])  # the model right, 40% low, 50% and 100% high
@pytest.mark.parametrize("quadratic", [0.0, 2e-9])  # linear memory (flash attention), or a [seq x seq] term too
def test_the_bisection_finds_the_oom_threshold_within_the_resolution_in_few_cells(error, quadratic):
    """The ceiling is a measured cell that fitted, the shortest OOM measured lies above it within max(1,024 tokens,
    3%), the true threshold between them; at most 7 cells, every one listed in order with its status."""
    gpu = LongGpu(quadratic=quadratic)
    out = max_context(space(gpu, error), gpu.measure)
    c = out.ceiling
    true = gpu.longest()
    assert c.longest_ok <= true < c.shortest_oom, (c, gpu.calls)
    assert c.shortest_oom - c.longest_ok <= max(1024, 0.03 * c.longest_ok) and c.stop.startswith("within the resol")
    assert len(gpu.calls) <= 7, gpu.calls
    assert [(t.seq_len, t.status) for t in out.trials] == gpu.calls and all(s % 256 == 0 for s, _ in gpu.calls)
    assert c.tok_s == pytest.approx(3000.0 / (1 + c.longest_ok / 65536)) and c.job == gpu.calls.index((c.longest_ok, "ok"))
    assert c.memory == {"device": space(gpu, error).estimate(c.longest_ok)}


def test_a_memory_model_that_lacks_a_term_still_brackets_the_threshold_by_bisection():
    """The model linear, the GPU's memory quadratic in seq_len too (a [seq x seq] mask the model was not told of):
    the line through the cells that fit keeps putting the OOM cell within the budget, so the midpoints close it."""
    for quadratic in (2e-9, 8e-9):
        gpu = LongGpu(per_token=1e-4, quadratic=quadratic)
        out = max_context(ContextSpace(LAYOUT, 1024, 131072, 22.0, lambda seq: 6.0 + 1e-4 * seq, 6.0), gpu.measure)
        c = out.ceiling
        assert c.longest_ok <= gpu.longest() < c.shortest_oom and c.stop.startswith("within the resolution")
        assert len(gpu.calls) <= 7, gpu.calls


def test_a_model_that_fits_its_whole_window_and_one_that_fits_nothing_say_so():
    """Ample memory: one cell at the longest asked (the model's window here), which fits; too little: the
    lengths halve down to search.min_seq_len, whose OOM ends the search. Neither is called a bracket."""
    gpu = LongGpu(budget=80.0)
    out = max_context(space(gpu, max_seq=32768, limit_why="the model's window"), gpu.measure)
    assert gpu.calls == [(32768, "ok")] and out.ceiling.longest_ok == 32768 and out.ceiling.shortest_oom is None
    assert out.ceiling.stop == "the longest asked fits (32,768 tokens, the model's window)"
    gpu = LongGpu(budget=5.0)
    out = max_context(space(gpu, error=0.1), gpu.measure)
    assert out.ceiling.longest_ok is None and gpu.calls[-1] == (1024, "oom") and len(gpu.calls) <= 8
    assert out.ceiling.stop == "nothing fits: search.min_seq_len=1,024 ran out of memory"
    # out of memory while its model was built: no shorter row holds less, the first such cell ends the search
    out = max_context(space(LongGpu(), error=0.1), lambda layout, seq: Measured("oom", None, 21.9, job=0, at_load=True))
    assert len(out.trials) == 1 and out.ceiling.longest_ok is None
    assert out.ceiling.stop == "nothing fits: cell 0 ran out of memory while its model was built"


def test_a_failed_or_skipped_cell_ends_the_search_with_its_reason_and_the_cap_holds():
    """Nothing is refused silently: a cell that fails (a kernel's limit at that length) ends the search, its trial
    holding the error and the stop naming it; the cell cap ends it too, saying so."""
    gpu = LongGpu()

    def failing(layout, seq):
        if seq > 40_000:
            gpu.calls.append((seq, "failed"))
            return Measured("failed", job=len(gpu.calls) - 1, error="RuntimeError: CUDA error: illegal memory access")
        return gpu.measure(layout, seq)

    out = max_context(space(gpu, error=0.5), failing)
    assert out.trials[-1].status == "failed" and "illegal memory access" in out.trials[-1].reason
    assert out.ceiling.stop.startswith("cell ") and "failed: RuntimeError: CUDA error" in out.ceiling.stop
    gpu = LongGpu()
    out = max_context(space(gpu, error=2.0, max_cells=2), gpu.measure)
    assert len(gpu.calls) == 2 and out.ceiling.stop == "the cell cap (search.max_cells=2) is spent"


def test_the_same_search_proposes_the_same_cells_so_a_second_run_reads_them_back():
    """Deterministic: the search a sweep runs again into the same dir proposes the same probes in the same order,
    each with the same job number, so the cells measured before are read back (BudgetSearch.launch) and a search
    cut short goes on from where it stopped."""
    gpu = LongGpu()
    first = max_context(space(gpu, 1.3), gpu.measure)
    cut = LongGpu()
    calls = []

    def stopped_after_two(layout, seq):
        m = cut.measure(layout, seq)
        calls.append(seq)
        m.last = "SIGTERM" if len(calls) == 2 else ""
        return m

    part = max_context(space(cut, 1.3), stopped_after_two)
    assert part.cut_short == "the sweep stopped after cell 1 (SIGTERM)" and calls == [s for s, _ in gpu.calls[:2]]
    again = LongGpu()
    rest = max_context(space(again, 1.3), again.measure)
    assert again.calls == gpu.calls and rest.ceiling == first.ceiling


def test_each_backend_s_max_context_layout_and_space():
    """+experiment=max_context: hf and fast every layer recomputed with its input in host memory, fast with its MLP
    in 4,096-token tiles and Liger's own loss chunks, Unsloth its offloaded checkpointing; seq_len within the model's
    window (Mistral-7B-v0.3: 32,768) and search.max_seq_len; the first probe the memory model's longest fit."""
    from lorabench.sweep.context import context_space

    def of(*over):
        return OmegaConf.to_object(compose_cfg(["+experiment=max_context", "gpu=a10", *over]))

    hf, fast, unsloth = (context_space(of(f"backend={b}")) for b in ("hf", "fast", "unsloth"))
    assert hf.layout.overrides == ("train.gradient_checkpointing=true", "train.checkpoint_fraction=1",
                                   "train.offload_fraction=0", "train.offload_checkpoints=true")
    assert fast.layout.overrides == hf.layout.overrides + ("backend.tiled_mlp=4096", "backend.ce_chunk_mem=1")
    assert unsloth.layout.label == "unsloth checkpointing offloaded, tiled MLP, PEFT's LoRA forward"
    # the experiment turns Unsloth's tiled MLP on and its fused LoRA kernels off (they fail under it)
    assert of("backend=unsloth").backend.unsloth_tiled_mlp and not of("backend=unsloth").backend.unsloth_fused_lora
    # and a command line that says otherwise is heard: the layout neither sets them back nor names them
    untiled = context_space(of("backend=unsloth", "backend.unsloth_tiled_mlp=false",
                               "backend.unsloth_fused_lora=true")).layout
    assert untiled.label == "unsloth checkpointing offloaded" and untiled.saves == (1, 1, 0)
    assert not any("unsloth_tiled_mlp" in o for o in unsloth.layout.overrides + untiled.overrides)
    assert (hf.max_seq, hf.budget_gib, hf.min_seq) == (131072, 22.0, 1024) and hf.limit_why == "search.max_seq_len"
    mistral = context_space(of("backend=fast", "model=mistral-7b-v0.3"))
    assert mistral.max_seq == 32768 and mistral.limit_why == "the model's window (max_position_embeddings)"
    # hf holds 2 MiB of fp32 logits a token (Llama-3's 128,256 words): its estimate crosses 22 GiB before 8,192
    # tokens; fast's and Unsloth's far later
    assert hf.estimate(8192) > 22 and fast.estimate(16384) < 22 and unsloth.estimate(16384) < 22
    assert set(fast.breakdown(16384)) >= {"weights", "lora", "kept", "inputs", "working", "logits", "host", "device"}


def context_cell(job, backend, seq, tok, peak=20.5, kernel=None):
    from lorabench.core.results import CellResult, Status

    config = {"backend": {"name": backend}, "batch": 1, "seq_len": seq, "gpu": {"name": "a10"},
              "model": {"name": "llama-3.1-8b"}, "data": {"kind": "synthetic"}, "lora": {"dropout": 0.05},
              "train": {"gradient_checkpointing": True, "checkpoint_fraction": 1.0, "offload_fraction": 0.0,
                        "offload_checkpoints": backend != "unsloth"}}
    metrics = {"perf/tokens_per_s": tok, "count/tokens_nonpad": 3 * seq, "count/timed_steps": 3,
               "perf/step_time_p50_s": seq / tok, "mem/peak_reserved_gib": peak}
    return CellResult(Status.ok, f"cell{job}", job, config=config, metrics=metrics, choices={"backend": backend},
                      gpu={"device_name": "NVIDIA H200", "budget_gib": 22.0},
                      model={"unsloth_varlen_kernel": kernel} if kernel else None)


def context_record(backend, ok_cell, oom, layout, cut=""):
    from lorabench.core.results import Ceiling, SearchRecord, Trial

    seq = ok_cell.config["seq_len"]
    memory = {"weights": 5.6, "lora": 0.6, "kept": 0.0, "inputs": 0.0, "working": 9.1, "logits": 4.0, "mask": 0.0,
              "slack": 0.5, "host": 2.0, "device": 19.8}
    trials = [Trial(layout, 1, "ok", ok_cell.metrics["perf/tokens_per_s"], 20.5, ok_cell.job_num, seq_len=seq),
              Trial(layout, 1, "oom", None, 22.0, ok_cell.job_num + 100, "CUDA out of memory", seq_len=oom)]
    ceiling = Ceiling(layout, seq, oom, 131072, max(1024, int(0.03 * seq)), "within the resolution",
                      ok_cell.metrics["perf/tokens_per_s"], 20.5, ok_cell.job_num, memory, 1.1)
    return SearchRecord(f"backend={backend}", [f"backend={backend}"], backend, 22.0, seq, 10, trials, trials[0],
                        "longest that fits", {}, [], cut, "max_context", ceiling)


def test_the_report_states_each_ceiling_its_tokens_per_s_the_ratios_and_where_the_memory_goes():
    """The answer names the longest context, its backend, layout, the OOM above it and tokens/s there, then each
    other backend's ceiling as a ratio; the tables list every ceiling against hf's with the measured peak beside
    the memory model's split. An Unsloth that ran without its varlen kernel is named so."""
    from lorabench.report.analysis import ceiling_memory_table, ceiling_table, context_answer, headline

    unsloth, fast, hf = (context_cell(0, "unsloth", 78336, 1210.0, kernel="xformers"),
                         context_cell(1, "fast", 65280, 1650.0), context_cell(2, "hf", 5888, 2400.0))
    searches = [context_record("hf", hf, 6400, "ckpt 1 offload 0 +inputs to host"),
                context_record("unsloth", unsloth, 80640, "unsloth checkpointing offloaded"),
                context_record("fast", fast, 67328, "ckpt 1 offload 0 +inputs to host +mlp tile 4096",
                               cut="the sweep stopped after cell 1 (SIGTERM)")]
    text = context_answer([unsloth, fast, hf], searches)
    assert text == ("On NVIDIA H200 (gpu=a10) within 22 GiB, model=llama-3.1-8b, at batch 1: the longest context is "
                    "unsloth's, 78,336 tokens (unsloth checkpointing offloaded; 80,640 ran out of memory), at 1,210 "
                    "non-pad tok/s there; 1.20x fast (65,280 tokens: ckpt 1 offload 0 +inputs to host +mlp tile "
                    "4096; 67,328 ran out of memory; its search cut short; 1,650 tok/s); 13.30x hf (5,888 tokens: "
                    "ckpt 1 offload 0 +inputs to host; 6,400 ran out of memory; 2,400 tok/s).")
    assert headline([unsloth, fast, hf], [], [], searches).markdown() == f"Answer:\n\n{text}"
    rows = {r.split(" | ")[0].strip("| "): r.split(" | ") for r in ceiling_table([unsloth, fast, hf], searches)
            .splitlines()[2:]}
    assert rows["backend=unsloth"][3:7] == ["78,336", "80,640", "1,210", "13.30"] and rows["backend=hf"][6] == "1.00"
    memory = ceiling_memory_table([unsloth, fast, hf], searches)
    assert "| backend=fast | 20.50 | 19.80 | 5.60 | 0.60 | 0.00 | 0.00 | 9.10 | 4.00 | 0.00 | 0.50 | 2.00 |" in memory
    bare = context_cell(0, "unsloth", 78336, 1210.0, kernel="none")
    assert "is Unsloth without its varlen kernel's, 78,336" in context_answer([bare, fast, hf], searches)
    nothing = context_record("hf", hf, 6400, "ckpt 1 offload 0 +inputs to host")
    nothing.ceiling.longest_ok, nothing.ceiling.job, nothing.why = None, None, "nothing fits: search.min_seq_len"
    assert context_answer([fast], [nothing]).endswith("backend=hf: no length fitted: nothing fits: search.min_seq_len.")


@pytest.mark.slow  # two sweeps of several processes (make test-slow; the bisection itself: the tests above)
def test_max_context_end_to_end_on_cpu_and_resumed(tmp_path):
    """`train.py +experiment=max_context` with the tiny model on the CPU, its host memory held to a little above what
    the process holds (train.host_memory_limit_gib: a long row's logits do not fit, a short one's do): every probe
    is a cell dir of the sweep, search.json holds the ceiling (a cell that fitted, an OOM above it), the report
    opens with it. The same command again reads every cell back: the ones that fitted from their result, the OOM
    ones from search.json's run, none run again."""
    import psutil
    from conftest import run_cli

    from lorabench.core.results import load_searches

    d = tmp_path / "sweep"
    limit = psutil.Process().memory_info().rss / 2**30 + 0.6
    args = ["+experiment=max_context", "backend=hf", "model=tiny", "precision=fp32", "optimizer=adamw_torch",
            "gpu=cpu", "train.max_steps=2", "train.untimed_steps=1", "data.max_samples=4", "search.min_seq_len=256",
            "search.max_seq_len=4096", "search.seq_multiple=64", "search.resolution_tokens=256", "search.max_cells=8",
            f"train.host_memory_limit_gib={limit:.2f}", f"hydra.sweep.dir={d}"]
    first = run_cli("train.py", args)
    (rec,) = load_searches(d)
    c = rec.ceiling
    assert rec.target == "max_context" and c.longest_ok and c.shortest_oom and c.longest_ok < c.shortest_oom, first.stderr
    statuses = {t.status for t in rec.trials}
    assert statuses == {"ok", "oom"} and len(rec.trials) <= 8 and rec.best.seq_len == c.longest_ok
    for t in rec.trials:
        cell = json.loads((d / str(t.job) / "metrics.json").read_text())
        assert (cell["config"]["seq_len"], cell["config"]["batch"], cell["status"]) == (t.seq_len, 1, t.status)
        assert cell["config"]["train"]["offload_checkpoints"] is True
    md = (d / "results.md").read_text()
    assert md.startswith("Answer:") and f"the longest context is hf's, {c.longest_ok:,} tokens" in md
    assert "Longest context per backend (batch 1):" in md and "Where the memory goes at each ceiling" in md
    again = run_cli("train.py", args)
    ok, oom = (sum(t.status == s for t in rec.trials) for s in ("ok", "oom"))
    assert again.stderr.count("result (from an earlier run)") == ok
    assert again.stderr.count("out of memory in an earlier run of this search") == oom
    (same,) = load_searches(d)
    assert same.ceiling == c and same.trials == rec.trials

