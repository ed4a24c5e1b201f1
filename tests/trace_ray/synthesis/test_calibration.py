import itertools
import json
import math
from fractions import Fraction

import pytest

from trace_ray.synthesis.calibration import (
    Band,
    CalibrationRound,
    CalibrationStats,
    band_verdict,
    calibration_stats,
    calibration_table,
    pass_at_k,
    search_difficulty,
)

# --------------------------------------------------------------------------- pass@k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),  # 1 - C(3,1)/C(4,1) = 1 - 3/4
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (10, 3, 2, 1 - 21 / 45),  # 1 - C(7,2)/C(10,2)
        (8, 0, 4, 0.0),  # no success
        (8, 8, 1, 1.0),  # all successes
        (16, 3, 16, 1.0),  # every 16-subset of 16 contains a success
        (16, 1, 1, 1 / 16),
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_brute_force_over_all_subsets():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))  # samples 0..c-1 are the successes
                hit = sum(any(i < c for i in s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(hit, abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n():
    exact = 1 - Fraction(math.comb(990, 500), math.comb(1000, 500))
    value = pass_at_k(1000, 10, 500)
    assert math.isfinite(value)
    assert value == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(100_000, 1, 1) == pytest.approx(1e-5, rel=1e-9)


@pytest.mark.parametrize(
    ("n", "c", "k", "match"),
    [
        (4, 1, 5, "exceeds"),
        (4, 1, 0, "at least 1"),
        (4, 1, -1, "at least 1"),
        (4, 5, 1, "0..n"),
        (4, -1, 1, "0..n"),
        (0, 0, 1, "exceeds"),
    ],
)
def test_pass_at_k_rejects_bad_arguments(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_pass_at_k_rejects_non_integers():
    with pytest.raises(TypeError):
        pass_at_k(4.0, 1, 1)
    with pytest.raises(TypeError):
        pass_at_k(4, True, 1)


# --------------------------------------------------------------------------- calibration_stats

S, F = True, False
HAND_GROUPS = [
    [(1.0, S), (1.0, S), (1.0, S), (1.0, S)],  # all success (not all-zero, not informative), c = 4
    [(0.0, F), (0.0, F), (0.0, F), (0.0, F)],  # all zero, not informative, c = 0
    [(1.0, S), (0.5, F), (0.0, F), (0.5, F)],  # informative, c = 1
    [(0.3, F), (0.3, F), (0.3, F), (0.3, F)],  # equal non-zero rewards: neither all-zero nor informative
]


def test_calibration_stats_by_hand():
    stats = calibration_stats(HAND_GROUPS, ks=(1, 2, 4, 8, 16))
    assert (stats.n_groups, stats.group_size) == (4, 4)
    # rewards sum 4 + 0 + 2 + 1.2 = 7.2 over 16 rollouts
    assert stats.mean_reward == pytest.approx(0.45)
    # successes 4 + 0 + 1 + 0 = 5 of 16
    assert stats.success_rate == pytest.approx(5 / 16)
    # squared deviations from 0.45: G1 4*0.55^2 = 1.21, G2 4*0.45^2 = 0.81,
    # G3 0.55^2 + 0.05^2 + 0.45^2 + 0.05^2 = 0.51, G4 4*0.15^2 = 0.09; sum 2.62 / 16 = 0.16375
    assert stats.reward_std == pytest.approx(math.sqrt(0.16375))
    # pass@1: (1 + 0 + 1/4 + 0) / 4; pass@2: (1 + 0 + 1 - C(3,2)/C(4,2) + 0) / 4 = (1 + 0.5) / 4;
    # pass@4: (1 + 0 + 1 + 0) / 4; k = 8, 16 exceed the group size
    assert stats.pass_at_k[1] == pytest.approx(0.3125)
    assert stats.pass_at_k[2] == pytest.approx(0.375)
    assert stats.pass_at_k[4] == pytest.approx(0.5)
    assert stats.pass_at_k[8] is None and stats.pass_at_k[16] is None
    assert list(stats.pass_at_k) == [1, 2, 4, 8, 16]
    # one group each: all-success G1, all-zero G2, informative G3
    assert stats.all_success_fraction == pytest.approx(0.25)
    assert stats.all_zero_fraction == pytest.approx(0.25)
    assert stats.informative_fraction == pytest.approx(0.25)


def test_calibration_stats_default_ks_and_json():
    stats = calibration_stats(HAND_GROUPS)
    assert list(stats.pass_at_k) == [1, 4, 8, 16]
    data = stats.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["pass_at_k"] == {"1": pytest.approx(0.3125), "4": pytest.approx(0.5), "8": None, "16": None}
    assert data["n_groups"] == 4 and data["informative_fraction"] == pytest.approx(0.25)


def test_calibration_stats_single_rollout_groups():
    # group size 1: no group can be informative; success 1 of 3
    stats = calibration_stats([[(1.0, S)], [(0.0, F)], [(0.0, F)]], ks=(1, 4))
    assert stats.informative_fraction == 0.0
    assert stats.all_success_fraction == pytest.approx(1 / 3)
    assert stats.all_zero_fraction == pytest.approx(2 / 3)
    assert stats.pass_at_k == {1: pytest.approx(1 / 3), 4: None}
    # rewards 1, 0, 0: mean 1/3, population variance (4/9 + 1/9 + 1/9) / 3 = 2/9
    assert stats.reward_std == pytest.approx(math.sqrt(2 / 9))


def test_calibration_stats_rejects_bad_input():
    with pytest.raises(ValueError, match="no groups"):
        calibration_stats([])
    with pytest.raises(ValueError, match="same size"):
        calibration_stats([[(1.0, S), (0.0, F)], [(1.0, S)]])
    with pytest.raises(ValueError, match="empty"):
        calibration_stats([[], []])
    with pytest.raises(ValueError, match="non-finite"):
        calibration_stats([[(float("nan"), F)]])
    with pytest.raises(ValueError, match="positive integer"):
        calibration_stats([[(1.0, S)]], ks=(0,))


# --------------------------------------------------------------------------- band_verdict


def make_stats(mean=0.4, success=0.4, all_success=0.1, all_zero=0.1, informative=0.8, std=0.3):
    return CalibrationStats(
        n_groups=10,
        group_size=8,
        mean_reward=mean,
        success_rate=success,
        reward_std=std,
        pass_at_k={1: success, 4: None, 8: None, 16: None},
        all_success_fraction=all_success,
        all_zero_fraction=all_zero,
        informative_fraction=informative,
    )


BAND = Band()


def test_band_verdict_in_band():
    assert band_verdict(make_stats(), BAND) == ("in_band", [])
    # edges are inside, also up to floating-point rounding (0.1 + 0.2 + 0.3 = 0.6000000000000001)
    edge = make_stats(mean=0.1 + 0.2 + 0.3, success=0.2, all_success=0.2, all_zero=0.2)
    assert band_verdict(edge, BAND) == ("in_band", [])


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"mean": 0.7}, "mean reward 0.70 > 0.60"),
        ({"success": 0.81}, "success rate 0.81 > 0.60"),
        ({"all_success": 0.35}, "all-success groups 0.35 > 0.20"),
        ({"success": 0.601}, "success rate 0.601 > 0.600"),  # more decimals where 2 would print equal
    ],
)
def test_band_verdict_too_easy_each_reason(overrides, reason):
    assert band_verdict(make_stats(**overrides), BAND) == ("too_easy", [reason])


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"mean": 0.1}, "mean reward 0.10 < 0.20"),
        ({"success": 0.05}, "success rate 0.05 < 0.20"),
        ({"all_zero": 0.35}, "all-zero groups 0.35 > 0.20"),
    ],
)
def test_band_verdict_too_hard_each_reason(overrides, reason):
    assert band_verdict(make_stats(**overrides), BAND) == ("too_hard", [reason])


