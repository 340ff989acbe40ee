"""What a cell's evaluations say: the first one at or under the target, the loss after a token count between two
evaluations, and the quality/ metrics with the evaluations' time apart."""

import pytest

from lorabench.measure.quality import Eval, first_reaching, loss_at_tokens, summary


def curve(*points, eval_s=1.0, usd_per_s=0.01):
    """Evaluations after (step, tokens, seconds of steps, loss), each taking eval_s."""
    out = []
    for i, (step, tokens, train_s, loss) in enumerate(points):
        out.append(Eval(step, tokens, train_s, eval_s * (i + 1), loss, eval_s, (train_s + eval_s * (i + 1)) * usd_per_s))
    return out


def test_time_to_target_counts_the_steps_and_every_evaluation_up_to_the_first_that_reaches_it():
    evals = curve((10, 1000, 5.0, 2.0), (20, 2000, 10.0, 1.5), (30, 3000, 15.0, 1.2), (40, 4000, 20.0, 1.1))
    r = first_reaching(evals, 1.5)  # at or under: the second evaluation
    assert r.reached and r.at.step == 20 and r.at.time_s == 10.0 + 2 * 1.0
    m = summary(evals, 1.5, warmup_s=0.7)
    assert m["quality/time_to_target_s"] == 12.0 and m["quality/train_s_to_target"] == 10.0
    assert m["quality/eval_s_to_target"] == 2.0 and m["quality/tokens_to_target"] == 2000
    assert m["quality/usd_to_target"] == pytest.approx(12.0 * 0.01) and m["quality/reached"] == 1
    assert m["quality/eval_loss_final"] == 1.1 and m["quality/eval_s"] == 4.0 and m["quality/wall_s"] == 24.0
    assert m["quality/warmup_s_included"] == 0.7


def test_a_target_no_evaluation_reached_is_not_reached_in_the_budget():
    evals = curve((10, 1000, 5.0, 2.0), (20, 2000, 10.0, 1.6))
    r = first_reaching(evals, 1.5)
    assert not r.reached and r.best.eval_loss == 1.6
    assert r.words() == "not reached in the budget (best 1.6000 at step 20)"
    m = summary(evals, 1.5, 0.0)
    assert m["quality/reached"] == 0 and "quality/time_to_target_s" not in m


def test_the_loss_after_a_token_count_lies_on_the_line_between_two_evaluations():
    evals = curve((10, 1000, 5.0, 2.0), (20, 3000, 10.0, 1.0))
    assert loss_at_tokens(evals, 2000) == pytest.approx(1.5)
    assert loss_at_tokens(evals, 1000) == 2.0 and loss_at_tokens(evals, 3000) == 1.0
    assert loss_at_tokens(evals, 3500) is None and loss_at_tokens(evals, 500) is None  # no extrapolation
    assert summary([], 1.0, 0.0) == {}
