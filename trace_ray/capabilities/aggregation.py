"""Statistics and selection of contrastive capability identification (TRACE step 1).

For one labeling run and capability c, with lf, pf, lp, pp the numbers of lacking_failed,
present_failed, lacking_passed and present_passed trajectories and F the run's failed total:

    Cov   = lf / F                 how many failures lack c
    ER-   = lf / (lf + pf)         how often failing trajectories that need c lack it
    ER+   = lp / (lp + pp)         how often passing trajectories that need c lack it
    Delta = ER- - ER+

The run passes c iff Cov >= rho and Delta >= delta. Capability c is kept (consistency) if it
passes in at least k of the N runs; a run without c counts as not passing it. Kept
capabilities are sorted by mean Delta, descending.

A rate with a zero denominator is None and produces a warning. Policy ``undefined_rate``:
"zero" (reference behaviour) counts an undefined rate as 0 for the pass decision and the
means (so Delta = ER- when ER+ is undefined); "fail" lets no run with an undefined Cov, ER-
or ER+ pass c, and leaves the undefined values out of the means.

Thresholds are compared with a tolerance of 1e-9, so that e.g. Delta = 0.7 - 0.5 clears
delta = 0.2 although the floating-point difference is 0.19999999999999996.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from environments.errors import TraceRayError
from trace_ray.capabilities.run_files import RunFile, validate_run

UNDEFINED_RATE_POLICIES = ("zero", "fail")
EXAMPLE_CASES = 8  # example_failed_cases per capability
_TOLERANCE = 1e-9


@dataclass
class RunStats:
    """One run's statistics of one capability; a rate is None where its denominator is 0."""

    cov: float | None
    er_minus: float | None
    er_plus: float | None
    delta: float | None  # under "zero" an undefined rate counts as 0; under "fail" None if ER- or ER+ is
    passed: bool
    lf: int
    pf: int
    lp: int
    pp: int


@dataclass
class SelectionSettings:
    rho: float = 0.10  # minimum Cov
    delta: float = 0.20  # minimum Delta
    k: int = 8  # minimum number of passing runs
    undefined_rate: str = "zero"  # "zero" or "fail"

    def __post_init__(self) -> None:
        if not 0 <= self.rho <= 1:
            raise TraceRayError(f"rho must be between 0 and 1, got {self.rho}")
        if not -1 <= self.delta <= 1:
            raise TraceRayError(f"delta must be between -1 and 1, got {self.delta}")
        if not isinstance(self.k, int) or self.k < 1:
            raise TraceRayError(f"k must be an integer of at least 1, got {self.k!r}")
        if self.undefined_rate not in UNDEFINED_RATE_POLICIES:
            raise TraceRayError(f"undefined_rate must be 'zero' or 'fail', got {self.undefined_rate!r}")


@dataclass
class CapabilityStats:
    """A candidate capability over all runs; means and stds over the runs that contain it.

    The Wilson intervals of ER- and ER+ and the p-value of Delta use counts pooled over the
    runs that contain the capability (lf, pf, lp, pp summed over those runs).
    """

    name: str
    description: str
    mean_cov: float | None
    std_cov: float | None
    mean_delta: float | None
    std_delta: float | None
    n_runs_passed: int
    n_runs_total: int  # all runs, including those without the capability
    passes_consistency: bool
    example_failed_cases: list[str]
    er_minus_ci: list[float] | None
    er_plus_ci: list[float] | None
    p_value: float | None
    status: str = "PENDING"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Aggregation:
    all: list[CapabilityStats]  # every candidate, by mean Delta descending (None last), then name
    selected: list[CapabilityStats]  # those passing consistency, same order
    warnings: list[str]


