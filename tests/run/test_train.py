"""End to end on the CPU with the tiny Mistral: the default task learns, results hold the right
numbers, the card's multirun leaves one result per cell, and failed cells are recorded."""

import math
import shutil

import pytest
import torch
from conftest import FAST, breadth, read_result, read_steps, run_cli, run_in_process

from lorabench.report.page import write_report
from lorabench.sweep import sweeper


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`python train.py` exactly as README's first command runs it (only the run dir is moved)."""
    run_dir = tmp_path_factory.mktemp("default")
    proc = run_cli("train.py", [f"hydra.run.dir={run_dir}"], fresh=True)  # a new interpreter: its console is checked
    return run_dir, proc


@pytest.mark.slow  # 100 steps in a fresh interpreter (~16 s of CPU): make test-all, CI; a short default run is below
def test_default_run_learns_and_records_consistent_numbers(default_run):
    """One test over the one default run (README's first command, 100 steps): its loss falls well
    below its start, and its result file holds numbers consistent with its steps."""
    default_task_loss_falls_well_below_its_start(*default_run)
    result_file_holds_consistent_numbers(*default_run)


def default_task_loss_falls_well_below_its_start(run_dir, proc):
    losses = [s["loss"] for s in read_steps(run_dir)]
    first, last = sum(losses[:3]) / 3, sum(losses[-5:]) / 5
    assert first > 9.0  # near ln(32768) = 10.4: the model starts knowing nothing
    assert last < 0.5 * first, (first, last)


