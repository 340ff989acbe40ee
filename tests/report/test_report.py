"""The sweep report and the W&B side: files whose numbers equal the cells' own, one offline W&B run
per cell with its summary, failed cells with their reasons, clear messages for broken sweep dirs."""

import csv
import json
import math
import shutil
import statistics

import pytest
from conftest import FAST, REPO, run_cli
from wandb_records import summarize_run

from lorabench.core.config import ReportConfig
from lorabench.core.results import CellResult, Status, is_sweep_dir, load_results, write_result
from lorabench.measure.metrics import percentile
from lorabench.report.analysis import (
    IQR_PER_SIGMA,
    NOISE_SIGMAS,
    axes,
    knob_effects,
    label,
    loss_curves,
    projection,
    sentence,
)
from lorabench.report.page import write_report

SECRET_KEY, SECRET_TOKEN = "fake-wandb-key-0123456789abcdef", "hf_fakeTokenThatMustNeverLeak42"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """4 cells, 2 of which fail (seq_len 5000 exceeds the tiny model's 4096 positions), W&B offline,
    with a fake W&B key and HF token planted in the environment."""
    d = tmp_path_factory.mktemp("sweep")
    pytest.importorskip("wandb")
    proc = run_cli("train.py", ["-m", "seq_len=32,5000", "batch=2,3", *FAST, "logger=wandb", "sweep.keep_going=true",
                                f"hydra.sweep.dir={d}"], check=False,
                   env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_API_KEY": SECRET_KEY,
                        "HF_TOKEN": SECRET_TOKEN})
    return d, proc


def cells(d):
    return {int(p.name): json.loads((p / "metrics.json").read_text()) for p in d.iterdir() if p.name.isdigit()}


@pytest.mark.slow  # a sweep of several processes (make test-slow; the report's parts: the tests below, test_plots)
def test_a_sweep_report_its_wandb_runs_and_no_secret(sweep):
    """One test over the one sweep (a whole 4-cell multirun): the report files hold the cells' own
    numbers, one offline W&B run per cell holds its result, and no planted secret reaches a file."""
    report_files_hold_the_cells_numbers(*sweep)
    one_offline_wandb_run_per_cell_with_its_result(*sweep)
    no_secret_reaches_any_file(*sweep)


def report_files_hold_the_cells_numbers(d, proc):
    assert proc.returncode == 2  # a multirun with a failed cell (README: exit codes)
    assert proc.stderr.splitlines()[-1].startswith("cells: 4 = 2 ok, 2 failed; not measured: 2 (")
    own = cells(d)
    assert len(own) == 4 and sorted(r["status"] for r in own.values()) == ["failed", "failed", "ok", "ok"]
    rows = list(csv.DictReader(open(d / "results.csv")))
    assert len(rows) == 4
    for row in rows:
        r = own[int(row["job_num"])]
        assert row["status"] == r["status"] and row["cell"] == r["cell"]
        for key, value in r["metrics"].items():
            if isinstance(value, float):
                assert float(row[key]) == value, key  # pandas writes a float's repr: it reads back to the bit
    md = (d / "results.md").read_text()
    assert md.count("| ok |") == 2 and md.count("failed: ValueError: seq_len=5000 exceeds") == 2
    assert "batch 2 -> 3: non-pad tokens/s" in md  # the knob effect, from the two finished cells
    assert rows[0]["seq_len"] == "32" and rows[0]["batch"] == "2" and rows[0]["model"] == "tiny"  # config columns
    for name in ("throughput", "speedup", "cost", "projection", "knobs"):
        png = d / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    page = (d / "report.html").read_text()
    assert page.count("<img") == len(list((d / "plots").glob("*.png"))) and "data:image/png;base64," in page
    assert page.count("<tr class='failed'>") == 2 and "exceeds model.max_position_embeddings" in page
    assert "http" not in page.replace("https://", "")  # self-contained: nothing to fetch


