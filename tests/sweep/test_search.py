"""lorabench.sweep.search: the search as a pure function over a synthetic GPU (a known memory line per layout,
a throughput that saturates with batch and falls with recompute), and once end to end on the CPU."""

import json
import re

import pytest
from conftest import breadth, compose_cfg, run_cli
from omegaconf import OmegaConf

from lorabench.core.results import load_searches
from lorabench.sweep.search import Layout, Measured, Space, search

BATCHES = [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64]
FRACTIONS = [(r, o) for r in (0, 0.25, 0.5, 1) for o in (0, 0.25) if r + o <= 1]


def layouts(est_per_sample):
    out = [Layout(f"ckpt {r:g} offload {o:g}", (), (r, o), est_per_sample(r, o)) for r, o in FRACTIONS]
    return sorted(out, key=lambda L: (sum(L.saves), L.saves[0]))


class Gpu:
    """A GPU with a known OOM boundary: peak = fixed + per_sample(layout) x batch; tok/s = peak rate x
    b / (b + knee) (saturating in batch) / (1 + recomputed / 3 + offloaded / 20)."""

    def __init__(self, budget=22.0, fixed=6.0, per_sample=lambda r, o: 1.6 * (1 - r - o) + 0.12 * r + 0.1, knee=8.0):
        self.budget, self.fixed, self.per_sample, self.knee = budget, fixed, per_sample, knee
        self.calls = []  # (layout, batch, status) in order

    def peak(self, L, b):
        return self.fixed + self.per_sample(*L.saves) * b

    def tok(self, L, b):
        r, o = L.saves
        return 20_000 * b / (b + self.knee) / (1 + r / 3 + o / 20)

    def measure(self, L, b):
        status = "oom" if self.peak(L, b) > self.budget else "ok"
        self.calls.append((L, b, status))
        peak = min(self.peak(L, b), self.budget)
        return Measured(status, self.tok(L, b) if status == "ok" else None, peak, job=len(self.calls) - 1)

    def true_best(self, Ls):
        return max(((L, b) for L in Ls for b in BATCHES if self.peak(L, b) <= self.budget),
                   key=lambda lb: self.tok(*lb))


def test_a_device_size_read_before_the_first_cell_starts_the_search_where_the_estimate_fits():
    """gpu=auto: without the device's size the first cell is the largest batch (an OOM on an 80 GB card); with
    it read up front (NVML, Space.budget_read) the first cell is one the estimate fits, and the figure the
    first cell reports (what torch sees, a little less than NVML's) then replaces the one read."""
    gpu = Gpu(budget=79.2)
    Ls = layouts(gpu.per_sample)

    def measure(L, b):
        return Measured(**{**vars(gpu.measure(L, b)), "device_gib": 79.2})

    blind = search(Space(Ls, BATCHES, None, fixed_gib=5.0, max_cells=12), measure)
    assert gpu.calls[0][1:] == (BATCHES[-1], "oom") and blind.budget_gib == 79.2
    gpu.calls.clear()
    read = search(Space(Ls, BATCHES, 80.0, fixed_gib=5.0, max_cells=12, budget_read=True), measure)
    assert gpu.calls[0][2] == "ok" and gpu.calls[0][1] < BATCHES[-1] and read.budget_gib == 79.2
    assert (read.best.layout, read.best.batch) == (blind.best.layout, blind.best.batch)


