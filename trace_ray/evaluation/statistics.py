"""Statistics of evaluation scores: bootstrap intervals of a mean and paired comparisons of two methods.

Every method is played on the same tasks, so comparisons are paired by task:

- :func:`bootstrap_interval`: the percentile bootstrap interval of the mean
  (resampling tasks with replacement);
- :func:`paired_comparison`: the mean per-task difference, its paired
  bootstrap interval, wins/losses/ties, and the two-sided p-value of the
  sign-flip permutation test (under "no difference" each task's difference is
  as likely positive as negative): exact over all 2^n sign patterns of the
  non-zero differences up to ``EXACT_LIMIT`` of them, Monte Carlo beyond, as
  (b + 1) / (m + 1) for b of m random patterns at least as extreme (the
  observed pattern counts as one of them, so the p-value is never 0);
- :func:`holm_adjusted`: Holm-Bonferroni step-down adjusted p-values of a
  family of comparisons.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

EXACT_LIMIT = 16  # non-zero differences up to which the permutation test enumerates every sign pattern


def _values(values) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"need a non-empty list of per-task scores, got shape {array.shape}")
    return array


def bootstrap_interval(values, confidence: float = 0.95, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values``."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    array = _values(values)
    rng = np.random.default_rng(seed)
    means = array[rng.integers(0, array.size, size=(resamples, array.size))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def sign_flip_p_value(differences, resamples: int = 100_000, seed: int = 0) -> float:
    """Two-sided p-value of the sign-flip permutation test of a zero mean difference.

    Exact (the share of all sign patterns at least as extreme) up to ``EXACT_LIMIT`` non-zero
    differences; beyond, (b + 1) / (resamples + 1) for b of ``resamples`` random patterns at least as extreme.
    """
    nonzero = _values(differences)
    nonzero = nonzero[nonzero != 0]
    if nonzero.size == 0:
        return 1.0
    observed = abs(nonzero.sum())
    if nonzero.size <= EXACT_LIMIT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=nonzero.size)))
        return float(np.mean(np.abs(signs @ nonzero) >= observed - 1e-12))
    signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(resamples, nonzero.size))
    extreme = int(np.sum(np.abs(signs @ nonzero) >= observed - 1e-12))
    return (extreme + 1) / (resamples + 1)


def holm_adjusted(p_values) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given.

    With the m p-values sorted ascending, p_(1) <= ... <= p_(m), the i-th becomes
    max over j <= i of min(1, (m - j + 1) p_(j)); rejecting where it is below alpha controls the
    family-wise error rate at alpha.
    """
    values = [float(p) for p in p_values]
    if not all(0.0 <= p <= 1.0 for p in values):
        raise ValueError(f"p-values must lie in [0, 1], got {values}")
    m = len(values)
    adjusted = [0.0] * m
    running = 0.0
    for j, index in enumerate(sorted(range(m), key=values.__getitem__)):  # j = 0 for the smallest
        running = max(running, min(1.0, (m - j) * values[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class PairedComparison:
    mean_difference: float  # mean of (method - baseline) per task
    interval: tuple[float, float]  # its paired bootstrap interval
    wins: int  # tasks where the method scored higher
    losses: int
    ties: int
    p_value: float  # two-sided sign-flip permutation test


def paired_comparison(method, baseline, confidence: float = 0.95, seed: int = 0) -> PairedComparison:
    """``method`` against ``baseline``, both scored on the same tasks in the same order."""
    a, b = _values(method), _values(baseline)
    if a.shape != b.shape:
        raise ValueError(f"paired scores need the same tasks: {a.size} scores against {b.size}")
    differences = a - b
    return PairedComparison(
        float(differences.mean()),
        bootstrap_interval(differences, confidence, seed=seed),
        int((differences > 0).sum()),
        int((differences < 0).sum()),
        int((differences == 0).sum()),
        sign_flip_p_value(differences, seed=seed),
    )
