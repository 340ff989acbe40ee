"""The report of cells that evaluated held-out data: time and $ to one target over repeats (median, spread, MLPerf's
score), a backend's loss after the same tokens against hf's within a tolerance from the repeats and the rounding,
and the answer naming the cheapest configuration that reaches the target. Cells made of files: no training here."""

import json
import math

import pytest

from lorabench.core.config import ReportConfig
from lorabench.core.results import CellResult, Status, load_results, write_result
from lorabench.report import quality as rq
from lorabench.report.analysis import axes
from lorabench.report.page import write_report


def quality_cell(d, num, backend, seed, losses, step_s, tok_s=1000.0, target=None, relative=None, price=3.6,
                 tokens_per_step=1000, every=10, eval_s=2.0, precision="bf16", batch=4, set_id=7):
    """A cell of sweep dir d: eval.jsonl after every `every` steps (losses[i] after (i + 1) x every steps of step_s
    seconds each, each evaluation eval_s), and its metrics.json."""
    cell_dir = d / str(num)
    (cell_dir / ".hydra").mkdir(parents=True)
    lines, done_eval = [], 0.0
    for i, loss in enumerate(losses):
        step, done_eval = (i + 1) * every, done_eval + eval_s
        train_s = step * step_s
        lines.append({"step": step, "tokens": step * tokens_per_step, "train_s": train_s, "eval_s": done_eval,
                      "eval_loss": loss, "this_eval_s": eval_s, "usd": (train_s + done_eval) * price / 3600})
    (cell_dir / "eval.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = {"seq_len": 512, "batch": batch, "model": {"name": "tiny"}, "data": {"kind": "sharegpt"},
              "gpu": {"name": "h100"}, "precision": {"name": precision}, "backend": {"name": backend},
              "train": {"seed": seed, "max_steps": 100},
              "quality": {"eval_every": every, "target_loss": target, "target_relative": relative}}
    metrics = {"perf/tokens_per_s": tok_s, "cost/usd_per_hour": price, "cost/usd_per_1m_tokens": price / 3.6 / tok_s,
               "count/tokens_nonpad": 1000, "count/timed_steps": 10, "count/samples": 40,
               "perf/step_time_p50_s": 1000 / 10 / tok_s, "perf/samples_per_s": 40 * tok_s / 1000,
               "quality/eval_loss_final": losses[-1], "quality/eval_set_id": set_id}
    write_result(cell_dir / "metrics.json", CellResult(Status.ok, f"backend={backend},train.seed={seed}", num,
                                                       config=config, metrics=metrics, choices={"backend": backend}))


def hf_and_fast(d, fast_losses, fast_tok_s=2000.0, target=1.5, seeds=5):
    """hf (1,000 tok/s) and fast repeated over `seeds` seeds; hf's seeds reach 1.5 at the 3rd evaluation."""
    for s in range(seeds):
        quality_cell(d, s, "hf", s, [2.0, 1.7, 1.5 - 0.01 * s, 1.3], step_s=1.0 + 0.02 * s, target=target)
    for s in range(seeds):
        quality_cell(d, seeds + s, "fast", s, fast_losses(s), step_s=0.5 + 0.01 * s, tok_s=fast_tok_s, target=target)


def test_repeats_give_the_median_the_spread_and_mlperfs_score(tmp_path):
    hf_and_fast(tmp_path, lambda s: [2.0, 1.7, 1.5 - 0.01 * s, 1.3])
    results = write_report(tmp_path, ReportConfig(project=False)).results
    groups = {g.name: g for g in rq.repeat_groups(rq.to_target(results), axes(results))}
    hf = groups["backend=hf"]
    times = sorted(30 * (1.0 + 0.02 * s) + 3 * 2.0 for s in range(5))  # 30 steps, then 3 evaluations of 2 s
    assert hf.times == times and hf.median_s == times[2] and hf.spread_s == times[-1] - times[0]
    assert hf.mlperf_s == sum(times[1:-1]) / 3  # MLPerf: fastest and slowest dropped
    fast = groups["backend=fast"]
    assert fast.median_s < hf.median_s and not rq.within_noise(fast, hf)
    md = (tmp_path / "results.md").read_text()
    assert "- Cheapest to the target (eval loss <= 1.5000; quality.target_loss=1.5): backend=fast at" in md
    assert "MLPerf score" in md and "| backend=fast | 5 | 5/5 |" in md


def test_each_backend_is_held_to_the_others_at_its_fastest_configuration(tmp_path):
    """hf and fast at batch 4 and 8, 3 seeds each: hf's fastest to the target is batch 8 (0.8 s a step against
    1.0), fast's batch 4 (0.5 against 0.6); the table sets fast's best against hf's best, not against the same batch."""
    num = 0
    for backend, batch, step_s in (("hf", 4, 1.0), ("hf", 8, 0.8), ("fast", 4, 0.5), ("fast", 8, 0.6)):
        for s in range(3):
            quality_cell(tmp_path, num, backend, s, [2.0, 1.7, 1.4], step_s=step_s + 0.01 * s, target=1.5,
                         batch=batch)
            num += 1
    results = write_report(tmp_path, ReportConfig(project=False)).results
    groups = rq.repeat_groups(rq.to_target(results), axes(results))
    best = rq.backend_bests(groups)
    assert best["hf"].name == "backend=hf,batch=8" and best["fast"].name == "backend=fast,batch=4"
    fast_s, hf_s = 30 * 0.51 + 3 * 2.0, 30 * 0.81 + 3 * 2.0  # the median seed: 30 steps, 3 evaluations of 2 s
    assert best["fast"].median_s == pytest.approx(fast_s) and best["hf"].median_s == pytest.approx(hf_s)
    md = (tmp_path / "results.md").read_text()
    assert f"| fast | backend=fast,batch=4 | 2 | 3 | {fast_s:,.1f} |" in md
    assert f"| {fast_s / hf_s:.2f}x |" in md and "| hf | backend=hf,batch=8 | 2 | 3 |" in md