def test_visible_gpu_gib_reads_the_first_visible_gpu_through_nvml(monkeypatch):
    """The first GPU CUDA_VISIBLE_DEVICES names, by index or UUID (GPU 0 without it), in GiB; None where NVML
    has no such GPU or is missing."""
    import sys
    import types

    from lorabench.core import devices

    class NVMLError(Exception):
        pass

    sizes = {1: 80 * 2**30, "GPU-abc": 141 * 2**30, 0: 24 * 2**30}

    def handle(key):
        if key not in sizes:
            raise NVMLError(key)
        return key

    nvml = types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                                 nvmlDeviceGetHandleByIndex=handle, nvmlDeviceGetHandleByUUID=handle,
                                 nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=sizes[h]))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert devices.visible_gpu_gib() == 24
    for visible, gib in (("1,0", 80), ("GPU-abc", 141), ("3", None), ("", None)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert devices.visible_gpu_gib() == gib, visible
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: the import fails
    assert devices.visible_gpu_gib() is None


def check_invariants(gpu, out, max_cells):
    """At most max_cells measured; no measured cell was implied OOM by an earlier one; every measured
    cell is listed with its status; every skipped one says why."""
    assert len(gpu.calls) <= max_cells
    for i, (L, b, _) in enumerate(gpu.calls):
        for K, c, status in gpu.calls[:i]:
            implied = status == "oom" and c <= b and L.uses_no_less_than(K)
            assert not implied, f"b{b} {L.label} implied OOM by b{c} {K.label}"
    measured = [(t.layout, t.batch, t.status) for t in out.trials if t.job is not None]
    assert measured == [(L.label, b, s) for L, b, s in gpu.calls]
    assert all(t.reason for t in out.trials if t.job is None)


@pytest.mark.parametrize("estimate_error", [1.0, 0.7, 1.4])  # the memory estimate right, 30% low, 40% high
def test_search_finds_the_true_best_within_the_cell_cap(estimate_error):
    gpu = Gpu()
    Ls = layouts(lambda r, o: estimate_error * gpu.per_sample(r, o))
    out = search(Space(Ls, BATCHES, gpu.budget, fixed_gib=5.0, max_cells=12), gpu.measure)
    check_invariants(gpu, out, 12)
    L, b = gpu.true_best(Ls)
    assert (out.best.layout, out.best.batch) == (L.label, b), (out.best, L.label, b, gpu.calls)
    assert out.best.tok_s == pytest.approx(gpu.tok(L, b))
    assert "fastest of" in out.why and f"{out.best.tok_s:,.0f} tok/s" in out.why


def test_cells_to_spare_go_to_layouts_halfway_between_the_grid_s_around_the_fastest():
    """Memory per kept layer is what decides between recomputing and a larger batch, and checkpoint_fractions is a
    coarse grid: a throughput saturating early (knee 2) with 2 GiB a sample a kept layer's worth puts the true best at
    2 of 32 layers recomputed, off the grid of 0, 1/4, 1/2, all. With the layouts halfway (in layers) between the
    fastest cell's and its neighbour, the search ends at least 3% faster than on the grid alone, within the cap and
    measuring nothing an OOM implied; at 4 layers, where each quarter is one layer, there is no halfway to add."""
    gpu = Gpu(fixed=7.7, knee=2.0, per_sample=lambda r, o: 2.0 * (1 - r) + 0.5)

    def make(r, o):
        return Layout(f"ckpt {r:g} offload {o:g}", (), (r, o), gpu.per_sample(r, o))

    def grid():
        return [make(r, 0) for r in (0, 0.25, 0.5, 1)]

    coarse = search(Space(grid(), BATCHES, gpu.budget, fixed_gib=7.7, max_cells=12), gpu.measure)
    gpu.calls = []
    out = search(Space(grid(), BATCHES, gpu.budget, fixed_gib=7.7, max_cells=12, make=make, refine=2, layers=32),
                 gpu.measure)
    check_invariants(gpu, out, 12)
    assert out.best.layout not in {L.label for L in grid()} and out.best.tok_s > 1.03 * coarse.best.tok_s
    r = float(out.best.layout.split()[1])  # "ckpt 0.125 offload 0"
    assert 0 < r < 0.25 and out.best.tok_s == pytest.approx(gpu.tok(make(r, 0), out.best.batch))
    gpu.calls = []
    four = search(Space(grid(), BATCHES, gpu.budget, fixed_gib=7.7, max_cells=12, make=make, refine=2, layers=4),
                  gpu.measure)
    assert {t.layout for t in four.trials} <= {L.label for L in grid()}


def test_a_best_that_slow_steps_decided_says_so():
    """Every cell but the true best had slow steps in its window (its tok/s at the median step 20% above its
    window's): the best by the window is named as before, and its why says that the next was faster at the
    median step, with both figures; where the median agrees, nothing is added."""
    gpu = Gpu()
    Ls = layouts(gpu.per_sample)
    L, b = gpu.true_best(Ls)

    def measure(K, c):
        m = gpu.measure(K, c)
        m.tok_s_p50 = m.tok_s and m.tok_s * (1.0 if (K, c) == (L, b) else 1.2)
        return m

    out = search(Space(Ls, BATCHES, gpu.budget, fixed_gib=5.0, max_cells=12), measure)
    nxt = sorted((t for t in out.trials if t.status == "ok"), key=lambda t: -t.tok_s)[1]
    assert (out.best.layout, out.best.batch) == (L.label, b)
    assert f"faster at the median step ({nxt.tok_s_p50:,.0f} against {out.best.tok_s_p50:,.0f})" in out.why
    assert "median" not in search(Space(Ls, BATCHES, gpu.budget, fixed_gib=5.0, max_cells=12), Gpu().measure).why


def test_the_largest_batch_end_is_measured_before_the_cap_runs_out():
    """hf's case within 22 GiB: kept activations so large (3 GiB a sample) that every layout but full
    recompute fits a small batch only, and the throughput still rising at b24 (knee 40). With a cap of 6
    cells the search must still reach the layout that recomputes every layer, whose large batch wins."""
    gpu = Gpu(per_sample=lambda r, o: 3.0 * (1 - r - o) + 0.5 * r + 0.1, knee=40.0)
    Ls = layouts(gpu.per_sample)
    out = search(Space(Ls, BATCHES, gpu.budget, fixed_gib=6.0, max_cells=6), gpu.measure)
    check_invariants(gpu, out, 6)
    assert [L.label for L, _, _ in gpu.calls][:1] == ["ckpt 0 offload 0"]
    assert out.best.layout == "ckpt 1 offload 0" and out.best.batch == gpu.true_best(Ls)[1], gpu.calls


def test_a_throughput_plateau_stops_the_batch_and_the_layouts_that_only_buy_batch():
    """Ample memory, a throughput flat from b4 (knee 0.05) and an estimate 3x too high (the first cell a
    small batch): the fastest layout climbs until tok/s rises < 3%, then every layout saving more
    memory is skipped without a cell."""
    gpu = Gpu(budget=80.0, knee=0.05)
    Ls = layouts(lambda r, o: 3 * gpu.per_sample(r, o))
    out = search(Space(Ls, BATCHES, gpu.budget, fixed_gib=6.0, max_cells=12), gpu.measure)
    check_invariants(gpu, out, 12)
    assert {L.label for L, _, _ in gpu.calls} == {"ckpt 0 offload 0"}
    assert out.stops["ckpt 0 offload 0"].startswith("plateau")
    (_, b0, _), (_, b1, _) = gpu.calls[-2:]
    assert b0 < b1 and gpu.tok(Ls[0], b1) / gpu.tok(Ls[0], b0) - 1 < 0.03
    skipped = [t for t in out.trials if t.job is None]
    assert len(skipped) == len(Ls) - 1 and all("no longer pays" in t.reason for t in skipped)
    assert out.best.batch == b1


def test_an_oom_implies_the_cells_that_need_more_memory():
    """The first cell (chosen by a memory estimate 2x too low) runs out of memory: no later cell of a
    layout that saves no more memory at that batch or above is measured, and the search still ends at
    the true best."""
    gpu = Gpu()
    Ls = layouts(lambda r, o: 0.5 * gpu.per_sample(r, o))
    out = search(Space(Ls, BATCHES, gpu.budget, fixed_gib=3.0, max_cells=12), gpu.measure)
    check_invariants(gpu, out, 12)
    assert gpu.calls[0][2] == "oom"
    L, b = gpu.true_best(Ls)
    assert (out.best.layout, out.best.batch) == (L.label, b)


def test_before_any_cell_the_raw_estimate_skips_only_what_it_puts_over_twice_the_budget():
    """The raw estimate chooses where a search starts; before any cell is measured it skips a cell only where it
    puts it over twice the budget (it is within 2x of every backend's measured peaks): a layout keeping everything
    at 10.5 GiB a row (48 GiB at b4, in 22) is not run, the search starts on the other end. At 1.5x the budget the
    same layout is run, and its OOM measured."""
    batches = [4, 8, 16]
    for per_row, skipped in ((10.4, True), (6.75, False)):  # b4 of the first layout: 6 + 4 x (per_row + 0.1) GiB
        gpu = Gpu(per_sample=lambda r, o, k=per_row: k * (1 - r - o) + 0.12 * r + 0.1)
        Ls = layouts(gpu.per_sample)
        out = search(Space(Ls, batches, gpu.budget, fixed_gib=6.0, max_cells=6), gpu.measure)
        check_invariants(gpu, out, 6)
        first = Ls[0]
        assert (first not in [L for L, _, _ in gpu.calls]) is skipped
        if skipped:
            t = next(t for t in out.trials if t.layout == first.label)
            assert t.status == "skipped" and "over 2x the budget of 22 GiB" in t.reason and t.batch == 4
            assert out.stops[first.label] == "nothing fits (estimated)" and gpu.calls[0][0] is Ls[-1]
        else:
            assert gpu.calls[0][:3] == (first, 4, "oom")
        L, b = max(((L, b) for L in Ls for b in batches if gpu.peak(L, b) <= gpu.budget), key=lambda lb: gpu.tok(*lb))
        assert (out.best.layout, out.best.batch) == (L.label, b)


def test_the_cell_cap_holds_and_unreached_layouts_are_listed():
    gpu = Gpu()
    Ls = layouts(lambda r, o: 1.5 * gpu.per_sample(r, o))
    out = search(Space(Ls, BATCHES, gpu.budget, fixed_gib=5.0, max_cells=3), gpu.measure)
    check_invariants(gpu, out, 3)
    assert len(gpu.calls) == 3 and out.best is not None
    assert {t.layout for t in out.trials} == {L.label for L in Ls}  # each layout: measured or skipped with a reason


def test_a_backend_that_cannot_run_stops_its_search():
    calls = []

    def measure(L, b):
        calls.append(b)
        return Measured("skipped", job=len(calls) - 1, error="backend=unsloth: the unsloth package is not installed")

    out = search(Space(layouts(lambda r, o: 1.0), BATCHES, 22.0, 5.0), measure)
    assert len(calls) == 1 and out.best is None and "no cell" in out.why


@pytest.mark.slow  # two sweeps of several processes (make test-slow; the search's choices: the tests above)
def test_search_end_to_end_on_cpu(tmp_path):
    """`train.py +experiment=tune` with the tiny model on the CPU, a 2 x 2 space and its best measured again
    at LoRA dropout 0 (two cells), stopped by sweep.deadline_s after its first cell: search.json and the
    report hold the search cut short (exit 4). The same command without the deadline resumes it: the
    finished cell is read back, the search goes on to its end; every cell it measured is a cell dir of the
    sweep, search.json lists them, and the report opens with the answer."""
    d = tmp_path / "sweep"
    args = ["+experiment=tune", "backend=hf", "model=tiny", "precision=fp32", "optimizer=adamw_torch",
            "data=tiny_instruct", "gpu=cpu", "search.batches=[1,2]", "search.checkpoint_fractions=[1,0]",
            "search.offload_fractions=[0]", "seq_len=64", "train.max_steps=3", "train.untimed_steps=1",
            "data.max_samples=16", "search.allow_dropout_zero=true", "search.refine_layouts=0", f"hydra.sweep.dir={d}"]
    cut = run_cli("train.py", args + ["sweep.deadline_s=0.001"], check=False)
    assert cut.returncode == 4, cut.stderr[-3000:]
    (part,) = load_searches(d)
    assert [t.job for t in part.trials if t.job is not None] == [0] and part.best.job == 0 and not part.dropout_zero
    assert part.cut_short == "the sweep stopped after cell 0 (sweep.deadline_s)" and "cut short" in part.why
    assert "cut short: the sweep stopped" in (d / "results.md").read_text()

    proc = run_cli("train.py", args)
    assert proc.stderr.count("result (from an earlier run)") == 1
    (rec,) = load_searches(d)
    measured = [t for t in rec.trials + rec.dropout_zero if t.job is not None]
    assert [t.job for t in measured] == [0, 1] and all(t.status == "ok" for t in measured) and not rec.cut_short
    assert rec.trials[0] == part.trials[0]
    for t in measured:
        cell = json.loads((d / str(t.job) / "metrics.json").read_text())
        assert cell["config"]["batch"] == t.batch and cell["status"] == "ok"
    assert rec.best.batch == 2 and rec.best.job is not None  # no budget on a CPU: the largest batch first
    assert re.search(r"\[search 2/12\] b2 ckpt 0 offload 0 lora.dropout=0: [\d,]+ tok/s", proc.stderr)
    md = (d / "results.md").read_text()
    assert md.startswith("Answer:") and "fastest is hf b2 ckpt 0 offload 0" in md and "cut short" not in md
    # every cell the search launched, and only those, counted (not the command line's one outer cell)
    assert f"cells: {len(measured)} = {len(measured)} ok\n" in proc.stderr


@pytest.mark.slow  # one cell of the tiny model in a process of its own (make test-slow)
def test_a_search_that_spends_its_cap_past_its_deadline_ends_whole(tmp_path):
    """A search of one cell (search.max_cells=1) whose cell ends past sweep.deadline_s: no cell was kept from
    starting, so the search is not cut short and the sweep exits 0, its report the search's answer."""
    d = tmp_path / "sweep"
    proc = run_cli("train.py", ["+experiment=tune", "backend=hf", "model=tiny", "precision=fp32",
                                "optimizer=adamw_torch", "data=tiny_instruct", "gpu=cpu", "search.batches=[1,2]",
                                "search.checkpoint_fractions=[1]", "search.offload_fractions=[0]", "seq_len=64",
                                "train.max_steps=2", "train.untimed_steps=1", "data.max_samples=8",
                                "search.max_cells=1", "sweep.deadline_s=0.001", f"hydra.sweep.dir={d}"], check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rec,) = load_searches(d)
    assert [t.job for t in rec.trials if t.job is not None] == [0] and not rec.cut_short
    assert "cut short" not in (d / "results.md").read_text() and "the sweep stops here" not in proc.stderr


def test_a_search_dir_refuses_another_commands_search_and_not_a_report_option(tmp_path):
    """The preflight of a search (lorabench.sweep.callbacks.other_searches): a dir holding the search of another outer
    cell is named; one that differs only in what a result does not depend on (report.*) resumes."""
    from lorabench.core.results import SearchRecord, write_searches
    from lorabench.sweep.callbacks import other_searches

    cell = ["+experiment=tune", "backend=hf", "seq_len=512"]
    write_searches(tmp_path, [SearchRecord("search", cell, "hf", 22.0, 512, 12, [], None, "", {})])
    assert other_searches(tmp_path, [cell + ["report.project=false"]]) == []
    assert other_searches(tmp_path, [cell + ["batch=8"]]) == []  # set by the search in every cell
    (line,) = other_searches(tmp_path, [["+experiment=tune", "backend=fast", "seq_len=512"]])
    assert "holds a search of another command (+experiment=tune,backend=hf,seq_len=512)" in line


def cell(job, backend, batch, ckpt, tok, dropout=0.05, offload=0.0):
    from lorabench.core.results import CellResult, Status

    config = {"backend": {"name": backend}, "batch": batch, "seq_len": 512, "gpu": {"name": "a10"},
              "data": {"kind": "synthetic"}, "lora": {"dropout": dropout},
              "train": {"gradient_checkpointing": ckpt > 0, "checkpoint_fraction": ckpt, "offload_fraction": offload}}
    steps, p50 = 15, batch * 512 / tok  # fixed-length rows: every step the same
    metrics = {"perf/tokens_per_s": tok, "count/tokens_nonpad": steps * batch * 512, "count/timed_steps": steps,
               "perf/step_time_p50_s": p50, "mem/peak_reserved_gib": 20.0}
    return CellResult(Status.ok, f"cell{job}", job, config=config, metrics=metrics,
                      choices={"backend": backend}, gpu={"device_name": "NVIDIA H100 80GB HBM3", "budget_gib": 22.0})


def record(name, cells, best):
    from lorabench.core.results import SearchRecord, Trial

    trials = [Trial(f"ckpt {c.config['train']['checkpoint_fraction']:g} offload 0", c.config["batch"], "ok",
                    c.metrics["perf/tokens_per_s"], 20.0, c.job_num) for c in cells]
    return SearchRecord(name, [name], name.split("=")[1], 22.0, 512, 12, trials,
                        next(t for t in trials if t.job == best.job_num), "fastest", {})


def test_backends_table_and_answer_compare_best_against_best():
    """The answer and the Backends table set each backend's searched best against hf's searched best
    (not hf's first cell), name both layouts, and label a ratio to an unsearched hf cell."""
    from lorabench.report.analysis import answer, axes, backend_table, headline

    hf = [cell(0, "hf", 8, 1, 6000), cell(1, "hf", 16, 1, 7500)]
    fast = [cell(2, "fast", 16, 0.5, 15000), cell(3, "fast", 24, 0.5, 15300)]
    zero = [cell(4, "fast", 24, 0.5, 16000, dropout=0.0)]
    unsloth = [cell(5, "unsloth", 8, 1, 12000), cell(6, "unsloth", 64, 1, 12750)]
    results = hf + fast + zero + unsloth
    searches = [record("backend=hf", hf, hf[1]), record("backend=fast", fast, fast[1]),
                record("backend=unsloth", unsloth, unsloth[1])]
    searches[1].dropout_zero = [searches[1].trials[1].__class__("ckpt 0.5 offload 0", 24, "ok", 16000, 20.0, 4)]
    searches[2].cut_short = "the sweep stopped after cell 6 (sweep.deadline_s)"
    text = answer(results, searches)
    assert text == ("On NVIDIA H100 80GB HBM3 (gpu=a10) within 22 GiB at seq 512: fastest is fast b24 ckpt 0.5 "
                    "offload 0 at 15,300 non-pad tok/s, 2.04x the plain HF recipe's best (hf b16 ckpt 1 offload 0, "
                    "7,500 tok/s); 1.20x unsloth's fastest cell so far (b64 unsloth checkpointing offloaded, "
                    "12,750 tok/s; its search cut short). "
                    "With lora.dropout=0 (a change to the recipe): fast b24 ckpt 0.5 offload 0 at 16,000 tok/s, 2.13x.")
    assert headline(results, axes(results), [], searches).markdown() == f"Answer:\n\n{text}"  # the report's opening
    searches[2].cut_short = ""  # finished: its best, called so
    assert "; 1.20x unsloth's best (b64 unsloth checkpointing offloaded, 12,750 tok/s). " in answer(results, searches)
    # no hf search (not asked, or a sweep cut before it): no ratio to the HF recipe, and why
    assert ("at 15,300 non-pad tok/s; no hf search among these cells for the ratio (add backend=hf, or resume a sweep "
            "cut short); 1.20x unsloth's best") in answer(results, searches[1:])
    table = backend_table(results, ["backend", "batch"], searches)
    rows = {r.split(" | ")[1]: r.split(" | ") for r in table.splitlines()[2:]}
    assert rows["fast"][3:5] == ["b24 ckpt 0.5 offload 0", "searched: 2 cells measured, 0 skipped"]
    assert rows["fast"][10] == "2.04 (2.04)" and rows["hf"][10] == "1.00 (1.00)"
    assert rows["fast, lora.dropout=0 (recipe change)"][10] == "2.13 (2.13)"
    # the same cells without search.json: no "best" is claimed, and hf's reference is labelled unsearched
    bare = {r.split(" | ")[1]: r.split(" | ") for r in backend_table(results, ["backend", "batch"]).splitlines()[2:]}
    assert bare["fast"][4] == "unsearched: fastest of 2 cells run"
    assert bare["fast"][10] == "2.04 (2.04) vs hf b16 ckpt 1 offload 0 (unsearched)"
    assert answer(results, []) == ""


def test_a_sweep_over_models_names_each_model_in_the_table_and_the_answer():
    """`model=llama-3.1-8b,qwen2.5-7b` with backend=hf,fast: one group per model, each labelled by its model (not by
    the GPU both share, nor by the shape keys that differ with it), and each answer names its model."""
    from lorabench.report.analysis import answer, backend_table

    def of(r, model, hidden):  # the model group's name and one shape key, as a composed config has them
        r.config["model"] = {"name": model, "hidden_size": hidden}
        return r

    llama = [of(cell(0, "hf", 8, 1, 6000), "llama-3.1-8b", 4096),
             of(cell(1, "fast", 8, 0, 15000), "llama-3.1-8b", 4096)]
    qwen = [of(cell(2, "hf", 8, 1, 6500), "qwen2.5-7b", 3584), of(cell(3, "fast", 8, 0, 16900), "qwen2.5-7b", 3584)]
    searches = [record(f"backend={c.config['backend']['name']}", [c], c) for c in llama + qwen]
    rows = [r.split(" | ") for r in backend_table(llama + qwen, ["backend", "model"], searches).splitlines()[2:]]
    assert [(r[0].strip("| "), r[1]) for r in rows] == [("model=llama-3.1-8b", "hf"), ("model=llama-3.1-8b", "fast"),
                                                        ("model=qwen2.5-7b", "hf"), ("model=qwen2.5-7b", "fast")]
    first, second = answer(llama + qwen, searches).split("\n\n")
    assert first.startswith("On NVIDIA H100 80GB HBM3 (gpu=a10) within 22 GiB at seq 512, model=llama-3.1-8b: "
                            "fastest is fast b8 ckpt 0 offload 0 at 15,000 non-pad tok/s, 2.50x")
    assert second.startswith("On NVIDIA H100 80GB HBM3 (gpu=a10) within 22 GiB at seq 512, model=qwen2.5-7b: "
                             "fastest is fast b8 ckpt 0 offload 0 at 16,900 non-pad tok/s, 2.60x")


def test_the_answer_names_a_search_of_which_no_cell_ran_and_why():
    """A backend whose search ran no cell (every cell out of memory, or the sweep cut before one finished) is
    named in the answer with its search's reason, not left out of the comparison; where that backend is hf, the
    answer says there is no ratio to the plain HF recipe because of it (not that hf was never asked for)."""
    from lorabench.core.results import SearchRecord, Trial
    from lorabench.report.analysis import answer

    fast = [cell(0, "fast", 16, 0, 19000)]
    cut = "the sweep stopped after cell 1 (SIGINT)"
    unsloth = SearchRecord("backend=unsloth", ["backend=unsloth"], "unsloth", 22.0, 512, 12,
                           [Trial("unsloth checkpointing off", 16, "interrupted", None, 66.0, 1)], None,
                           f"no cell fitted or ran among the 1 measured; cut short: {cut}", {}, cut_short=cut)
    hf = SearchRecord("backend=hf", ["backend=hf"], "hf", 22.0, 512, 12,
                      [Trial("ckpt 1 offload 0", 64, "oom", None, 22.5, 2)], None,
                      "no cell fitted or ran among the 1 measured", {})
    first, last = answer(fast, [record("backend=fast", fast, fast[0]), unsloth]).split("\n\n")
    assert first.startswith("On NVIDIA H100 80GB HBM3 (gpu=a10) within 22 GiB at seq 512: fastest is fast b16")
    assert last == f"backend=unsloth: no cell of its search ran: no cell fitted or ran among the 1 measured; cut short: {cut}."
    text = answer(fast, [record("backend=fast", fast, fast[0]), hf])
    assert "; no cell of hf's search ran, so no ratio to the plain HF recipe (why: below)." in text
    assert text.endswith("backend=hf: no cell of its search ran: no cell fitted or ran among the 1 measured.")
    assert "no hf search among these cells" not in text


def test_an_oom_while_the_model_is_built_ends_the_search():
    """No batch or layout holds less than the model being built: after such a cell the search stops and says
    why; an OOM in a step (at_load false) lowers the batch as before."""
    gpu = Gpu()
    out = search(Space(layouts(gpu.per_sample), BATCHES, 22.0, 5.0),
                 lambda L, b: Measured("oom", None, 21.9, job=0, at_load=True))
    assert [t.job for t in out.trials if t.job is not None] == [0] and out.best is None
    assert "cell 0 ran out of memory while its model was built" in out.why
    in_step = search(Space(layouts(gpu.per_sample), BATCHES, 22.0, 5.0), gpu.measure)
    assert len(gpu.calls) > 1 and in_step.best is not None


def test_two_failed_cells_in_a_row_stop_a_search():
    calls = []

    def measure(L, b):
        calls.append(b)
        return Measured("failed", job=len(calls) - 1, error="RuntimeError: needs a CUDA GPU")

    out = search(Space(layouts(lambda r, o: 1.0), BATCHES, 22.0, 5.0), measure)
    assert len(calls) == 2 and out.best is None
    assert [t.status for t in out.trials] == ["failed", "failed"] and out.trials[0].reason.startswith("RuntimeError")


def test_dropout_zero_measures_the_best_layout_again_and_one_batch_up():
    """search.allow_dropout_zero: the best cell's layout at its batch, then one step up (dropout 0 keeps
    no masks: a little less memory), within the cells left."""
    from lorabench.sweep.search import dropout_zero

    gpu = Gpu(budget=14.0)  # the best (ckpt 1, b32) below the top of the ladder
    Ls = layouts(gpu.per_sample)
    space = Space(Ls, BATCHES, gpu.budget, fixed_gib=6.0, max_cells=10)
    out = search(space, gpu.measure)
    n = len(gpu.calls)
    zero = dropout_zero(space, out.best, gpu.measure, cells=2)
    assert [(t.layout, t.batch) for t in zero] == [(out.best.layout, out.best.batch),
                                                   (out.best.layout, BATCHES[BATCHES.index(out.best.batch) + 1])]
    assert len(gpu.calls) == n + 2 and zero[1].status == "oom"  # the same GPU: one step up does not fit



# The hf search of Qwen3-8B within 22 GiB at seq 1024 on an H100 (docs/runs/2026-11-25_models_search,
# qwen3-8b/search.json): (layout, batch) -> (status, tok/s, peak GiB) of the cells it measured.
QWEN3_HF = {("ckpt 0 offload 0", 2): ("oom", None, 21.96), ("ckpt 0 offload 0", 1): ("ok", 1996, 20.84),
            ("ckpt 1 offload 0", 1): ("ok", 1258, 11.77), ("ckpt 1 offload 0", 2): ("ok", 2287, 14.67)}


def test_a_layouts_own_cells_set_its_memory_per_sample_when_the_estimate_splits_layouts_wrong():
    """Qwen3's 152k-vocabulary logits make the layouts' memory per sample closer than the estimate says, and
    the OOM of the layout keeping every activation raised the calibrated slope of every layout: b4 with
    every layer recomputed was skipped as 24.6 GiB although its own two cells (11.77 GiB at b1, 14.67 at
    b2: 2.9 GiB a sample) put it at 14.67 + 2 x 2.9 = 20.5 GiB, under the 22 GiB budget. Replayed on the
    real space: the search measures it."""
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    from lorabench.sweep.search import space_for

    c = OmegaConf.to_object(compose_cfg(["model=qwen3-8b", "backend=hf", "precision=nf4", "seq_len=1024",
                                         "gpu=a10", "search.max_cells=10"]))
    space = space_for(c)
    measured = []

    def replay(L, b):  # the recorded cells as they were; any other one out of memory (the worst case)
        status, tok, peak = QWEN3_HF.get((L.label, b), ("oom", None, 22.0))
        measured.append((L.label, b))
        return Measured(status, tok, peak, job=len(measured) - 1)

    search(space, replay)
    assert ("ckpt 1 offload 0", 4) in measured


@pytest.mark.parametrize("name", ["qwen2.5-7b", "phi-4", "qwen3-30b-a3b"])
def test_memory_estimate_holds_every_weight_of_the_model(name):
    """The search's fixed memory holds the model's weights, 2 bytes each in bf16, read from its
    Architecture: Qwen2.5's and Phi-4's head_dim is hidden / heads (head_dim: null in their options), all
    128 of Qwen3-30B-A3B's experts are held. Above them: LoRA's weights and states (0.1-0.2 GiB at r 16
    on q/k/v/o) and 0.5 GiB of slack."""
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    from lorabench.models import architecture_of
    from lorabench.sweep.search import fixed_gib

    c = OmegaConf.to_object(compose_cfg([f"model={name}", "precision=bf16"]))
    weights = 2 * architecture_of(c.model).total_params() / 2**30
    assert weights < fixed_gib(c) < weights + 1


def test_a_ratio_to_unsloth_without_its_varlen_kernel_is_labelled_so_never_best_against_best():
    """Unsloth's cells recorded that it had no varlen attention kernel (model.unsloth_varlen_kernel: none): the
    answer and the Backends table name it "Unsloth without its varlen kernel", not "unsloth's best"; with xformers
    or flash-attn it is its best as before; packed through one SDPA call per sample, it is named so."""
    from lorabench.report.analysis import answer, backend_table

    hf, fast = [cell(0, "hf", 16, 1, 7500)], [cell(1, "fast", 24, 0.5, 15300)]
    unsloth = [cell(2, "unsloth", 64, 1, 12750)]
    searches = [record("backend=hf", hf, hf[0]), record("backend=fast", fast, fast[0]),
                record("backend=unsloth", unsloth, unsloth[0])]
    unsloth[0].model = {"unsloth_varlen_kernel": "none"}
    text = answer(hf + fast + unsloth, searches)
    assert "; 1.20x Unsloth without its varlen kernel (b64 unsloth checkpointing offloaded, 12,750 tok/s)" in text
    assert "unsloth's best" not in text
    rows = [r.split(" | ")[1] for r in backend_table(hf + fast + unsloth, ["backend", "batch"], searches).splitlines()[2:]]
    assert "Unsloth without its varlen kernel" in rows and "unsloth" not in rows
    unsloth[0].model = {"unsloth_varlen_kernel": "xformers"}
    assert "; 1.20x unsloth's best (b64 unsloth checkpointing offloaded" in answer(hf + fast + unsloth, searches)
    # its packed rows through one SDPA call per sample: packed, yet without a varlen kernel; on fixed-length rows
    # (nothing packed) that route never runs, and it is Unsloth's best
    unsloth[0].model = {"unsloth_varlen_kernel": "sdpa per sample", "unsloth_packing": True}
    assert "; 1.20x Unsloth packing through SDPA per sample (no varlen kernel) (b64" in answer(hf + fast + unsloth,
                                                                                            searches)
    unsloth[0].model = {"unsloth_varlen_kernel": "sdpa per sample", "unsloth_packing": False}
    assert "; 1.20x unsloth's best (b64" in answer(hf + fast + unsloth, searches)


@pytest.mark.parametrize("seq_len", breadth([1024, 16384, 32768], [32768]))
def test_tune_on_all_linear_lora_and_long_rows_proposes_only_cells_that_pass_the_checks(seq_len):
    """`+experiment=tune backend=fast,unsloth,hf gpu=a10 lora=all_linear seq_len=...`: the fixed memory counts the
    adapters of all seven projections; the long-context layouts (every layer recomputed with its input in host
    memory; on fast also the MLP in tiles and Liger's own loss chunks) join hf's and fast's spaces exactly where
    the memory model puts the ladder's second batch of every other layout over the budget (none at 1,024 tokens,
    both of fast's at 32,768), Unsloth's offloaded checkpointing is always there; every cell a search can
    propose (each layout at batch 1) composes and passes every value check."""
    import yaml

    from lorabench.run.checks import check_values
    from lorabench.sweep.memory import MemoryModel
    from lorabench.sweep.search import LONG, space_for

    for backend in ("fast", "unsloth", "hf"):
        base = compose_cfg(["+experiment=tune", f"backend={backend}", "gpu=a10", "lora=all_linear",
                            f"seq_len={seq_len}"])
        c = OmegaConf.to_object(base)
        space, mm = space_for(c), MemoryModel.of(c)
        assert space.fixed_gib == mm.fixed_gib and mm.lora_gib == pytest.approx(
            32 * 16 * (2 * 8192 + 2 * 5120 + 3 * (4096 + 14336)) * 16 / 2**30)  # Mistral-7B, r16, 7 projections
        labels = [L.label for L in space.layouts]
        if backend == "unsloth":
            assert labels[-1] == "unsloth checkpointing offloaded"
        else:
            plain = [L for L in space.layouts if "+" not in L.label]
            needs = space.fixed_gib + min(L.gib_per_sample for L in plain) * space.batches[1] > space.budget_gib
            assert any("+inputs to host" in x for x in labels) == needs
            assert any("+mlp tile 4096" in x for x in labels) == (needs and backend == "fast")
            assert needs == (seq_len >= 16384 if backend == "hf" else seq_len >= 32768) and LONG <= 16384
        for L in space.layouts:
            cell = base.copy()
            for o in (*L.overrides, "batch=1"):
                key, value = o.split("=", 1)
                OmegaConf.update(cell, key, yaml.safe_load(value), merge=False)
            check_values(OmegaConf.to_object(cell))


def test_what_a_layout_holds_whatever_the_batch_moves_the_first_cell_to_one_that_fits():
    """LoRA on an MoE model's experts: each layer that keeps its activations also keeps its merged expert weights
    (36 GiB over all layers on gpt-oss-20b; lorabench.sweep.memory), whatever the batch. With that in each layout's
    estimate the search's first cell on an 80 GB GPU is one that fits; without it, one that runs out of memory."""
    class Experts(Gpu):
        def peak(self, L, b):
            return super().peak(L, b) + 36.0 * (1 - L.saves[0] - L.saves[1])

    gpu = Experts(budget=78.0, fixed=40.0, per_sample=lambda r, o: 0.5 * (1 - r - o) + 0.05)
    plain = layouts(gpu.per_sample)
    held = [Layout(L.label, (), L.saves, L.gib_per_sample, gib_fixed=36.0 * (1 - sum(L.saves))) for L in plain]
    search(Space(plain, BATCHES, gpu.budget, fixed_gib=40.0, max_cells=4), gpu.measure)
    assert gpu.calls[0][2] == "oom"
    gpu.calls.clear()
    out = search(Space(held, BATCHES, gpu.budget, fixed_gib=40.0, max_cells=4), gpu.measure)
    assert gpu.calls[0][2] == "ok" and out.best is not None


@pytest.mark.parametrize("fractions,expect", [
    ("[0,0.25,0.5,1]", ["off", "on", "offloaded"]), ("[1]", ["on", "offloaded"]), ("[0]", ["off"])])
def test_checkpoint_fractions_narrow_unsloths_own_layouts_too(fractions, expect):
    """Unsloth checkpoints every layer or none: a share above 0 in search.checkpoint_fractions keeps its two
    checkpointing layouts, 0 keeps its checkpointing off, so `search.checkpoint_fractions=[1]` spends no cell on a
    layout known not to fit, on every backend alike."""
    from lorabench.sweep.search import layouts as own_layouts

    c = OmegaConf.to_object(compose_cfg(["+experiment=tune", "backend=unsloth", "gpu=a10",
                                         f"search.checkpoint_fractions={fractions}"]))
    assert [L.label for L in own_layouts(c)] == [f"unsloth checkpointing {x}" for x in expect]
