"""docs/results.md and README's "Results at a glance", generated from the run dirs committed in docs/runs
(run from the repository root, with lorabench importable):

    python docs/runs/scripts/results.py               # print docs/results.md
    python docs/runs/scripts/results.py reference     # print one section (glance: README's table)
    python docs/runs/scripts/results.py --write       # rewrite docs/results.md and README's glance block

Every figure is read from a cell's metrics.json, a sweep's search.json and multirun.yaml (render/runs.py); each
section of the page is one module of render/. Runs on a CPU, offline.
"""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # render/ and projection_validation.py beside this file

from render.glance import glance  # noqa: E402
from render.page import SECTIONS, page  # noqa: E402
from render.runs import DOCS, REPO  # noqa: E402

GLANCE = re.compile(r"<!-- results.py: glance -->\n.*?\n<!-- /results.py -->", re.S)


def write() -> None:
    (DOCS / "results.md").write_text(page())
    readme = (REPO / "README.md").read_text()
    block = f"<!-- results.py: glance -->\n{glance()}\n<!-- /results.py -->"
    new, n = GLANCE.subn(lambda _: block, readme)
    if n != 1:
        raise SystemExit("README.md has no '<!-- results.py: glance -->' block to fill")
    (REPO / "README.md").write_text(new)


def main(args: list[str]) -> None:
    if args == ["--write"]:
        return write()
    for a in args or ["page"]:
        if a not in {*SECTIONS, "glance", "page"}:
            raise SystemExit(f"{a!r}: not one of page, glance, {', '.join(SECTIONS)} (or --write)")
        print({"glance": glance, "page": page, **SECTIONS}[a]())


if __name__ == "__main__":
    main(sys.argv[1:])
