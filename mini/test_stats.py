"""The paired bootstrap of evaluate.py (and chess_eval.py's --compare) against answers known without it,
with tolerances that tell a 95% interval from a 90% one.

    python mini/test_stats.py
"""
import pytest

from mini import evaluate as ev


def test_interval_of_a_coin_is_the_binomial_one():
    """100 prompts, half gaining 1: a bootstrap mean is Binomial(100, 1/2) / 100, whose 2.5% and 97.5% quantiles
    are 0.40 and 0.60 (P(X <= 39) = 0.0176 < 0.025 <= P(X <= 40) = 0.0284; by symmetry 60). A 90% interval
    would be [0.42, 0.58] (P(X <= 41) = 0.0443 < 0.05 <= P(X <= 42) = 0.0666): 0.02 away, 4 tolerances."""
    rows = ev.paired_bootstrap({"m": [0.0] * 100}, {"m": [0.0, 1.0] * 50}, n_boot=20000)
    b, a, d, lo, hi, n = rows["m"]
    assert (b, a, d, n) == (0.0, 0.5, 0.5, 100)
    assert lo == pytest.approx(0.40, abs=0.005) and hi == pytest.approx(0.60, abs=0.005)


def test_interval_of_a_loss_mirrors_the_gain():
    """The same coin as a loss on a before of 1: delta -0.5, interval [-0.60, -0.40]."""
    b, a, d, lo, hi, n = ev.paired_bootstrap({"m": [1.0] * 100}, {"m": [1.0, 0.0] * 50}, n_boot=20000)["m"]
    assert (b, a, d, n) == (1.0, 0.5, -0.5, 100)
    assert lo == pytest.approx(-0.60, abs=0.005) and hi == pytest.approx(-0.40, abs=0.005)


def test_the_interval_is_over_prompts_both_sides_measured():
    """None (not measured) on either side drops the prompt: of 102 prompts 100 pair up, the coin above."""
    before, after = [0.0] * 100 + [None, 5.0], [0.0, 1.0] * 50 + [3.0, None]
    b, a, d, lo, hi, n = ev.paired_bootstrap({"m": before}, {"m": after}, n_boot=20000)["m"]
    assert (b, a, d, n) == (0.0, 0.5, 0.5, 100)
    assert lo == pytest.approx(0.40, abs=0.005) and hi == pytest.approx(0.60, abs=0.005)


def test_a_constant_delta_has_no_spread_and_a_sure_one_no_interval():
    """Every prompt gains 0.25 (a varying before): the interval is [0.25, 0.25]; prompts that all gain 0 or
    all gain 1 give [0, 0] and [1, 1]."""
    before = [i / 10 for i in range(10)]
    rows = ev.paired_bootstrap({"m": before, "z": [0.0] * 10, "o": [0.0] * 10},
                               {"m": [x + 0.25 for x in before], "z": [0.0] * 10, "o": [1.0] * 10})
    assert rows["m"][2:5] == pytest.approx((0.25, 0.25, 0.25), abs=1e-12)
    assert rows["z"][2:5] == (0.0, 0.0, 0.0) and rows["o"][2:5] == (1.0, 1.0, 1.0)



def test_an_interval_does_not_depend_on_the_metrics_beside_it():
    """The prompt draws are seeded by the seed and the number of pairs: a metric's interval is the same alone
    as after a metric of another length (an evaluation with a section more or less)."""
    before, after = [0.0] * 60, [0.0, 1.0] * 30
    alone = ev.paired_bootstrap({"m": before}, {"m": after})["m"]
    beside = ev.paired_bootstrap({"other": [0.0] * 7, "m": before}, {"other": [1.0, 0.0] * 3 + [1.0], "m": after})
    assert beside["m"] == alone


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
