"""The GPU projection (lorabench.report.projection) on the H100 and H200 run dirs committed in docs/runs:
the arithmetic of the model by hand, memory fit, refusal of a GPU option without figures, the CSV
other tools read (written into suite=project's own run dir, the dir it reads left as it was), the check
against measured cells, the sweep report's section (left out, alone, where a GPU's figures cannot be
read), and conf/gpu's measured figures: those of the hardware runs they name, and all a projection reads."""

import csv
import dataclasses
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, compose_cfg, run_cli
from omegaconf import OmegaConf

from lorabench.core.config import ReportConfig
from lorabench.core.results import load_results, read_result
from lorabench.report import projection as pj
from lorabench.report.page import write_report

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
    # A10: the published best-shape bf16 rate (59.5 TFLOP/s expected, 54-63) put on the H100's measured
    # scale (its rate at 4,096 rows over its published 794.5), and the published copy (515 GB/s, 469-537)
    # times the H100's elementwise / copy; host as measured (no A10 launch floor)
    shape = a["hw/gemm_t4096_tflops"] / 794.5
    to_elementwise = a["hw/elementwise_gbs"] / a["hw/device_copy_gbs"]
    a10 = {k: compute * a["hw/gemm_t4096_tflops"] / (rate * shape)
           + memory * a["hw/elementwise_gbs"] / (copy * to_elementwise) + data + host
           for k, rate, copy in (("slow", 54.0, 469), ("expected", 59.5, 515), ("fast", 63.0, 537))}
    assert by["a10"].step_time_s == pytest.approx(a10["expected"])
    assert by["a10"].samples_per_s == pytest.approx(4 / a10["expected"])
    assert by["a10"].tokens_per_s_low == pytest.approx(4096 / a10["slow"])
    assert by["a10"].tokens_per_s_high == pytest.approx(4096 / a10["fast"])
    # money: $0.60/h on demand, $0.18 spot (conf/gpu/a10.yaml); hours for 10,000 samples
    a10 = a10["expected"]
    assert by["a10"].usd_per_1m_tokens == pytest.approx(0.60 / 3600 * a10 / 4096 * 1e6)
    assert by["a10"].usd_per_1m_tokens_spot == pytest.approx(0.18 / 3600 * a10 / 4096 * 1e6)
    assert by["a10"].hours == pytest.approx(10_000 / (4 / a10) / 3600)
    assert by["a10"].usd == pytest.approx(by["a10"].hours * 0.60)
    assert "projected from h100" in by["a10"].basis and "published GEMM rates" in by["a10"].basis


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
    assert fits == {n: peak + pj.margin_gib(pj.gpu_option(n)) <= pj.gpu_option(n).memory_gib for n in fits}
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
    proc = run_cli("bench.py", ["suite=project", f"sweep_dir={tmp_path / 'fast'}", "target=[a10,cpu]",
                                f"hydra.run.dir={tmp_path / 'out'}"], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr  # a bad value: exit 2, as train.py
    assert proc.stderr.strip().splitlines()[-1].startswith("bench.py: gpu option 'cpu' has no")
    assert not list(tmp_path.rglob("projection.csv"))


def hashes(d):
    """Every file below d by its path, as its sha256."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def test_project_suite_writes_the_csv_other_tools_read(tmp_path):
    """Into its own run dir: the dir it reads (a committed run, its own projection files included) is left
    as it was, byte for byte."""
    shutil.copytree(H100 / "fast", tmp_path / "fast")
    before = hashes(tmp_path / "fast")
    out = tmp_path / "out"
    proc = run_cli("bench.py", ["suite=project", f"sweep_dir={tmp_path / 'fast'}",
                                "target=[a10,l4,a100_40,a100_80,h100,h200]", f"measured=[{H200 / 'fast'}]",
                                f"hydra.run.dir={out}"])
    assert proc.returncode == 0
    assert hashes(tmp_path / "fast") == before
    written = {"projection.csv", "projection.md", "projection_validation.csv", "plots/gpu_projection.png"}
    assert written <= set(hashes(out))
    rows = list(csv.DictReader(open(out / "projection.csv")))
    assert {"cell", "target", "samples_per_s", "tokens_per_s", "step_time_s", "fits", "usd_per_1m_tokens",
            "basis"} <= set(rows[0])
    assert len(rows) == 2 * 6 and {r["target"] for r in rows} == {"a10", "l4", "a100_40", "a100_80", "h100", "h200"}
    assert all(r["basis"].startswith("measured on h100") == (r["target"] == "h100") for r in rows)
    # the check against the H200's own measurement of the same cells: error = predicted / measured - 1
    checks = list(csv.DictReader(open(out / "projection_validation.csv")))
    measured = {r.cell: r.metrics["perf/tokens_per_s"] for r in load_results(H200 / "fast")[0]}
    predicted = {r["cell"]: float(r["tokens_per_s"]) for r in rows if r["target"] == "h200"}
    assert len(checks) == 2
    for c in checks:
        assert float(c["measured"]) == pytest.approx(measured[c["cell"]])
        assert float(c["error"]) == pytest.approx(predicted[c["cell"]] / measured[c["cell"]] - 1)
    assert "median |error|" in proc.stdout and (out / "plots/gpu_projection.png").stat().st_size > 10_000


def test_the_measured_figures_are_those_of_the_hardware_run_their_comment_names():
    """conf/gpu's `measured:` figures are copies of a committed `bench.py suite=hardware` run's metrics.json,
    named on the `# measured by:` line above them (command, GPU, run dir): they cannot drift from it."""
    options = 0
    for path in sorted((REPO / "conf/gpu").glob("*.yaml")):
        measured = OmegaConf.to_container(OmegaConf.load(path)).get("measured")
        lines = [x for x in path.read_text().splitlines() if x.startswith("# measured by: ")]
        assert bool(measured) == bool(lines), path.name
        if not measured:
            continue
        options += 1
        [line] = lines
        command, device, run = re.fullmatch(r"# measured by: (.+) on an? (.+), (\S+)", line).groups()
        r = read_result(REPO / run / "metrics.json")
        assert command == f"python bench.py suite=hardware model={r.config['model']['name']}"
        assert r.config["suite"] == "hardware" and r.gpu["device_name"] == device, path.name
        assert pj.read_hardware(REPO / run) == measured, path.name
    assert options >= 2
    # `measured: {run: <dir>}` alone reads the same figures from the run dir
    read, h100 = pj.measured_figures("h100", {"run": str(H100 / "hardware")}), pj.gpu_option("h100")
    assert (read["gemm"], read["copy_gbs"], read["elementwise_gbs"], read["launch_us"]) == \
        (h100.gemm, h100.copy_gbs, h100.elementwise_gbs, h100.launch_us)
    assert read["source"] == f"measured: {H100 / 'hardware'}" and h100.source == "measured: conf/gpu/h100.yaml"


def test_a_projection_reads_nothing_of_docs(tmp_path):
    """From a copy of src/ and conf/ alone (a checkout without docs/runs, the image): every GPU option with
    figures is read, and a cell projects onto each as it does here."""
    for d in ("src", "conf"):
        shutil.copytree(REPO / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(H100 / "diagnostic/0/metrics.json", tmp_path / "cell.json")
    script = ("import json\n"
              "from lorabench.core.results import read_result\n"
              "from lorabench.report import projection as pj\n"
              "gpus = [pj.gpu_option(n) for n in pj.projectable()]\n"
              "rows, _ = pj.project([read_result('cell.json')], gpus, 10_000)\n"
              "print(json.dumps({r.target: r.step_time_s for r in rows}))\n")
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(tmp_path / "src")}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    gpus = [pj.gpu_option(n) for n in pj.projectable()]
    rows, _ = pj.project([read_result(H100 / "diagnostic/0/metrics.json")], gpus, 10_000)
    assert json.loads(proc.stdout.splitlines()[-1]) == {r.target: r.step_time_s for r in rows}


@pytest.fixture
def h100_unreadable(tmp_path, monkeypatch):
    """conf/gpu with the H100's figures replaced by a hardware run dir that is not there."""
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf/gpu", conf / "gpu")
    o = OmegaConf.load(conf / "gpu/h100.yaml")
    o.measured = {"run": str(tmp_path / "no_such_run")}
    OmegaConf.save(o, conf / "gpu/h100.yaml")
    monkeypatch.setattr(pj, "CONF_DIR", conf)
    pj.gpu_option.cache_clear()
    yield
    pj.gpu_option.cache_clear()


def test_a_hardware_run_that_is_not_there_leaves_out_the_projection_only(tmp_path, h100_unreadable, capsys):
    """The multirun's end (SweepSummary): the report is written, its projection left out with one line
    naming the run dir, and the exit code is the cells' (0: no SystemExit)."""
    from lorabench.sweep.callbacks import SweepSummary

    with pytest.raises(FileNotFoundError, match="no_such_run"):
        pj.gpu_option("h100")
    d = copy(H100 / "fast", tmp_path / "fast")
    SweepSummary().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(d)}}}))
    out = capsys.readouterr()
    assert "could not be written" not in out.err and out.err.strip().splitlines()[-1].startswith("cells: 2 = 2 ok")
    md = (d / "results.md").read_text()
    [note] = [x for x in md.splitlines() if x.startswith("Projection onto other GPUs: left out: ")]
    assert "no_such_run" in note and "Projected onto other GPUs" not in md
    assert "left out" in (d / "report.html").read_text() and not (d / "projection.csv").exists()


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


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_every_gpu_sweep_report_projects_its_cells(tmp_path):
    copy(H200 / "diagnostic", tmp_path / "d")
    out = write_report(tmp_path / "d", ReportConfig())
    assert "Projected onto other GPUs" in out.markdown and "cheapest (on demand)" in out.markdown
    assert (tmp_path / "d/projection.csv").exists() and (tmp_path / "d/plots/gpu_projection.png").exists()
    assert "gpu_projection" in (tmp_path / "d/report.html").read_text()
    assert "Projected onto other GPUs" not in write_report(tmp_path / "d", ReportConfig(project=False)).markdown