def test_faster_per_token_but_slower_to_the_target_is_said_so(tmp_path):
    """fast runs twice hf's tokens/s but its loss falls slower: it reaches the target two evaluations later, at
    twice the steps, which costs it more than its speed saved."""
    hf_and_fast(tmp_path, lambda s: [2.0, 1.9, 1.8, 1.7, 1.6, 1.5 - 0.01 * s], seeds=3)
    results = load_results(tmp_path)[0]
    lines = rq.answer_lines(rq.to_target(results), axes(results))
    assert lines[0].startswith("- Cheapest to the target (eval loss <= 1.5000; quality.target_loss=1.5): backend=hf")
    assert any(x.startswith("- backend=fast runs 2.00x the non-pad tokens/s of backend=hf but reaches the target "
                            "later") for x in lines)


def test_a_target_relative_to_hfs_loss_after_the_same_tokens(tmp_path):
    for s in range(3):
        quality_cell(tmp_path, s, "hf", s, [2.0, 1.6, 1.4], step_s=1.0, relative=1.1)
    quality_cell(tmp_path, 3, "liger", 0, [2.0, 1.7, 1.5], step_s=0.9, relative=1.1)
    results = write_report(tmp_path, ReportConfig(project=False)).results
    tt = rq.to_target(results)
    assert {round(c.target, 6) for c in tt} == {round(1.1 * 1.4, 6)}  # hf's median after 30,000 tokens, +10%
    assert "1.1 x hf's eval loss after 30,000 non-pad tokens (1.4000, median of 3 hf cells)" in tt[0].how
    (liger,) = [c for c in tt if c.cell.config["backend"]["name"] == "liger"]
    assert liger.reached.at.step == 30  # 1.5 <= 1.54; 1.7 is not
    csv = (tmp_path / "results.csv").read_text()
    assert "quality/time_to_target_s" in csv.splitlines()[0]


def parity_sweep(d, candidate_losses, hf_seeds=3, precision="fp32"):
    for s in range(hf_seeds):
        quality_cell(d, s, "hf", s, [2.0, 1.6, 1.40 + 0.01 * s], step_s=1.0, precision=precision)
    quality_cell(d, hf_seeds, "fast", 0, candidate_losses, step_s=0.5, precision=precision)
    results = load_results(d)[0]
    (p,) = rq.parities(rq.to_target(results), axes(results))
    return p


def test_parity_holds_a_backend_to_hfs_spread_and_the_rounding(tmp_path):
    """hf's 3 seeds spread 0.02 after 30,000 tokens: a run 0.005 from their median matches, one 0.2 off does not;
    the tolerance is 3 sd of the difference (sd = range / d2(3)) plus the rounding."""
    ok = parity_sweep(tmp_path / "ok", [2.0, 1.6, 1.415])
    sigma = 0.02 / 1.693
    assert ok.sigma == pytest.approx(sigma) and ok.hf_loss == 1.41 and ok.matches
    assert ok.tolerance == pytest.approx(ok.rounding + 3 * sigma * math.sqrt(math.pi / 2 * (1 / 3 + 1)))
    off = parity_sweep(tmp_path / "off", [2.0, 1.7, 1.61])
    assert not off.matches and "DIFFERS from hf" in off.sentence()


def test_parity_holds_each_batch_to_hfs_cells_at_that_batch(tmp_path):
    """hf at batch 8 learns less per token than at batch 4 (1.50 against 1.40 after 30,000 tokens): fast at batch 8
    matching hf's batch 8 matches, though it is 0.1 off hf's batch-4 cells."""
    for s in range(3):
        quality_cell(tmp_path, s, "hf", s, [2.0, 1.6, 1.40 + 0.01 * s], step_s=1.0, batch=4)
        quality_cell(tmp_path, 3 + s, "hf", s, [2.0, 1.7, 1.50 + 0.01 * s], step_s=1.0, batch=8)
    quality_cell(tmp_path, 6, "fast", 0, [2.0, 1.7, 1.51], step_s=0.5, batch=8)
    results = load_results(tmp_path)[0]
    (p,) = rq.parities(rq.to_target(results), axes(results))
    assert p.hf_loss == 1.51 and p.n == 3 and p.matches and "at batch 8" in p.reference


def test_without_repeats_parity_is_the_rounding_alone_and_says_so(tmp_path):
    p = parity_sweep(tmp_path, [2.0, 1.6, 1.40 * (1 + 2**-8)], hf_seeds=1, precision="bf16")
    assert p.sigma is None and p.tolerance == p.rounding == 2 * 2**-7 * 1.40 and p.matches
    assert "rounding alone, no repeats" in p.sentence()


def test_the_quality_plot_is_legible_at_24_cells(tmp_path):
    for i in range(24):
        quality_cell(tmp_path, i, ("hf", "fast", "liger")[i % 3], i // 3, [2.5 - 0.1 * i / 24, 1.8, 1.4 + i / 100],
                     step_s=1.0 + i / 10, target=1.5, batch=4 * (1 + i // 6))
    write_report(tmp_path, ReportConfig(project=False))
    assert (tmp_path / "plots" / "quality.png").stat().st_size > 20_000
    assert "<img alt='quality'" in (tmp_path / "report.html").read_text()
    assert "Eval loss against hf's after the same tokens (parity)" in (tmp_path / "results.md").read_text()
