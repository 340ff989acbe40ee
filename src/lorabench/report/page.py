"""The sweep report: every cell's metrics.json -> results.csv, results.md, slow_steps.md, plots/*.png,
report.html. Both pages open with the answer (analysis.headline) and the cells table; report.html then shows the
figures, then the tables.

Written at the end of every multirun (lorabench.sweep.callbacks) and on demand with
`python bench.py suite=report sweep_dir=<dir>`, which also works on a sweep still running or
killed part-way: a cell without a readable metrics.json is listed in the state it is in (corrupt, running,
killed, not started: lorabench.run.rundir.missing_cells). The tables come
from lorabench.report.analysis, the figures from lorabench.report.plots; this module lays out the page. Every
file is written to a temporary name and renamed, so a failed write leaves the previous one whole.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

from lorabench.core.config import ReportConfig
from lorabench.core.results import CellResult, Status, atomic_write_text, load_results, load_searches
from lorabench.report import analysis as an
from lorabench.report import projection as pj
from lorabench.report import quality as rq
from lorabench.report.plots import gpu_projection, make_plots
from lorabench.run.rundir import missing_cells


@dataclass
class Report:
    markdown: str  # results.md: the summary, then every table
    files: list[Path]
    results: list[CellResult]
    axes: list[str]
    summary: str = ""  # its opening: the answer, the cells table, its notes, the slow steps' line


def sections(results: list[CellResult], axes_: list[str], cfg: ReportConfig, curves, grid, searches,
             effects: list[an.Effect], answer: an.Answer) -> dict[str, str]:
    """The report's tables beyond the cells table, by title (empty ones left out). The knob effects stand here
    where the answer does not state them all (a knob of three values, a tune sweep)."""
    context = [s for s in searches if s.target == "max_context"]
    tuned = [s for s in searches if s.target != "max_context"]
    # (a max-context sweep's cells differ in seq_len: no two of them do equal work to set side by side)
    backends = an.backend_table(results, axes_, tuned) if tuned or not context else ""
    shown = all(e in answer.effects for e in effects)
    out = {
        "Longest context per backend (batch 1)": an.ceiling_table(results, context),
        "Where the memory goes at each ceiling (GiB: the memory model beside the measured peak)":
            an.ceiling_memory_table(results, context),
        **rq.sections(results, axes_),  # (cells that evaluated held-out data: time and $ to the target, parity)
        "Knob effects": "" if shown or context else "\n".join(f"- {an.sentence(e)}" for e in effects),
        "Spread over repeated cells (train.seed)": an.spread_table(results, axes_),
        ("Backends: each one's best against hf's best, same rows and budget" if tuned else
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
    missing = missing_cells(sweep_dir, results, incomplete)  # corrupt, killed, running, never started: named
    if not results and not missing:
        raise FileNotFoundError(f"{sweep_dir} holds no cells (no sub-directory with a .hydra folder): is it the "
                                "dir of a multirun (outputs/sweeps/<time>)?")
    results.sort(key=lambda r: r.job_num)
    if results and not any("train" in r.config for r in results):  # bench cells: a metrics table is the whole report
        md = an.metrics_table(results)
        atomic_write_text(sweep_dir / "results.md", md + "\n")
        return Report(md, [sweep_dir / "results.md"], results, [], md)
    axes_ = an.axes(results)
    an.baseline(results, cfg)  # a report.baseline that names no cell fails here, before any file
    notes = [f"No result for cell {m.job_num} ({m.cell}): {m.state}: {m.reason}" for m in missing]
    if len({r.config.get("seq_len") for r in results}) > 1:
        notes.append("Cells differ in seq_len: samples/s is not comparable across them; compare non-pad tokens/s.")
    curves = an.loss_curves(results, axes_)  # each cell's steps.jsonl, read once for the table and the plot
    grid = an.fit_grid(results, axes_)
    searches = load_searches(sweep_dir)  # +experiment=tune's record of each backend's search
    effects = an.knob_effects(results, axes_)
    reached = rq.to_target(results) if rq.uses_quality(results) else None
    answer = an.headline(results, axes_, effects, searches, rq.answer_lines(reached, axes_) if reached else [])
    slow = an.slow_steps(results, axes_)
    extra = sections(results, axes_, cfg, curves, grid, searches, effects, answer)
    projected, left_out = projection_section(sweep_dir, results, cfg)
    if left_out:
        notes.append(left_out)
    to_target = rq.cell_columns(reached) if reached else {}
    summary = opening(results, axes_, cfg, answer, notes, slow, to_target)
    md = summary + "".join(f"\n\n{t}:\n\n{tab}" for t, tab in extra.items())
    plots = make_plots(results, axes_, cfg, sweep_dir / "plots", curves, grid)
    if projected and projected.rows:
        title = f"Projected onto other GPUs (USD per 1M non-pad tokens; {cfg.dataset_samples:,} samples)"
        extra[title] = projected.markdown
        md += f"\n\n{title}:\n\n{projected.markdown}"
        plots.update({p.stem: p for p in projected.files if p.suffix == ".png"})
    files = {"results.md": md + "\n",
             "results.csv": an.frame(results, cfg, missing, to_target).to_csv(index=False),
             "report.html": page(sweep_dir, results, axes_, notes, extra, plots, cfg, answer, slow, to_target)}
    if slow.rows:
        files[an.SLOW_FILE] = f"{SLOW_TITLE}:\n\n{slow.table()}\n"
    for name, text in files.items():
        atomic_write_text(sweep_dir / name, text)
    if not slow.rows:
        (sweep_dir / an.SLOW_FILE).unlink(missing_ok=True)  # one an earlier report wrote would say otherwise
    tables = [f for f in projected.files if f.suffix != ".png"] if projected else []  # its plot is among plots
    return Report(md, [sweep_dir / n for n in files] + list(plots.values()) + tables, results, axes_, summary)


SLOW_TITLE = (f"Slow steps (over {an.SLOW:g}x the cell's median step; the window's tok/s counts them, 'at p50' "
              "does not)")


def opening(results: list[CellResult], axes_: list[str], cfg: ReportConfig, answer: an.Answer, notes: list[str],
            slow: an.SlowSteps, to_target: dict[int, dict] | None = None) -> str:
    """results.md's first lines, and all the console prints at a multirun's end: the answer, what every cell
    shares, the cells table, its notes, and the slow steps in one line."""
    shared = an.constants(results)
    md = f"{answer.markdown()}\n\n" + (f"All cells: {shared}.\n\n" if shared else "")
    md += an.cells_table(results, axes_, cfg, to_target) + "".join(f"\n\n{n}" for n in notes)
    return md + (f"\n\n{slow.line()}" if slow.line() else "")


@dataclass
class Projected:
    markdown: str
    files: list[Path]
    rows: list


def projection_section(sweep_dir: Path, results: list[CellResult], cfg: ReportConfig
                       ) -> tuple[Projected | None, str | None]:
    """The report's projection onto other GPUs, or the one line that says why it is left out: a GPU
    option's figures it could not read (a `measured.run` dir not there) cost this section, never the
    report nor the sweep's exit code."""
    if not cfg.project:
        return None, None
    try:
        return write_projection(sweep_dir, results, [], [], cfg.dataset_samples), None
    except (OSError, ValueError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"Projection onto other GPUs: left out: {why}"


def write_projection(out_dir: Path, results: list[CellResult], targets: list[str], measured: list[str],
                     dataset_samples: int) -> Projected:
    """Cells projected onto GPUs (targets: conf/gpu option names; empty: every one with figures), written
    into out_dir (the sweep's own dir for its report; a run dir of its own for `bench.py suite=project`):
    projection.csv, projection.md, plots/gpu_projection.png and, with measured cells on the targets, the
    check of each projection against them (projection_validation.csv)."""
    gpus = [pj.gpu_option(n) for n in (targets or pj.projectable())]  # an option without figures: refused here
    rows, notes = pj.project(results, gpus, dataset_samples)
    if not rows:
        return Projected("\n".join(notes), [], rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    pj.write_csv(rows, out_dir / "projection.csv")
    files = [out_dir / "projection.csv"]
    md = pj.summary(rows, notes, dataset_samples)
    if measured:
        points = [p for m in measured for p in pj.measured_points(Path(m), gpus)]
        checks = pj.validate(rows, points, results)
        md += "\n\nProjection against measured cells (error = predicted / measured - 1):\n\n" + pj.validation_table(checks)
        pj.write_csv(checks, out_dir / "projection_validation.csv")
        files.append(out_dir / "projection_validation.csv")
    atomic_write_text(out_dir / "projection.md", md + "\n")
    files.append(out_dir / "projection.md")
    (out_dir / "plots").mkdir(exist_ok=True)
    files.append(gpu_projection(rows, out_dir / "plots", dataset_samples))
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


def page(sweep_dir: Path, results, axes_, notes, extra, plots, cfg, answer: an.Answer, slow: an.SlowSteps,
         to_target: dict[int, dict] | None = None) -> str:
    """report.html: the answer and the cells table, then the figures, then the other tables; the slow steps
    folded away at the end (their count stands under the cells table)."""
    imgs = "".join(f"<figure><img alt='{name}' src='data:image/png;base64,"
                   f"{base64.b64encode(path.read_bytes()).decode()}'><figcaption>{name}</figcaption></figure>"
                   for name, path in plots.items())
    shared = an.constants(results)
    slow_rows = (f"<details><summary>{html.escape(SLOW_TITLE)}</summary>{md_to_html(slow.table())}</details>"
                 if slow.rows else "")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>lorabench: {html.escape(sweep_dir.name)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1300px}}table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}td:nth-child(-n+2){{text-align:left}}
p.note{{font-size:12px;color:#444}}tr.oom td,tr.skipped td{{background:#fbe3e4}}tr.failed td{{background:#eee}}
tr.interrupted td{{background:#fdebd3}}img{{max-width:100%}}figure{{margin:1em 0}}summary{{cursor:pointer}}</style>
</head><body>
<h1>Sweep {html.escape(sweep_dir.name)}</h1>
<h2>Answer</h2>{md_to_html(answer.text())}
<p>{len(results)} cells{html.escape(f" ({shared})" if shared else "")}; they differ in:
{html.escape(", ".join(axes_) or "nothing (one configuration)")}.
Non-pad tokens/s counts real tokens only, over the timed steps (warmup excluded).</p>
{"".join(f"<p><b>{html.escape(n)}</b></p>" for n in notes)}
{md_to_html(an.cells_table(results, axes_, cfg, to_target))}
{f"<p class='note'>{html.escape(slow.line())}</p>" if slow.rows else ""}
{f"<h2>Plots</h2>{imgs}" if imgs else ""}
{"".join(f"<h2>{html.escape(t)}</h2>{md_to_html(tab)}" for t, tab in extra.items())}
{slow_rows}
</body></html>"""