def test_every_projected_figure_is_an_ordered_range():
    """low <= expected <= high for tokens/s, samples/s, $/1M tokens and hours, on every target; a
    measured target's range is its one measurement."""
    rs = load_results(H100 / "diagnostic")[0] + load_results(H100 / "fast")[0]
    rows, _ = pj.project(rs, [pj.gpu_option(n) for n in pj.projectable()], 10_000)
    assert len(rows) == 8 * len(pj.projectable())
    for r in rows:
        assert r.tokens_per_s_low <= r.tokens_per_s <= r.tokens_per_s_high
        assert r.samples_per_s_low <= r.samples_per_s <= r.samples_per_s_high
        assert r.usd_per_1m_tokens_low <= r.usd_per_1m_tokens <= r.usd_per_1m_tokens_high
        assert r.hours_low <= r.hours <= r.hours_high
        if r.target in ("h100", "h200"):
            assert r.tokens_per_s_low == r.tokens_per_s_high  # measured figures, no range
        else:  # a published or modelled rate: a range of its own, with its expected error beside it
            assert r.tokens_per_s_low < r.tokens_per_s_high and r.expected_error
    md = pj.summary(rows, [], 10_000)
    assert "(" in md.splitlines()[2] and "Fits: measured peak reserved plus a margin per GPU" in md