def one_offline_wandb_run_per_cell_with_its_result(d, proc):
    own = cells(d)
    runs = {}
    for f in d.glob("*/wandb/offline-run-*/run-*.wandb"):
        runs[int(f.relative_to(d).parts[0])] = summarize_run(f)
    assert sorted(runs) == sorted(own)  # every cell, the failed ones too
    for n, run in runs.items():
        r = own[n]
        assert run["name"] == f"{d.name}/{r['cell']}" and run["group"] == d.name and run["job_type"] == "train-cell"
        assert f"seq_len={r['config']['seq_len']}" in run["tags"]
        assert run["summary"]["status"] == r["status"] and run["exit_code"] == (0 if r["status"] == "ok" else 1)
        if r["status"] == "ok":
            assert run["summary"]["perf/tokens_per_s"] == pytest.approx(r["metrics"]["perf/tokens_per_s"])
        else:
            assert run["summary"]["error"] == r["error"]
        assert run["config"]["seq_len"] == r["config"]["seq_len"]
    aggregate = [summarize_run(f) for f in d.glob("wandb/offline-run-*/run-*.wandb")]
    assert len(aggregate) == 1 and aggregate[0]["job_type"] == "aggregate" and aggregate[0]["group"] == d.name
    assert "sweep/results" in aggregate[0]["history_keys"]
    (table,) = d.glob("wandb/offline-run-*/files/media/table/sweep/results_*.table.json")
    table = json.loads(table.read_text())
    assert len(table["data"]) == 4 and table["columns"][:3] == ["cell", "seq_len", "batch"]


def no_secret_reaches_any_file(d, proc):
    for f in d.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert SECRET_KEY.encode() not in data and SECRET_TOKEN.encode() not in data, f
    assert SECRET_KEY not in proc.stdout + proc.stderr and SECRET_TOKEN not in proc.stdout + proc.stderr


def test_workspace_payload_compares_the_sweep(tmp_path):
    pytest.importorskip("wandb_workspaces")
    from lorabench.measure.tracking import table
    from lorabench.measure.wandb_run import build_workspace

    view = build_workspace("me", "lorabench", "2026-11-22_10-00-00", ["batch", "seq_len"])._to_model()
    payload = json.dumps(view.model_dump(by_alias=True, exclude_none=True), default=str)
    for metric in ("perf/tokens_per_s", "mem/peak_reserved_gib", "cost/usd_per_1k_samples", "batch", "seq_len"):
        assert metric in payload, metric
    assert "2026-11-22_10-00-00" in payload and "train-cell" in payload  # filtered to the sweep's cell runs
    columns, rows = table([CellResult.from_dict({"cell": "batch=2", "status": "ok", "config": {"batch": 2},
                                                          "metrics": {"perf/tokens_per_s": 10.0}})], ["batch"])
    assert rows == [["batch=2", "2", "ok", None, 10.0, None, None, None, None, None]] and columns[1] == "batch"


def test_knob_effects_pair_cells_that_differ_in_one_key():
    def r(batch, seq, tok, mem):
        return CellResult.from_dict({"status": "ok", "config": {"batch": batch, "seq_len": seq},
                                     "metrics": {"perf/tokens_per_s": tok, "mem/peak_reserved_gib": mem}})
    results = [r(4, 512, 100.0, 10.0), r(8, 512, 150.0, 12.0), r(4, 1024, 110.0, 12.5), r(8, 1024, 165.0, 16.5),
               CellResult.from_dict({"status": "oom", "config": {"batch": 16, "seq_len": 1024}, "metrics": {}})]
    effects = {(e.key, e.from_, e.to): e for e in knob_effects(results, ["batch", "seq_len"])}
    assert effects[("batch", "4", "8")].tokens_ratio == pytest.approx(1.5)  # 150/100 and 165/110
    assert effects[("batch", "4", "8")].mem_delta_gib == pytest.approx(3.0)  # median of 2.0 and 4.0
    assert effects[("seq_len", "512", "1024")].tokens_ratio == pytest.approx(median_of(1.1, 1.1))
    assert effects[("batch", "4", "8")].pairs == 2 and len(effects) == 2  # the OOM cell pairs with nothing