def result_file_holds_consistent_numbers(run_dir, proc):
    r, steps = read_result(run_dir), read_steps(run_dir)
    cfg = r["config"]
    assert r["status"] == "ok" and r["model"]["weights"] == "random_init"
    assert len(steps) == cfg["train"]["max_steps"] and [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    timed = [s for s in steps if s["timed"]]
    warm = r["metrics"]["count/warmup_steps"]
    assert warm == 5 and cfg["train"]["untimed_steps"] is None  # unset: 5 for a run this long
    assert len(timed) == len(steps) - warm and all(not s["timed"] for s in steps[:warm])
    m = r["metrics"]
    assert m["count/tokens_nonpad"] == sum(s["tokens_nonpad"] for s in timed)
    assert m["count/samples"] == cfg["batch"] * len(timed)
    assert m["perf/tokens_per_s"] == pytest.approx(m["count/tokens_nonpad"] / m["time/window_s"])
    # Step times of the window add up to the window (each step is the time since the previous end).
    assert sum(s["time_s"] for s in timed) == m["time/window_s"]  # the meter's sum: the same floats, same order
    assert m["perf/step_time_p50_s"] <= m["perf/step_time_p90_s"]
    assert 0.5 < m["data/nonpad_fraction"] < 1  # tiny_instruct pads each batch to its longest sample
    assert m["perf/tokens_per_s"] < m["perf/total_tokens_per_s"]
    assert m["train/loss_final"] == steps[-1]["loss"]
    assert r["gpu"]["name"] == "cpu" and m["cost/usd_per_1k_samples"] > 0
    assert m["perf/mfu_pct"] is None  # no CPU peak to divide by
    env = r["env"]
    assert env["versions"]["torch"] == torch.__version__ and env["versions"]["transformers"]
    assert "sha" in env["git"] and env["device"] == "cpu"
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert "tok/s non-pad" in proc.stderr  # the printed summary table
    # A quiet console: no library warning on the default run (bitsandbytes' CPU-kernel notice included).
    assert "WARNING" not in proc.stdout + proc.stderr and "Failed to load CPU" not in proc.stderr
    assert oct((run_dir / "metrics.json").stat().st_mode & 0o777) == "0o644"  # readable by the group


def test_a_short_run_times_what_its_warmup_leaves(tmp_path):
    """`python train.py train.max_steps=5`, the size a user tries first: the unset warmup shrinks to
    half the run (2 steps) and the other 3 are timed."""
    r = run_in_process(["train.max_steps=5", "data.max_samples=64"], tmp_path)
    assert r.ok and r.exit_code == 0
    assert r.metrics["count/warmup_steps"] == 2 and r.metrics["count/timed_steps"] == 3


def test_every_step_holds_a_full_batch_where_the_data_has_one(tmp_path):
    """10 synthetic rows at batch 4: the epoch's last, short batch (2 rows) is left out, so each of the 5 steps trains
    on 4 rows (the timed window compares steps of one size). Rows for no full batch (packing can leave fewer rows
    than a batch; each process batches its share of them): the Trainer is told to keep the short batch."""
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    from lorabench.run.loop import training_arguments

    r = run_in_process(["data=synthetic", "data.max_samples=10", "batch=4", "seq_len=64", "train.max_steps=5",
                        "train.untimed_steps=2"], tmp_path)  # short rows: the step's size is what is checked
    assert r.ok, r.error
    assert [s["samples"] for s in read_steps(tmp_path)] == [4] * 5
    c = OmegaConf.to_object(compose_cfg(["batch=4", "train.nproc=2"]))
    drop = {rows: training_arguments(c, torch.device("cpu"), tmp_path, rows=rows).dataloader_drop_last
            for rows in (7, 8)}
    assert drop == {7: False, 8: True}  # 2 processes x batch 4


def test_help_shows_examples_options_and_exit_codes():
    out = run_cli("train.py", ["--help"]).stdout
    assert "python train.py -m seq_len=512,1024 batch=4,8" in out and "Exit codes: 0 ok" in out
    assert "backend=    fast, hf, liger, unsloth" in out and "base_" not in out  # options, not the schemas


@pytest.mark.slow  # the card's four-cell sweep, a process per cell (make test-slow)
def test_card_multirun_leaves_one_result_per_cell(tmp_path):
    # The card's command, verbatim, plus only what makes it quick.
    run_cli("train.py", ["-m", "seq_len=512,1024", "batch=4,8", *FAST, f"hydra.sweep.dir={tmp_path}"])
    cells = {}
    for cell_dir in sorted(p for p in tmp_path.iterdir() if p.name.isdigit()):
        r, steps = read_result(cell_dir), read_steps(cell_dir)
        assert r["status"] == "ok"
        cfg = r["config"]
        assert all(s["samples"] == cfg["batch"] for s in steps)
        assert {f"batch={cfg['batch']}", f"seq_len={cfg['seq_len']}"} <= set(r["cell"].split(","))
        cells[(cfg["seq_len"], cfg["batch"])] = r
    assert set(cells) == {(512, 4), (512, 8), (1024, 4), (1024, 8)}
    # each cell's dir also by its name: the keys that differ (the constant ones left out)
    linked = {p.name: p.resolve().name for p in (tmp_path / "by_name").iterdir()}
    assert linked == {"batch=4,seq_len=512": "0", "batch=8,seq_len=512": "1", "batch=4,seq_len=1024": "2",
                      "batch=8,seq_len=1024": "3"}, linked
    table = (tmp_path / "results.md").read_text()
    assert table.count("| ok |") == 4 and "samples/s is not comparable" in table
    assert len((tmp_path / "results.csv").read_text().splitlines()) == 5


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_synthetic_tokens_count_exactly_and_a_partial_sweep_still_reports(tmp_path):
    """Two cells laid out as a multirun's (in this process: the CLI's multirun is test_card_multirun's)."""
    for n, seq_len in enumerate((24, 40)):
        (tmp_path / str(n) / ".hydra").mkdir(parents=True)
        run_in_process(["data=synthetic", f"seq_len={seq_len}", "batch=3", *FAST], tmp_path / str(n))
    write_report(tmp_path)
    for cell_dir in (tmp_path / "0", tmp_path / "1"):
        r, steps = read_result(cell_dir), read_steps(cell_dir)
        seq_len, batch = r["config"]["seq_len"], r["config"]["batch"]
        # synthetic rows are exactly seq_len tokens and every one is trained on: no padding
        assert all(s["tokens_nonpad"] == s["tokens_total"] == s["tokens_label"] == seq_len * batch for s in steps)
        m = r["metrics"]
        assert m["data/nonpad_fraction"] == 1
        assert m["perf/tokens_per_s"] == pytest.approx(m["perf/samples_per_s"] * seq_len)

    # The same sweep, as if cell 1 had been killed mid-run: the report still comes, naming it.
    (tmp_path / "1" / "metrics.json").unlink()
    (tmp_path / "results.md").unlink()
    out = write_report(tmp_path)  # what `python bench.py sweep_dir=...` runs (its CLI: test_report.py)
    md = (tmp_path / "results.md").read_text()
    assert md == out.markdown + "\n"
    assert md.count("| ok |") == 1 and "No result for cell 1 (1): killed: " in md and "seq_len=24" in md
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[-1].startswith("1,1,killed,")  # the killed cell has its row


@pytest.mark.parametrize("override,message", [
    ("precision=nf4", "needs a CUDA GPU"),
    ("precision=int8", "needs a CUDA GPU"),
    ("precision=fp16", "needs a CUDA GPU"),
    ("optimizer=paged_adamw_8bit", "bitsandbytes CUDA optimizer"),
    ("seq_len=5000", "max_position_embeddings"),
    ("lora.r=256", "larger than the model's hidden size"),
    ("seq_len=0", "seq_len must be > 0"),
    ("train.device=cuda", "sees no CUDA device"),
])
def test_impossible_cell_fails_before_the_model_is_built(tmp_path, override, message):
    if override == "train.device=cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    result = run_in_process([override, *FAST], tmp_path)
    assert result.status.value == "failed" and message in result.error and result.model is None
    assert read_result(tmp_path)["error"] == result.error
    assert not (tmp_path / "steps.jsonl").exists()


def test_out_of_memory_is_recorded_as_oom(tmp_path, monkeypatch):
    """With the model builder made to raise what CUDA raises when memory runs out."""
    from lorabench.builders import modeling

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(modeling, "build_model", oom)
    result = run_in_process(FAST, tmp_path)
    assert result.status.value == "oom" and "Tried to allocate 2.00 GiB" in result.error
    assert read_result(tmp_path)["status"] == "oom"
    # its model never built, and the one line says so: a search stops here (no batch or layout holds less)
    assert result.error.startswith("while the model was built: CUDA out of memory") and sweeper.at_load(result)


def test_out_of_memory_in_a_step_is_told_from_one_while_the_model_is_built(tmp_path, monkeypatch):
    """An OOM in the first training step is the batch's or the layout's: a search goes on to a smaller batch or a
    layout that holds less."""
    from lorabench.run.trainer import MeasuredTrainer

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")

    monkeypatch.setattr(MeasuredTrainer, "training_step", oom)
    result = run_in_process(FAST, tmp_path)
    assert result.status.value == "oom" and result.error.startswith("CUDA out of memory")
    assert result.metrics["count/steps_done"] == 0 and not sweeper.at_load(result)


@pytest.mark.parametrize("overrides", breadth([
    ["precision=bf16"], ["optimizer=adafactor"], ["optimizer=adamw_torch_fused"], ["lora=r8"], ["lora=all_linear"],
    ["train.gradient_checkpointing=true"], ["train.grad_accum=2"],
    ["optimizer.schedule=cosine", "optimizer.lr_warmup_steps=2"],
    ["data.padding=max_length", "seq_len=48"], ["gpu=a10", "gpu.pricing=spot", "gpu.price_of_target=true"],
    ["gpu=h100"], ["data.num_workers=1"],
], [["lora=all_linear"], ["train.grad_accum=2"], ["data.padding=max_length", "seq_len=48"],
    ["gpu=a10", "gpu.pricing=spot", "gpu.price_of_target=true"]]), ids=lambda o: ",".join(o))
def test_every_cpu_option_trains(tmp_path, overrides):
    result = run_in_process([*overrides, *FAST], tmp_path)
    assert result.status.value == "ok", result.error
    assert "rank" not in read_result(tmp_path)  # per-rank records are for DDP launchers only
    m, cfg = result.metrics, result.config
    assert math.isfinite(m["train/loss_final"]) and m["perf/tokens_per_s"] > 0
    assert m["count/samples"] == cfg["batch"] * cfg["train"]["grad_accum"] * m["count/timed_steps"]
    # LoRA adds r * (in + out) per adapted layer. Tiny: hidden 128, kv 2 x 32 = 64, MLP 384, 2 layers.
    qkvo = 2 * 16 * ((128 + 128) + (128 + 64) * 2 + (128 + 128))
    mlp = 2 * 16 * (128 + 384) * 3
    if "lora=all_linear" in overrides:
        assert result.model["trainable"] == qkvo + mlp
    elif "lora=r8" in overrides:
        assert result.model["trainable"] == qkvo // 2
    else:
        assert result.model["trainable"] == qkvo
    if "gpu=a10" in overrides:  # priced as an A10 on spot, as asked
        assert result.gpu["name"] == "a10" and m["cost/usd_per_hour"] == 0.18
    if "gpu=h100" in overrides:  # another GPU than this CPU: its price is not used, no budget on a CPU
        assert result.gpu["name"] == "cpu" and result.gpu["emulated"] is None and "mem/budget_gib" not in m
    if "data.padding=max_length" in overrides:
        assert m["count/tokens_total"] == 48 * m["count/samples"]
    # The base layers' matmuls ran at the cell's width: bf16 (2 bytes an element) only where asked.
    assert m["precision/matmul_bytes"] == (2 if "precision=bf16" in overrides else 4)


def test_a_cell_leaves_nothing_registered_for_the_next(tmp_path):
    """bitsandbytes' process-wide optimizer manager must not keep a finished cell's modules alive
    (the HF Trainer registers embeddings there for 8-bit optimizers)."""
    import bitsandbytes as bnb

    manager = bnb.optim.GlobalOptimManager.get_instance()
    manager.register_module_override(torch.nn.Embedding(4, 4), "weight", {"optim_bits": 32})
    assert run_in_process(FAST, tmp_path).ok
    assert manager.module_weight_config_triple == [] and manager.pid2config == {}


@pytest.mark.slow  # two ShareGPT cells (make test-slow; packing itself: test_data)
def test_packed_sharegpt_cell_counts_samples_not_rows(tmp_path):
    common = [*FAST, "data=sharegpt", "seq_len=256", "data.max_samples=200"]
    plain = run_in_process([*common, "data.packing=false"], tmp_path / "plain")
    packed = run_in_process([*common, "data.packing=true"], tmp_path / "packed")
    assert plain.status.value == packed.status.value == "ok", (plain.error, packed.error)
    p, q = plain.metrics, packed.metrics
    assert q["data/packed_rows"] < q["data/samples"] == p["data/samples"] == 200
    rows_seen = packed.config["batch"] * q["count/timed_steps"]
    assert q["count/samples"] >= rows_seen  # a packed row holds one or more samples
    assert 0.5 < q["data/nonpad_fraction"] <= 1 and 0.5 < q["data/rows_nonpad_fraction"] <= 1
    assert p["data/truncated"] == q["data/truncated"] > 0  # ShareGPT conversations run long
    assert q["perf/samples_per_s"] == pytest.approx(q["count/samples"] / q["time/window_s"])


def test_bad_data_fails_the_cell_before_the_model_is_built(tmp_path):
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"text": "fine"}\n{"messages": [{"role": "user", "content": "no answer"}]}\n')
    result = run_in_process(["data=jsonl", f"data.path={bad}", *FAST], tmp_path / "run")
    assert result.status.value == "failed" and result.model is None
    assert f"{bad}:2: conversation has no assistant turn" in result.error


