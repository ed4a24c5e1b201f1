"""PNG plots of an identification: Cov against Delta with the thresholds, label counts per capability."""

from __future__ import annotations

from pathlib import Path

from trace_ray.artifacts import atomic_path
from trace_ray.capabilities.aggregation import Aggregation
from trace_ray.capabilities.run_files import LABEL_LISTS, RunFile


def _save(figure, path: Path) -> None:
    with atomic_path(path) as scratch:
        figure.savefig(scratch, format="png", dpi=120, bbox_inches="tight")


def cov_vs_delta(result: Aggregation, rho: float, delta: float, path: Path) -> None:
    """Mean Cov (x) against mean Delta (y) per capability; kept ones filled; dashed lines at rho and delta."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 5))
    for capability in result.all:
        x, y = capability.mean_cov or 0.0, capability.mean_delta or 0.0
        axes.scatter([x], [y], color="tab:green" if capability.passes_consistency else "tab:gray", s=40)
        axes.annotate(capability.name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    axes.axvline(rho, linestyle="--", color="tab:red", linewidth=1, label=f"rho = {rho}")
    axes.axhline(delta, linestyle="--", color="tab:blue", linewidth=1, label=f"delta = {delta}")
    axes.set_xlabel("mean Cov (share of failures lacking it)")
    axes.set_ylabel("mean Delta (ER- - ER+)")
    axes.set_title("candidate capabilities (green: kept)")
    axes.legend(loc="lower right", fontsize=8)
    _save(figure, path)
    plt.close(figure)


def label_counts(runs: list[RunFile], names: list[str], path: Path) -> None:
    """Mean number of trajectories per label, in failures and in successes, per capability."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(max(6, 1.6 * len(names)), 4.5))
    width = 0.8 / len(LABEL_LISTS)
    for offset, key in enumerate(LABEL_LISTS):
        means = [sum(len(run.labels[name][key]) for run in runs if name in run.labels) / len(runs) for name in names]
        axes.bar([i + offset * width for i in range(len(names))], means, width=width, label=key)
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=30, ha="right", fontsize=8)
    axes.set_ylabel("trajectories per run (mean)")
    axes.set_title("labels in failures and successes")
    axes.legend(fontsize=7, ncols=2)
    _save(figure, path)
    plt.close(figure)
