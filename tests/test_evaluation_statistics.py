"""Bootstrap intervals and paired comparisons against hand-computed cases."""

import itertools

import numpy as np
import pytest

from trace_ray.evaluation.statistics import bootstrap_interval, paired_comparison, sign_flip_p_value


def test_a_constant_score_has_a_point_interval():
    assert bootstrap_interval([0.4] * 7) == pytest.approx((0.4, 0.4))


def test_two_tasks_give_the_whole_range():
    # resampling [0, 1]: means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the 2.5% and 97.5% points are 0 and 1
    assert bootstrap_interval([0.0, 1.0]) == pytest.approx((0.0, 1.0))


def test_the_interval_matches_the_exact_bootstrap_distribution():
    values = [0.0, 0.0, 1.0, 1.0, 1.0]
    # every resample of 5 from 5 (5^5 equally likely index tuples): the exact distribution of the mean
    means = np.sort([np.mean([values[i] for i in pick]) for pick in itertools.product(range(5), repeat=5)])
    exact = (np.quantile(means, 0.025), np.quantile(means, 0.975))  # (0.2, 1.0)
    assert exact == pytest.approx((0.2, 1.0))
    assert bootstrap_interval(values, resamples=50_000) == pytest.approx(exact, abs=0.0001)


def test_a_wider_confidence_gives_a_wider_interval():
    values = np.random.default_rng(1).random(30)
    low90, high90 = bootstrap_interval(values, 0.90)
    low99, high99 = bootstrap_interval(values, 0.99)
    assert low99 < low90 < values.mean() < high90 < high99


@pytest.mark.parametrize(
    "differences, expected",
    [
        ([1, 1, 1], 2 / 8),  # only all-plus and all-minus reach |sum| 3
        ([1, 1, -1], 1.0),  # every pattern reaches |sum| >= 1
        ([2, 1, 1, 0], 2 / 8),  # the zero drops out; sums of (+-2, +-1, +-1) are 4, 2, 2, 0, 0, -2, -2, -4
        ([0, 0], 1.0),
    ],
)
def test_sign_flip_p_values_by_hand(differences, expected):
    assert sign_flip_p_value(differences) == pytest.approx(expected)


def test_paired_comparison_counts_and_differences():
    result = paired_comparison([1.0, 0.5, 1.0, 0.0], [0.0, 0.5, 0.0, 0.0])
    assert result.mean_difference == pytest.approx(0.5)
    assert (result.wins, result.losses, result.ties) == (2, 0, 2)
    assert result.p_value == pytest.approx(2 / 4)  # two non-zero differences: ++ and -- reach |sum| 2
    assert result.interval[0] <= 0.5 <= result.interval[1]


def test_a_large_consistent_gain_is_significant_and_its_interval_excludes_zero():
    rng = np.random.default_rng(0)
    baseline = rng.random(40) * 0.5
    result = paired_comparison(baseline + 0.3 + rng.normal(0, 0.05, 40), baseline)
    assert result.p_value < 0.001 and result.interval[0] > 0.2


@pytest.mark.parametrize("method, baseline, message", [([], [], "non-empty"), ([1.0, 0.0], [1.0], "same tasks")])
def test_bad_inputs(method, baseline, message):
    with pytest.raises(ValueError, match=message):
        paired_comparison(method, baseline)