def test_band_verdict_lists_every_reason_of_one_kind():
    verdict, reasons = band_verdict(make_stats(mean=0.9, success=0.95, all_success=0.8, all_zero=0.0), BAND)
    assert verdict == "too_easy"
    assert reasons == ["mean reward 0.90 > 0.60", "success rate 0.95 > 0.60", "all-success groups 0.80 > 0.20"]
    verdict, reasons = band_verdict(make_stats(mean=0.05, success=0.0, all_success=0.0, all_zero=0.9), BAND)
    assert verdict == "too_hard"
    assert reasons == ["mean reward 0.05 < 0.20", "success rate 0.00 < 0.20", "all-zero groups 0.90 > 0.20"]


def test_band_verdict_conflict_is_decided_by_mean_reward_against_band_middle():
    # bimodal: 45% all-success and 45% all-zero groups, mean 0.5 above the middle 0.4 -> too easy
    verdict, reasons = band_verdict(make_stats(mean=0.5, success=0.45, all_success=0.45, all_zero=0.45), BAND)
    assert verdict == "too_easy"
    assert "all-success groups 0.45 > 0.20" in reasons and "all-zero groups 0.45 > 0.20" in reasons
    assert reasons[-1] == "conflicting signals: mean reward 0.50 > band middle 0.40"
    # same shape with mean 0.3 below the middle -> too hard
    verdict, reasons = band_verdict(make_stats(mean=0.3, success=0.3, all_success=0.3, all_zero=0.5), BAND)
    assert verdict == "too_hard"
    assert "all-success groups 0.30 > 0.20" in reasons and "all-zero groups 0.50 > 0.20" in reasons
    assert reasons[-1] == "conflicting signals: mean reward 0.30 <= band middle 0.40"
    # success above the band while mean reward is below it (successes with low reward)
    verdict, _ = band_verdict(make_stats(mean=0.15, success=0.65, all_success=0.0, all_zero=0.0), BAND)
    assert verdict == "too_hard"
    # the middle follows the band
    verdict, _ = band_verdict(
        make_stats(mean=0.5, success=0.5, all_success=0.3, all_zero=0.3), Band(mean_reward=(0.4, 0.8))
    )
    assert verdict == "too_hard"


