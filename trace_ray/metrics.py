"""Benchmark metrics as ToolSandbox reports them: Perfect count and Mean similarity."""

from __future__ import annotations

from dataclasses import dataclass

from trace_ray.rollout_loop import EpisodeResult


@dataclass
class MetricsRow:
    group: str
    tasks: int
    perfect: int  # episodes with similarity exactly 1.0
    successes: int  # episodes at or above the environment's success threshold
    mean_similarity: float


def _row(group: str, results: list[EpisodeResult]) -> MetricsRow:
    return MetricsRow(
        group=group,
        tasks=len(results),
        perfect=sum(result.reward == 1.0 for result in results),
        successes=sum(result.success for result in results),
        mean_similarity=sum(result.reward for result in results) / len(results) if results else 0.0,
    )


def summarize(results: list[EpisodeResult]) -> list[MetricsRow]:
    """One row per task family (sorted by name), then the overall row."""
    families = sorted({result.family for result in results})
    rows = [_row(family, [result for result in results if result.family == family]) for family in families]
    return rows + [_row("overall", results)]
