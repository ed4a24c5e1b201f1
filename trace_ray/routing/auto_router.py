"""``router=auto``: the router that ``trace-ray route`` chose by cross-validation, rebuilt for serving and evaluation.

``route`` scores every candidate of :mod:`trace_ray.routing.selection` out of
fold on the training split's tasks, fits the chosen one on all of them, and
saves it in ``run_dir/router/selection.json`` (the folds' figures, the choice,
the rule, the keyword vocabulary), with a chosen learned gate's weights in
``run_dir/router/auto/``. :class:`AutoRouter` reads them back and computes
only the features the rule reads: none for a constant choice, the logit
router's scores, the gate's pooled hidden states, or the request's keywords.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from environments.errors import TraceRayError
from trace_ray.artifacts import write_json
from trace_ray.routing.learned_gate import load_gate, pooled_features, save_gate
from trace_ray.routing.logit_router import LogitRouter, RouteDecision
from trace_ray.routing.offsets import read_route_file
from trace_ray.routing.selection import TaskFeatures, keyword_features, needs, rule_from_state, rule_state

SELECTION_FILE = "selection.json"  # in run_dir/router
GATE_FOLDER = "auto"  # run_dir/router/auto/: the chosen learned gate's weights


def task_features(
    model, tokenizer, logit: LogitRouter | None, observations: list[list[dict]], vocabulary: list[str], wanted: set[str]
) -> list[TaskFeatures]:
    """Each task's features among ``wanted`` (``logit``: from ``logit``, a content-free-calibrated router; ``hidden``;
    ``keywords``); the others are left empty."""
    count = len(observations)
    raw, free = [{} for _ in range(count)], [{} for _ in range(count)]
    if "logit" in wanted:
        table = logit.raw_label_logits(observations)
        raw = [dict(zip(logit.names, row.tolist())) for row in table]
        free = [dict(zip(logit.names, row.tolist())) for row in logit.scores(observations, table, "content_free")]
    hidden = pooled_features(model, tokenizer, observations).numpy() if "hidden" in wanted else np.zeros((count, 0))
    keywords = [keyword_features(o, vocabulary) if "keywords" in wanted else np.zeros(0) for o in observations]
    return [TaskFeatures(r, f, h, k) for r, f, h, k in zip(raw, free, hidden, keywords)]


def save_selection(
    folder: Path, model_name: str, names: list[str], vocabulary: list[str], chosen: str, rule, results: dict, **facts
) -> None:
    """``folder/selection.json`` (and a chosen gate's weights in ``folder/auto/``)."""
    state = rule_state(rule)
    if state["kind"] == "gate" and state["trained"]:
        save_gate(Path(folder) / GATE_FOLDER, rule.gate, model_name)
    write_json(
        Path(folder) / SELECTION_FILE,
        {
            "model": model_name,
            "options": names,
            "chosen": chosen,
            "rule": state,
            "vocabulary": vocabulary,
            **facts,
            "candidates": results,
        },
    )


def load_selection(folder: Path, model_name: str, names: list[str]) -> dict:
    """The selection ``trace-ray route`` saved for these options and this base model; a one-line error otherwise."""
    path = Path(folder) / SELECTION_FILE
    fix = (
        f"run trace-ray route run_dir={Path(folder).parent} (it chooses the router), or pick one with "
        "router=logit|learned"
    )

    def parse(saved: dict) -> dict:
        # what serving reads
        saved["model"], saved["options"], saved["rule"]["kind"], saved["chosen"], saved["fallback"], saved["vocabulary"]
        return saved

    saved = read_route_file(
        path, "router=auto serves the router trace-ray route chose in", "a router selection file", fix, parse
    )
    model, options = saved["model"], saved["options"]
    if model != model_name or sorted(options) != sorted(names):
        raise TraceRayError(
            f"{path} chose a router for model {model} over {sorted(options)}, not {model_name} over "
            f"{sorted(names)}; {fix}"
        )
    return saved


class AutoRouter:
    """Routes a task with the rule ``trace-ray route`` chose (``selection``: :func:`load_selection`'s)."""

    def __init__(self, selection: dict, model, tokenizer, logit: LogitRouter | None, folder: Path):
        state = selection["rule"]
        self.names = list(selection["options"])
        self.chosen = selection["chosen"]
        # always-best-adapter on the training split: the comparator the choice had to beat
        self.fallback = selection["fallback"]
        self.vocabulary = list(selection["vocabulary"])
        self.wanted = needs(state)
        gate = (
            load_gate(Path(folder) / GATE_FOLDER, selection["model"], self.names[:-1])
            if "hidden" in self.wanted
            else None
        )
        self.rule = rule_from_state(state, gate)
        self.model, self.tokenizer, self.logit = model, tokenizer, logit

    def route(self, first_observation: list[dict]) -> RouteDecision:
        return self.route_many([first_observation])[0]

    def route_many(self, observations: list[list[dict]]) -> list[RouteDecision]:
        features = task_features(self.model, self.tokenizer, self.logit, observations, self.vocabulary, self.wanted)
        return chosen_decisions(self.rule.choose(features), self.names)


def chosen_decisions(choices: list[str], names: list[str]) -> list[RouteDecision]:
    """A rule's choices as decisions: score and probability 1 for the chosen option, 0 for the others."""
    one_hot = [{name: float(name == choice) for name in names} for choice in choices]
    return [RouteDecision(choice, scores, scores) for choice, scores in zip(choices, one_hot)]
