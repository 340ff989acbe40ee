"""The trackers (logger=wandb, mlflow, tensorboard, several at once): a 2-cell sweep read back from each one's
own files or client: one run per cell with its config, per-step loss, grad_norm, tokens/s and memory, its final
metrics and status (the failed cell too), the sweep as a group with its table and report; a quiet console; and
each environment variable of theirs that lorabench reads, honoured or refused in one line (cells run in this
process). MLflow writes to a file store here (fast); tests/measure/test_mlflow_server.py logs a sweep to a real
tracking server and opens its UI."""

import json
import os
import time
from pathlib import Path

import pytest
from conftest import run_cli, run_in_process
from wandb_records import summarize_run

mlflow = pytest.importorskip("mlflow")  # make test installs it (.[mlflow]); imported here, before the sweep forks
pytest.importorskip("tensorboard")
import torch.utils.tensorboard  # noqa: E402,F401  (the same: imported once, in the test's process)

# MLflow 3 refuses its file store unless asked: it is made in milliseconds, where a new SQLite store's migrations
# take 10 s and more. (The tracking server's test uses SQLite.)
os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
# A sweep of two cells: batch=2 trains 4 steps, batch=0 fails its range check at once (sweep.keep_going).
SMALL = ["seq_len=64", "train.max_steps=4", "train.untimed_steps=2", "data.max_samples=32"]
CELLS = ["batch=2,0", "sweep.keep_going=true"]
STEP_KEYS = {"loss", "grad_norm", "learning_rate", "tokens_per_s", "step_time_s", "host_rss_gib"}


def file_store(path: Path) -> dict:
    return {"MLFLOW_TRACKING_URI": path.as_uri()}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("tracked")
    store = file_store(d / "mlruns")
    with pytest.MonkeyPatch.context() as mp:  # W&B's defaults: no mode set (offline), no WANDB_SILENT
        for var in ("WANDB_MODE", "WANDB_SILENT", "WANDB_PROJECT", "WANDB_ENTITY", "MLFLOW_EXPERIMENT_NAME"):
            mp.delenv(var, raising=False)
        proc = run_cli("train.py", ["-m", "logger=[wandb,mlflow,tensorboard]", *CELLS, *SMALL,
                                    f"hydra.sweep.dir={d / 'sweep'}"], check=False, env=store)
    return d / "sweep", proc, mlflow.MlflowClient(store["MLFLOW_TRACKING_URI"])


def own(d: Path) -> dict:
    return {p.name: json.loads((p / "metrics.json").read_text()) for p in d.iterdir() if p.name.isdigit()}


def test_the_console_stays_quiet_and_says_where_each_tracker_is(sweep):
    d, proc, _ = sweep
    assert proc.returncode == 2, proc.stderr[-3000:]  # batch=0 failed (README: exit codes)
    out = proc.stdout + proc.stderr
    assert "wandb:" not in out and "View run" not in out and "alembic" not in out
    lines = proc.stderr.splitlines()
    assert lines[-1].startswith("cells: 2 = 1 ok, 1 failed")
    assert [line.split(":")[0] for line in lines[-4:-1]] == ["W&B", "MLflow", "TensorBoard"]
    assert f"tensorboard --logdir {d}" in lines[-2] and f"wandb sync {d}/*/wandb/offline-run-*" in lines[-4]


def test_wandb_holds_one_offline_run_per_cell_and_the_sweep_s_aggregate(sweep):
    d, _, _ = sweep
    cells = own(d)
    runs = {f.relative_to(d).parts[0]: summarize_run(f) for f in d.glob("*/wandb/offline-run-*/run-*.wandb")}
    assert sorted(runs) == sorted(cells) == ["0", "1"]  # every cell, the failed one too
    for n, run in runs.items():
        r = cells[n]
        assert run["name"] == f"{d.name}/{r['cell']}" and run["group"] == d.name and run["project"] == "lorabench"
        assert run["config"]["seq_len"] == 64 and run["config"]["optimizer"]["lr"] == r["config"]["optimizer"]["lr"]
        assert run["summary"]["status"] == r["status"] and f"status={r['status']}" in run["tags"]
        if r["status"] == "ok":
            assert run["exit_code"] == 0
            assert run["summary"]["perf/tokens_per_s"] == pytest.approx(r["metrics"]["perf/tokens_per_s"])
            steps = [h for h in run["history"] if "train/loss" in h]
            assert [h["train/global_step"] for h in steps] == [1, 2, 3, 4]  # transformers' WandbCallback, each step
            assert {f"train/{k}" for k in STEP_KEYS} <= set(steps[-1])
            recorded = [json.loads(line) for line in (d / n / "steps.jsonl").read_text().splitlines()]
            assert [h["train/loss"] for h in steps] == [s["loss"] for s in recorded]
        else:
            assert run["exit_code"] == 1 and run["summary"]["error"] == r["error"]
            assert "batch must be > 0" in r["error"]
    (aggregate,) = [summarize_run(f) for f in d.glob("wandb/offline-run-*/run-*.wandb")]
    assert aggregate["job_type"] == "aggregate" and aggregate["group"] == d.name
    assert aggregate["config"]["swept"] == ["batch"] and aggregate["config"]["cells"] == 2
    assert aggregate["config"]["seq_len"] == 64  # what every cell shares
    assert "sweep/results" in aggregate["history_keys"]
    files = aggregate["artifacts"][f"report-{d.name}"]  # (beside the table's own artifact)
    assert {"report.html", "results.csv", "results.md", "plots/throughput.png"} <= set(files)