def test_band_rejects_inverted_edges():
    with pytest.raises(ValueError, match="mean_reward"):
        Band(mean_reward=(0.6, 0.2))


# --------------------------------------------------------------------------- search_difficulty

LEVELS = list(range(7))  # 0 (easiest) .. 6 (hardest)
OFFSETS = (-2, -2, 0, 0, 2, 2)  # per task seed: some seeds are easier, some harder


def scripted_groups(difficulty, size=6):
    """Deterministic groups of a policy with success probability p(d) = 1 - d/6.

    Seed g succeeds on round(6 p(d)) + OFFSETS[g] of its 6 rollouts (clamped to 0..6); reward 1
    for a success, 0 otherwise. Successes per seed:
      d=0: 6 6 6 6 6 6 (too easy)        d=4: 0 0 2 2 4 4 (all-zero 1/3: too hard)
      d=1: 3 3 5 5 6 6 (too easy)        d=5: 0 0 1 1 3 3 (too hard)
      d=2: 2 2 4 4 6 6 (all-success 1/3) d=6: all zero (too hard)
      d=3: 1 1 3 3 5 5 (mean 0.5, no all-success/all-zero group: in band)
    """
    base = round(size * (1 - difficulty / 6))
    groups = []
    for offset in OFFSETS:
        c = min(size, max(0, base + offset))
        groups.append([(1.0, True)] * c + [(0.0, False)] * (size - c))
    return groups


class Counting:
    """evaluate() that records its calls and fails on a repeated level."""

    def __init__(self, stats_of):
        self.stats_of = stats_of
        self.calls = []

    def __call__(self, level):
        assert level not in self.calls, f"level {level} evaluated twice"
        self.calls.append(level)
        return self.stats_of(level)


def scripted_policy():
    return Counting(lambda d: calibration_stats(scripted_groups(d)))


def test_scripted_policy_verdicts():
    verdicts = [band_verdict(calibration_stats(scripted_groups(d)), BAND)[0] for d in LEVELS]
    assert verdicts == ["too_easy", "too_easy", "too_easy", "in_band", "too_hard", "too_hard", "too_hard"]


def test_search_converges_from_an_easy_start():
    evaluate = scripted_policy()
    result = search_difficulty(evaluate, LEVELS, start=1, band=BAND, max_rounds=5)
    assert result.in_band and result.difficulty == 3
    # 1 too easy -> bracket 2..6, middle 4 too hard -> bracket 2..3, middle 2 too easy -> 3
    assert evaluate.calls == [1, 4, 2, 3]
    assert [r.round for r in result.rounds] == [1, 2, 3, 4]
    assert [r.verdict for r in result.rounds] == ["too_easy", "too_hard", "too_easy", "in_band"]
    assert result.rounds[-1].reasons == []
    assert "all-zero groups 0.33 > 0.20" in result.rounds[1].reasons


def test_search_converges_from_a_hard_start():
    evaluate = scripted_policy()
    result = search_difficulty(evaluate, LEVELS, start=5, band=BAND, max_rounds=5)
    assert result.in_band and result.difficulty == 3
    # 5 too hard -> bracket 0..4, middle 2 too easy -> bracket 3..4, middle 3 in band
    assert evaluate.calls == [5, 2, 3]


