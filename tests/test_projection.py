"""The GPU projection (lorabench.projection) on the H100 and H200 run dirs committed in docs/runs:
the arithmetic of the model by hand, memory fit, refusal of a GPU option without figures, the CSV
other tools read, the check against measured cells, and the sweep report's section."""

import csv
import json
import shutil

import pytest
from conftest import REPO, run_cli

from lorabench import projection as pj
from lorabench.config import ReportConfig
from lorabench.report import write_report
from lorabench.results import load_results, read_result

H100 = REPO / "docs/runs/2026-11-24_h100_projection"
H200 = REPO / "docs/runs/2026-11-24_h200_projection"


def copy(src, dst):
    """A run dir to write into, without the projection files committed beside it."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("projection*", "gpu_projection.png"))
    return dst


def hw(path):
    return json.loads((path / "hardware/metrics.json").read_text())["metrics"]


def test_projection_reproduces_the_model_by_hand():
    """H100 seed baseline (seq 1024 x batch 4 = 4096 GEMM rows, a measured GEMM rate at exactly 4096)
    onto the H200 (measured) and the A10 (datasheet at the H100's measured fractions)."""
    r = read_result(H100 / "diagnostic/0/metrics.json")
    m, a, b = r.metrics, hw(H100), hw(H200)
    t = m["time/window_s"] / m["count/timed_steps"]
    compute = (m["prof/matmul_ms"] + m["prof/attention_ms"]) / 1e3
    memory = sum(m[f"prof/{k}_ms"] for k in ("dequant", "elementwise", "loss", "optimizer")) / 1e3
    data = m["prof/data_ms"] / 1e3
    host = t - compute - memory - data
    assert host > 0.1  # this H100 machine's step waited on its host: the part that does not scale

    rows, notes = pj.project([r], [pj.gpu_option(n) for n in ("h100", "h200", "a10")], 10_000)
    by = {x.target: x for x in rows}
    assert not notes and set(by) == {"h100", "h200", "a10"}
    # on its own GPU a cell is its measurement, never a projection
    assert by["h100"].measured and by["h100"].tokens_per_s == pytest.approx(m["perf/tokens_per_s"])
    assert "measured on h100" in by["h100"].basis

    h200 = (compute * a["hw/gemm_t4096_tflops"] / b["hw/gemm_t4096_tflops"]
            + memory * a["hw/elementwise_gbs"] / b["hw/elementwise_gbs"] + data
            + host * b["hw/launch_us"] / a["hw/launch_us"])
    assert not by["h200"].measured and by["h200"].step_time_s == pytest.approx(h200)
    assert by["h200"].tokens_per_s == pytest.approx(4096 / h200)
    # A10: 125 TFLOP/s and 600 GB/s (datasheet) at the fractions of their datasheet the H100 reached
    a10_rate = 125 * a["hw/gemm_t4096_tflops"] / 989
    a10_gbs = 600 * a["hw/elementwise_gbs"] / 3350
    a10 = compute * a["hw/gemm_t4096_tflops"] / a10_rate + memory * a["hw/elementwise_gbs"] / a10_gbs + data + host
    assert by["a10"].step_time_s == pytest.approx(a10)
    assert by["a10"].samples_per_s == pytest.approx(4 / a10)
    # money: $0.60/h on demand, $0.18 spot (conf/gpu/a10.yaml); hours for 10,000 samples
    assert by["a10"].usd_per_1m_tokens == pytest.approx(0.60 / 3600 * a10 / 4096 * 1e6)
    assert by["a10"].usd_per_1m_tokens_spot == pytest.approx(0.18 / 3600 * a10 / 4096 * 1e6)
    assert by["a10"].hours == pytest.approx(10_000 / (4 / a10) / 3600)
    assert by["a10"].usd == pytest.approx(by["a10"].hours * 0.60)
    assert "projected from h100" in by["a10"].basis and "datasheet" in by["a10"].basis


def test_interpolation_between_measured_gemm_shapes():
    table = {2048: 700.0, 8192: 600.0}
    assert pj.interp(table, 4096) == pytest.approx(650.0)  # halfway in log(rows)
    assert pj.interp(table, 512) == 700.0 and pj.interp(table, 65536) == 600.0  # flat outside


def test_a_cell_that_does_not_fit_a_smaller_gpu_is_marked():
    """fast, batch 24, no checkpointing: 58.6 GiB reserved. It fits 80 GB parts, not 24-48 GB ones."""
    r = read_result(H100 / "fast/auto_b24_ckpt0/metrics.json")
    peak = r.metrics["mem/peak_reserved_gib"]
    rows, _ = pj.project([r], [pj.gpu_option(n) for n in pj.projectable()], 10_000)
    fits = {x.target: x.fits for x in rows}
    assert fits == {n: peak + pj.MARGIN_GIB <= pj.gpu_option(n).memory_gib for n in fits}
    assert not fits["a10"] and not fits["l4"] and not fits["l40s"] and not fits["a100_40"]
    assert fits["a100_80"] and fits["h100"] and fits["h200"]
    assert pj.cheapest([x for x in rows]).fits
    assert "no fit" in pj.matrix_table(rows)


def test_a_gpu_option_without_figures_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"gpu option 'cpu' has no memory_gib, peak_bf16_tflops, memory_bandwidth_gbs"):
        pj.gpu_option("cpu")
    with pytest.raises(ValueError, match=r"no GPU option 'b200'"):
        pj.gpu_option("b200")
    copy(H100 / "fast", tmp_path / "fast")
    proc = run_cli("bench.py", ["suite=project", f"sweep_dir={tmp_path / 'fast'}", "target=[a10,cpu]"], check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("bench.py: gpu option 'cpu' has no")
    assert not (tmp_path / "fast/projection.csv").exists()


def test_project_suite_writes_the_csv_other_tools_read(tmp_path):
    copy(H100 / "fast", tmp_path / "fast")
    proc = run_cli("bench.py", ["suite=project", f"sweep_dir={tmp_path / 'fast'}", "target=[a10,l4,a100_40,a100_80,h100,h200]",
                                f"measured=[{H200 / 'fast'}]"])
    assert proc.returncode == 0
    rows = list(csv.DictReader(open(tmp_path / "fast/projection.csv")))
    assert {"cell", "target", "samples_per_s", "tokens_per_s", "step_time_s", "fits", "usd_per_1m_tokens",
            "basis"} <= set(rows[0])
    assert len(rows) == 2 * 6 and {r["target"] for r in rows} == {"a10", "l4", "a100_40", "a100_80", "h100", "h200"}
    assert all(r["basis"].startswith("measured on h100") == (r["target"] == "h100") for r in rows)
    # the check against the H200's own measurement of the same cells: error = predicted / measured - 1
    checks = list(csv.DictReader(open(tmp_path / "fast/projection_validation.csv")))
    measured = {r.cell: r.metrics["perf/tokens_per_s"] for r in load_results(H200 / "fast")[0]}
    predicted = {r["cell"]: float(r["tokens_per_s"]) for r in rows if r["target"] == "h200"}
    assert len(checks) == 2
    for c in checks:
        assert float(c["measured"]) == pytest.approx(measured[c["cell"]])
        assert float(c["error"]) == pytest.approx(predicted[c["cell"]] / measured[c["cell"]] - 1)
    assert "median |error|" in proc.stdout and (tmp_path / "fast/plots/gpu_projection.png").stat().st_size > 10_000


def test_without_a_profile_the_split_comes_from_the_flop_count():
    r = read_result(H100 / "diagnostic/4/metrics.json")
    r.metrics = {k: v for k, v in r.metrics.items() if not k.startswith("prof/")}
    h100 = pj.gpu_option("h100")
    s = pj.step_parts(r, h100)
    t = r.metrics["time/window_s"] / r.metrics["count/timed_steps"]
    # model FLOPs plus every checkpointed layer's second forward (2 x N x tokens), at the measured rate
    flops = r.metrics["perf/model_tflops"] * 1e12 * t + 2 * r.metrics["params/base_matmul"] * 4096
    assert s.compute == pytest.approx(flops / (h100.matmul_tflops(4096, h100) * 1e12))
    assert s.memory == pytest.approx(t - s.compute) and s.host == 0 and "FLOP count" in s.basis


def test_every_gpu_sweep_report_projects_its_cells(tmp_path):
    copy(H200 / "diagnostic", tmp_path / "d")
    out = write_report(tmp_path / "d", ReportConfig())
    assert "Projected onto other GPUs" in out.markdown and "cheapest (on demand)" in out.markdown
    assert (tmp_path / "d/projection.csv").exists() and (tmp_path / "d/plots/gpu_projection.png").exists()
    assert "gpu_projection" in (tmp_path / "d/report.html").read_text()
    assert "Projected onto other GPUs" not in write_report(tmp_path / "d", ReportConfig(project=False)).markdown


@pytest.mark.parametrize("profiled", [True, False], ids=["profile", "flop-count"])
def test_a_multi_gpu_cell_projects_onto_as_many_gpus_of_each_target(profiled):
    """The H100 seed cell made a 2-GPU cell (DDP or FSDP, one node) that scaled perfectly: twice the
    tokens, samples and model FLOPs in the same step time. Projected, each of its ranks runs the
    1-GPU cell's step: the same step time on every target, twice the tokens/s, at twice the price per
    hour (the same $/1M tokens), on 2 GPUs of the target, fitting where one rank fits one GPU."""
    import copy as copy_

    one = read_result(H100 / "diagnostic/0/metrics.json")
    if not profiled:  # the FLOP-count split (no profile)
        one.metrics = {k: v for k, v in one.metrics.items() if not k.startswith("prof/")}
    two = copy_.deepcopy(one)
    two.cell = "two"
    two.config["train"]["nproc"], two.config["train"]["parallel"] = 2, "fsdp"
    two.metrics["dist/world_size"] = 2
    for k in ("count/tokens_nonpad", "count/samples", "perf/model_tflops"):
        two.metrics[k] *= 2
    targets = [pj.gpu_option(n) for n in ("h100", "a10")]
    rows, notes = pj.project([one, two], targets, 10_000)
    assert not notes
    by = {(x.cell, x.target): x for x in rows}
    for t in ("h100", "a10"):
        a, b = by[(one.cell, t)], by[("two", t)]
        assert (a.gpus, b.gpus) == (1, 2) and b.on == f"2 x {t}"
        assert b.step_time_s == pytest.approx(a.step_time_s) and b.tokens_per_s == pytest.approx(2 * a.tokens_per_s)
        assert b.usd_per_1m_tokens == pytest.approx(a.usd_per_1m_tokens) and b.fits == a.fits
        assert b.hours == pytest.approx(a.hours / 2) and b.usd == pytest.approx(a.usd)
    assert "interconnect assumed of the source's kind" in by[("two", "a10")].basis
    nodes = copy_.deepcopy(two)
    nodes.config["train"]["nnodes"] = 2
    rows, notes = pj.project([nodes], targets, 10_000)
    assert not rows and "several nodes" in notes[0]
