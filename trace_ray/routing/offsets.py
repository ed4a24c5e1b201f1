"""Per-option offsets of the logit router's scores, fitted on training tasks (``router.calibration=fitted``).

Content-free calibration removes the bias a small model has toward some
option labels, but it measures that bias on requests that say nothing, and
with two options it can over-correct (every task then goes to one option).
``fit_offsets`` instead adds one offset per option (the base's stays 0) to
the content-free-calibrated scores and chooses the offsets that maximise the
routed reward on the training tasks, the reward of the option the router
would pick on each, given every option's greedy reward there.

The search is coordinate ascent, exact in one coordinate: with the other
offsets held, option ``j`` wins a task exactly when its offset exceeds the
task's gap (the best other score minus ``j``'s), so the routed reward is a
step function of the offset with steps at the gaps; every step is tried.
Between equal routed rewards the fit prefers the higher accuracy against the
oracle labels (ties in reward count as base), then the smaller offset: where
the training tasks give no reason to move an option, its offset stays 0.
Inside a step the offset is the step's middle (0 when the step holds 0), so
the decision has a margin on both sides.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from environments.errors import TraceRayError
from trace_ray.artifacts import write_json
from trace_ray.routing.logit_router import BASE, RouteDecision, decide

__all__ = ["OFFSETS_FILE", "fit_offsets", "load_offsets", "offset_decisions", "read_route_file", "save_offsets"]

OFFSETS_FILE = "logit_offsets.json"  # in run_dir/router
MAX_PASSES = 8  # coordinate-ascent sweeps over the options (each sweep never lowers the objective)
END_MARGIN = 1.0  # beyond the lowest or highest gap: this far past it (scores are log-probabilities)


def offset_decisions(scores: list[dict[str, float]], offsets: dict[str, float]) -> list[RouteDecision]:
    """The router's decision on each task: the highest score plus offset (ties to the base, as :func:`decide`)."""
    return [decide({name: value + offsets[name] for name, value in row.items()}) for row in scores]


def _objective(scores, rewards, labels, offsets) -> tuple[float, int, float]:
    choices = [decision.choice for decision in offset_decisions(scores, offsets)]
    reward = sum(task[choice] for task, choice in zip(rewards, choices))
    accuracy = sum(choice == label for choice, label in zip(choices, labels))
    return (round(reward, 9), accuracy, -sum(abs(value) for value in offsets.values()))


def _step_values(gaps: list[float]) -> list[float]:
    """One offset per step of the routed reward: below every gap, between each two, above every gap (0 where it lies in
    the step)."""
    edges = sorted(set(gaps))
    steps = [(None, edges[0]), *zip(edges, edges[1:]), (edges[-1], None)]
    values = []
    for low, high in steps:
        if (low is None or low < 0) and (high is None or 0 < high):
            values.append(0.0)
        elif low is None:
            values.append(high - END_MARGIN)
        elif high is None:
            values.append(low + END_MARGIN)
        else:
            values.append((low + high) / 2)
    return values


def fit_offsets(scores: list[dict[str, float]], rewards: list[dict[str, float]], labels: list[str]) -> dict[str, float]:
    """Option -> offset (the base's 0) maximising the routed reward of ``scores`` (per task: option -> score) on the
    training tasks, whose per-option greedy rewards are ``rewards`` and oracle labels ``labels``."""
    if not scores or not len(scores) == len(rewards) == len(labels):
        raise ValueError(
            f"fit_offsets needs one score row, reward row and label per training task; got {len(scores)}, "
            f"{len(rewards)}, {len(labels)}"
        )
    names = list(scores[0])
    if BASE not in names:
        raise ValueError(
            f"the options {names} have no {BASE!r}: its offset is the fixed 0 the others are fitted against"
        )
    offsets = {name: 0.0 for name in names}
    best = _objective(scores, rewards, labels, offsets)
    for _ in range(MAX_PASSES):
        moved = False
        for name in names:
            if name == BASE:
                continue
            gaps = [
                max(value + offsets[other] for other, value in row.items() if other != name) - row[name]
                for row in scores
            ]
            for value in _step_values(gaps):
                trial = {**offsets, name: value}
                outcome = _objective(scores, rewards, labels, trial)
                if outcome > best:
                    best, offsets, moved = outcome, trial, True
        if not moved:
            break
    return offsets


def read_route_file(path: Path, needed_by: str, kind: str, fix: str, parse: Callable[[dict], dict]) -> dict:
    """``parse`` of the JSON file ``path`` that ``trace-ray route`` wrote; a one-line error (``needed_by`` it, with
    ``fix``)
    when it is missing, and naming ``kind`` when it does not parse."""
    if not path.is_file():
        raise TraceRayError(f"{needed_by} {path}, which is missing; {fix}")
    try:
        return parse(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TraceRayError(f"{path} is not {kind} ({exc}); {fix}") from None


def save_offsets(folder: Path, offsets: dict[str, float], model_name: str, **facts) -> None:
    write_json(
        Path(folder) / OFFSETS_FILE, {"model": model_name, "options": list(offsets), "offsets": offsets, **facts}
    )


def load_offsets(folder: Path, model_name: str, names: list[str]) -> dict[str, float]:
    """The offsets ``trace-ray route`` fitted for these options and this base model; a one-line error otherwise."""
    path = Path(folder) / OFFSETS_FILE
    fix = f"run trace-ray route run_dir={Path(folder).parent} (it fits them), or set router.calibration=content_free"
    saved = read_route_file(
        path,
        "router.calibration=fitted needs the logit router's offsets in",
        "a logit router offsets file",
        fix,
        lambda saved: {"model": saved["model"], "offsets": {k: float(v) for k, v in saved["offsets"].items()}},
    )
    offsets, model = saved["offsets"], saved["model"]
    if model != model_name or sorted(offsets) != sorted(names):
        raise TraceRayError(
            f"{path} was fitted for model {model} over {sorted(offsets)}, not {model_name} over {sorted(names)}; {fix}"
        )
    return {name: offsets[name] for name in names}
