"""The evaluation table: per method, Perfect / success counts, mean reward with its bootstrap interval,
the paired comparison against the base model, and the training rollouts the method spent; then each
TRACE method paired against GRPO on target and against the best single adapter. Every paired
comparison of the report also gets its Holm-adjusted p-value (``p_holm``), the family being all of them.

Pure: per-task scores in, rows and Markdown out (``trace_ray/app/evaluate.py`` plays the tasks).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from trace_ray.evaluation.statistics import bootstrap_interval, holm_adjusted, paired_comparison
from trace_ray.metrics import summarize

BASE_METHOD = "base"
GRPO_METHOD = "GRPO on target"
TRACE_PREFIX = "TRACE ("
ADAPTER_PREFIX = "adapter:"


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
        raise ValueError(
            f"{method.name} was not scored on the base model's tasks; evaluate every method on the same tasks"
        )
    rows = summarize(list(zip(method.families, method.rewards, method.successes)))
    overall = rows[-1]
    low, high = bootstrap_interval(method.rewards, confidence, seed=seed)
    row = {
        "method": method.name,
        "tasks": overall.episodes,
        "perfect": overall.perfect,
        "successes": overall.successes,
        "mean_reward": overall.mean_similarity,
        "interval": [low, high],
        "rollouts": method.rollouts,
        "families": {
            r.group: {
                "tasks": r.episodes,
                "perfect": r.perfect,
                "successes": r.successes,
                "mean_reward": r.mean_similarity,
            }
            for r in rows[:-1]
        },
        "rewards": [float(reward) for reward in method.rewards],  # per task, in the evaluation's task order
    }
    if method.name != base.name:
        row["vs_base"] = compared(method, base, confidence, seed)
    return row


def compared(method: MethodScores, baseline: MethodScores, confidence: float, seed: int) -> dict:
    """The paired comparison of ``method`` with ``baseline`` on their (shared) tasks, as JSON values."""
    comparison = paired_comparison(method.rewards, baseline.rewards, confidence, seed=seed)
    return {**asdict(comparison), "interval": list(comparison.interval)}


def report_rows(methods: list[MethodScores], confidence: float = 0.95, seed: int = 0) -> list[dict]:
    """Rows for every method; the first method named ``base`` is the reference of the paired comparisons."""
    base = next((method for method in methods if method.name == BASE_METHOD), None)
    if base is None:
        raise ValueError("the evaluation needs the base model's scores (a method named 'base')")
    return [method_row(method, base, confidence, seed) for method in methods]


def best_adapter(methods: list[MethodScores]) -> MethodScores | None:
    """The single-adapter method with the highest mean reward (ties: the first); None without one."""
    adapters = [method for method in methods if method.name.startswith(ADAPTER_PREFIX)]
    return max(adapters, key=lambda method: statistics.fmean(method.rewards), default=None)


def trace_comparisons(methods: list[MethodScores], confidence: float = 0.95, seed: int = 0) -> list[dict]:
    """Each TRACE method paired against GRPO on target and against the best single adapter (those evaluated)."""
    references = [
        (GRPO_METHOD, next((m for m in methods if m.name == GRPO_METHOD), None)),
        ("best single adapter", best_adapter(methods)),
    ]
    return [
        {
            "method": method.name,
            "baseline": reference.name,
            "role": role,
            **compared(method, reference, confidence, seed),
        }
        for method in methods
        if method.name.startswith(TRACE_PREFIX)
        for role, reference in references
        if reference is not None
    ]


def evaluation_report(methods: list[MethodScores], confidence: float = 0.95, seed: int = 0) -> dict:
    """The method rows (each compared with base), the TRACE comparisons, the best single adapter's name,
    and ``p_holm`` in every paired comparison: Holm-adjusted across all of them."""
    rows = report_rows(methods, confidence, seed)
    comparisons = trace_comparisons(methods, confidence, seed)
    paired = [row["vs_base"] for row in rows if "vs_base" in row] + comparisons
    for comparison, adjusted in zip(paired, holm_adjusted([c["p_value"] for c in paired])):
        comparison["p_holm"] = adjusted
    best = best_adapter(methods)
    return {"methods": rows, "comparisons": comparisons, "best_adapter": best.name if best else None}


def _difference(versus: dict) -> str:
    low, high = versus["interval"]
    return f"{versus['mean_difference']:+.3f} [{low:+.3f}, {high:+.3f}]"


def _p(versus: dict) -> str:
    return f"p={versus['p_value']:.3g}" + (f" Holm {versus['p_holm']:.3g}" if "p_holm" in versus else "")


def _versus(row: dict) -> str:
    versus = row.get("vs_base")
    if versus is None:
        return "reference"
    return f"{_difference(versus)} {_p(versus)} ({versus['wins']}W/{versus['losses']}L)"


def table_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    """The main table's cells: method, Perfect, success, mean reward [interval], vs base, rollouts."""
    return [
        (
            row["method"],
            f"{row['perfect']}/{row['tasks']}",
            f"{row['successes']}/{row['tasks']}",
            f"{row['mean_reward']:.3f} [{row['interval'][0]:.3f}, {row['interval'][1]:.3f}]",
            _versus(row),
            str(row["rollouts"]),
        )
        for row in rows
    ]


