"""The evaluation table: per method, Perfect / success counts, mean reward with its bootstrap interval,
the paired comparison against the base model, and the training rollouts the method spent.

Pure: per-task scores in, rows and Markdown out (``trace_ray/commands/evaluate.py`` plays the tasks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trace_ray.evaluation.statistics import bootstrap_interval, paired_comparison
from trace_ray.metrics import summarize

BASE_METHOD = "base"


@dataclass
class MethodScores:
    name: str
    families: list[str]  # per task, in the evaluation's task order
    rewards: list[float]
    successes: list[bool]
    rollouts: int  # training rollouts the method spent (0: none)


def method_row(method: MethodScores, base: MethodScores, confidence: float, seed: int) -> dict:
    """One method's overall and per-family figures, and its paired comparison with ``base``."""
    if method.families != base.families:
        raise ValueError(f"{method.name} was not scored on the base model's tasks; evaluate every method on the same tasks")
    rows = summarize(list(zip(method.families, method.rewards, method.successes)))
    overall = rows[-1]
    low, high = bootstrap_interval(method.rewards, confidence, seed=seed)
    row = {
        "method": method.name, "tasks": overall.episodes, "perfect": overall.perfect, "successes": overall.successes,
        "mean_reward": overall.mean_similarity, "interval": [low, high], "rollouts": method.rollouts,
        "families": {r.group: {"tasks": r.episodes, "perfect": r.perfect, "successes": r.successes, "mean_reward": r.mean_similarity} for r in rows[:-1]},
    }
    if method.name != base.name:
        comparison = paired_comparison(method.rewards, base.rewards, confidence, seed=seed)
        row["vs_base"] = {**asdict(comparison), "interval": list(comparison.interval)}
    return row


def report_rows(methods: list[MethodScores], confidence: float = 0.95, seed: int = 0) -> list[dict]:
    """Rows for every method; the first method named ``base`` is the reference of the paired comparisons."""
    base = next((method for method in methods if method.name == BASE_METHOD), None)
    if base is None:
        raise ValueError("the evaluation needs the base model's scores (a method named 'base')")
    return [method_row(method, base, confidence, seed) for method in methods]


def _versus(row: dict) -> str:
    versus = row.get("vs_base")
    if versus is None:
        return "reference"
    low, high = versus["interval"]
    return f"{versus['mean_difference']:+.3f} [{low:+.3f}, {high:+.3f}] p={versus['p_value']:.3g} ({versus['wins']}W/{versus['losses']}L)"


def table_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    """The main table's cells: method, Perfect, success, mean reward [interval], vs base, rollouts."""
    return [
        (
            row["method"], f"{row['perfect']}/{row['tasks']}", f"{row['successes']}/{row['tasks']}",
            f"{row['mean_reward']:.3f} [{row['interval'][0]:.3f}, {row['interval'][1]:.3f}]", _versus(row), str(row["rollouts"]),
        )
        for row in rows
    ]


TABLE_HEADER = ["method", "perfect", "success", "mean reward [95% CI]", "vs base: mean diff [CI] p (wins/losses)", "training rollouts"]


def report_markdown(title: str, rows: list[dict], unavailable: dict[str, str], notes: list[str]) -> str:
    """The report: the main table first, then the methods that could not run, per-family rewards and notes."""
    lines = [f"# {title}", "", "| " + " | ".join(TABLE_HEADER) + " |", "|---" * len(TABLE_HEADER) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    if unavailable:
        lines += ["", "Not evaluated:", ""] + [f"- {name}: {reason}" for name, reason in unavailable.items()]
    families = sorted({family for row in rows for family in row["families"]})
    if len(families) > 1:
        lines += ["", "## Mean reward per task family", "", "| method | " + " | ".join(families) + " |", "|---" * (len(families) + 1) + "|"]
        for row in rows:
            cells = [f"{row['families'][f]['mean_reward']:.3f}" if f in row["families"] else "" for f in families]
            lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"
