"""Bootstrap intervals and paired comparisons against hand-computed cases."""

import itertools
import math

import numpy as np
import pytest

from trace_ray.evaluation.statistics import (
    EXACT_LIMIT,
    bootstrap_interval,
    holm_adjusted,
    paired_comparison,
    sign_flip_p_value,
)


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


@pytest.mark.parametrize("resamples", [999, 100_000])
def test_a_monte_carlo_p_value_with_no_pattern_as_extreme_is_one_over_m_plus_one(resamples):
    # 60 equal differences: only the all-plus and all-minus patterns (probability 2 / 2^60) reach |sum| 60,
    # so no random pattern does (b = 0) and the p-value is (0 + 1) / (m + 1), not 0
    differences = [0.5] * 60
    assert len(differences) > EXACT_LIMIT
    assert sign_flip_p_value(differences, resamples=resamples) == 1 / (resamples + 1)


def test_a_monte_carlo_p_value_where_every_pattern_is_as_extreme_is_one():
    # observed sum 0: every pattern reaches |sum| >= 0, so b = m and (m + 1) / (m + 1) = 1
    assert sign_flip_p_value([1.0] * 10 + [-1.0] * 10, resamples=500) == 1.0


def test_a_monte_carlo_p_value_estimates_the_binomial_tail():
    # 15 differences of +1 and 5 of -1: the sign-flipped sum is 2k - 20 with k ~ Binomial(20, 1/2);
    # P(|2k - 20| >= 10) = 2 (C(20,15) + ... + C(20,20)) / 2^20 = 2 * 21700 / 1048576 = 0.041389...
    exact = 2 * sum(math.comb(20, k) for k in range(15, 21)) / 2**20
    assert exact == pytest.approx(2 * 21700 / 1048576)
    # 100,000 resamples: standard error sqrt(0.04 * 0.96 / 1e5) = 0.0006
    assert sign_flip_p_value([1.0] * 15 + [-1.0] * 5) == pytest.approx(exact, abs=0.003)


def test_holm_adjusted_p_values_by_hand():
    # m = 4; sorted ascending 0.005 (4th), 0.01 (1st), 0.03 (3rd), 0.04 (2nd):
    #   0.005 -> min(1, 4 * 0.005) = 0.02
    #   0.01  -> max(0.02, 3 * 0.01 = 0.03) = 0.03
    #   0.03  -> max(0.03, 2 * 0.03 = 0.06) = 0.06
    #   0.04  -> max(0.06, 1 * 0.04 = 0.04) = 0.06 (the step-down keeps the adjusted values monotone)
    assert holm_adjusted([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1: 2 * 0.6 = 1.2 -> 1, then max(1, 0.7) = 1
    assert holm_adjusted([0.7, 0.6]) == [1.0, 1.0]
    # ties: 3 * 0.02 = 0.06, then max(0.06, 2 * 0.02 = 0.04) = 0.06, then max(0.06, 1 * 0.5) = 0.5
    assert holm_adjusted([0.02, 0.5, 0.02]) == pytest.approx([0.06, 0.5, 0.06])
    assert holm_adjusted([0.3]) == [0.3] and holm_adjusted([]) == []
    with pytest.raises(ValueError, match="must lie in"):
        holm_adjusted([0.1, 1.5])


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
