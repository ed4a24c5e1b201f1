"""``router=learned``: the gate's training on features, degenerate labels, pooled features of the tiny model,
save/load."""

import pytest
import torch

from environments.errors import TraceRayError
from tests.conftest import model_config
from trace_ray.config_compose import compose_config
from trace_ray.models import load_model
from trace_ray.routing.learned_gate import (
    LearnedRouter,
    fit_gate,
    gate_decisions,
    load_gate,
    pooled_features,
    save_gate,
)

NAMES = ["wifi", "calendar", "base"]


def gate_settings(*overrides):
    return compose_config("route", list(overrides)).router.gate


def clusters(per_class, seed, dim=16, spread=0.6):
    """Three Gaussian clusters, one per option, at fixed random centres."""
    centres = torch.randn(len(NAMES), dim, generator=torch.Generator().manual_seed(99)) * 2
    noise = torch.Generator().manual_seed(seed)
    features = torch.cat(
        [centres[i] + spread * torch.randn(per_class, dim, generator=noise) for i in range(len(NAMES))]
    )
    return features, [name for name in NAMES for _ in range(per_class)]


@pytest.mark.parametrize("hidden", ["0", "64"])
def test_the_gate_learns_separable_labels_and_generalizes(hidden):
    train_x, train_y = clusters(20, seed=1)
    test_x, test_y = clusters(20, seed=2)
    gate = fit_gate(train_x, train_y, NAMES, gate_settings(f"router.gate.hidden={hidden}"))
    assert gate.metrics["train_accuracy"] == 1.0 and gate.metrics["label_counts"] == {name: 20 for name in NAMES}
    # the reported accuracy, checked choice by choice
    assert [d.choice for d in gate_decisions(gate, train_x)] == train_y
    choices = [d.choice for d in gate_decisions(gate, test_x)]
    assert sum(c == y for c, y in zip(choices, test_y)) / len(test_y) >= 0.9


def test_the_gate_cannot_learn_noise_beyond_chance_on_held_out_tasks():
    generator = torch.Generator().manual_seed(3)
    train_x, test_x = torch.randn(60, 16, generator=generator), torch.randn(60, 16, generator=generator)
    labels = [NAMES[i % 3] for i in range(60)]
    gate = fit_gate(train_x, labels, NAMES, gate_settings())
    choices = [d.choice for d in gate_decisions(gate, test_x)]
    assert sum(c == y for c, y in zip(choices, labels)) / 60 < 0.6  # a leak of labels into features would show here


@pytest.mark.parametrize(
    "labels, message",
    [
        (["base"] * 6, "all 6 training labels are 'base': a gate would learn a constant"),
        (["wifi", "base", "phone"], "gate labels ['phone'] are not routing options"),
    ],
)
def test_degenerate_labels_fail_loudly(labels, message):
    with pytest.raises(TraceRayError, match=message.replace("[", r"\[").replace("]", r"\]")):
        fit_gate(torch.randn(len(labels), 4), labels, NAMES, gate_settings())


@pytest.fixture(scope="module")
def tiny():
    return load_model(model_config("tiny_random"))


def observation(request):
    return [{"role": "system", "content": "You are a phone assistant."}, {"role": "user", "content": request}]


def test_pooled_features_ignore_padding_and_the_system_policy(tiny):
    model, tokenizer = tiny
    short, long = observation("turn on wifi"), observation("move my dentist appointment to next tuesday at noon please")
    alone = pooled_features(model, tokenizer, [short])
    batched = pooled_features(model, tokenizer, [long, short])
    assert batched.shape == (2, model.config.hidden_size)
    # by hand: the request alone in the chat template, one unpadded forward pass, the plain mean of the last hidden
    # states
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "turn on wifi"}], tokenize=True, return_dict=True)[
        "input_ids"
    ]
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    assert torch.allclose(alone[0], hidden.mean(dim=0), atol=1e-5)
    assert torch.allclose(alone[0], batched[1], atol=1e-5)
    other_policy = [{"role": "system", "content": "Another policy."}, short[1]]
    assert torch.equal(pooled_features(model, tokenizer, [other_policy]), alone)
    assert not torch.allclose(batched[0], batched[1])
    with pytest.raises(ValueError, match="no user message"):
        pooled_features(model, tokenizer, [[{"role": "system", "content": "x"}]])


def test_a_saved_gate_routes_the_same_after_loading(tiny, tmp_path):
    model, tokenizer = tiny
    tasks = (
        [observation(f"please turn on {thing}") for thing in ("wifi", "bluetooth")]
        + [observation(f"book {when} on my calendar") for when in ("lunch", "a call")]
        + [observation("hello"), observation("thanks")]
    )
    labels = ["wifi", "wifi", "calendar", "calendar", "base", "base"]
    features = pooled_features(model, tokenizer, tasks)
    gate = fit_gate(features, labels, NAMES, gate_settings())
    router = LearnedRouter(model, tokenizer, gate)
    decisions = router.route_many(tasks)
    assert [d.choice for d in decisions] == labels  # six points, 64 features: the gate fits them
    assert router.route(tasks[2]).scores == pytest.approx(decisions[2].scores, abs=1e-5)
    save_gate(tmp_path, gate, "tiny_random")
    loaded = LearnedRouter(model, tokenizer, load_gate(tmp_path, "tiny_random", ["calendar", "wifi"]))
    assert [d.scores for d in loaded.route_many(tasks)] == [d.scores for d in decisions]
    with pytest.raises(TraceRayError, match="trained on model=tiny_random, not smollm2_135m"):
        load_gate(tmp_path, "smollm2_135m", ["wifi", "calendar"])
    with pytest.raises(TraceRayError, match="but the run's adapters are"):
        load_gate(tmp_path, "tiny_random", ["wifi"])
    with pytest.raises(TraceRayError, match="no learned gate in"):
        load_gate(tmp_path / "missing", "tiny_random", ["wifi", "calendar"])