def test_mlflow_nests_the_cells_under_the_sweep_s_run(sweep):
    d, _, client = sweep
    cells = own(d)
    exp = client.get_experiment_by_name("lorabench")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    parent = runs.pop(d.name)
    assert sorted(runs) == sorted(f"{d.name}/{r['cell']}" for r in cells.values())
    for n, r in cells.items():
        run = runs[f"{d.name}/{r['cell']}"]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id and run.data.tags["status"] == r["status"]
        assert run.data.params["seq_len"] == "64" and run.data.params["model.name"] == "tiny"  # the config, flat
        arts = {a.path for a in client.list_artifacts(run.info.run_id, "cell")}
        assert {"cell/metrics.json", "cell/steps.jsonl"} & arts
        if r["status"] == "ok":
            assert run.info.status == "FINISHED"
            assert run.data.metrics["perf/tokens_per_s"] == pytest.approx(r["metrics"]["perf/tokens_per_s"])
            assert STEP_KEYS <= set(run.data.metrics)  # MLflowCallback's keys, and the meter's beside them
            history = client.get_metric_history(run.info.run_id, "tokens_per_s")
            recorded = [json.loads(line) for line in (d / n / "steps.jsonl").read_text().splitlines()]
            assert [(m.step, m.value) for m in history] == [
                (s["step"], pytest.approx(s["tokens_nonpad"] / s["time_s"])) for s in recorded]
        else:
            assert run.info.status == "FAILED" and run.data.tags["error"] == r["error"]
    assert parent.info.status == "FINISHED" and parent.data.params["swept"] == '["batch"]'
    assert parent.data.metrics["cells_ok"] == 1 and parent.data.metrics["cells_failed"] == 1
    top = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.html", "results.csv", "results.md", "plots", "results_table.json"} <= top
    assert json.loads((d / "mlflow.json").read_text())["run_id"] == parent.info.run_id


def test_tensorboard_has_a_dir_per_cell_and_the_sweep_s_table(sweep):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    d, _, _ = sweep
    for n, r in own(d).items():
        events = EventAccumulator(str(d / n / "tensorboard"), size_guidance={"tensors": 0}).Reload()
        scalars, tensors = set(events.Tags()["scalars"]), set(events.Tags()["tensors"])
        if r["status"] == "ok":
            assert {f"train/{k}" for k in STEP_KEYS} <= scalars  # transformers' TensorBoardCallback
            assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]
            assert events.Scalars("perf/tokens_per_s")[-1].value == pytest.approx(r["metrics"]["perf/tokens_per_s"])
        status = events.Tensors("status/text_summary")[-1].tensor_proto.string_val[0].decode()
        assert status.startswith(r["status"]) and (r["error"] or "") in status
        assert "cell/text_summary" in tensors
    events = EventAccumulator(str(d / "tensorboard"), size_guidance={"tensors": 0, "images": 0}).Reload()
    table = events.Tensors("results/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "| batch=2 | ok |" in table and "plots/throughput" in events.Tags()["images"]


# ---------------------------------------------------------------------------- each environment variable

@pytest.fixture
def env(monkeypatch):
    """The trackers' variables unset, then what a test sets; the cell runs in this process (cell.run, as train.py
    runs it), batch=0: its runs start, then it fails its range check at once."""
    for var in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def tracked_cell(run_dir: Path, *overrides: str):
    return run_in_process(["batch=0", *overrides], run_dir)


def wandb_run(run_dir: Path, wait_s: float = 30) -> dict:
    """The cell's offline run, once W&B's service (still running in this process) has written it whole."""
    deadline = time.time() + wait_s
    while True:
        files = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
        run = summarize_run(files[0]) if len(files) == 1 else {}
        if "exit_code" in run and "entity" in run or time.time() > deadline:
            return run
        time.sleep(0.2)


def test_wandb_mode(tmp_path, env):
    """disabled: no W&B run and no file; a mode W&B does not have: one line naming it, before any run or model;
    logger.wandb.mode set: it wins over the variable."""
    env.setenv("WANDB_MODE", "disabled")
    assert tracked_cell(tmp_path / "off", "logger=wandb").status.value == "failed"
    assert not (tmp_path / "off" / "wandb").exists()
    env.setenv("WANDB_MODE", "bogus")
    r = tracked_cell(tmp_path / "bogus", "logger=wandb", "batch=4")
    assert r.error == "ValueError: WANDB_MODE='bogus' is not a W&B mode: use one of disabled, offline, online"
    assert r.model is None and not (tmp_path / "bogus" / "wandb").exists()
    env.setenv("WANDB_MODE", "online")  # (no account, no network here: the config's offline must win)
    tracked_cell(tmp_path / "set", "logger=wandb", "logger.wandb.mode=offline")
    assert wandb_run(tmp_path / "set")["summary"]["status"] == "failed"


def test_wandb_project(tmp_path, env):
    env.setenv("WANDB_PROJECT", "myproj")
    tracked_cell(tmp_path, "logger=wandb")
    assert wandb_run(tmp_path)["project"] == "myproj"


def test_wandb_entity(tmp_path, env):
    env.setenv("WANDB_ENTITY", "myteam")
    tracked_cell(tmp_path, "logger=wandb")
    run = wandb_run(tmp_path)
    assert run["entity"] == "myteam" and run["project"] == "lorabench"


def test_mlflow_tracking_uri(tmp_path, env):
    uri = (tmp_path / "elsewhere").as_uri()
    env.setenv("MLFLOW_TRACKING_URI", uri)
    tracked_cell(tmp_path / "run", "logger=mlflow")
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("lorabench").experiment_id])
    assert run.info.status == "FAILED" and run.data.tags["status"] == "failed"
    assert run.info.run_name == "run/batch=0,logger=mlflow"  # <run dir name>/<cell name>
    env.setenv("MLFLOW_TRACKING_URI", "localhost:5000")
    r = tracked_cell(tmp_path / "bad", "logger=mlflow")
    assert r.error.startswith("ValueError: MLFLOW_TRACKING_URI='localhost:5000' is not a tracking URI MLflow reads")