TABLE_HEADER = [
    "method",
    "perfect",
    "success",
    "mean reward [95% CI]",
    "vs base: mean diff [CI] p, Holm p (wins/losses)",
    "training rollouts",
]


def comparison_rows(comparisons: list[dict]) -> list[tuple[str, ...]]:
    """The TRACE comparisons' cells: method, against (which), mean difference [interval], p, Holm p,
    wins/losses/ties."""
    return [
        (
            c["method"],
            c["baseline"] if c["baseline"] == c["role"] else f"{c['baseline']} ({c['role']})",
            _difference(c),
            f"{c['p_value']:.3g}",
            f"{c['p_holm']:.3g}",
            f"{c['wins']}/{c['losses']}/{c['ties']}",
        )
        for c in comparisons
    ]


COMPARISON_HEADER = ["TRACE method", "against", "mean diff [CI]", "p", "Holm p", "wins/losses/ties"]


ROUTING_HEADER = ["router", "accuracy (ties count)", "routed reward", "regret [95% CI]"]
ROUTING_NOTE = (
    "A choice counts as correct when its reward equals the best option's on that task; regret is the best "
    "option's "
    "reward minus the chosen one's."
)


def routing_cells(result: dict) -> list[str]:
    """Tie-aware accuracy, routed reward and regret [interval] of a routing summary
    (:func:`trace_ray.routing.selection.routing_summary`)."""
    regret = f"{result['regret']:.3f}"
    if "regret_interval" in result:
        regret += " [{:.3f}, {:.3f}]".format(*result["regret_interval"])
    return [f"{result['accuracy']:.3f}", f"{result['routed_reward']:.3f}", regret]


CURVE_HEADER = ["iteration", "level", "mean reward", "success", "informative groups", "rollouts", "seconds"]


def curve_rows(history: list[dict]) -> list[tuple[str, ...]]:
    """One adapter's training curve (its ``metrics.parquet`` rows): the synthetic environment's level ("-": an
    environment without levels), reward, success, informative groups of all groups, rollouts and seconds
    (rollouts and update) per iteration."""
    return [
        (
            str(row["iteration"]),
            "-" if row.get("difficulty") is None else str(row["difficulty"]),
            f"{row['reward_mean']:.3f}",
            f"{row['success_rate']:.3f}",
            f"{row['informative_groups']}/{row['groups']}",
            str(row["rollouts"]),
            f"{row['rollout_s'] + row['update_s']:.0f}",
        )
        for row in history
    ]


def _table(header: list[str], rows: list[tuple[str, ...]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
        *("| " + " | ".join(cells) + " |" for cells in rows),
    ]


def report_markdown(title: str, report: dict, unavailable: dict[str, str], notes: list[str]) -> str:
    """The report (``evaluation_report``): the main table first, then the TRACE comparisons, the methods that
    could not run, per-family rewards, the training curves (``report["training"]``: name -> metrics rows) and notes."""
    rows, comparisons = report["methods"], report["comparisons"]
    lines = [f"# {title}", "", *_table(TABLE_HEADER, table_rows(rows))]
    if comparisons:
        paired = len(comparisons) + sum("vs_base" in row for row in rows)
        lines += ["", "## TRACE against GRPO on target and the best single adapter", ""]
        if report["best_adapter"]:
            lines += [
                f"Best single adapter: {report['best_adapter']} (highest mean reward of the single adapters on "
                "these tasks).",
                "",
            ]
        lines += [
            f"Holm p: Holm-adjusted over all {paired} paired comparisons of this report (these and those against "
            "base).",
            "",
        ]
        lines += _table(COMPARISON_HEADER, comparison_rows(comparisons))
    if report.get("routing"):
        lines += ["", "## Routing", "", ROUTING_NOTE, ""]
        lines += _table(ROUTING_HEADER, [(name, *routing_cells(result)) for name, result in report["routing"].items()])
    if unavailable:
        lines += ["", "Not evaluated:", ""] + [f"- {name}: {reason}" for name, reason in unavailable.items()]
    families = sorted({family for row in rows for family in row["families"]})
    if len(families) > 1:
        lines += [
            "",
            "## Mean reward per task family",
            "",
            "| method | " + " | ".join(families) + " |",
            "|---" * (len(families) + 1) + "|",
        ]
        for row in rows:
            cells = [f"{row['families'][f]['mean_reward']:.3f}" if f in row["families"] else "" for f in families]
            lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    for name, history in report.get("training", {}).items():
        lines += ["", f"## Training curve: {name}", "", *_table(CURVE_HEADER, curve_rows(history))]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"
