"""The docs say what the code and the committed run dirs say: docs/results.md and README's glance are what
docs/runs/scripts/results.py prints from docs/runs, README's exit-code table is lorabench.results' codes,
and every relative link of README.md and docs/*.md names a file that exists."""

import importlib.util
import re

from conftest import REPO

from lorabench.results import EXIT_CODES, Status


def results_script():
    spec = importlib.util.spec_from_file_location("docs_results", REPO / "docs/runs/scripts/results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_and_readme_glance_are_what_the_script_prints():
    script = results_script()
    assert (REPO / "docs/results.md").read_text() == script.page(), \
        "docs/results.md is stale: run python docs/runs/scripts/results.py --write"
    readme = (REPO / "README.md").read_text()
    block = re.search(r"<!-- results.py: glance -->\n(.*?)\n<!-- /results.py -->", readme, re.S)
    assert block and block[1] == script.glance()


def test_readme_exit_codes_are_the_code_s():
    """Each status's row in README's table starts with its exit code (Hydra's own errors are 1)."""
    readme = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| (\d) \| `?(\w+)", readme, re.M))
    for status in (Status.ok, Status.failed, Status.oom, Status.interrupted, Status.skipped):
        code = str(EXIT_CODES[status])
        assert code in rows, f"README has no exit code {code}"
        if status is not Status.ok:  # row 0 reads "the cell ended `ok`"
            assert rows[code] == status.value, (code, rows[code])


def test_doc_links_name_existing_files():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(REPO)} -> {target}")
    assert not missing, missing
