"""The report's figures stay legible from 2 to 60+ cells, and report.html shows every one of them in
a real browser. The sweeps here are made of result files (no training): 60 cells with long names,
OOM, failed and skipped cells among them."""

import itertools
import shutil
import subprocess
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from lorabench.core.config import ReportConfig
from lorabench.core.results import CellResult, Status, write_result
from lorabench.report import plots
from lorabench.report.page import write_report

BACKENDS = ["fast-liger-rms-norm-rope-swiglu-fused-linear-cross-entropy", "hf-as-the-seed-study-published-it",
            "unsloth-2026.10.9-offloaded-checkpointing"]


def cell(num, backend, batch, fraction, gpu="a10", seq_len=512):
    """A plausible result: tok/s and memory grow with batch, some cells out of memory or failed."""
    status = Status.ok
    if batch == 32 and fraction < 0.5:
        status = Status.oom
    elif batch == 32 and fraction == 0.5:
        status = Status.skipped
    elif num == 7:
        status = Status.failed
    config = {"seq_len": seq_len, "batch": batch, "model": {"name": "mistral-7b-v0.3"}, "precision": {"name": "nf4"},
              "backend": {"name": backend.split("-")[0]},
              "data": {"kind": "sharegpt", "packing": backend.startswith("fast")}, "gpu": {"name": gpu},
              "train": {"checkpoint_fraction": fraction, "nproc": 1, "seed": 0}}
    tok = 4000.0 * (1 + batch / 16) * (2 - fraction) * (1.5 if backend.startswith("fast") else 1)
    metrics = {} if status is not Status.ok else {
        "perf/tokens_per_s": tok, "perf/samples_per_s": tok / 480, "perf/total_tokens_per_s": tok * 1.05,
        "perf/step_time_p50_s": batch * 480 / tok, "mem/peak_reserved_gib": 6 + batch * (1.2 - fraction) / 2,
        "mem/budget_gib": 22.0, "cost/usd_per_hour": 2.0, "cost/usd_per_1m_tokens": 2.0 / 3600 / tok * 1e6,
        "cost/usd_per_1k_samples": 2.0 / 3600 / (tok / 480) * 1e3, "count/tokens_nonpad": 20 * batch * 480,
        "count/samples": 20 * batch, "count/timed_steps": 20, "gpu/energy_j": 500.0 * batch * 480 * 20 / tok,
        "time/window_s": 20 * batch * 480 / tok, "perf/model_tflops": tok * 4 * 7.1e9 / 1e12,
        "params/base_matmul": 7.1e9}
    return CellResult(status, f"backend={backend},batch={batch}", num, config=config, metrics=metrics,
                      choices={"backend": backend, "gpu": gpu, "model": "mistral-7b-v0.3", "precision": "nf4",
                               "data": "sharegpt"},
                      error={Status.oom: "CUDA out of memory. Tried to allocate 2.00 GiB",
                             Status.failed: "ValueError: a reason long enough to need the note under the table " * 3,
                             Status.skipped: "does not fit: cell 3 ran out of memory"}.get(status),
                      gpu={"device_name": "NVIDIA H100 80GB HBM3", "budget_gib": 22.0})


def sweep_dir(tmp_path, results) -> Path:
    for r in results:
        d = tmp_path / str(r.job_num)
        (d / ".hydra").mkdir(parents=True)
        write_result(d / "metrics.json", r)
    return tmp_path


def sixty(tmp_path):
    grid = itertools.product(BACKENDS, [4, 8, 16, 32], [1, 0.75, 0.5, 0.25, 0])
    return sweep_dir(tmp_path, [cell(n, *g) for n, g in enumerate(grid)])


