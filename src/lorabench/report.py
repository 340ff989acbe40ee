"""The sweep report: every cell's metrics.json -> results.csv, results.md, plots/*.png, report.html.

Written at the end of every multirun (lorabench.sweep) and on demand with
`python bench.py suite=report sweep_dir=<dir>`, which also works on a sweep still running or
killed part-way: cells without a readable metrics.json are listed as incomplete. The tables come
from lorabench.analysis, the figures from lorabench.plots; this module lays out the page. Every
file is written to a temporary name and renamed, so a failed write leaves the previous one whole.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

from lorabench import analysis as an
from lorabench import projection as pj
from lorabench.config import ReportConfig
from lorabench.plots import gpu_projection, make_plots
from lorabench.results import CellResult, Status, atomic_write_text, load_results
from lorabench.search import load_searches


@dataclass
class Report:
    markdown: str
    files: list[Path]
    results: list[CellResult]
    axes: list[str]


def sections(results: list[CellResult], axes_: list[str], cfg: ReportConfig, curves, grid,
             searches) -> dict[str, str]:
    """The report's tables beyond the cells table, by title (empty ones left out)."""
    effects = an.knob_effects(results, axes_)
    backends = an.backend_table(results, axes_, searches)
    out = {
        "Knob effects": "\n".join(f"- {an.sentence(e)}" for e in effects),
        "Spread over repeated cells (train.seed)": an.spread_table(results, axes_),
        f"Slow steps (over {an.SLOW:g}x the cell's median step; the window's tok/s counts them, 'at p50' does not)":
            an.slow_steps_table(results, axes_),
        ("Backends: each one's best against hf's best, same rows and budget" if searches else
         "Backends: each one's fastest cell run against hf's (unsearched), same rows and budget"): backends,
        "Search: every cell tried per backend (search.json)": an.search_table(searches),
        "Loss curves against the reference cell (same data, same order)": an.loss_match_table(axes_, curves),
        "Where the step time goes (% of a profiled step)": an.bottleneck_table(results, axes_),
        "What fits (largest batch per seq_len)": an.fit_table(grid) if grid else "",
        "Scaling over GPUs (DDP, FSDP)": an.scaling_table(results, axes_),
        f"Projection for {cfg.dataset_samples:,} samples": an.projection_table(results, axes_, cfg),
    }
    return {title: text for title, text in out.items() if text}


def write_report(sweep_dir: Path, cfg: ReportConfig | None = None) -> Report:
    """Every file of the report."""
    cfg = cfg or ReportConfig()
    sweep_dir = Path(sweep_dir)
    if sweep_dir.is_file():
        raise NotADirectoryError(f"sweep_dir={str(sweep_dir)!r} is a file; give the dir of a multirun "
                                 "(outputs/sweeps/<time>)")
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep dir {str(sweep_dir)!r} does not exist")
    results, incomplete = load_results(sweep_dir)
    if not results and not incomplete:
        raise FileNotFoundError(f"{sweep_dir} holds no cells (no sub-directory with a .hydra folder): is it the "
                                "dir of a multirun (outputs/sweeps/<time>)?")
    results.sort(key=lambda r: r.job_num)
    if results and not any("train" in r.config for r in results):  # bench cells: a metrics table is the whole report
        md = an.metrics_table(results)
        atomic_write_text(sweep_dir / "results.md", md + "\n")
        return Report(md, [sweep_dir / "results.md"], results, [])
    axes_ = an.axes(results)
    an.baseline(results, cfg)  # a report.baseline that names no cell fails here, before any file
    notes = []
    if incomplete:
        notes.append("No result (incomplete): " + ", ".join(p.name for p in incomplete))
    if len({r.config.get("seq_len") for r in results}) > 1:
        notes.append("Cells differ in seq_len: samples/s is not comparable across them; compare non-pad tokens/s.")
    curves = an.loss_curves(results, axes_)  # each cell's steps.jsonl, read once for the table and the plot
    grid = an.fit_grid(results, axes_)
    searches = load_searches(sweep_dir)  # +experiment=tune's record of each backend's search
    extra = sections(results, axes_, cfg, curves, grid, searches)
    shared = an.constants(results)
    answer = an.answer(results, searches)
    md = (f"Answer:\n\n{answer}\n\n" if answer else "") + (f"All cells: {shared}.\n\n" if shared else "")
    md += an.cells_table(results, axes_, cfg)
    md += "".join(f"\n\n{n}" for n in notes) + "".join(f"\n\n{t}:\n\n{tab}" for t, tab in extra.items())
    plots = make_plots(results, axes_, cfg, sweep_dir / "plots", curves, grid)
    projected = write_projection(sweep_dir, results, [], [], cfg.dataset_samples) if cfg.project else None
    if projected and projected.rows:
        title = f"Projected onto other GPUs (USD per 1M non-pad tokens; {cfg.dataset_samples:,} samples)"
        extra[title] = projected.markdown
        md += f"\n\n{title}:\n\n{projected.markdown}"
        plots.update({p.stem: p for p in projected.files if p.suffix == ".png"})
    files = {"results.md": md + "\n",
             "results.csv": an.frame(results, cfg, incomplete).to_csv(index=False),
             "report.html": page(sweep_dir, results, axes_, notes, extra, plots, cfg, answer)}
    for name, text in files.items():
        atomic_write_text(sweep_dir / name, text)
    tables = [f for f in projected.files if f.suffix != ".png"] if projected else []  # its plot is among plots
    return Report(md, [sweep_dir / n for n in files] + list(plots.values()) + tables, results, axes_)