def test_training_from_a_local_checkpoint(tmp_path):
    """model.path: the same cell trains from real weights on disk, and the result says so."""
    from conftest import compose_cfg
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM

    from lorabench.models import hf_config

    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(hf_config(OmegaConf.to_object(compose_cfg()).model)).save_pretrained(
        tmp_path / "ckpt", safe_serialization=True)
    result = run_in_process([*FAST, f"model.path={tmp_path / 'ckpt'}"], tmp_path / "run")
    assert result.status.value == "ok", result.error
    assert result.model["weights"] == str(tmp_path / "ckpt") and result.metrics["perf/tokens_per_s"] > 0


@pytest.mark.slow  # six cells in a fresh interpreter, ~16 s on 2 cores: make test-slow and CI run it
def test_diagnostic_experiment_runs_its_six_cells(tmp_path):
    run_cli("train.py", ["+experiment=diagnostic", "model=tiny", "data=tiny_instruct", "precision=fp32",
                         "optimizer=adamw_torch", "train.gradient_checkpointing=false", *FAST,
                         "train.max_steps=5", "train.untimed_steps=1", "train.profile_steps=1",
                         f"hydra.sweep.dir={tmp_path}"])
    results = [read_result(tmp_path / str(i)) for i in range(6)]
    assert [r["status"] for r in results] == ["ok"] * 6
    assert [r["config"]["seq_len"] for r in results] == [1024, 1024, 1024, 512, 512, 1024]
    assert [r["config"]["lora"]["r"] for r in results] == [16, 16, 8, 16, 16, 16]
    md = (tmp_path / "results.md").read_text()  # one sentence per knob, a group's keys taken together
    assert "lora r16 -> r8: non-pad tokens/s" in md and "batch 4 -> 8" in md  # the group by its option
    # The opt-in bottleneck breakdown of every cell: its table row and a bar in the plot.
    assert "Where the step time goes" in md
    assert all(r["metrics"]["prof/steps"] == 1 for r in results)
    assert (tmp_path / "plots" / "bottleneck.png").stat().st_size > 0
    assert "Where the step time goes" in (tmp_path / "report.html").read_text()


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_sizing_skips_cells_larger_than_one_that_ran_out_of_memory(tmp_path):
    """In a multirun, a cell whose seq_len and batch are both no smaller than those of an OOM cell
    with the same configuration is skipped without a model load; others run. (A CPU cannot run out
    of device memory: cell 0's OOM result is planted; the GPU test makes a real one.)"""
    from conftest import compose_cfg

    from lorabench.core.results import RunContext, Status, write_result
    from lorabench.train import run_cell

    def cell(num, seq_len, batch, extra=()):
        cfg = compose_cfg(["+experiment=gpu_sizing", "model=tiny", "precision=fp32", "optimizer=adamw_torch",
                           "data=synthetic", "data.max_samples=32", "train.gradient_checkpointing=false",
                           f"seq_len={seq_len}", f"batch={batch}", *extra])
        (tmp_path / str(num) / ".hydra").mkdir(parents=True)
        return run_cell(cfg, RunContext(tmp_path / str(num), f"seq_len={seq_len},batch={batch}", num, tmp_path))

    planted = cell(0, 64, 2)
    assert planted.status.value == "ok"
    planted.status, planted.error = Status.oom, "CUDA out of memory (planted)"
    write_result(tmp_path / "0" / "metrics.json", planted)

    bigger = cell(1, 128, 2)
    assert bigger.status.value == "skipped" and "cell 0" in bigger.error and bigger.model is None
    assert cell(2, 64, 4).status is Status.skipped
    assert cell(3, 32, 4).ok  # shorter: not implied
    assert cell(4, 128, 4, ["lora=r8"]).ok  # another configuration: not implied
    shutil.rmtree(tmp_path / "4")  # the fit table is for sweeps over seq_len and batch alone
    md = write_report(tmp_path).markdown
    assert "| 64 | none | - | - | 2 |" in md and "| 32 | 4 |" in md
    assert (tmp_path / "plots" / "fit.png").stat().st_size > 0


def test_a_cell_name_past_the_file_name_limit_links_under_a_cut_name(tmp_path):
    """A cell of many overrides (the fifth round's `before` cell: 276 bytes) failed with 'File name too
    long' before training; its link now takes a cut name that keeps two such names apart."""
    from lorabench.run.cell import link_name

    long = ",".join(f"backend.option_{i}=False" for i in range(12))
    other = long.replace("option_11=False", "option_11=True")
    assert len(long.encode()) > 255 and link_name(long) != link_name(other)
    assert all(len(link_name(n).encode()) <= 255 for n in (long, other))
    (tmp_path / link_name(long)).symlink_to(tmp_path)  # a name the file system takes
    assert link_name("backend=fast,batch=16") == "backend=fast,batch=16"