def texts(fig):
    """Every visible, non-empty text of a drawn figure with its box in display pixels."""
    renderer = fig.canvas.get_renderer()
    hidden = set()  # tick labels past an axis' limits exist as objects but are not drawn
    for ax in fig.axes:
        for axis, (lo, hi) in ((ax.xaxis, sorted(ax.get_xlim())), (ax.yaxis, sorted(ax.get_ylim()))):
            for tick in axis.get_major_ticks():
                if not lo - 1e-9 <= tick.get_loc() <= hi + 1e-9:
                    hidden.update({id(tick.label1), id(tick.label2)})
    return [(t.get_text(), t.get_window_extent(renderer)) for t in fig.findobj(plt.Text)
            if t.get_visible() and t.get_text().strip() and id(t) not in hidden]


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_sixty_cells_with_long_names_stay_legible(tmp_path, monkeypatch):
    """No text is clipped by the figure's edge, none overlaps another, and every cell of the sweep
    is drawn, OOM, failed and skipped ones marked in words."""
    figures = []
    monkeypatch.setattr(plots.plt, "close", lambda fig: figures.append(fig))
    # Drawn once below (the layout runs in that draw): no PNG needs encoding here, which halves the time.
    monkeypatch.setattr(plots.plt.Figure, "savefig", lambda fig, path, **kw: Path(path).write_bytes(b""))
    report = write_report(sixty(tmp_path), ReportConfig())
    assert len(report.results) == 60 and len(figures) >= 6
    for fig in figures:
        fig.canvas.draw()
        page = fig.bbox
        boxes = texts(fig)
        name = fig.get_suptitle().splitlines()[0]
        for text, box in boxes:
            assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1 and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, \
                (name, text, box, page)
        for (ta, a), (tb, b) in itertools.combinations(boxes, 2):
            assert not a.overlaps(b) or a.width * b.width == 0, (name, ta, tb)
    drawn = {fig.get_suptitle().splitlines()[0]: fig for fig in figures}
    assert "Cost against time on each GPU (projected; lorabench.report.projection)" in drawn  # 60 cells x 7 GPUs
    bars = drawn["Throughput per cell"]
    words = [t.get_text().strip() for t in bars.findobj(plt.Text)]
    legend = {t.get_text() for t in bars.axes[0].get_legend().get_texts()}
    assert legend == {"ok", "oom", "failed", "skipped"}  # a legend for the colours, not a title
    assert words.count("OOM") == 6 and words.count("failed") == 1 + 1 and words.count("skipped") == 3 + 1
    assert len(bars.axes[0].get_yticklabels()) == 60  # every cell has its row
    # the title says what every cell shares
    assert "mistral-7b-v0.3, nf4, GPU a10, data sharegpt, on NVIDIA H100 80GB HBM3, budget 22 GiB" in bars.get_suptitle()


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_a_2d_sweep_is_drawn_as_heatmaps_faceted_by_gpu(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots.plt, "close", lambda fig: figures.append(fig))
    results = [cell(n, "fast", b, 1, gpu=g, seq_len=s)
               for n, (g, s, b) in enumerate(itertools.product(["a10", "auto"], [512, 1024, 2048], [4, 8, 16, 32]))]
    write_report(sweep_dir(tmp_path, results))
    heat = next(f for f in figures if f.get_suptitle().startswith("seq_len x batch"))
    assert len(heat.axes) == 4  # tok/s and memory, one row per gpu option
    assert {ax.get_title() for ax in heat.axes} == {"non-pad tok/s, gpu=a10", "peak resv GiB, gpu=a10",
                                                   "non-pad tok/s, gpu=auto", "peak resv GiB, gpu=auto"}


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="no chromium: `apt-get install chromium` (Debian) runs this test; "
                                               ".ci/run installs it")
def test_report_page_shows_every_plot_in_a_browser(tmp_path):
    """report.html in headless Chromium: a screenshot of the page, and the page's own count of
    images that did not load (none), and of images (one per plot file)."""
    d = sweep_dir(tmp_path / "sweep", [cell(n, b, 8, f) for n, (b, f) in enumerate(itertools.product(BACKENDS, [1, 0]))])
    report = write_report(d)
    probe = d / "probe.html"  # the page plus a script that writes what the browser sees into the DOM
    probe.write_text((d / "report.html").read_text().replace("</body>", """<script>
window.addEventListener('load', () => { const imgs = [...document.images];
  document.body.insertAdjacentHTML('beforeend', `<pre id="probe">images=${imgs.length} broken=${
    imgs.filter(i => !i.complete || i.naturalWidth === 0).length}</pre>`); });</script></body>"""))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([chromium(), *flags, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    n_plots = len([f for f in report.files if f.suffix == ".png"])
    assert f"images={n_plots} broken=0" in dom, dom[-500:]
    shot = tmp_path / "page.png"
    subprocess.run([chromium(), *flags, f"--screenshot={shot}", "--window-size=1300,2000", probe.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000  # a page, not a blank


def test_a_report_that_fails_to_render_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    d = sweep_dir(tmp_path, [cell(n, b, 8, 1) for n, b in enumerate(BACKENDS)])
    write_report(d)
    before = {f: (d / f).read_bytes() for f in ("report.html", "results.md", "results.csv")}

    def broken(*a, **k):
        raise RuntimeError("a plot that cannot be drawn")

    monkeypatch.setattr("lorabench.report.page.make_plots", broken)
    with pytest.raises(RuntimeError, match="cannot be drawn"):
        write_report(d)
    assert {f: (d / f).read_bytes() for f in before} == before and not list(d.glob(".*.tmp"))
