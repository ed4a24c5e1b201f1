"""router=auto's pure parts: tie-aware metrics, the fallback, the keyword features, the gain rule, cross-validation and
the choice."""

import json

import numpy as np
import pytest

from environments.errors import TraceRayError
from trace_ray.config import GateConfig
from trace_ray.routing.auto_router import load_selection, save_selection
from trace_ray.routing.selection import (
    FALLBACK,
    Candidate,
    Constant,
    RoutingRow,
    TaskFeatures,
    best_on_average,
    candidate_rules,
    choose,
    correct,
    cross_validate,
    fit_gain,
    fold_of,
    keyword_features,
    routing_metrics,
    rule_from_state,
    rule_state,
    tool_vocabulary,
)

NAMES = ["a", "b", "base"]
GATE = GateConfig(hidden=0, epochs=50, lr=0.05, weight_decay=0.0)


def features(keywords=(0.0,), free=None) -> TaskFeatures:
    free = free or {name: 0.0 for name in NAMES}
    return TaskFeatures(dict(free), dict(free), np.zeros(3), np.array(keywords, dtype=float))


def row(seed, rewards, keywords=(0.0,), free=None) -> RoutingRow:
    best = max(rewards.values())
    label = "base" if rewards["base"] == best else next(name for name in NAMES if rewards[name] == best)
    return RoutingRow(seed, features(keywords, free), dict(rewards), label)


def test_a_choice_is_correct_when_it_ties_the_best_reward_and_regret_is_the_gap_to_it():
    rewards = [
        {"a": 0.0, "b": 0.0, "base": 0.0},  # every option ties: any choice is correct
        {"a": 1.0, "b": 0.0, "base": 0.5},  # base loses 0.5 to a
        {"a": 0.2, "b": 0.6, "base": 0.6},  # b ties the base at the best
        {"a": 0.0, "b": 0.3, "base": 0.0},  # a loses 0.3 to b
    ]
    assert [correct(r, c) for r, c in zip(rewards, ["a", "base", "b", "a"])] == [True, False, True, False]
    metrics = routing_metrics(["a", "base", "b", "a"], rewards)
    # by hand: 2 of 4 correct; routed 0 + 0.5 + 0.6 + 0 = 1.1 over 4; regret 0 + 0.5 + 0 + 0.3 = 0.8 over 4
    assert metrics == pytest.approx({"accuracy": 0.5, "routed_reward": 0.275, "regret": 0.2})
    # the oracle (a, a, b, b) is correct everywhere with no regret: 0 + 1 + 0.6 + 0.3 = 1.9 over 4
    assert routing_metrics(["a", "a", "b", "b"], rewards) == pytest.approx(
        {"accuracy": 1.0, "routed_reward": 0.475, "regret": 0.0}
    )
    with pytest.raises(ValueError, match="one choice per task"):
        routing_metrics(["a"], rewards)


def test_the_fallback_is_the_best_option_on_average_with_ties_to_more_correct_tasks_then_the_base():
    rows = [row(0, {"a": 1.0, "b": 0.0, "base": 0.5}), row(1, {"a": 0.0, "b": 0.5, "base": 0.2})]
    assert best_on_average(rows, NAMES) == "a"  # means a 0.5, b 0.25, base 0.35
    even = [row(0, {"a": 1.0, "b": 0.0, "base": 0.0}), row(1, {"a": 0.0, "b": 0.0, "base": 1.0})]
    assert best_on_average(even, NAMES) == "base"  # a and base: mean 0.5, best on 1 task each: the base
    # a and base both average 0.15; a is best on 3 tasks (one a tie of all), the base on 2: a
    more = [
        row(0, {"a": 0.3, "b": 0.0, "base": 0.0}),
        row(1, {"a": 0.3, "b": 0.0, "base": 0.0}),
        row(2, {"a": 0.0, "b": 0.0, "base": 0.6}),
        row(3, {"a": 0.0, "b": 0.0, "base": 0.0}),
    ]
    assert best_on_average(more, NAMES) == "a"


def test_the_vocabulary_is_the_tool_names_words_and_a_request_marks_the_ones_it_uses():
    tools = [
        {"type": "function", "function": {"name": name}}
        for name in ("set_wifi_status", "get_cellular_service_status", "search_contacts")
    ]
    vocabulary = tool_vocabulary(tools)
    # get/set are too short to say anything
    assert vocabulary == ["cellular", "contact", "search", "service", "status", "wifi"]
    request = [
        {"role": "system", "content": "policy mentions wifi"},
        {"role": "user", "content": "Turn on WiFi, then search my Contacts."},
    ]
    assert keyword_features(request, vocabulary).tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, 1.0]  # the policy is not read


def test_folds_are_seeded_balanced_and_need_as_many_tasks_as_folds():
    assignment = fold_of(10, 4, seed=3)
    assert sorted(assignment.count(fold) for fold in range(4)) == [2, 2, 3, 3]
    assert assignment == fold_of(10, 4, seed=3) and assignment != fold_of(10, 4, seed=4)
    with pytest.raises(TraceRayError, match="router.auto.folds=5"):
        fold_of(4, 5, seed=0)


