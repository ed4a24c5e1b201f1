"""Difficulty calibration of a synthetic training environment (TRACE step 2), pure logic.

GRPO learns only from groups whose rewards differ (the advantage of a group with identical
rewards is zero), so a synthetic environment is useful only if the base model's success sits in
a middle band. Calibration samples K rollouts for each of a number of task seeds at one
difficulty level, summarizes them (``calibration_stats``), compares the summary with the
acceptance band (``band_verdict``; reference: mean reward 0.2-0.6, success 0.2-0.6, at most 20%
all-success and at most 20% all-zero groups) and, if the level is too easy or too hard, tries
another one (``search_difficulty``, a bisection over the ordered levels).

pass@k uses the unbiased estimator 1 - C(n-c, k) / C(n, k) for n samples of which c succeeded,
computed as a product so that no large binomial coefficient is formed.

Threshold comparisons allow a tolerance of 1e-9 so that a value that equals a band edge up to
floating-point rounding counts as on the edge (inside the band).

Nothing here runs rollouts, touches files or imports Ray or torch.
"""

from __future__ import annotations

import math
import numbers
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

VERDICTS = ("in_band", "too_easy", "too_hard")
DEFAULT_KS = (1, 4, 8, 16)
TABLE_KS = (1, 4, 8, 16)  # the pass@k columns of calibration_table
_TOLERANCE = 1e-9


