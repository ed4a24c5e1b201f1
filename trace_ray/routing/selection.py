"""Choosing a router (``router=auto``): tie-aware routing metrics, candidate routing rules, and k-fold cross-validation.

A task's *features* are what the rules read of its first observation
(:class:`TaskFeatures`); a training task's *row* adds every option's greedy
reward on it (:class:`RoutingRow`). A *rule* is fitted on rows and then
chooses one option per task from its features alone; in cross-validation a
rule never sees the rows it is scored on.

Tie-aware scoring: on most tasks several options earn the same reward (often
all 0), so a choice is correct when its reward equals the best option's
(:func:`correct`), and a router's *regret* on a task is the best reward minus
the reward of its choice.

The candidates (:func:`candidate_rules`), in order of preference:

- ``fallback``: always the option with the highest mean reward on the rows it
  is fitted on (``always-best-adapter``, base included; ties: the option best
  on more tasks, then the base, then the first adapter). Every other rule
  must beat it in cross-validation to be chosen.
- ``always <option>``: one option on every task (the comparators).
- ``logit (uncalibrated|content-free|fitted)``: the highest logit-router score,
  raw, contextually calibrated, or calibrated plus per-option offsets fitted on
  the training rows (:mod:`trace_ray.routing.offsets`).
- ``learned``: the learned gate (:mod:`trace_ray.routing.learned_gate`) fitted
  on the training rows' oracle labels (plus the synthetic environments' rows);
  where those labels are one option throughout it cannot be trained and
  chooses the fallback.
- ``keywords`` and ``keywords + logit``: per option, a ridge regression of its
  reward minus the fallback's on the request's features (the target's
  tool-name words found in the request; with the calibrated logit scores too),
  choosing the option of the highest predicted gain when that gain exceeds
  ``margin`` and abstaining to the fallback otherwise.

:func:`cross_validate` scores every candidate out of fold on the training
split's rows, and :func:`choose` takes the best mean routed reward, which
must be strictly above the fallback's; ties go to the earlier candidate.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from environments.errors import TraceRayError
from trace_ray.config import GateConfig
from trace_ray.evaluation.statistics import bootstrap_interval
from trace_ray.routing.learned_gate import first_request, fit_gate, gate_decisions
from trace_ray.routing.logit_router import BASE, decide
from trace_ray.routing.offsets import fit_offsets, offset_decisions

REWARD_TOLERANCE = 1e-9  # rewards this close count as equal
FALLBACK = "fallback"
MIN_KEYWORD_CHARS = 4  # tool-name words shorter than this (get, set, ...) say nothing about the capability


# -- tie-aware metrics ----------------------------------------------------------------------------
def best_choice(rewards: dict[str, float], order: list[str]) -> str:
    """The oracle label: the option with the highest reward; ties go to the base, else to the first in ``order``."""
    best = max(rewards.values())
    tied = [name for name in order if rewards[name] == best]
    return BASE if BASE in tied else tied[0]


def correct(rewards: dict[str, float], choice: str) -> bool:
    """Whether ``choice`` earns the best reward of the task's options (ties count as correct)."""
    return rewards[choice] >= max(rewards.values()) - REWARD_TOLERANCE


def routing_metrics(choices: list[str], rewards: list[dict[str, float]]) -> dict:
    """Tie-aware accuracy, mean routed reward, and mean regret (best reward minus the chosen one's) of ``choices``."""
    if not choices or len(choices) != len(rewards):
        raise ValueError(
            f"routing metrics need one choice per task's rewards; got {len(choices)} choices, {len(rewards)} tasks"
        )
    routed = [task[choice] for task, choice in zip(rewards, choices)]
    regret = [max(task.values()) - value for task, value in zip(rewards, routed)]
    return {
        "accuracy": sum(correct(task, choice) for task, choice in zip(rewards, choices)) / len(choices),
        "routed_reward": float(np.mean(routed)),
        "regret": float(np.mean(regret)),
    }


def regrets(choices: list[str], rewards: list[dict[str, float]]) -> list[float]:
    """Per task, the best option's reward minus the chosen option's."""
    return [max(task.values()) - task[choice] for task, choice in zip(rewards, choices)]