def test_scaling_table_labels_the_mode_and_compares_either_mode_with_one_gpu():
    """1 GPU, then 2 GPUs under DDP and under FSDP: each multi-GPU row against the 1-process cell (its
    parallel value does not matter with one process), global and per-GPU tok/s, the weights a rank holds."""
    def r(nproc, parallel, tok, weights, usd):
        metrics = {"perf/tokens_per_s": tok, "dist/world_size": nproc, "mem/weights_gib": weights,
                   "mem/peak_reserved_gib": 2 * weights, "cost/usd_per_1m_tokens": usd}
        return CellResult.from_dict({"status": "ok", "config": {"batch": 4, "train": {"nproc": nproc,
                                                                                      "parallel": parallel}},
                                     "metrics": metrics})
    results = [r(1, "fsdp", 1000.0, 4.0, 1.0), r(2, "ddp", 1900.0, 4.0, 1.05), r(2, "fsdp", 1500.0, 2.0, 1.33)]
    from lorabench.report.analysis import scaling_table

    table = scaling_table(results, axes(results))
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert [(x[1], x[2]) for x in rows] == [("1", "1 process"), ("2", "ddp"), ("2", "fsdp")]
    assert [x[3:6] for x in rows[1:]] == [["1,900", "950", "95.0%"], ["1,500", "750", "75.0%"]]
    assert rows[2][7] == "2.00" and rows[2][8].startswith("$1.33")


def test_cells_are_named_by_a_key_swept_within_each_backend(tmp_path):
    """+experiment=fast_loss_match sweeps backend x backend.upcast_fp32: four cells, four names (the keys
    a backend only sets, data.packing, stay out of them), and their loss curves compared with hf's."""
    def r(name, upcast):
        d = tmp_path / f"{name}{upcast}"
        d.mkdir()
        (d / "steps.jsonl").write_text("".join(json.dumps({"step": s, "loss": 10.0 - s}) + "\n" for s in (1, 2)))
        return CellResult.from_dict({"status": "ok", "choices": {"backend": name}, "metrics": {}, "run_dir": str(d),
                                     "config": {"backend": {"name": name, "upcast_fp32": upcast},
                                                "data": {"packing": name == "fast"}}})
    results = [r(name, upcast) for name in ("hf", "fast") for upcast in (True, False)]
    axes_ = axes(results)
    assert axes_ == ["backend", "backend.upcast_fp32"]
    assert [label(c, axes_) for c in results] == [
        "backend=hf,upcast_fp32=True", "backend=hf,upcast_fp32=False",
        "backend=fast,upcast_fp32=True", "backend=fast,upcast_fp32=False"]
    (ref, _), curves = loss_curves(results, axes_)
    assert ref is results[0] and len(curves) == 4
    assert loss_curves(results, [*axes_, "data.packing"]) is None  # other rows: not the same batches


def median_of(*xs):
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def test_projection_for_a_dataset_size():
    r = CellResult.from_dict({"status": "ok", "metrics": {"perf/samples_per_s": 1.46, "count/tokens_nonpad": 5120,
                                                          "count/samples": 10, "cost/usd_per_hour": 0.60}})
    p = projection(r, ReportConfig(dataset_samples=10_000, reference_usd_per_1m_tokens=2.0))
    assert p["hours"] == pytest.approx(10_000 / 1.46 / 3600)  # the seed's "10,000 samples": 1.9 h
    assert p["usd"] == pytest.approx(p["hours"] * 0.60) and p["tokens"] == 10_000 * 512
    assert p["reference_usd"] == pytest.approx(5.12 * 2.0)


def test_broken_sweep_dirs_give_a_clear_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_report(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="holds no cells"):
        write_report(tmp_path)
    (tmp_path / "cells.json").write_text('{"cells": []}')  # a sweep's, as its preflight writes it
    proc = run_cli("bench.py", [f"sweep_dir={tmp_path}", f"hydra.run.dir={tmp_path}_bench"], check=False)
    assert proc.returncode != 0 and "holds no cells" in proc.stderr and "Traceback" not in proc.stderr
    # a half-written result: listed as corrupt, the rest still reported
    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "0" / "metrics.json").write_text('{"status": "ok", "metr')
    out = write_report(tmp_path)
    assert "No result for cell 0 (0): corrupt: " in out.markdown
    assert math.isfinite(len(out.files))