def test_the_memory_margin_is_per_card():
    """CUDA context 0.24 GiB + local memory (SMs x threads per SM x 1 KiB) + 0.5 GiB for the allocator:
    an A10 0.85 GiB, an H100 1.0, so a cell 0.9 GiB below an A10's 22 GiB fits it."""
    a10, h100 = pj.gpu_option("a10"), pj.gpu_option("h100")
    assert pj.margin_gib(a10) == pytest.approx(0.5 - 132 * 2048 / 2**20 + 72 * 1536 / 2**20 + 0.5)
    assert pj.margin_gib(h100) == pytest.approx(1.0)
    r = read_result(H100 / "diagnostic/0/metrics.json")
    r.metrics["mem/peak_reserved_gib"] = a10.memory_gib - 0.9
    by = {x.target: x for x in pj.project([r], [a10, pj.gpu_option("l4")], 10_000)[0]}
    assert by["a10"].fits and by["a10"].margin_gib == pytest.approx(pj.margin_gib(a10))
    assert r.metrics["mem/peak_reserved_gib"] + pj.MARGIN_GIB > a10.memory_gib  # the old 1 GiB would refuse it
    r.metrics["mem/peak_reserved_gib"] = a10.memory_gib - 0.8
    assert not pj.project([r], [a10], 10_000)[0][0].fits