def routing_summary(
    choices: list[str], rewards: list[dict[str, float]], confidence: float = 0.95, seed: int = 0
) -> dict:
    """:func:`routing_metrics` and the bootstrap interval of the mean regret."""
    interval = bootstrap_interval(regrets(choices, rewards), confidence, seed=seed)
    return {**routing_metrics(choices, rewards), "regret_interval": [float(interval[0]), float(interval[1])]}


# -- rows and features ----------------------------------------------------------------------------
@dataclass
class TaskFeatures:
    """What the rules read of a task's first observation."""

    raw_logits: dict[str, float]  # the logit router's label logits, uncalibrated (option -> logit)
    content_free: dict[str, float]  # the same, contextually calibrated
    hidden: np.ndarray  # the learned gate's pooled hidden state of the request
    keywords: np.ndarray  # 1.0 where a word of the vocabulary occurs in the request


@dataclass
class RoutingRow:
    """A training task: its features and its options' greedy rewards."""

    seed: int
    features: TaskFeatures
    rewards: dict[str, float]  # option -> greedy reward (the adapters, then base)
    label: str  # the oracle label (ties to the base)


def _stem(word: str) -> str:
    """A plural's ``s`` dropped (contacts -> contact; status, access stay)."""
    plural = word.endswith("s") and not word.endswith(("ss", "us")) and len(word) > MIN_KEYWORD_CHARS
    return word[:-1] if plural else word


def tool_vocabulary(tools: list[dict]) -> list[str]:
    """The words of the target's tool names (``set_wifi_status`` -> wifi, status), plural ``s`` dropped, sorted."""
    words = set()
    for tool in tools:
        name = tool.get("function", tool).get("name", "")
        words.update(_stem(part) for part in name.lower().split("_") if len(part) >= MIN_KEYWORD_CHARS)
    return sorted(words)


def keyword_features(first_observation: list[dict], vocabulary: list[str]) -> np.ndarray:
    """1.0 for each vocabulary word that occurs in the task's first user request (plural ``s`` dropped), else 0.0."""
    words = {_stem(word) for word in re.findall(r"[a-z0-9]+", first_request(first_observation).lower())}
    return np.array([1.0 if word in words else 0.0 for word in vocabulary])


# -- rules ----------------------------------------------------------------------------------------
class FittedRule(Protocol):
    def choose(self, tasks: list[TaskFeatures]) -> list[str]: ...


@dataclass
class Constant:
    option: str

    def choose(self, tasks: list[TaskFeatures]) -> list[str]:
        return [self.option] * len(tasks)


def best_on_average(rows: list[RoutingRow], names: list[str]) -> str:
    """The option of the highest mean reward on ``rows``; ties: correct on more rows, then the base, then ``names``
    order."""

    def key(name: str) -> tuple:
        return (
            round(float(np.mean([row.rewards[name] for row in rows])), 9),
            sum(correct(row.rewards, name) for row in rows),
            name == BASE,
            -names.index(name),
        )

    return max(names, key=key)


@dataclass
class LogitRule:
    calibration: str  # none | content_free | fitted
    offsets: dict[str, float] = field(default_factory=dict)

    def choose(self, tasks: list[TaskFeatures]) -> list[str]:
        if self.calibration == "none":
            return [decide(task.raw_logits).choice for task in tasks]
        names = list(tasks[0].content_free) if tasks else []
        shift = self.offsets or {name: 0.0 for name in names}
        return [d.choice for d in offset_decisions([task.content_free for task in tasks], shift)]


@dataclass
class GateRule:
    gate: object  # a TrainedGate, or None when the labels could not train one
    fallback: str

    def choose(self, tasks: list[TaskFeatures]) -> list[str]:
        if self.gate is None:
            return [self.fallback] * len(tasks)
        return [d.choice for d in gate_decisions(self.gate, hidden_matrix(tasks))]


def hidden_matrix(tasks: list[TaskFeatures]) -> torch.Tensor:
    return torch.tensor(np.stack([task.hidden for task in tasks]), dtype=torch.float32)


