"""A sweep logged to a real MLflow tracking server (SQLite behind it) that the test starts on 127.0.0.1 and stops:
read back through MlflowClient (the sweep's parent run, its cells nested under it with their config, per-step and
final metrics, files and statuses, the failed cell's reason), and the server's UI in headless Chromium showing
the cells. The server takes 30 s to 2 min to answer on 2 busy cores: both tests are slow."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import run_cli

mlflow = pytest.importorskip("mlflow")  # imported here, before the sweep forks from this process

pytestmark = pytest.mark.slow
CELLS = ["batch=2,3,0", "sweep.keep_going=true", "seq_len=64", "train.max_steps=4", "train.untimed_steps=2",
         "data.max_samples=32"]
SERVER_LIFE_S = 1200  # the server ends itself after this, whatever happens to the test (`timeout`)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    cmd = ["timeout", str(SERVER_LIFE_S), str(Path(sys.executable).parent / "mlflow"), "server",
           "--backend-store-uri", f"sqlite:///{d / 'mlflow.db'}", "--artifacts-destination", str(d / "artifacts"),
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    log = open(d / "server.log", "w")
    proc = subprocess.Popen(cmd, cwd=d, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            try:
                if urllib.request.urlopen(f"{url}/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            said = (d / "server.log").read_text()[-3000:]
            assert proc.poll() is None, f"mlflow server exited {proc.returncode}: {said}"
            assert time.time() < deadline, f"mlflow server not answering after 300 s: {said}"
            time.sleep(1)
        yield url
    finally:
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):  # the server and its workers: its group
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait_s)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


@pytest.fixture(scope="module")
def sweep(server, tmp_path_factory):
    d = tmp_path_factory.mktemp("served") / "sweep"
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        proc = run_cli("train.py", ["-m", "logger=mlflow", *CELLS, f"hydra.sweep.dir={d}"], check=False,
                       env={"MLFLOW_TRACKING_URI": server})
    client = mlflow.MlflowClient(server)
    exp = client.get_experiment_by_name("lorabench")
    return d, proc, client, exp, server


def test_the_sweep_reads_back_through_mlflow_s_client(sweep):
    d, proc, client, exp, url = sweep
    assert proc.returncode == 2, proc.stderr[-3000:]  # batch=0 failed
    cells = {p.name: json.loads((p / "metrics.json").read_text()) for p in d.iterdir() if p.name.isdigit()}
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    parent = runs.pop(d.name)
    assert sorted(runs) == sorted(f"{d.name}/{r['cell']}" for r in cells.values()) and len(runs) == 3
    for n, r in cells.items():
        run = runs[f"{d.name}/{r['cell']}"]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.params["batch"] == str(r["config"]["batch"]) and run.data.params["precision.name"] == "fp32"
        assert run.data.tags["status"] == r["status"]
        assert {"cell/metrics.json"} <= {a.path for a in client.list_artifacts(run.info.run_id, "cell")}
        if r["status"] == "ok":
            assert run.info.status == "FINISHED"
            assert run.data.metrics["perf/tokens_per_s"] == pytest.approx(r["metrics"]["perf/tokens_per_s"])
            steps = [json.loads(line) for line in (d / n / "steps.jsonl").read_text().splitlines()]
            for key, own in (("loss", "loss"), ("grad_norm", "grad_norm"), ("host_rss_gib", "host_rss_gib")):
                history = client.get_metric_history(run.info.run_id, key)
                assert [(m.step, m.value) for m in history] == [(s["step"], pytest.approx(s[own])) for s in steps], key
            assert [m.step for m in client.get_metric_history(run.info.run_id, "tokens_per_s")] == [1, 2, 3, 4]
        else:
            assert run.info.status == "FAILED" and "batch must be > 0, got 0" in run.data.tags["error"]
    assert parent.info.status == "FINISHED" and parent.data.metrics["cells_failed"] == 1
    files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.html", "results.csv", "results.md", "results_table.json", "plots"} <= files
    assert "plots/throughput.png" in {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "results_table.json", str(d.parent)))
                       .read_text())
    assert [row[0] for row in table["data"]] == ["batch=2", "batch=3", "batch=0"]
    # The console: MLflow's own lines (migrations, a link per run) stay out of it; lorabench's one line says where.
    assert "View run" not in proc.stdout + proc.stderr and "alembic" not in proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-2] == (
        f"MLflow: experiment lorabench, parent run {d.name} with 3 cell runs at {url}: "
        f"{url}/#/experiments/{exp.experiment_id}/runs/{parent.info.run_id}")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="no chromium: `apt-get install chromium` (Debian) runs this test; "
                                               ".ci/run installs it")
def test_the_ui_shows_the_sweep_s_cells(sweep, tmp_path):
    """The experiment's runs page, sorted by name (MLflow then lists child runs flat, each under its own name):
    the sweep's run and its three cells, the failed one too. The screenshot is docs/img/mlflow_sweep.png's."""
    d, _, client, exp, server = sweep
    url = (f"{server}/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning&"
           f"orderByKey={urllib.parse.quote('tags.`mlflow.runName`')}&orderByAsc=true")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=20000"]
    dom = subprocess.run([chromium(), *flags, "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
    for name in (d.name, f"{d.name}/batch=2", f"{d.name}/batch=3", f"{d.name}/batch=0"):
        assert f">{name}<" in dom, name
    shot = tmp_path / "mlflow_sweep.png"
    subprocess.run([chromium(), *flags, f"--screenshot={shot}", "--window-size=1400,900", url], capture_output=True,
                   timeout=180)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000  # a page, not a blank
    print(f"screenshot: {shot}")
