"""Kubernetes manifests: the base resources and one rendered Job per cell validate against the
Kubernetes JSON schemas offline (kubernetes-validate), with DNS-safe names, non-root pods, the W&B
key only from a Secret, and a pod command that runs exactly one cell."""

import importlib.metadata
import re
import subprocess
import sys

import pytest
import yaml
from conftest import FAST, REPO, compose_cfg, read_result, run_cli

import lorabench
from lorabench.sweep import k8s

kubernetes_validate = pytest.importorskip("kubernetes_validate")


def compose(overrides, **kw):
    return compose_cfg(overrides, **kw)


def validate(doc):
    try:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as e:  # the message alone; the schema dump is pages long
        raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {e.message} at {list(e.path)}") from None


def test_base_manifests_validate():
    docs = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "k8s" / "base").glob("*.yaml"))
            if p.name != "kustomization.yaml"]
    assert {d["kind"] for d in docs} == {"Namespace", "PersistentVolumeClaim", "ConfigMap"}
    for d in docs:
        validate(d)
    listed = yaml.safe_load((REPO / "k8s" / "base" / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in (REPO / "k8s" / "base").glob("*.yaml")
                                    if p.name != "kustomization.yaml")


@pytest.mark.parametrize("sweep,overrides,cells", [
    ("card", ["seq_len=512,1024", "batch=4,8"], 4),
    ("diag", ["+experiment=diagnostic", "gpu=a10"], 6),  # the sweep comes from the experiment's config
    ("ddp", ["+experiment=ddp_scaling", "train.nproc=1,2"], 2),  # the command line wins over it
    ("fsdp", ["+experiment=fsdp_scaling", "train.nproc=2,4"], 2),  # sharded cells: one pod of N GPUs each
])
def test_one_valid_job_per_cell(sweep, overrides, cells):
    jobs = [docs[-1] for docs in k8s.render(sweep, overrides, "registry.example.com/lorabench:0.1", compose)]
    assert len(jobs) == cells and len({j["metadata"]["name"] for j in jobs}) == cells
    for j in jobs:
        validate(j)
        name = j["metadata"]["name"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
        pod = j["spec"]["template"]["spec"]
        [c] = pod["containers"]
        assert pod["securityContext"]["runAsNonRoot"] and not c["securityContext"]["allowPrivilegeEscalation"]
        [key] = [e for e in c["env"] if e["name"] == "WANDB_API_KEY"]
        assert "value" not in key and key["valueFrom"]["secretKeyRef"]["name"] == "wandb"
        assert "hydra.mode=RUN" in c["args"] and f"hydra.run.dir=/data/outputs/{sweep}/{name}" in c["args"]
        nproc = compose([a for a in c["args"] if not a.startswith("hydra.")]).train.nproc
        assert c["resources"]["limits"]["nvidia.com/gpu"] == nproc
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    gpus = [j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for j in jobs]
    if sweep == "ddp":
        assert gpus == [1, 2]
    if sweep == "fsdp":
        assert gpus == [2, 4] and all(compose([a for a in j["spec"]["template"]["spec"]["containers"][0]["args"]
                                                if not a.startswith("hydra.")]).train.parallel.value == "fsdp"
                                       for j in jobs)


def test_jobs_run_the_image_that_the_build_tags_by_default(tmp_path):
    """One version, lorabench.__version__: the package's metadata (pyproject's dynamic version), the tag
    `make image` gives (docker/image.sh tag) and the image the rendered Jobs run without --image."""
    tag = subprocess.run(["bash", str(REPO / "docker" / "image.sh"), "tag"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert tag == k8s.IMAGE == f"lorabench:{lorabench.__version__}"
    assert importlib.metadata.version("lorabench") == lorabench.__version__
    subprocess.run([sys.executable, str(REPO / "launchers" / "k8s_render.py"), "--sweep", "t", "--out", str(tmp_path),
                    "--", "batch=4,8"], check=True, capture_output=True, cwd=REPO)
    jobs = [yaml.safe_load(p.read_text()) for p in (tmp_path / "t").glob("*.yaml")]
    assert len(jobs) == 2 and {j["spec"]["template"]["spec"]["containers"][0]["image"] for j in jobs} == {tag}
    # Every command in the docs builds or names that tag (the with-model variant adds a suffix).
    pages = ["README.md", "k8s/README.md", "launchers/README.md", "docs/scaling.md", "docker/Dockerfile",
             "launchers/k8s_render.py"]
    named = {m for page in pages for m in re.findall(r"lorabench:(\d[\w.]*)", (REPO / page).read_text())}
    assert named and {n.removesuffix("-mistral") for n in named} == {lorabench.__version__}, named


def test_a_multi_node_cell_is_an_indexed_job_with_a_headless_service():
    """train.nnodes=2: two pods (index = node rank) that reach pod 0 by its stable DNS name."""
    [[svc, job]] = k8s.render("multi", ["+experiment=seed_optimum", "train.nnodes=2", "train.nproc=4"], "img",
                              compose)
    for doc in (svc, job):
        validate(doc)
    name = job["metadata"]["name"]
    assert svc["metadata"]["name"] == name and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"lorabench/cell": name} == {
        k: v for k, v in job["spec"]["template"]["metadata"]["labels"].items() if k == "lorabench/cell"}
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    assert pod["subdomain"] == name
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == f"{name}-0.{name}" and env["MASTER_PORT"] == "29500"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4


def test_a_bad_cell_fails_at_render_time_not_in_a_pod():
    with pytest.raises(Exception, match="batch"):
        k8s.render("bad", ["batch=4,foo"], "img", compose)
    with pytest.raises(ValueError, match="sweep name"):
        k8s.render("Bad_Name", ["batch=4"], "img", compose)


def test_the_pods_command_runs_one_cell(tmp_path):
    """The rendered args, with the tiny model in place of Mistral-7B: one run dir, one result,
    even though the experiment itself asks for a multirun."""
    [[job]] = k8s.render("pod", ["+experiment=diagnostic", "diag=seq512"], "img", compose)
    args = [a for a in job["spec"]["template"]["spec"]["containers"][0]["args"] if not a.startswith("hydra.run")]
    run_cli("train.py", [*args, "model=tiny", "precision=fp32", "optimizer=adamw_torch", "data=tiny_instruct",
                         "train.gradient_checkpointing=false", *FAST, f"hydra.run.dir={tmp_path}"])
    r = read_result(tmp_path)
    assert r["status"] == "ok" and r["config"]["seq_len"] == 512
    assert not any(p.is_dir() and p.name.isdigit() for p in tmp_path.iterdir())  # no multirun sub-dirs