def test_search_stops_at_once_when_start_is_in_band():
    evaluate = scripted_policy()
    result = search_difficulty(evaluate, LEVELS, start=3, band=BAND, max_rounds=5)
    assert (result.difficulty, result.in_band, evaluate.calls) == (3, True, [3])


def test_search_respects_max_rounds_and_falls_back():
    evaluate = scripted_policy()
    result = search_difficulty(evaluate, LEVELS, start=1, band=BAND, max_rounds=2)
    assert evaluate.calls == [1, 4] and len(result.rounds) == 2
    assert not result.in_band
    # both have informative fraction 4/6; mean rewards 28/36 (level 1) and 12/36 (level 4):
    # level 4 is closer to the band's middle 0.4
    assert result.difficulty == 4 and result.chosen is result.rounds[1]
    # level 4: successes 0 0 2 2 4 4 of 6 per seed -> mean and success 12/36, no all-success group,
    # all-zero groups 2 of 6 (above 0.2: too hard, the only reason)
    assert result.chosen.figures() == {
        "difficulty": 4,
        "verdict": "too_hard",
        "mean_reward": pytest.approx(1 / 3),
        "success_rate": pytest.approx(1 / 3),
        "all_success_fraction": 0.0,
        "all_zero_fraction": pytest.approx(1 / 3),
        "reasons": ["all-zero groups 0.33 > 0.20"],
    }

    evaluate = scripted_policy()
    result = search_difficulty(evaluate, LEVELS, start=6, band=BAND, max_rounds=1)
    assert evaluate.calls == [6] and (result.difficulty, result.in_band) == (6, False)


def test_search_fallback_prefers_informative_level_when_all_too_easy():
    # every level is too easy; level 3 has the most informative groups although 4 is harder
    informative = {1: 0.2, 2: 0.9, 3: 0.6, 4: 0.5}
    mean = {1: 0.95, 2: 0.9, 3: 0.85, 4: 0.7}
    evaluate = Counting(
        lambda d: make_stats(mean=mean[d], success=mean[d], all_success=0.5, all_zero=0.0, informative=informative[d])
    )
    result = search_difficulty(evaluate, [1, 2, 3, 4], start=1, band=BAND, max_rounds=5)
    # 1 too easy -> bracket 2..4, middle 3 too easy -> bracket 4, 4 too easy -> empty bracket; 2 never tried
    assert evaluate.calls == [1, 3, 4]
    assert [r.verdict for r in result.rounds] == ["too_easy"] * 3
    assert (result.difficulty, result.in_band) == (3, False)


def test_search_fallback_ties_go_to_mean_reward_then_lower_difficulty():
    band = Band(mean_reward=(0.25, 0.75), success_rate=(0.25, 0.75))  # middle 0.5, exact in binary
    stats = {
        1: make_stats(mean=0.875, success=0.875, all_success=0.0, all_zero=0.0, informative=0.5),
        2: make_stats(mean=0.875, success=0.875, all_success=0.0, all_zero=0.0, informative=0.5),
        3: make_stats(mean=0.125, success=0.125, all_success=0.0, all_zero=0.0, informative=0.5),
        4: make_stats(mean=0.0, success=0.0, all_success=0.0, all_zero=0.0, informative=0.5),
    }
    # start 4 too hard -> bracket 1..3, middle 2 too easy -> bracket 3, 3 too hard -> empty
    evaluate = Counting(stats.__getitem__)
    result = search_difficulty(evaluate, [1, 2, 3, 4], start=4, band=band, max_rounds=5)
    assert evaluate.calls == [4, 2, 3]
    # equal informative; |0.875 - 0.5| = |0.125 - 0.5| = 0.375 for 2 and 3 -> the lower difficulty, 2
    assert (result.difficulty, result.in_band) == (2, False)
    # a mean reward closer to the middle beats the lower difficulty
    stats[3] = make_stats(mean=0.1875, success=0.125, all_success=0.0, all_zero=0.0, informative=0.5)
    evaluate = Counting(stats.__getitem__)
    assert search_difficulty(evaluate, [1, 2, 3, 4], start=4, band=band, max_rounds=5).difficulty == 3


