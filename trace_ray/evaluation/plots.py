"""The evaluation's PNG plots: methods with their intervals, and the adapters' training reward curves."""

from __future__ import annotations

from pathlib import Path

from trace_ray.artifacts import atomic_path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path: Path) -> None:
    figure.tight_layout()
    with atomic_path(path) as scratch:
        figure.savefig(scratch, format="png", dpi=100)
    _pyplot().close(figure)


def plot_methods(rows: list[dict], path: Path) -> None:
    """One bar per method: mean reward, with its bootstrap interval."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4))
    means = [row["mean_reward"] for row in rows]
    errors = [
        [m - row["interval"][0] for m, row in zip(means, rows)],
        [row["interval"][1] - m for m, row in zip(means, rows)],
    ]
    axis.bar(range(len(rows)), means, yerr=errors, capsize=4, color="#4c72b0")
    axis.set_xticks(range(len(rows)), [row["method"] for row in rows], rotation=30, ha="right")
    axis.set_ylabel("mean reward (95% CI)")
    axis.set_ylim(0, 1.02)
    axis.grid(axis="y", alpha=0.3)
    _save(figure, path)


def plot_reward_curves(curves: dict[str, list[tuple[int, float]]], path: Path) -> None:
    """Each adapter's mean training reward per GRPO iteration."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6, 3.5))
    for name, points in curves.items():
        axis.plot([i for i, _ in points], [r for _, r in points], marker="o", label=name)
    axis.set_xlabel("GRPO iteration")
    axis.set_ylabel("mean reward")
    axis.set_ylim(-0.02, 1.02)
    if curves:
        axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    _save(figure, path)
