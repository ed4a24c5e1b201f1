"""Agreement between two labelers on the same trajectories: Cohen's kappa per capability.

kappa = (p_o - p_e) / (1 - p_e), with p_o the share of trajectories both
labelers label alike and p_e the agreement expected by chance from each
labeler's label frequencies. kappa is None when it is undefined (p_e = 1:
both labelers give one and the same label to everything).
"""

from __future__ import annotations

from collections import Counter

from trace_ray.capabilities.trajectories import LABELS


def cohens_kappa(first: list[str], second: list[str]) -> float | None:
    if len(first) != len(second) or not first:
        raise ValueError("kappa needs two label lists of the same, non-zero length")
    total = len(first)
    observed = sum(a == b for a, b in zip(first, second)) / total
    counts_first, counts_second = Counter(first), Counter(second)
    expected = sum(counts_first[label] * counts_second[label] for label in LABELS) / (total * total)
    if expected == 1:
        return None
    return (observed - expected) / (1 - expected)


def agreement(first: dict[str, dict[str, str]], second: dict[str, dict[str, str]]) -> dict[str, float | None]:
    """Kappa per capability both labelers labelled, over the trajectories both labelled."""
    result = {}
    for capability in sorted(set(first) & set(second)):
        shared = sorted(set(first[capability]) & set(second[capability]))
        if shared:
            result[capability] = cohens_kappa(
                [first[capability][i] for i in shared], [second[capability][i] for i in shared]
            )
    return result