def test_search_never_repeats_and_keeps_the_bracket_for_any_verdicts():
    """Exhaustively over every verdict pattern of 5 levels (also non-monotone ones) and every start."""
    levels = [10, 20, 30, 40, 50]
    kinds = {
        "too_easy": make_stats(mean=0.9, success=0.9),
        "too_hard": make_stats(mean=0.05, success=0.05),
        "in_band": make_stats(),
    }
    for pattern in itertools.product(kinds, repeat=len(levels)):
        verdict_of = dict(zip(levels, pattern))
        for start in levels:
            for max_rounds in (1, 2, 10):
                evaluate = Counting(lambda d, verdict_of=verdict_of: kinds[verdict_of[d]])
                result = search_difficulty(evaluate, levels, start=start, band=BAND, max_rounds=max_rounds)
                assert evaluate.calls[0] == start
                assert len(evaluate.calls) == len(result.rounds) <= max_rounds
                assert [r.difficulty for r in result.rounds] == evaluate.calls
                for i, r in enumerate(result.rounds):
                    later = [levels.index(x.difficulty) for x in result.rounds[i + 1 :]]
                    here = levels.index(r.difficulty)
                    if r.verdict == "too_easy":
                        assert all(j > here for j in later)
                    elif r.verdict == "too_hard":
                        assert all(j < here for j in later)
                    else:
                        assert later == []
                found = [r.difficulty for r in result.rounds if r.verdict == "in_band"]
                assert result.in_band == bool(found)
                if found:
                    assert result.difficulty == found[0]
                else:
                    # the nearest level: every kind has informative 0.8; a too-hard level's mean 0.05 is 0.35 from
                    # the band's middle 0.4, a too-easy one's 0.9 is 0.5 away: the easiest too-hard level tried,
                    # else the easiest level tried
                    hard = [level for level in evaluate.calls if verdict_of[level] == "too_hard"]
                    assert result.difficulty == min(hard or evaluate.calls)


def test_search_rejects_bad_arguments():
    evaluate = scripted_policy()
    with pytest.raises(ValueError, match="no difficulty levels"):
        search_difficulty(evaluate, [], start=1, band=BAND, max_rounds=3)
    with pytest.raises(ValueError, match="not one of the levels"):
        search_difficulty(evaluate, LEVELS, start=9, band=BAND, max_rounds=3)
    with pytest.raises(ValueError, match="max_rounds"):
        search_difficulty(evaluate, LEVELS, start=1, band=BAND, max_rounds=0)
    with pytest.raises(ValueError, match="distinct"):
        search_difficulty(evaluate, [1, 2, 2], start=1, band=BAND, max_rounds=3)
    assert evaluate.calls == []


# --------------------------------------------------------------------------- report


def test_calibration_table_and_json():
    result = search_difficulty(scripted_policy(), LEVELS, start=1, band=BAND, max_rounds=5)
    table = calibration_table(result.rounds)
    lines = table.splitlines()
    assert lines[0] == (
        "| round | difficulty | mean reward | success | reward std | pass@1 | pass@4 | pass@8 | pass@16 "
        "| all-success | all-zero | informative | verdict |"
    )
    assert len(lines) == 2 + len(result.rounds) == 6
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert [row[0] for row in rows] == ["1", "2", "3", "4"]
    assert [row[1] for row in rows] == ["1", "4", "2", "3"]
    assert [row[-1] for row in rows] == ["too_easy", "too_hard", "too_easy", "in_band"]
    # level 3: successes 1 1 3 3 5 5 of 6 -> mean 18/36 = 0.5, std 0.5, all-success/all-zero 0, informative 1;
    # group size 6 -> pass@8 and pass@16 undefined
    assert rows[3][2:5] == ["0.500", "0.500", "0.500"]
    assert rows[3][7:9] == ["-", "-"]
    assert rows[3][9:12] == ["0.00", "0.00", "1.00"]
    assert rows[1][10] == "0.33"  # level 4: all-zero 2 of 6
    assert calibration_table([]).count("\n") == 1  # header and separator only

    data = result.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["difficulty"] == 3 and data["in_band"] is True
    assert data["rounds"][0]["stats"]["pass_at_k"]["16"] is None
    # level 4: mean and success 12/36 inside [0.2, 0.6], no all-success group, all-zero 2/6 = 0.33 > 0.2: the one reason
    assert data["rounds"][1]["verdict"] == "too_hard" and data["rounds"][1]["reasons"] == [
        "all-zero groups 0.33 > 0.20"
    ]
    assert isinstance(result.rounds[0], CalibrationRound)
