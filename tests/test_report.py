"""The sweep report and the W&B side: files whose numbers equal the cells' own, one offline W&B run
per cell with its summary, failed cells with their reasons, clear messages for broken sweep dirs."""

import csv
import json
import math

import pytest
from conftest import FAST, REPO, run_cli
from wandb_records import summarize_run

from lorabench.config import ReportConfig
from lorabench.analysis import axes, knob_effects, label, loss_curves, projection
from lorabench.report import write_report
from lorabench.results import CellResult

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
        assert run["name"] == r["cell"] and run["group"] == d.name and run["job_type"] == "train-cell"
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
    from lorabench.loggers import aggregate_rows, build_workspace

    view = build_workspace("me", "lorabench", "2026-11-22_10-00-00", ["batch", "seq_len"])._to_model()
    payload = json.dumps(view.model_dump(by_alias=True, exclude_none=True), default=str)
    for metric in ("perf/tokens_per_s", "mem/peak_reserved_gib", "cost/usd_per_1k_samples", "batch", "seq_len"):
        assert metric in payload, metric
    assert "2026-11-22_10-00-00" in payload and "train-cell" in payload  # filtered to the sweep's cell runs
    columns, rows = aggregate_rows([CellResult.from_dict({"cell": "batch=2", "status": "ok", "config": {"batch": 2},
                                                          "metrics": {"perf/tokens_per_s": 10.0}})], ["batch"])
    assert rows == [["batch=2", "2", "ok", None, 10.0, None, None, None, None, None]] and columns[1] == "batch"


def test_knob_effects_pair_cells_that_differ_in_one_key():
    def r(batch, seq, tok, mem):
        return CellResult.from_dict({"status": "ok", "config": {"batch": batch, "seq_len": seq},
                                     "metrics": {"perf/tokens_per_s": tok, "mem/peak_reserved_gib": mem}})
    results = [r(4, 512, 100.0, 10.0), r(8, 512, 150.0, 12.0), r(4, 1024, 110.0, 12.5), r(8, 1024, 165.0, 16.5),
               CellResult.from_dict({"status": "oom", "config": {"batch": 16, "seq_len": 1024}, "metrics": {}})]
    effects = {(e["key"], e["from"], e["to"]): e for e in knob_effects(results, ["batch", "seq_len"])}
    assert effects[("batch", "4", "8")]["tokens_ratio"] == pytest.approx(1.5)  # 150/100 and 165/110
    assert effects[("batch", "4", "8")]["mem_delta_gib"] == pytest.approx(3.0)  # median of 2.0 and 4.0
    assert effects[("seq_len", "512", "1024")]["tokens_ratio"] == pytest.approx(median_of(1.1, 1.1))
    assert effects[("batch", "4", "8")]["pairs"] == 2 and len(effects) == 2  # the OOM cell pairs with nothing


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
    from lorabench.analysis import scaling_table

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
    proc = run_cli("bench.py", [f"sweep_dir={tmp_path}"], check=False)
    assert proc.returncode != 0 and "holds no cells" in proc.stderr and "Traceback" not in proc.stderr
    # a half-written result: listed as incomplete, the rest still reported
    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "0" / "metrics.json").write_text('{"status": "ok", "metr')
    out = write_report(tmp_path)
    assert "No result (incomplete): 0" in out.markdown
    assert math.isfinite(len(out.files))


def test_bench_report_options_compose():
    proc = run_cli("bench.py", ["sweep_dir=x", "report.baseline=3", "report.dataset_samples=500", "--cfg", "job"])
    assert "dataset_samples: 500" in proc.stdout and "baseline: '3'" in proc.stdout
    assert (REPO / "conf" / "bench.yaml").is_file()


def test_a_slow_step_is_listed_with_the_garbage_collections_in_it(tmp_path):
    """A cell whose 5th timed step took 2x its median step: the table lists that step, its seconds, 2.00x and
    the full collections in it; steps at 1.5x or under, warmup steps and records from before the collector
    was measured (no gc fields: '-') behave as said; a cell without slow steps adds no row."""
    from lorabench.analysis import slow_steps_table

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