# --------------------------------------------------------------------------- pass@k


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"pass_at_k: {name} must be an integer, got {value!r}")
    return int(value)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for n samples with c successes: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which equals the ratio of binomials and
    never forms a factorial. Raises ValueError unless 1 <= k <= n and 0 <= c <= n.
    """
    n, c, k = _check_int("n", n), _check_int("c", c), _check_int("k", k)
    if k < 1:
        raise ValueError(f"pass_at_k: k must be at least 1, got k={k}")
    if k > n:
        raise ValueError(f"pass_at_k: k={k} exceeds the number of samples n={n}")
    if c < 0 or c > n:
        raise ValueError(f"pass_at_k: successes c={c} must lie in 0..n (n={n})")
    if n - c < k:  # every k-subset contains a success
        return 1.0
    miss = math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
    return min(1.0, max(0.0, 1.0 - miss))


# --------------------------------------------------------------------------- statistics


@dataclass
class CalibrationStats:
    """Summary of the calibration rollouts at one difficulty level."""

    n_groups: int
    group_size: int
    mean_reward: float
    success_rate: float
    reward_std: float  # std of all rollout rewards (population, ddof=0)
    pass_at_k: dict[int, float | None]  # mean over groups; None where k > group_size
    all_success_fraction: float  # groups where every rollout succeeded
    all_zero_fraction: float  # groups where every reward == 0.0
    informative_fraction: float  # groups whose rewards are not all equal

    def to_json(self) -> dict:
        return {
            "n_groups": int(self.n_groups),
            "group_size": int(self.group_size),
            "mean_reward": float(self.mean_reward),
            "success_rate": float(self.success_rate),
            "reward_std": float(self.reward_std),
            "pass_at_k": {str(k): (None if v is None else float(v)) for k, v in self.pass_at_k.items()},
            "all_success_fraction": float(self.all_success_fraction),
            "all_zero_fraction": float(self.all_zero_fraction),
            "informative_fraction": float(self.informative_fraction),
        }


def calibration_stats(groups: list[list[tuple[float, bool]]], ks: tuple[int, ...] = DEFAULT_KS) -> CalibrationStats:
    """Summarize groups of rollouts: one list per task seed, each the (reward, success) of its K rollouts.

    All groups must have the same, non-zero size. pass@k is the mean over groups of
    pass_at_k(group_size, successes in the group, k), or None for a k above the group size.
    """
    if not groups:
        raise ValueError("calibration_stats: no groups (need at least one group of rollouts)")
    sizes = sorted({len(group) for group in groups})
    if len(sizes) != 1:
        raise ValueError(f"calibration_stats: all groups must have the same size, got sizes {sizes}")
    group_size = sizes[0]
    if group_size == 0:
        raise ValueError("calibration_stats: groups are empty (need at least one rollout per group)")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"calibration_stats: every k must be a positive integer, got {k!r}")

    rewards_per_group: list[list[float]] = []
    successes_per_group: list[int] = []
    for g, group in enumerate(groups):
        rewards = []
        successes = 0
        for rollout in group:
            reward, success = rollout
            reward = float(reward)
            if not math.isfinite(reward):
                raise ValueError(f"calibration_stats: group {g} has a non-finite reward {reward!r}")
            rewards.append(reward)
            successes += bool(success)
        rewards_per_group.append(rewards)
        successes_per_group.append(successes)

    n_groups = len(groups)
    all_rewards = [r for rewards in rewards_per_group for r in rewards]
    pass_k: dict[int, float | None] = {}
    for k in ks:
        k = int(k)
        if k > group_size:
            pass_k[k] = None
        else:
            pass_k[k] = statistics.fmean(pass_at_k(group_size, c, k) for c in successes_per_group)
    return CalibrationStats(
        n_groups=n_groups,
        group_size=group_size,
        mean_reward=statistics.fmean(all_rewards),
        success_rate=sum(successes_per_group) / len(all_rewards),
        reward_std=statistics.pstdev(all_rewards),
        pass_at_k=pass_k,
        all_success_fraction=sum(c == group_size for c in successes_per_group) / n_groups,
        all_zero_fraction=sum(all(r == 0.0 for r in rewards) for rewards in rewards_per_group) / n_groups,
        informative_fraction=sum(len(set(rewards)) > 1 for rewards in rewards_per_group) / n_groups,
    )


# --------------------------------------------------------------------------- band


@dataclass(frozen=True)
class Band:
    """Acceptance band of calibration (reference values as defaults)."""

    mean_reward: tuple[float, float] = (0.2, 0.6)
    success_rate: tuple[float, float] = (0.2, 0.6)
    max_all_success: float = 0.2
    max_all_zero: float = 0.2

    def __post_init__(self) -> None:
        for name in ("mean_reward", "success_rate"):
            low, high = getattr(self, name)
            if low > high:
                raise ValueError(f"Band.{name}: lower edge {low} exceeds upper edge {high}")

    @property
    def middle(self) -> float:
        """Middle of the mean-reward band."""
        low, high = self.mean_reward
        return (low + high) / 2


def _pair(value: float, limit: float) -> tuple[str, str]:
    """Format value and limit with 2 decimals, more if 2 would print them equal."""
    for digits in (2, 3, 4, 6):
        a, b = f"{value:.{digits}f}", f"{limit:.{digits}f}"
        if a != b:
            return a, b
    return f"{value!r}", f"{limit!r}"


def _above(label: str, value: float, limit: float) -> str | None:
    if value > limit + _TOLERANCE:
        a, b = _pair(value, limit)
        return f"{label} {a} > {b}"
    return None


def _below(label: str, value: float, limit: float) -> str | None:
    if value < limit - _TOLERANCE:
        a, b = _pair(value, limit)
        return f"{label} {a} < {b}"
    return None


def band_verdict(stats: CalibrationStats, band: Band) -> tuple[str, list[str]]:
    """("in_band" | "too_easy" | "too_hard", reasons).

    too_easy: mean reward or success rate above the band, or too many all-success groups;
    too_hard: mean reward or success rate below the band, or too many all-zero groups. If both
    kinds of signal are present (e.g. a bimodal split into all-success and all-zero groups), the
    mean reward decides against the band's middle: above it too_easy, otherwise too_hard; the
    reasons then list every signal plus the deciding comparison.
    """
    easy = [
        _above("mean reward", stats.mean_reward, band.mean_reward[1]),
        _above("success rate", stats.success_rate, band.success_rate[1]),
        _above("all-success groups", stats.all_success_fraction, band.max_all_success),
    ]
    hard = [
        _below("mean reward", stats.mean_reward, band.mean_reward[0]),
        _below("success rate", stats.success_rate, band.success_rate[0]),
        _above("all-zero groups", stats.all_zero_fraction, band.max_all_zero),
    ]
    easy = [r for r in easy if r]
    hard = [r for r in hard if r]
    if not easy and not hard:
        return "in_band", []
    if easy and not hard:
        return "too_easy", easy
    if hard and not easy:
        return "too_hard", hard
    middle = band.middle
    if stats.mean_reward > middle + _TOLERANCE:
        a, b = _pair(stats.mean_reward, middle)
        return "too_easy", easy + hard + [f"conflicting signals: mean reward {a} > band middle {b}"]
    a, b = _pair(stats.mean_reward, middle)
    return "too_hard", easy + hard + [f"conflicting signals: mean reward {a} <= band middle {b}"]


# --------------------------------------------------------------------------- search


@dataclass
class CalibrationRound:
    """One evaluated difficulty level."""

    round: int  # 1, 2, ...
    difficulty: int
    stats: CalibrationStats
    verdict: str
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "round": int(self.round),
            "difficulty": int(self.difficulty),
            "stats": self.stats.to_json(),
            "verdict": self.verdict,
            "reasons": list(self.reasons),
        }

    def figures(self) -> dict:
        """The level's verdict in brief: its band figures and the reasons it is out of band (none when in band)."""
        return {
            "difficulty": int(self.difficulty),
            "verdict": self.verdict,
            "mean_reward": float(self.stats.mean_reward),
            "success_rate": float(self.stats.success_rate),
            "all_success_fraction": float(self.stats.all_success_fraction),
            "all_zero_fraction": float(self.stats.all_zero_fraction),
            "reasons": list(self.reasons),
        }


