"""docs/projection.md's validation section, from the committed run dirs (run from the repository root):

    python docs/runs/scripts/projection_validation.py          # rewrites the block between the markers
    python docs/runs/scripts/projection_validation.py --check  # exit 1 if the block is not what it writes

The H100 and H200 runs of 2026-11-24 projected onto each other and onto the A10 (the seed study's
published diagnostic, docs/runs/seed_a10); the H100 run of 2026-11-26 onto the A100-80GB (fms-acceleration's
published table, docs/runs/fms_a100_80); the H100 cell of 2026-11-26_l4mem onto the L4 (a published TRL notebook's
run, docs/runs/trl_l4, as amended); then the physical model against the published GEMM rates.
"""

import sys

from lorabench.projection import REPO, validation_markdown

R = REPO / "docs/runs"
RUNS = [
    (R / "2026-11-24_h100_projection/diagnostic",
     [R / "2026-11-24_h200_projection/diagnostic", R / "seed_a10/diagnostic.csv"]),
    (R / "2026-11-24_h100_projection/fast", [R / "2026-11-24_h200_projection/fast"]),
    (R / "2026-11-24_h200_projection/diagnostic",
     [R / "2026-11-24_h100_projection/diagnostic", R / "seed_a10/diagnostic.csv"]),
    (R / "2026-11-24_h200_projection/fast", [R / "2026-11-24_h100_projection/fast"]),
    (R / "2026-11-26_best/fms", [R / "fms_a100_80/tokens.csv"]),
    # The L4 source cell as docs/runs/trl_l4 was amended (the embedding and head in bf16, as TRL 0.9.6 leaves them);
    # 2026-11-26_flex's and 2026-11-26_h100's trl_l4 cells ran them in fp32, not the source's recipe: left out.
    (R / "2026-11-26_l4mem/trl_l4", [R / "trl_l4/tokens.csv"]),
]
DOC = REPO / "docs/projection.md"
START, END = "<!-- validation: written by docs/runs/scripts/projection_validation.py -->", "<!-- validation end -->"


def block() -> str:
    return f"{START}\n\n{validation_markdown(RUNS)}\n\n{END}"


def main() -> int:
    text = DOC.read_text()
    a, b = text.index(START), text.index(END) + len(END)
    if "--check" in sys.argv:
        return 0 if text[a:b] == block() else 1
    DOC.write_text(text[:a] + block() + text[b:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