def test_the_report_is_written_only_into_a_lorabench_sweep_dir(tmp_path):
    """`bench.py sweep_dir=<dir>` writes the report into the dir it reports on: refused, in one line naming
    the dir and exit 2, where lorabench ran no sweep there (a folder of copied cells), its files left as they
    were; written where it did (the preflight's cells.json, Hydra's multirun.yaml of lorabench, or cells that
    ran in that dir, as a Kubernetes sweep's pods run them)."""
    d = tmp_path / "cells"
    shutil.copytree(REPO / "docs/runs/2026-11-24_h100_projection/fast", d)
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    proc = run_cli("bench.py", [f"sweep_dir={d}", f"hydra.run.dir={tmp_path / 'bench'}"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("bench.py: ")]
    assert line.startswith(f"bench.py: sweep_dir={d} is not the dir of a sweep lorabench ran")
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before
    pods = tmp_path / "pods"  # each cell run into the sweep's dir by a pod of its own
    for cell in ("a10_b16_ckpt075", "auto_b24_ckpt0"):
        shutil.copytree(d / cell, pods / cell)
        r = json.loads((pods / cell / "metrics.json").read_text())
        (pods / cell / "metrics.json").write_text(json.dumps({**r, "run_dir": str(pods / cell)}))
    assert is_sweep_dir(pods)
    (pods / "a10_b16_ckpt075/metrics.json").write_text((d / "a10_b16_ckpt075/metrics.json").read_text())
    assert not is_sweep_dir(pods)  # one of its cells ran elsewhere
    (d / "multirun.yaml").write_text("hydra:\n  help:\n    app_name: another-app\n")
    assert not is_sweep_dir(d)
    (d / "multirun.yaml").write_text("hydra:\n  help:\n    app_name: lorabench\n")
    assert is_sweep_dir(d) and is_sweep_dir(REPO / "docs/runs/2026-11-24_h100_projection/diagnostic")  # cells.json
    proc = run_cli("bench.py", [f"sweep_dir={d}", f"hydra.run.dir={tmp_path / 'bench2'}"])
    assert (d / "results.md").read_bytes() != before[d / "results.md"] and (d / "report.html").is_file()


def test_bench_report_options_compose():
    proc = run_cli("bench.py", ["sweep_dir=x", "report.baseline=3", "report.dataset_samples=500", "--cfg", "job"])
    assert "dataset_samples: 500" in proc.stdout and "baseline: '3'" in proc.stdout
    assert (REPO / "conf" / "bench.yaml").is_file()


def test_a_slow_step_is_listed_with_the_garbage_collections_in_it(tmp_path):
    """A cell whose 5th timed step took 2x its median step: the table lists that step, its seconds, 2.00x and
    the full collections in it; steps at 1.5x or under, warmup steps and records from before the collector
    was measured (no gc fields: '-') behave as said; a cell without slow steps adds no row."""
    from lorabench.report.analysis import slow_steps_table

    def cell(name, times, gc=True):
        d = tmp_path / name
        d.mkdir()
        recs = [{"step": i + 1, "timed": i > 0, "time_s": t, **({"gc_ms": 40.0 * (t > 0.3), "gc_full": int(t > 0.3)}
                                                               if gc else {})} for i, t in enumerate(times)]
        (d / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
        timed = sorted(times[1:])
        return CellResult.from_dict({"status": "ok", "config": {"batch": int(name[1:])}, "dir": str(d),
                                     "metrics": {"perf/tokens_per_s": 1.0,
                                                 "perf/step_time_p50_s": timed[len(timed) // 2]}})
    results = [cell("b4", [9.0, 0.2, 0.2, 0.3, 0.2, 0.4, 0.2]),  # warmup 9 s; 0.3 = 1.5x is not listed
               cell("b8", [9.0, 0.2, 0.2, 0.5], gc=False), cell("b16", [9.0, 0.2, 0.2, 0.2])]
    rows = [line.split(" | ") for line in slow_steps_table(results, ["batch"]).splitlines()[2:]]
    assert rows == [["| batch=4", "6", "0.400", "2.00", "1 (40 ms) |"], ["| batch=8", "4", "0.500", "2.50", "- |"]]
    assert slow_steps_table(results[2:], ["batch"]) == ""


# ---------------------------------------------------------------------------- the answer first

def grid_cell(d, num, config, steps, price=0.30, gpu=None):
    """A cell made of files in sweep dir d: steps.jsonl (one untimed step, then the timed ones given as
    (seconds, non-pad tokens)) and the metrics.json a cell computes from them."""
    cell_dir = d / str(num)
    (cell_dir / ".hydra").mkdir(parents=True)
    recs = [{"step": 1, "timed": False, "time_s": 5.0, "tokens_nonpad": 1, "tokens_total": 1}]
    recs += [{"step": i + 2, "timed": True, "time_s": t, "tokens_nonpad": n, "tokens_total": n + 10, "gc_ms": 0.0,
              "gc_full": 0} for i, (t, n) in enumerate(steps)]
    (cell_dir / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    window, tokens = sum(t for t, _ in steps), sum(n for _, n in steps)
    metrics = {"perf/tokens_per_s": tokens / window, "perf/samples_per_s": config["batch"] * len(steps) / window,
               "perf/step_time_p50_s": statistics.median(t for t, _ in steps), "count/timed_steps": len(steps),
               "count/samples": config["batch"] * len(steps), "count/tokens_nonpad": tokens,
               "count/tokens_total": tokens + 10 * len(steps), "cost/usd_per_hour": price,
               "cost/usd_per_1m_tokens": price / 3600 / (tokens / window) * 1e6}
    name = ",".join(f"{k}={v}" for k, v in config.items() if not isinstance(v, dict))
    write_result(cell_dir / "metrics.json", CellResult(Status.ok, name, num, config=config, metrics=metrics,
                                                       choices={"gpu": config["gpu"]["name"]}, gpu=gpu))


def steady(seconds, tokens, n=20, jitter=0.01):
    """n steps of `tokens` each that take `seconds`, give or take `jitter` (mean exactly `seconds`)."""
    return [(seconds * (1 + jitter * (-1, 0, 1, 0)[i % 4]), tokens) for i in range(n)]


def config(seq_len, batch, gpu="cpu"):
    return {"seq_len": seq_len, "batch": batch, "model": {"name": "tiny"}, "data": {"kind": "tiny_instruct"},
            "gpu": {"name": gpu}, "precision": {"name": "fp32"}, "train": {"max_steps": 100}}


def test_the_report_opens_with_the_answer_then_plots_then_tables(tmp_path):
    """Two GPU options x batch, each emulated within its memory on an H100: results.md opens with the fastest
    cell, the cheapest that fits (a slower GPU at a lower price) with its budget named, and what each knob did;
    then the cells table and the slow steps in one line (the table in slow_steps.md). report.html: the answer
    and the cells table, the figures, the other tables, the slow steps folded away at its end."""
    a10, l4 = ({"device_name": "NVIDIA H100 80GB HBM3", "budget_gib": gib} for gib in (22.0, 24.0))
    slow = steady(0.2, 400)
    slow[5] = (0.6, 400)  # 3x the cell's median step
    grid_cell(tmp_path, 0, config(512, 4, "a10"), slow, 2.0, a10)
    grid_cell(tmp_path, 1, config(512, 8, "a10"), steady(800 / 3000, 800), 2.0, a10)
    grid_cell(tmp_path, 2, config(512, 8, "l4"), steady(800 / 1500, 800), 0.7, l4)
    out = write_report(tmp_path, ReportConfig(project=False))
    md = (tmp_path / "results.md").read_text()
    lines = md.splitlines()
    next_ = 3000 / (20 * 400 / (19 * 0.2 + 0.6))
    assert lines[:4] == [
        "Answer:", "",
        f"- Fastest: gpu=a10,batch=8 at 3,000 non-pad tok/s, {next_:.2f}x the next (gpu=a10,batch=4, 1,818).",
        ("- Cheapest that fits within 24 GiB (gpu=l4): gpu=l4,batch=8 at $0.130 per 1M non-pad tokens "
         "(1,500 tok/s at $0.700/h).")]
    # each knob, the largest change first: a change of work well over its cells' steady steps
    assert lines[4].startswith("- gpu a10 -> l4: non-pad tokens/s -50.0% (median of 1 pair")
    assert lines[5].startswith("- batch 4 -> 8: non-pad tokens/s +65.0%")
    assert "Over the ±" in lines[4] and "Over the ±" in lines[5]
    assert lines[7].startswith("All cells:") and lines[9].startswith("| cell | status |")
    # the slow steps: one line in results.md (and in the console's summary, which ends there); the table apart
    (line,) = [x for x in lines if x.startswith("Slow steps")]
    assert line.startswith("Slow steps: 1 of 60 timed steps took over 1.5x their cell's median step, in 1 of 3 cells")
    assert out.summary.endswith(line) and md.startswith(out.summary) and "| gpu=a10,batch=4 | 7 |" not in md
    assert "| gpu=a10,batch=4 | 7 | 0.600 | 3.00 | 0 (0 ms) |" in (tmp_path / "slow_steps.md").read_text()
    assert "Knob effects:" not in md  # every one is in the answer
    page = (tmp_path / "report.html").read_text()
    order = [page.index(s) for s in ("<h2>Answer</h2>", "Fastest: gpu=a10,batch=8", "<table>", "<h2>Plots</h2>",
                                     "<img", "<h2>Projection for", "<details>", "<td>gpu=a10,batch=4</td><td>7</td>")]
    assert order == sorted(order) and page.rindex("<h2>") < page.index("<details>")


@pytest.fixture(scope="module")
def default_grid(tmp_path_factory):
    """`python train.py -m seq_len=512,1024 batch=4,8` on a shared CPU, made of files: tiny_instruct's samples
    are shorter than both seq_lens, so each batch's two cells trained on the same rows (the same token counts,
    step for step), one of them 58% faster by the machine's whim; the steps themselves are steady."""
    d = tmp_path_factory.mktemp("default_grid")
    rows = {b: [86 * b // 4 + (7 * i) % 14 for i in range(95)] for b in (4, 8)}
    seconds = {(512, 4): 0.058, (1024, 4): 0.0367, (512, 8): 0.0862, (1024, 8): 0.13}
    for num, ((seq, b), s) in enumerate(seconds.items()):
        grid_cell(d, num, config(seq, b), [(s * (1 + 0.01 * (i % 3)) * n / rows[b][0], n)
                                           for i, n in enumerate(rows[b])])
    return d


def test_a_seq_len_that_changes_no_row_is_not_an_effect(default_grid, tmp_path):
    """The default grid's seq_len 512 -> 1024 did the same work at each batch: said so, with no percentage, in
    the answer and in the plot; the fastest cell's twin on the same rows is named as the same work, and the
    twins' gap is the noise an effect is held against. The same key with other token counts (fixed-length
    rows, seq_len tokens each) is an effect."""
    md = write_report(default_grid, ReportConfig(project=False)).markdown
    assert ("- seq_len 512 -> 1024: same work (each of its 2 pairs of cells did the same token counts, e.g. "
            f"{sum(86 + (7 * i) % 14 for i in range(95)):,} non-pad tokens in 95 timed steps): no effect to measure."
            ) in md
    assert "seq_len 512 -> 1024: non-pad" not in md and "- batch 4 -> 8: non-pad tokens/s" in md
    assert md.splitlines()[2].startswith("- Fastest: seq_len=1024,batch=4 at ") and \
        "not told apart from seq_len=512,batch=4 (" in md and ", the same work)" in md
    # those twins measure the machine's run-to-run noise, which the batch effect is within
    results = load_results(default_grid)[0]
    tok = [[r.metrics["perf/tokens_per_s"] for r in results if r.config["batch"] == b] for b in (4, 8)]
    twins = max((max(t) - min(t)) / statistics.mean(t) for t in tok)
    assert (f"Within noise: under the {100 * twins:.1f}% by which cells that did the same work differ in this "
            "sweep (no repeats, train.seed, to measure it).") in md.splitlines()[4]
    plot = [e.key for e in knob_effects(results, ["seq_len", "batch"]) if e.tokens_ratio]
    assert plot == ["batch"]  # (plots.knobs draws these alone)

    for num, (seq, b) in enumerate([(512, 4), (1024, 4)]):  # fixed-length rows: twice the tokens at 1024
        grid_cell(tmp_path, num, config(seq, b), steady(0.1 * seq / 512, b * seq))
    (e,) = knob_effects(load_results(tmp_path)[0], ["seq_len"])
    assert e.tokens_ratio == pytest.approx(1.0) and not e.same_work and e.pairs == 1
    assert sentence(e).startswith("seq_len 512 -> 1024: non-pad tokens/s +0.0%")


def test_without_repeats_the_noise_floor_comes_from_the_cells_steps(tmp_path):
    """No train.seed: the floor is NOISE_SIGMAS combined standard deviations of the two cells' step rates (each
    its interquartile range over 1.349); a change under it is within noise, over it is stated as measured. With
    repeats, their spread is the noise, as before."""
    noisy = [(0.1 * (1, 1.3, 0.8, 1.1, 0.9)[i % 5], 400) for i in range(40)]
    grid_cell(tmp_path / "a", 0, config(512, 4), noisy)
    grid_cell(tmp_path / "a", 1, config(512, 8), [(t * 1.6, 2 * n) for t, n in noisy])  # +25%
    results = load_results(tmp_path / "a")[0]
    iqr = [(percentile(r, 75) - percentile(r, 25)) / percentile(r, 50)
           for r in ([n / t for t, n in noisy], [2 * n / (1.6 * t) for t, n in noisy])]
    (e,) = knob_effects(results, ["batch"])
    assert e.noise_from == "steps" and e.noise == pytest.approx(NOISE_SIGMAS * math.hypot(*iqr) / IQR_PER_SIGMA)
    assert e.tokens_ratio == pytest.approx(1.25) and e.noise > 0.25 and e.within_noise
    assert sentence(e).endswith(f"Within noise: under the ±{100 * e.noise:.1f}% noise floor of its cells' step "
                                "times (no repeats, train.seed, to measure it).")
    grid_cell(tmp_path / "b", 0, config(512, 4), steady(0.1, 400))
    grid_cell(tmp_path / "b", 1, config(512, 8), steady(0.16, 800))
    (e,) = knob_effects(load_results(tmp_path / "b")[0], ["batch"])
    assert e.tokens_ratio == pytest.approx(1.25) and e.noise < 0.05 and not e.within_noise
    assert sentence(e).endswith(f"Over the ±{100 * e.noise:.1f}% noise floor of its cells' step times.")

    def seeded(batch, lr, seed, tok):
        return CellResult.from_dict({"status": "ok", "metrics": {"perf/tokens_per_s": tok},
                                     "config": {"batch": batch, "lr": lr, "train": {"seed": seed}}})
    cells = [seeded(4, 1, 0, 100.0), seeded(4, 1, 1, 120.0), seeded(8, 1, 0, 115.0), seeded(8, 1, 1, 118.0),
             seeded(4, 2, 0, 101.0), seeded(4, 2, 1, 99.0)]
    effects = {e.key: e for e in knob_effects(cells, ["batch", "lr", "train.seed"])}
    assert {e.noise_from for e in effects.values()} == {"repeats"}
    assert effects["batch"].within_noise and "Within noise: repeated cells spread 18.2%." in sentence(effects["batch"])


def test_a_multirun_prints_the_answer_and_the_cells_table_only(default_grid, tmp_path, capsys):
    """The multirun's end (lorabench.sweep.callbacks.SweepSummary) prints the answer, the cells table and the
    one line of slow steps; the other tables stay in results.md."""
    from omegaconf import OmegaConf

    from lorabench.sweep.callbacks import SweepSummary

    d = shutil.copytree(default_grid, tmp_path / "sweep")
    grid_cell(d, 4, config(2048, 4), [(0.2, 400)] * 9 + [(0.9, 400)])  # a cell with a slow step
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(d)}}}))
    printed = capsys.readouterr().out
    assert "Answer:\n\n- Fastest: " in printed and "| cell | status |" in printed
    assert "Slow steps: 1 of 390 timed steps took over 1.5x" in printed
    assert "| seq_len=2048,batch=4 | 11 |" not in printed  # (the slow step's row: in slow_steps.md)
    assert "Projection for" not in printed and "Projection for" in (d / "results.md").read_text()
