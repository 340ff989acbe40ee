"""docs/projection.md's validation section, from the committed run dirs (run from the repository root):

    python docs/runs/scripts/projection_validation.py          # rewrites the two blocks between their markers
    python docs/runs/scripts/projection_validation.py --check  # exit 1 if a block is not what it writes

The H100 and H200 runs of 2026-11-24 projected onto each other; the seed study's six A10 cells (its published
diagnostic, docs/runs/seed_a10) from their source cells as the seed's software ran them (+experiment=seed_a10_check,
2026-11-27_seed_check: two H100s and one H200); the H100 run of 2026-11-26 onto the A100-80GB (fms-acceleration's
published table, docs/runs/fms_a100_80); the H100 cell of 2026-11-26_l4mem onto the L4 (a published TRL notebook's
run, docs/runs/trl_l4, as amended); then the physical model against the published GEMM rates. The second block:
the same six A10 figures from the source cells used before, which were not the seed's work.
"""

import sys

from lorabench.core.results import REPO, load_cells
from lorabench.report.analysis import md_table
from lorabench.report.projection import (
    errors,
    gpu_option,
    measured_points,
    project,
    projectable,
    step_parts,
    validate,
    validation_markdown,
)

R = REPO / "docs/runs"
SEED = R / "seed_a10/diagnostic.csv"
CHECK = R / "2026-11-27_seed_check"
RUNS = [
    (R / "2026-11-24_h100_projection/diagnostic", [R / "2026-11-24_h200_projection/diagnostic"]),
    (R / "2026-11-24_h100_projection/fast", [R / "2026-11-24_h200_projection/fast"]),
    (R / "2026-11-24_h200_projection/diagnostic", [R / "2026-11-24_h100_projection/diagnostic"]),
    (R / "2026-11-24_h200_projection/fast", [R / "2026-11-24_h100_projection/fast"]),
    # The seed's cells with its eager attention, profiled after 977a605 (copies are not matrix products):
    # two H100 machines and one H200.
    (CHECK / "eager_s3", [SEED]),
    (CHECK / "eager_s4", [SEED]),
    (CHECK / "eager_h3", [SEED]),
    (R / "2026-11-26_best/fms", [R / "fms_a100_80/tokens.csv"]),
    # The L4 source cell as docs/runs/trl_l4 was amended (the embedding and head in bf16, as TRL 0.9.6 leaves them);
    # 2026-11-26_flex's and 2026-11-26_h100's trl_l4 cells ran them in fp32, not the source's recipe: left out.
    (R / "2026-11-26_l4mem/trl_l4", [R / "trl_l4/tokens.csv"]),
]
# (source cells, their attention, how their profile classified copies inside a matrix product)
STEPS = [
    (R / "2026-11-24_h100_projection/diagnostic", "SDPA", "as matmul"),
    (R / "2026-11-24_h200_projection/diagnostic", "SDPA", "as matmul"),
    (CHECK / "sdpa_s2", "SDPA", "as matmul"),
    (CHECK / "eager_s1", "eager (the seed's)", "as matmul"),
    (CHECK / "eager_s3", "eager (the seed's)", "as elementwise"),
    (CHECK / "eager_s4", "eager (the seed's)", "as elementwise"),
    (CHECK / "eager_h3", "eager (the seed's)", "as elementwise"),
]
DOC = REPO / "docs/projection.md"
BLOCKS = {
    "validation": validation_markdown,
    "a10 steps": lambda _: steps_table(),
}


def steps_table() -> str:
    """The seed's six A10 figures projected from each set of source cells: the signed errors' span, the median and
    the largest |error|."""
    gpus = [gpu_option(n) for n in projectable()]
    points = measured_points(SEED, gpus)
    rows = []
    for path, attention, copies in STEPS:
        results = load_cells(path)
        projected, _ = project(results, [gpu_option("a10")], 1)
        checks = validate(projected, points, results)
        (med, worst, _), = errors(checks).values()
        signed = [100 * c["error"] for c in checks]
        base = step_parts(next(r for r in results if r.cell == "diag=baseline"), gpu_option(checks[0]["source"]))
        split = " / ".join(f"{1e3 * x:.0f}" for x in (base.seconds, base.compute, base.memory, base.host))
        rows.append([f"`{path.relative_to(R)}`", checks[0]["source"], attention, copies,
                     f"{min(signed):+.1f}% to {max(signed):+.1f}%", f"{100 * med:.1f}%", f"{100 * worst:.1f}%", split])
    return md_table(["source cells (docs/runs/)", "measured on", "attention", "copies inside a matrix product",
                     "errors", "median |error|", "largest",
                     "baseline's step / its compute / memory-bound / host part, ms"],
                    rows)


def markers(name: str) -> tuple[str, str]:
    return (f"<!-- {name}: written by docs/runs/scripts/projection_validation.py -->", f"<!-- {name} end -->")


def block(name: str = "validation") -> str:
    start, end = markers(name)
    return f"{start}\n\n{BLOCKS[name](RUNS)}\n\n{end}"


def main() -> int:
    text = new = DOC.read_text()
    for name in BLOCKS:
        start, end = markers(name)
        a, b = new.index(start), new.index(end) + len(end)
        new = new[:a] + block(name) + new[b:]
    if "--check" in sys.argv:
        return 0 if new == text else 1
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