@dataclass
class SearchResult:
    difficulty: int  # the chosen level: the in-band one, or else the nearest (see search_difficulty)
    in_band: bool
    rounds: list[CalibrationRound]

    @property
    def chosen(self) -> CalibrationRound:
        """The round that evaluated the chosen level."""
        return next(r for r in self.rounds if r.difficulty == self.difficulty)

    def to_json(self) -> dict:
        return {
            "difficulty": int(self.difficulty),
            "in_band": bool(self.in_band),
            "rounds": [r.to_json() for r in self.rounds],
        }


def _fallback(rounds: list[CalibrationRound], band: Band, rank: dict[int, int]) -> CalibrationRound:
    """The nearest evaluated level when none was in band: highest informative fraction, then mean reward
    closest to the band's middle, then the lower (easier) difficulty."""
    middle = band.middle
    return min(
        rounds,
        key=lambda r: (-r.stats.informative_fraction, abs(r.stats.mean_reward - middle), rank[r.difficulty]),
    )


def search_difficulty(
    evaluate: Callable[[int], CalibrationStats],
    levels: Sequence[int],
    start: int,
    band: Band,
    max_rounds: int,
) -> SearchResult:
    """Find a difficulty level whose calibration stats are in band, by bisection.

    ``levels`` are ordered easy -> hard. The bracket of still-possible levels starts as all of
    them; a too-easy level removes itself and every easier level, a too-hard one itself and every
    harder level, and the next level evaluated is the (lower) middle of the bracket. No level is
    evaluated twice. The search stops at the first in-band level, when the bracket is empty, or
    after ``max_rounds`` evaluations; without an in-band level (``in_band`` False) the chosen one is
    the nearest: the evaluated level with the highest informative fraction (ties: mean reward
    closest to the band's middle, then the lower, i.e. easier, difficulty).
    """
    levels = list(levels)
    if not levels:
        raise ValueError("search_difficulty: no difficulty levels given")
    if len(set(levels)) != len(levels):
        raise ValueError(f"search_difficulty: difficulty levels must be distinct, got {levels}")
    if start not in levels:
        raise ValueError(f"search_difficulty: start level {start!r} is not one of the levels {levels}")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, numbers.Integral) or max_rounds < 1:
        raise ValueError(f"search_difficulty: max_rounds must be a positive integer, got {max_rounds!r}")

    rank = {level: i for i, level in enumerate(levels)}
    low, high = 0, len(levels) - 1  # bracket of level indices, inclusive
    index = levels.index(start)
    rounds: list[CalibrationRound] = []
    while True:
        level = levels[index]
        stats = evaluate(level)
        verdict, reasons = band_verdict(stats, band)
        rounds.append(CalibrationRound(len(rounds) + 1, level, stats, verdict, reasons))
        if verdict == "in_band":
            return SearchResult(difficulty=level, in_band=True, rounds=rounds)
        if verdict == "too_easy":
            low = index + 1
        else:
            high = index - 1
        if low > high or len(rounds) >= max_rounds:
            break
        index = (low + high) // 2
    best = _fallback(rounds, band, rank)
    return SearchResult(difficulty=best.difficulty, in_band=False, rounds=rounds)


# --------------------------------------------------------------------------- report


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def calibration_table(rounds: list[CalibrationRound]) -> str:
    """Markdown table of calibration rounds, one row per round."""
    header = (
        ["round", "difficulty", "mean reward", "success", "reward std"]
        + [f"pass@{k}" for k in TABLE_KS]
        + ["all-success", "all-zero", "informative", "verdict"]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rounds:
        s = r.stats
        cells = (
            [str(r.round), str(r.difficulty), _num(s.mean_reward), _num(s.success_rate), _num(s.reward_std)]
            + [_num(s.pass_at_k.get(k)) for k in TABLE_KS]
            + [_num(s.all_success_fraction, 2), _num(s.all_zero_fraction, 2), _num(s.informative_fraction, 2)]
            + [r.verdict]
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
