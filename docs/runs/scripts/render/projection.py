"""How far bench.py's projection onto another GPU is from a measurement on that GPU: the cells of
docs/runs/scripts/projection_validation.py (the figures docs/projection.md details), summed up per pair of GPUs."""
import statistics
from pathlib import Path

import projection_validation as pv

from lorabench.core.results import load_cells
from lorabench.report.projection import gpu_option, measured_points, project, projectable, validate

from .runs import RUNS, link, md_table


def checked_against(path: Path) -> str:
    """Where a target GPU's figures come from: a published measurement (its README's title) or cells here."""
    run = path.relative_to(RUNS).parts[0]
    if path.suffix == ".csv":
        return (RUNS / run / "README.md").read_text().splitlines()[0].lstrip("# ") + f" ({link(run)})"
    return "this repo's cells on that GPU, " + link(str(path.relative_to(RUNS)))


def checks() -> dict[tuple[str, str, str], list[dict]]:
    """{(source GPU, target GPU, what the target's figures are): [each cell's check]} over pv.RUNS."""
    gpus = [gpu_option(n) for n in projectable()]
    out = {}
    for path, measured in pv.RUNS:
        results = load_cells(path)
        for m in measured:
            points = measured_points(m, gpus)
            rows, _ = project(results, [gpu_option(n) for n in sorted({p["target"] for p in points})], 1)
            for c in validate(rows, points, results):
                out.setdefault((c["source"], c["target"], checked_against(m)), []).append(c)
    return out


def projection() -> str:
    rows = []
    for (src, tgt, against), cs in checks().items():
        err = [abs(c["error"]) for c in cs]
        ranged = [c for c in cs if c["in_range"] is not None]  # a measured GPU's projection is one figure
        inside = f"{sum(c['in_range'] for c in ranged)} of {len(ranged)}" if ranged else "-"
        rows.append([src, tgt, len(cs), f"{100 * statistics.median(err):.1f}%", f"{100 * max(err):.1f}%",
                     inside, against])
    return "\n\n".join([
        "## Projection onto other GPUs: how far off it is",
        "`python bench.py suite=project sweep_dir=<your sweep>` projects measured cells onto GPUs you did not measure "
        "(each figure a range). Checked against measurements of the same cells on the target GPU: error is projected "
        "over measured tokens/s (or samples/s) minus 1, per cell, its median and largest taken of its size whatever "
        "its sign; in range counts the measurements inside the projected range ('-': onto a GPU whose rates were "
        "measured, the H100 and the H200, a projection is one figure).",
        md_table(["measured on", "projected onto", "cells", "median error", "largest", "in range", "checked against"],
                 rows),
        "Every cell, the method and what it misses: [projection.md](projection.md). Table: "
        "`python docs/runs/scripts/results.py projection`; the cells: "
        "`python docs/runs/scripts/projection_validation.py`."])
