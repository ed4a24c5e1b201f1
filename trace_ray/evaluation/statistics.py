"""Statistics of evaluation scores: bootstrap intervals of a mean and paired comparisons of two methods.

Every method is played on the same tasks, so comparisons are paired by task:

- :func:`bootstrap_interval`: the percentile bootstrap interval of the mean
  (resampling tasks with replacement);
- :func:`paired_comparison`: the mean per-task difference, its paired
  bootstrap interval, wins/losses/ties, and the two-sided p-value of the
  sign-flip permutation test (under "no difference" each task's difference is
  as likely positive as negative): exact over all 2^n sign patterns of the
  non-zero differences up to ``EXACT_LIMIT`` of them, Monte Carlo beyond.
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
    """Two-sided p-value of the sign-flip permutation test of a zero mean difference."""
    nonzero = _values(differences)
    nonzero = nonzero[nonzero != 0]
    if nonzero.size == 0:
        return 1.0
    observed = abs(nonzero.sum())
    if nonzero.size <= EXACT_LIMIT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=nonzero.size)))
    else:
        signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(resamples, nonzero.size))
    sums = np.abs(signs @ nonzero)
    return float(np.mean(sums >= observed - 1e-12))


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
        float(differences.mean()), bootstrap_interval(differences, confidence, seed=seed),
        int((differences > 0).sum()), int((differences < 0).sum()), int((differences == 0).sum()),
        sign_flip_p_value(differences, seed=seed),
    )