def _rate(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def _at_least(value: float, threshold: float) -> bool:
    return value >= threshold - _TOLERANCE


def run_stats(
    labels_for_cap: dict[str, list[str]], total_failed: int, rho: float, delta: float, undefined_rate: str
) -> tuple[RunStats, list[str]]:
    """Cov, ER-, ER+, Delta and the pass decision of one capability in one run.

    The warnings (one per undefined rate) name neither run nor capability; ``aggregate`` adds both.
    """
    lf, pf = len(labels_for_cap["lacking_failed"]), len(labels_for_cap["present_failed"])
    lp, pp = len(labels_for_cap["lacking_passed"]), len(labels_for_cap["present_passed"])
    cov, er_minus, er_plus = _rate(lf, total_failed), _rate(lf, lf + pf), _rate(lp, lp + pp)
    warnings: list[str] = []
    if cov is None:
        warnings.append("Cov is undefined (the run has no failed trajectory)")
    if er_minus is None:
        warnings.append("ER- is undefined (no failed trajectory needs it)")
    if er_plus is None:
        warnings.append("ER+ is undefined (no passed trajectory needs it)")
    if undefined_rate == "zero":
        run_delta = (er_minus or 0.0) - (er_plus or 0.0)
        passed = _at_least(cov or 0.0, rho) and _at_least(run_delta, delta)
    else:
        run_delta = None if er_minus is None or er_plus is None else er_minus - er_plus
        passed = cov is not None and run_delta is not None and _at_least(cov, rho) and _at_least(run_delta, delta)
    return RunStats(cov, er_minus, er_plus, run_delta, passed, lf, pf, lp, pp), warnings


def pass_matrix(runs: list[RunFile], names: list[str], settings: SelectionSettings) -> np.ndarray:
    """Vectorized pass decisions: bool [len(names), len(runs)], False where a run lacks the capability."""
    shape = (len(names), len(runs))
    present = np.zeros(shape, dtype=bool)
    keys = ("lacking_failed", "present_failed", "lacking_passed", "present_passed")
    counts = {key: np.zeros(shape, dtype=np.int64) for key in keys}
    for j, run in enumerate(runs):
        for i, name in enumerate(names):
            if name in run.labels:
                present[i, j] = True
                for key, array in counts.items():
                    array[i, j] = len(run.labels[name][key])
    lf, pf, lp, pp = counts.values()
    failed = np.broadcast_to(np.array([run.total_failed for run in runs], dtype=np.int64), shape)

    def rate(numerator: np.ndarray, denominator: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rate with 0 where undefined, defined mask)."""
        defined = denominator > 0
        return np.where(defined, numerator / np.maximum(denominator, 1), 0.0), defined

    cov, cov_defined = rate(lf, failed)
    er_minus, er_minus_defined = rate(lf, lf + pf)
    er_plus, er_plus_defined = rate(lp, lp + pp)
    passed = present & (cov >= settings.rho - _TOLERANCE) & (er_minus - er_plus >= settings.delta - _TOLERANCE)
    if settings.undefined_rate == "fail":
        passed &= cov_defined & er_minus_defined & er_plus_defined
    return passed


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float] | None:
    """Wilson score interval of a proportion; None when there are no trials.

    centre = (p + z²/2n) / (1 + z²/n),  half-width = z / (1 + z²/n) * sqrt(p(1-p)/n + z²/4n²).
    """
    if trials == 0:
        return None
    p = successes / trials
    scale = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / scale
    half = z / scale * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def two_proportion_p_value(x1: int, n1: int, x2: int, n2: int) -> float | None:
    """Two-sided p-value of the pooled two-proportion z-test of x1/n1 against x2/n2.

    p = (x1 + x2) / (n1 + n2),  z = (x1/n1 - x2/n2) / sqrt(p(1-p)(1/n1 + 1/n2)),  p-value = erfc(|z| / √2).
    None when either proportion is undefined (n = 0); 1.0 when the pooled variance is 0.
    """
    if n1 == 0 or n2 == 0:
        return None
    pooled = (x1 + x2) / (n1 + n2)
    variance = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if variance == 0:
        return 1.0
    z = (x1 / n1 - x2 / n2) / math.sqrt(variance)
    return math.erfc(abs(z) / math.sqrt(2))


def aggregate(runs: list[RunFile], descriptions: dict[str, str], settings: SelectionSettings) -> Aggregation:
    """Statistics of every capability in ``descriptions`` or any run, and the consistent ones."""
    if settings.k > len(runs):
        raise TraceRayError(f"k={settings.k} exceeds the number of runs ({len(runs)}); lower k or add run files")
    for run in runs:
        validate_run(run)
    names = list(descriptions) + sorted({cap for run in runs for cap in run.labels} - set(descriptions))
    warnings = [f"capability '{name}' has no description" for name in names if name not in descriptions]
    per_cap: dict[str, list[RunStats]] = {name: [] for name in names}
    lacking: dict[str, Counter[str]] = {name: Counter() for name in names}
    for run in runs:
        run_name = Path(run.source).stem
        for name in names:
            if name not in run.labels:
                warnings.append(f"{run_name}: capability '{name}' is not labelled; counted as not passing this run")
                continue
            stats, notes = run_stats(
                run.labels[name], run.total_failed, settings.rho, settings.delta, settings.undefined_rate
            )
            per_cap[name].append(stats)
            lacking[name].update(run.labels[name]["lacking_failed"])
            warnings += [f"{run_name}: capability '{name}': {note}" for note in notes]
    everything = [
        _summarize(name, descriptions.get(name, ""), per_cap[name], lacking[name], len(runs), settings)
        for name in names
    ]
    everything.sort(key=lambda cap: (cap.mean_delta is None, -(cap.mean_delta or 0.0), cap.name))
    return Aggregation(everything, [cap for cap in everything if cap.passes_consistency], warnings)


def _summarize(
    name: str, description: str, stats: list[RunStats], lacking: Counter[str], n_runs: int, settings: SelectionSettings
) -> CapabilityStats:
    """One capability's record from its RunStats (one per run that contains it)."""
    covs = [s.cov if s.cov is not None else (0.0 if settings.undefined_rate == "zero" else None) for s in stats]
    mean_cov, std_cov = _mean_std(covs)
    mean_delta, std_delta = _mean_std([s.delta for s in stats])
    n_passed = sum(s.passed for s in stats)
    lf, pf = sum(s.lf for s in stats), sum(s.pf for s in stats)
    lp, pp = sum(s.lp for s in stats), sum(s.pp for s in stats)
    er_minus_ci, er_plus_ci = wilson_interval(lf, lf + pf), wilson_interval(lp, lp + pp)
    return CapabilityStats(
        name=name,
        description=description,
        mean_cov=mean_cov,
        std_cov=std_cov,
        mean_delta=mean_delta,
        std_delta=std_delta,
        n_runs_passed=n_passed,
        n_runs_total=n_runs,
        passes_consistency=n_passed >= settings.k,
        example_failed_cases=sorted(lacking, key=lambda task: (-lacking[task], task))[:EXAMPLE_CASES],
        er_minus_ci=list(er_minus_ci) if er_minus_ci else None,
        er_plus_ci=list(er_plus_ci) if er_plus_ci else None,
        p_value=two_proportion_p_value(lf, lf + pf, lp, lp + pp),
    )


def _mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and population std (ddof=0) of the defined values; (None, None) if there are none."""
    defined = [value for value in values if value is not None]
    if not defined:
        return None, None
    return float(np.mean(defined)), float(np.std(defined, ddof=0))