def test_mlflow_experiment_name(tmp_path, env):
    uri = (tmp_path / "mlruns").as_uri()
    env.setenv("MLFLOW_TRACKING_URI", uri)
    env.setenv("MLFLOW_EXPERIMENT_NAME", "myexp")
    tracked_cell(tmp_path / "run", "logger=mlflow")
    client = mlflow.MlflowClient(uri)
    assert client.get_experiment_by_name("lorabench") is None
    assert len(client.search_runs([client.get_experiment_by_name("myexp").experiment_id])) == 1


def test_mlflow_default_store_is_local_under_outputs(env):
    """MLFLOW_TRACKING_URI unset: a SQLite file under outputs/ of the directory train.py runs in (no network)."""
    from lorabench.core.config import MlflowConfig

    cfg = MlflowConfig().resolved()
    assert cfg.tracking_uri == f"sqlite:///{Path('outputs/mlflow/mlflow.db').absolute()}"
    assert cfg.experiment == "lorabench"
    assert MlflowConfig(tracking_uri="http://h:5000").resolved().tracking_uri == "http://h:5000"


def test_tensorboard_dir_is_the_run_dir_s(tmp_path, env):
    """TensorBoard has no variable of its own for where: each cell's run dir (TENSORBOARD_LOGGING_DIR, which
    transformers' callback reads, is not used: it would put every cell in one dir)."""
    env.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "elsewhere"))
    tracked_cell(tmp_path / "run", "logger=tensorboard")
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert not (tmp_path / "elsewhere").exists()


def test_a_cell_trained_in_other_processes_has_its_steps_from_steps_jsonl(tmp_path):
    """train.nproc > 1 or backend=unsloth: the Trainer and its callbacks run in rank processes that track nothing;
    the cell's run gets rank 0's steps.jsonl when the cell ends."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lorabench.core.config import LoggerConfig, TensorBoardConfig
    from lorabench.core.results import CellResult, RunContext, Status
    from lorabench.measure.loggers import build_logger

    logger = build_logger(LoggerConfig(tensorboard=TensorBoardConfig()), RunContext(tmp_path, "batch=4"), {"batch": 4})
    steps = [{"step": s, "time_s": 0.5, "tokens_nonpad": 100, "loss": 3.0 / s, "grad_norm": 1.0, "lr": 1e-4,
              "mem_reserved_gib": 2.0, "power_w": 250.0} for s in (1, 2, 3)]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    logger.finish(CellResult(status=Status.ok, cell="batch=4", metrics={"perf/tokens_per_s": 200.0}))
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 3.0), (2, 1.5), (3, 1.0)]
    assert [e.value for e in events.Scalars("train/tokens_per_s")] == [200.0] * 3
    assert {"train/grad_norm", "train/learning_rate", "train/mem_reserved_gib", "train/power_w"} <= set(
        events.Tags()["scalars"])
