"""Bounded staleness (``grpo.max_staleness``), pure: which rollouts a batch may hold, and what it reports.

With rollouts overlapping the update, the batch of iteration n (which updates adapter version n - 1 into n) may
hold rollouts sampled with versions n - 1 - max_staleness .. n - 1. Each rollout carries the version it was sampled
with (``EpisodeResult.adapter``; each turn's in ``turn_adapters``); its behaviour log-probs are those of the version
that sampled each token, and the loss's importance ratio ``exp(new - behaviour)`` corrects for the gap
(``grpo.policy_loss``). A group with any rollout older than the bound (by its oldest turn) is dropped whole (its
advantages compare its members) and counted.
"""

from __future__ import annotations

from trace_ray.rollout_loop import EpisodeResult

Group = list[EpisodeResult]


def staleness(result: EpisodeResult, trained_version: int) -> int:
    """How many versions older than ``trained_version`` the oldest adapter that sampled ``result`` is: its episode's,
    or its oldest turn's when it took up newer versions between turns (the base model: the first update's
    version 0)."""
    adapters = result.turn_adapters or [result.adapter]
    return trained_version - min(adapter[1] if adapter else 0 for adapter in adapters)


def within_bound(groups: list[Group], trained_version: int, max_staleness: int) -> tuple[list[Group], int]:
    """(the groups whose every rollout is at most ``max_staleness`` versions old, rollouts dropped)."""
    kept = [group for group in groups if all(staleness(r, trained_version) <= max_staleness for r in group)]
    return kept, sum(len(group) for group in groups) - sum(len(group) for group in kept)


def staleness_counts(groups: list[Group], trained_version: int, max_staleness: int) -> dict[str, int]:
    """The batch's staleness histogram: ``staleness_<s>`` -> rollouts ``s`` versions old, for s = 0..max_staleness."""
    counts = {f"staleness_{s}": 0 for s in range(max_staleness + 1)}
    for group in groups:
        for result in group:
            counts[f"staleness_{staleness(result, trained_version)}"] += 1
    return counts