@dataclass
class Projected:
    markdown: str
    files: list[Path]
    rows: list


def write_projection(sweep_dir: Path, results: list[CellResult], targets: list[str], measured: list[str],
                     dataset_samples: int) -> Projected:
    """A sweep's ok cells projected onto GPUs (targets: conf/gpu option names; empty: every one with
    figures): projection.csv, plots/gpu_projection.png and, with measured cells on the targets, the
    check of each projection against them (projection_validation.csv)."""
    gpus = [pj.gpu_option(n) for n in (targets or pj.projectable())]  # an option without figures: refused here
    rows, notes = pj.project(results, gpus, dataset_samples)
    if not rows:
        return Projected("\n".join(notes), [], rows)
    pj.write_csv(rows, sweep_dir / "projection.csv")
    files = [sweep_dir / "projection.csv"]
    md = pj.summary(rows, notes, dataset_samples)
    if measured:
        points = [p for m in measured for p in pj.measured_points(Path(m), gpus)]
        checks = pj.validate(rows, points, results)
        md += "\n\nProjection against measured cells (error = predicted / measured - 1):\n\n" + pj.validation_table(checks)
        pj.write_csv(checks, sweep_dir / "projection_validation.csv")
        files.append(sweep_dir / "projection_validation.csv")
    atomic_write_text(sweep_dir / "projection.md", md + "\n")
    files.append(sweep_dir / "projection.md")
    (sweep_dir / "plots").mkdir(exist_ok=True)
    files.append(gpu_projection(rows, sweep_dir / "plots", dataset_samples))
    return Projected(md, files, rows)


def md_to_html(text: str) -> str:
    """A markdown table (with its notes) or a bullet list as HTML."""
    lines = text.splitlines()
    if lines and lines[0].startswith("- "):
        return "<ul>" + "".join(f"<li>{html.escape(x[2:])}</li>" for x in lines) + "</ul>"
    out, rows = [], []

    def flush():
        if rows:
            cells = lambda r, tag: "".join(f"<{tag}>{html.escape(c.strip())}</{tag}>" for c in r)  # noqa: E731
            out.append(f"<table><tr>{cells(rows[0], 'th')}</tr>"
                       + "".join(f"<tr{row_class(r)}>{cells(r, 'td')}</tr>" for r in rows[1:]) + "</table>")
            rows.clear()

    for line in lines:
        if line.startswith("|"):
            if not line.startswith("|---"):
                rows.append(line.strip().strip("|").split(" | "))
        else:
            flush()
            if line.strip():
                out.append(f"<p class='note'>{html.escape(line)}</p>")
    flush()
    return "".join(out)


def row_class(row: list[str]) -> str:
    """A cells-table row is marked by its status (failed and OOM rows coloured)."""
    word = row[1].split()[0] if len(row) > 1 and row[1].split() else ""
    return f" class='{word}'" if word in {s.value for s in Status} else ""


def page(sweep_dir: Path, results, axes_, notes, extra, plots, cfg, answer: str = "") -> str:
    imgs = "".join(f"<figure><img alt='{name}' src='data:image/png;base64,"
                   f"{base64.b64encode(path.read_bytes()).decode()}'><figcaption>{name}</figcaption></figure>"
                   for name, path in plots.items())
    shared = an.constants(results)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>lorabench: {html.escape(sweep_dir.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1300px}}table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}td:nth-child(-n+2){{text-align:left}}
p.note{{font-size:12px;color:#444}}tr.oom td,tr.skipped td{{background:#fbe3e4}}tr.failed td{{background:#eee}}
tr.interrupted td{{background:#fdebd3}}img{{max-width:100%}}figure{{margin:1em 0}}</style></head><body>
<h1>Sweep {html.escape(sweep_dir.name)}</h1>
{f"<h2>Answer</h2>{md_to_html(answer)}" if answer else ""}
<p>{len(results)} cells{html.escape(f" ({shared})" if shared else "")}; they differ in:
{html.escape(", ".join(axes_) or "nothing (one configuration)")}.
Non-pad tokens/s counts real tokens only, over the timed steps (warmup excluded).</p>
{"".join(f"<p><b>{html.escape(n)}</b></p>" for n in notes)}
{md_to_html(an.cells_table(results, axes_, cfg))}
{"".join(f"<h2>{html.escape(t)}</h2>{md_to_html(tab)}" for t, tab in extra.items())}
<h2>Plots</h2>{imgs}
</body></html>"""