def gain_features(tasks: list[TaskFeatures], with_logits: bool) -> np.ndarray:
    """[tasks, features]: the keyword indicators, then (``with_logits``) the calibrated logit scores."""
    parts = [np.stack([task.keywords for task in tasks])]
    if with_logits:
        parts.append(np.array([list(task.content_free.values()) for task in tasks]))
    return np.concatenate(parts, axis=1)


@dataclass
class GainRule:
    """Per option, predicted reward minus the fallback's: ``intercept + ((x - mean) / std) . weights``."""

    fallback: str
    with_logits: bool
    margin: float
    mean: np.ndarray
    std: np.ndarray
    weights: dict[str, np.ndarray]  # option (not the fallback) -> ridge weights
    intercepts: dict[str, float]

    def gains(self, tasks: list[TaskFeatures]) -> list[dict[str, float]]:
        scaled = (gain_features(tasks, self.with_logits) - self.mean) / self.std
        return [{name: float(self.intercepts[name] + x @ w) for name, w in self.weights.items()} for x in scaled]

    def choose(self, tasks: list[TaskFeatures]) -> list[str]:
        choices = []
        for gains in self.gains(tasks):
            best = max(gains, key=gains.get) if gains else None
            choices.append(best if best is not None and gains[best] > self.margin else self.fallback)
        return choices

    def state(self) -> dict:
        return {
            "fallback": self.fallback,
            "with_logits": self.with_logits,
            "margin": self.margin,
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "weights": {k: v.tolist() for k, v in self.weights.items()},
            "intercepts": self.intercepts,
        }

    @classmethod
    def from_state(cls, state: dict) -> GainRule:
        return cls(
            state["fallback"],
            state["with_logits"],
            state["margin"],
            np.array(state["mean"]),
            np.array(state["std"]),
            {k: np.array(v) for k, v in state["weights"].items()},
            dict(state["intercepts"]),
        )


def fit_gain(rows: list[RoutingRow], names: list[str], with_logits: bool, ridge: float, margin: float) -> GainRule:
    """Ridge regression (unpenalised intercept) of each option's reward minus the fallback's on the standardised
    features."""
    fallback = best_on_average(rows, names)
    features = gain_features([row.features for row in rows], with_logits)
    mean, std = features.mean(axis=0), features.std(axis=0)
    std = np.where(std > 1e-6, std, 1.0)
    scaled = (features - mean) / std
    system = scaled.T @ scaled + ridge * np.eye(scaled.shape[1])
    weights, intercepts = {}, {}
    for name in names:
        if name == fallback:
            continue
        gain = np.array([row.rewards[name] - row.rewards[fallback] for row in rows])
        intercepts[name] = float(gain.mean())
        weights[name] = np.linalg.solve(system, scaled.T @ (gain - gain.mean()))
    return GainRule(fallback, with_logits, margin, mean, std, weights, intercepts)


@dataclass
class Candidate:
    """A named way of fitting a rule on training rows (``synthetic``: rows of the adapters' own environments, labels
    only)."""

    name: str
    fit: Callable[[list[RoutingRow], list[RoutingRow]], FittedRule]


def candidate_rules(names: list[str], gate: GateConfig, ridge: float, margin: float, seed: int = 0) -> list[Candidate]:
    """Every candidate over the options ``names`` (the adapters, then base), in order of preference."""

    def fitted_logit(rows, _synthetic):
        scores = [row.features.content_free for row in rows]
        return LogitRule("fitted", fit_offsets(scores, [row.rewards for row in rows], [row.label for row in rows]))

    def learned(rows, synthetic):
        fallback = best_on_average(rows, names)
        training = rows + synthetic
        try:
            gated = fit_gate(
                hidden_matrix([row.features for row in training]), [row.label for row in training], names, gate, seed
            )
            return GateRule(gated, fallback)
        except TraceRayError:  # one label throughout: no gate; it abstains to the fallback
            return GateRule(None, fallback)

    candidates = [Candidate(FALLBACK, lambda rows, _: Constant(best_on_average(rows, names)))]
    candidates += [
        Candidate(f"always {name}", lambda rows, _, name=name: Constant(name)) for name in [BASE, *names[:-1]]
    ]
    candidates += [
        Candidate("logit (uncalibrated)", lambda rows, _: LogitRule("none")),
        Candidate("logit (content-free)", lambda rows, _: LogitRule("content_free")),
        Candidate("logit (fitted)", fitted_logit),
        Candidate("learned", learned),
        Candidate("keywords", lambda rows, _: fit_gain(rows, names, False, ridge, margin)),
        Candidate("keywords + logit", lambda rows, _: fit_gain(rows, names, True, ridge, margin)),
    ]
    return candidates


