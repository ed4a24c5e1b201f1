"""Benchmark metrics as ToolSandbox reports them: Perfect count and Mean similarity, per family."""

from __future__ import annotations

from dataclasses import dataclass

Outcome = tuple[str, float, bool]  # (family, reward, success) of one episode


@dataclass
class MetricsRow:
    group: str
    episodes: int
    perfect: int  # episodes with similarity exactly 1.0
    successes: int  # episodes at or above the environment's success threshold
    mean_similarity: float

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


def _row(group: str, outcomes: list[Outcome]) -> MetricsRow:
    return MetricsRow(
        group=group,
        episodes=len(outcomes),
        perfect=sum(reward == 1.0 for _, reward, _ in outcomes),
        successes=sum(success for _, _, success in outcomes),
        mean_similarity=sum(reward for _, reward, _ in outcomes) / len(outcomes) if outcomes else 0.0,
    )


def summarize(outcomes: list[Outcome]) -> list[MetricsRow]:
    """One row per task family (sorted by name), then the overall row."""
    families = sorted({family for family, _, _ in outcomes})
    rows = [_row(family, [outcome for outcome in outcomes if outcome[0] == family]) for family in families]
    return rows + [_row("overall", outcomes)]