def test_without_published_rates_the_physical_model_gives_the_range():
    """A GPU with no published GEMM or copy rate: its clock under the board's power limit (cube root of
    watts per SM against the source's; low at the base clock, high at none) and its memory type's share."""
    h100 = pj.gpu_option("h100")
    a10 = dataclasses.replace(pj.gpu_option("a10"), published_gemm=None, published_copy=None)
    share = 794.5 / 989
    clock = (150 / 72 / (700 / 132)) ** (1 / 3)
    assert pj.clock_model(a10, h100, share) == pytest.approx(
        (125 * share * 885 / 1695, 125 * share * clock, 125 * 0.869))
    low, mid, high = a10.matmul_range(4096, h100)
    assert low < mid < high and mid == pytest.approx(125 * share * clock * 694.7233 / 794.5, rel=1e-6)
    assert a10.copy_range(h100)[0] == pytest.approx((0.78 * 600, 0.86 * 600, 0.895 * 600))
    hbm = dataclasses.replace(pj.gpu_option("a100_40"), published_copy=None)
    s = h100.copy_gbs / 3350
    assert hbm.copy_range(h100)[0] == pytest.approx((1555 * s * 0.9, 1555 * s, 1555 * s))


def test_a_rate_range_out_of_order_is_refused_by_name():
    from lorabench.core.config import GpuConfig
    bad = r"^gpu.achieved_gemm_tflops=\[60.0, 50.0, 70.0\]: expected \[low, expected, high\]"
    with pytest.raises(ValueError, match=bad):
        GpuConfig(name="x", achieved_gemm_tflops=[60.0, 50.0, 70.0])