# -- cross-validation -----------------------------------------------------------------------------
def fold_of(count: int, folds: int, seed: int) -> list[int]:
    """Each row's fold: a seeded shuffle dealt round-robin, so fold sizes differ by at most one."""
    if not 2 <= folds <= count:
        raise TraceRayError(
            f"router.auto.folds={folds} needs 2 <= folds <= the {count} training tasks; lower it or route more tasks"
        )
    order = np.random.default_rng(seed).permutation(count)
    assignment = [0] * count
    for position, row in enumerate(order):
        assignment[row] = position % folds
    return assignment


def cross_validate(
    candidates: list[Candidate], rows: list[RoutingRow], synthetic: list[RoutingRow], folds: int, seed: int = 0
) -> dict[str, dict]:
    """Candidate name -> its out-of-fold choices and metrics on ``rows`` (all of them, and per fold)."""
    assignment = fold_of(len(rows), folds, seed)
    results = {}
    for candidate in candidates:
        choices: list[str | None] = [None] * len(rows)
        per_fold = []
        for fold in range(folds):
            inside = [row for row, f in zip(rows, assignment) if f != fold]
            held = [index for index, f in enumerate(assignment) if f == fold]
            picks = candidate.fit(inside, synthetic).choose([rows[index].features for index in held])
            for index, pick in zip(held, picks):
                choices[index] = pick
            per_fold.append({"tasks": len(held), **routing_metrics(picks, [rows[index].rewards for index in held])})
        results[candidate.name] = {
            "choices": choices,
            **routing_metrics(choices, [row.rewards for row in rows]),
            "folds": per_fold,
        }
    return results


def choose(results: dict[str, dict]) -> str:
    """The candidate of the highest out-of-fold routed reward; it must beat the fallback's strictly (ties: the
    earlier)."""
    floor = results[FALLBACK]["routed_reward"]
    best = FALLBACK
    for name, result in results.items():
        if result["routed_reward"] > max(floor, results[best]["routed_reward"]) + REWARD_TOLERANCE:
            best = name
    return best


# -- the chosen rule, saved and restored -----------------------------------------------------------
def rule_state(rule: FittedRule) -> dict:
    """What serving needs to rebuild ``rule`` (a gate's weights are saved beside it, see
    :mod:`trace_ray.routing.auto_router`)."""
    if isinstance(rule, Constant):
        return {"kind": "constant", "option": rule.option}
    if isinstance(rule, LogitRule):
        return {"kind": "logit", "calibration": rule.calibration, "offsets": rule.offsets}
    if isinstance(rule, GateRule):
        return {"kind": "gate", "fallback": rule.fallback, "trained": rule.gate is not None}
    if isinstance(rule, GainRule):
        return {"kind": "gain", **rule.state()}
    raise TypeError(f"no saved form for routing rule {rule!r}")


def needs(state: dict) -> set[str]:
    """The features a saved rule reads: ``logit``, ``hidden``, ``keywords`` (a constant reads none)."""
    kind = state["kind"]
    if kind == "logit":
        return {"logit"}
    if kind == "gate":
        return {"hidden"} if state["trained"] else set()
    if kind == "gain":
        return {"keywords", "logit"} if state["with_logits"] else {"keywords"}
    return set()


def rule_from_state(state: dict, gate=None) -> FittedRule:
    """The rule :func:`rule_state` saved (``gate``: the learned gate's weights, for a trained gate rule)."""
    kind = state["kind"]
    if kind == "constant":
        return Constant(state["option"])
    if kind == "logit":
        return LogitRule(state["calibration"], dict(state["offsets"]))
    if kind == "gate":
        return GateRule(gate if state["trained"] else None, state["fallback"])
    if kind == "gain":
        return GainRule.from_state(state)
    raise ValueError(f"unknown routing rule kind {kind!r}")