def test_cross_validation_fits_on_the_other_folds_only_and_scores_every_row_once():
    rows = [row(seed, {"a": float(seed % 2), "b": 0.0, "base": 0.5}) for seed in range(9)]
    seen = []

    class Spy:
        def __init__(self, fitted):
            self.fitted = fitted

        def choose(self, tasks):
            held = [next(r.seed for r in rows if r.features is task) for task in tasks]
            seen.append((self.fitted, held))
            return ["base"] * len(tasks)

    spy = Candidate("spy", lambda inside, synthetic: Spy([r.seed for r in inside]))
    results = cross_validate([Candidate(FALLBACK, lambda inside, _: Constant("base")), spy], rows, [], folds=3, seed=0)
    assert len(seen) == 3 and sorted(seed for _, held in seen for seed in held) == list(range(9))
    for fitted, held in seen:
        assert not set(fitted) & set(held) and sorted(fitted + held) == list(range(9))
    assert results["spy"]["choices"] == ["base"] * 9 and len(results["spy"]["folds"]) == 3
    assert (
        results["spy"]["routed_reward"] == pytest.approx(0.5) and sum(f["tasks"] for f in results["spy"]["folds"]) == 9
    )


def test_a_router_is_chosen_only_when_it_beats_the_fallback_out_of_fold():
    results = {FALLBACK: {"routed_reward": 0.2}, "logit": {"routed_reward": 0.2}, "keywords": {"routed_reward": 0.19}}
    assert choose(results) == FALLBACK  # a tie is not a win
    results["learned"] = {"routed_reward": 0.25}
    results["keywords + logit"] = {"routed_reward": 0.25}
    assert choose(results) == "learned"  # the earlier of two equal winners


def keyword_rows():
    """wifi requests: adapter a earns 1, the base 0; other requests: a 0, the base 0.4 (b earns nothing anywhere)."""
    wifi = [row(seed, {"a": 1.0, "b": 0.0, "base": 0.0}, keywords=(1.0,)) for seed in range(3)]
    other = [row(seed, {"a": 0.0, "b": 0.0, "base": 0.4}, keywords=(0.0,)) for seed in range(3, 8)]
    return wifi + other


def test_the_keyword_router_predicts_each_options_gain_over_the_fallback_and_abstains_under_the_margin():
    rows = keyword_rows()
    rule = fit_gain(rows, NAMES, with_logits=False, ridge=0.1, margin=0.05)
    assert rule.fallback == "a"  # mean 3/8 against the base's 2/8
    # the base's gain over a: -1 on the 3 wifi tasks, +0.4 on the 5 others, -0.125 on average (the unpenalised
    # intercept)
    assert rule.intercepts["base"] == pytest.approx(-0.125) and rule.intercepts["b"] == pytest.approx(-3 / 8)
    assert rule.choose([features((1.0,)), features((0.0,))]) == ["a", "base"]
    routed = routing_metrics(rule.choose([r.features for r in rows]), [r.rewards for r in rows])
    assert routed["routed_reward"] == pytest.approx((3 * 1.0 + 5 * 0.4) / 8) and routed["regret"] == 0.0
    timid = fit_gain(rows, NAMES, with_logits=False, ridge=0.1, margin=10.0)
    assert timid.choose([features((1.0,)), features((0.0,))]) == ["a", "a"]  # no gain clears the margin: the fallback
    restored = rule_from_state(json.loads(json.dumps(rule_state(rule))))
    assert restored.choose([features((1.0,)), features((0.0,))]) == ["a", "base"]


def test_cross_validation_chooses_the_keyword_router_where_keywords_tell_the_winner():
    rows = keyword_rows() + [
        row(seed, r.rewards, (r.features.keywords[0],)) for seed, r in zip(range(8, 16), keyword_rows())
    ]
    candidates = candidate_rules(NAMES, GATE, ridge=0.1, margin=0.05)
    results = cross_validate(candidates, rows, [], folds=4, seed=0)
    assert results[FALLBACK]["routed_reward"] == pytest.approx(3 / 8)  # always a, in every fold
    assert results["keywords"]["routed_reward"] == pytest.approx(5 / 8) and results["keywords"]["accuracy"] == 1.0
    assert choose(results) == "keywords"
    # the logit scores say nothing here (all 0, ties to the base); the gate has only zero features: neither beats the
    # fallback
    assert results["logit (uncalibrated)"]["choices"] == ["base"] * 16


def test_the_learned_candidate_abstains_to_the_fallback_when_every_label_is_one_option():
    rows = [row(seed, {"a": 0.0, "b": 0.0, "base": 0.0}) for seed in range(6)]
    learned = next(c for c in candidate_rules(NAMES, GATE, 1.0, 0.05) if c.name == "learned")
    rule = learned.fit(rows, [])
    assert rule.gate is None and rule.choose([r.features for r in rows]) == ["base"] * 6
    assert rule_state(rule) == {"kind": "gate", "fallback": "base", "trained": False}


def test_a_selection_file_round_trips_and_a_missing_or_foreign_one_is_a_one_line_error(tmp_path):
    rule = Constant("a")
    save_selection(
        tmp_path,
        "tiny_random",
        NAMES,
        ["wifi"],
        FALLBACK,
        rule,
        {FALLBACK: {"routed_reward": 0.1}},
        fallback="a",
        train_tasks=4,
    )
    saved = load_selection(tmp_path, "tiny_random", ["base", "a", "b"])
    assert (
        saved["chosen"] == FALLBACK
        and saved["rule"] == {"kind": "constant", "option": "a"}
        and saved["vocabulary"] == ["wifi"]
    )
    for model, names, message in (
        ("smollm2_135m", NAMES, "not smollm2_135m"),
        ("tiny_random", ["a", "base"], "not tiny_random"),
    ):
        with pytest.raises(TraceRayError, match=message) as error:
            load_selection(tmp_path, model, names)
        assert "trace-ray route" in str(error.value) and "\n" not in str(error.value)
    (tmp_path / "selection.json").write_text("{not json")
    with pytest.raises(TraceRayError, match="is not a router selection file"):
        load_selection(tmp_path, "tiny_random", NAMES)
    with pytest.raises(TraceRayError, match="selection.json, which is missing; run trace-ray route"):
        load_selection(tmp_path / "nowhere", "tiny_random", NAMES)