def validation_script():
    path = REPO / "docs/runs/scripts/projection_validation.py"
    spec = importlib.util.spec_from_file_location("projection_validation", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_seed_a10_cells_validate_the_projection_and_the_docs_say_so():
    """The seed study's six A10 cells (docs/runs/seed_a10) predicted from their source cells as the seed ran them
    (+experiment=seed_a10_check: eager attention; docs/runs/2026-11-27_seed_check) on two H100s and one H200: the
    issue's thresholds, median <= 10% and worst <= 20%, hold from each; the two H100s' 12 cells pooled are the
    figure that conf/gpu/a10.yaml prints beside every A10 projection and docs/projection.md states."""
    gpus = [pj.gpu_option(n) for n in pj.projectable()]
    seed = pj.measured_points(REPO / "docs/runs/seed_a10/diagnostic.csv", gpus)
    assert len(seed) == 6
    every = []
    for name in ("eager_s3", "eager_s4", "eager_h3"):
        results = load_results(REPO / "docs/runs/2026-11-27_seed_check" / name)[0]
        assert {r.config["model"]["attn_implementation"] for r in results} == {"eager"}
        rows, _ = pj.project(results, [pj.gpu_option("a10")], 1)
        checks = pj.validate(rows, seed, results)
        assert len(checks) == 6 and all(c["predicted_low"] <= c["predicted"] <= c["predicted_high"] for c in checks)
        (med, worst, n), = pj.errors(checks).values()
        assert med <= 0.10 and worst <= 0.20, (name, med, worst)
        every += checks
    (med, worst, n), = [v for (src, _), v in pj.errors(every).items() if src == "h100"]
    assert n == 12
    assert [round(100 * med, 1), round(100 * worst, 1)] == list(pj.gpu_option("a10").validated_error_pct)
    doc = (REPO / "docs/projection.md").read_text()
    assert f"h100 -> a10: median |error| {100 * med:.1f}%, largest {100 * worst:.1f}% over 12 cells" in doc


def test_the_docs_validation_tables_are_what_the_code_writes():
    """docs/projection.md's validation block is the script's output (no hand-typed figure), and every
    validated_error_pct in conf/gpu is its median and largest error for that target."""
    mod = validation_script()
    doc = (REPO / "docs/projection.md").read_text()
    assert mod.block() in doc and mod.block("a10 steps") in doc
    figures = {}  # target -> (median, largest) of its one source, or of every source's cells pooled
    for line in mod.block().splitlines():
        if line.startswith("- ") and "median |error|" in line:
            pair = line[2:].split(":")[0].split(" -> ")
            med, worst = (float(x) for x in re.findall(r"([\d.]+)%", line))
            if pair != ["h200", "a10"]:  # the A10 states the H100s' validation, the issue's reference
                figures[pair[-1]] = [med, worst]  # a pooled line comes after its target's sources
    assert "\n- h100 -> l4: median |error|" in mod.block()  # the amended source cell's (docs/runs/trl_l4)
    for tgt, figure in figures.items():
        if tgt != "a10":
            assert list(pj.gpu_option(tgt).validated_error_pct) == figure, tgt


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


def test_the_seed_a10_figures_name_the_cells_of_their_experiment():
    """docs/runs/seed_a10/diagnostic.csv names each of the seed's six A10 figures by the cell of
    +experiment=seed_a10_check that computes the same work: the diagnostic's cells, each with the eager attention
    the seed's transformers (4.36.2) ran for Mistral, and nothing else changed."""
    from lorabench.core.results import cell_name
    from lorabench.sweep import grid

    # Both sweep the same conf/diag deltas (the sweeper's params), so the experiments' own configs differing in the
    # attention alone is each cell's differing in it alone.
    check, diag = (compose_cfg([f"+experiment={name}"], return_hydra_config=True)
                   for name in ("seed_a10_check", "diagnostic"))
    assert check.hydra.sweeper.params == diag.hydra.sweeper.params
    cells = grid.expand(["+experiment=seed_a10_check"], check.hydra.sweeper.params)
    rows = list(csv.DictReader((REPO / "docs/runs/seed_a10/diagnostic.csv").open()))
    assert {r["cell"] for r in rows} == {cell_name(c, cells) for c in cells} and len(rows) == 6
    a, b = ({k: v for k, v in OmegaConf.to_container(c).items() if k != "hydra"} for c in (check, diag))
    assert (a["model"].pop("attn_implementation"), b["model"].pop("attn_implementation")) == ("eager", "sdpa")
    assert a == b


def test_the_published_a100_figures_name_the_cells_of_their_experiment():
    """docs/runs/fms_a100_80/tokens.csv (fms-acceleration's A100-80GB table) names each figure by the cell of
    +experiment=fms_a100_check that computes the same work, so `bench.py suite=project ... measured=[it]`
    meets them; each figure is its run's 100 steps x batch x 4,096 tokens over the published runtime."""
    from lorabench.core.results import cell_name
    from lorabench.sweep import grid

    cfg = compose_cfg(["+experiment=fms_a100_check"], return_hydra_config=True)
    cells = grid.expand(["+experiment=fms_a100_check"], cfg.hydra.sweeper.params)
    rows = list(csv.DictReader((REPO / "docs/runs/fms_a100_80/tokens.csv").open()))
    assert {r["cell"] for r in rows} == {cell_name(c, cells) for c in cells} and len(rows) == 4
    assert {r["target"] for r in rows} == {"a100_80"}
    runtime_s = {"batch=4,precision=bf16": 492.8771, "batch=4,precision=nf4": 564.2301}  # as published
    for r in rows:
        if r["cell"] in runtime_s:
            assert float(r["tokens_per_s"]) * runtime_s[r["cell"]] == pytest.approx(100 * 4 * 4096, rel=1e-6)
