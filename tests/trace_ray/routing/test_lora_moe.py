"""``router=moe``: gated layers against PEFT, top-k mixing, gate training, save/load, generation on the HF engine."""

import itertools
import json

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from safetensors.torch import save_file

from environments.errors import TraceRayError
from tests.conftest import model_config
from trace_ray.config_compose import compose_config
from trace_ray.engines import SamplingParams
from trace_ray.engines.hf import HFEngine
from trace_ray.models import load_model
from trace_ray.routing.adapters import TrainedAdapter
from trace_ray.routing.lora_moe import BASE, MoERouter, fit_moe, gate_model, load_moe, moe_engine, prompt_ids, save_moe

LORA_A = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"], "lora_dropout": 0.0}
LORA_B = {"r": 2, "lora_alpha": 6, "target_modules": ["o_proj", "q_proj", "up_proj"], "lora_dropout": 0.0}
GREEDY = SamplingParams(0.0, 1.0, 6)
TOPICS = {
    "adapter_a": ["wifi", "wifi network", "wireless wifi router"],
    "adapter_b": ["calendar", "calendar event", "meeting in my calendar"],
    BASE: ["pizza", "weather today", "a short poem"],
}
REQUESTS = ["please fix my", "help me with the", "what about my", "I need the", "check the", "open my"]
HELD_OUT = ["can you look at my", "something is wrong with my", "show me the", "tell me about the"]
POLICY = (  # a prefix long enough for the HF engine's prefix cache
    "You are a phone assistant. Follow the user's instructions carefully, use the phone's settings and apps "
    "when the user asks for a change, never guess a value the user did not give, and answer in one short sentence."
)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's ops are too small to share out: on a busy 2-core machine, 2 threads trained 40x slower than
    1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_adapter(seed, lora):
    """((PEFT state dict, LoRA settings), PEFT model) of an adapter with non-zero B, a tenth of PEFT's random init
    (a trained adapter changes the model a little)."""
    network, _ = load_model(model_config("tiny_random"))
    torch.manual_seed(seed)
    peft_model = get_peft_model(network, LoraConfig(**lora, init_lora_weights=False), adapter_name="trained")
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.mul_(0.1)
    return (get_peft_model_state_dict(peft_model, adapter_name="trained"), lora), peft_model


@pytest.fixture(scope="module")
def adapters():
    """{name: ((weights, lora settings), PEFT model)}: two adapters with different ranks, alphas and target modules."""
    return {"adapter_a": random_adapter(1, LORA_A), "adapter_b": random_adapter(2, LORA_B)}


def pairs(adapters):
    return {name: pair for name, (pair, _) in adapters.items()}


def fix_gates(moe, option):
    """Every gate always picks ``option`` (the base where a layer does not offer it)."""
    with torch.no_grad():
        for layer in moe.layers.values():
            chosen = option if option in layer.options else BASE
            layer.gate.weight.zero_()
            layer.gate.bias.copy_(torch.tensor([10.0 if name == chosen else 0.0 for name in layer.options]))


def observation(text):
    return [{"role": "system", "content": "You are a phone assistant."}, {"role": "user", "content": text}]


def policy_prompt(tokenizer, text):
    return prompt_ids(tokenizer, [{"role": "system", "content": POLICY}, {"role": "user", "content": text}])


def test_a_gate_fixed_on_an_adapter_is_that_adapters_peft_model_and_on_base_the_base_model(adapters):
    network, tokenizer = load_model(model_config("tiny_random"))
    ids = torch.tensor([prompt_ids(tokenizer, observation("turn on the wifi please"))])
    with torch.no_grad():
        plain = network(ids).logits
    moe = gate_model(network, pairs(adapters))
    assert moe.names == ["adapter_a", "adapter_b", BASE]
    assert moe.layers["model.layers.0.self_attn.q_proj"].options == ["adapter_a", "adapter_b", BASE]
    assert moe.layers["model.layers.1.mlp.down_proj"].options == ["adapter_a", BASE]
    assert moe.layers["model.layers.1.mlp.up_proj"].options == ["adapter_b", BASE]
    assert "model.layers.0.self_attn.k_proj" not in moe.layers
    with torch.no_grad():
        for name, (_, peft_model) in adapters.items():
            fix_gates(moe, name)
            assert (network(ids).logits - peft_model(ids).logits).abs().max() < 1e-5
            assert (network(ids).logits - plain).abs().max() > 1e-3  # the adapter changes the model
        fix_gates(moe, BASE)
        assert (network(ids).logits - plain).abs().max() < 1e-5


def test_top_2_mixes_the_two_best_options_with_the_softmax_of_their_logits(adapters):
    network, _ = load_model(model_config("tiny_random"))
    moe = gate_model(network, pairs(adapters), top_k=2)
    layer = moe.layers["model.layers.0.self_attn.q_proj"]
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))

    def delta(name, lora):
        weights = adapters[name][0][0]
        key = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
        return lora["lora_alpha"] / lora["r"] * (x @ weights[key.format("A")].T) @ weights[key.format("B")].T

    with torch.no_grad():
        layer.gate.weight.zero_()
        layer.gate.bias.copy_(torch.tensor([2.0, 1.0, 0.0]))  # adapter_a, adapter_b, base
        # top 2 by hand: logits 2 and 1 -> e^2 / (e^2 + e^1) = e / (e + 1) = 0.7310585786, 1 / (e + 1) = 0.2689414214
        expected = layer.base(x) + 0.7310585786 * delta("adapter_a", LORA_A) + 0.2689414214 * delta("adapter_b", LORA_B)
        assert torch.allclose(layer(x), expected, atol=1e-6)
        layer.gate.bias.copy_(torch.tensor([0.0, 1.0, 3.0]))  # base and adapter_b: base adds nothing
        # logits 3 (base) and 1 (adapter_b) -> adapter_b's weight e^1 / (e^3 + e^1) = 1 / (e^2 + 1) = 0.1192029220
        assert torch.allclose(layer(x), layer.base(x) + 0.1192029220 * delta("adapter_b", LORA_B), atol=1e-6)


def test_fixed_gates_route_to_the_option_most_of_its_layers_pick(adapters):
    network, tokenizer = load_model(model_config("tiny_random"))
    moe = gate_model(network, pairs(adapters))
    fix_gates(moe, "adapter_b")
    decision = MoERouter(moe, tokenizer).route(observation("turn on the wifi please"))
    # per layer (2 of them): q_proj offers a, b, base; v_proj and down_proj a, base; o_proj and up_proj b, base.
    # adapter_b is offered by q, o, up (6 slots) and picked in all 6; adapter_a by q, v, down (6) and picked in none;
    # base is offered everywhere (10) and picked where b is not offered, v and down (4): scores 0/6, 6/6, 4/10
    assert decision.scores == {"adapter_a": 0.0, "adapter_b": 1.0, BASE: 0.4}
    assert decision.choice == "adapter_b"
    fix_gates(moe, "adapter_a")  # a picked in its 6 slots; base in o and up (4 of 10); b nowhere
    assert MoERouter(moe, tokenizer).route(observation("turn on the wifi please")).scores == {
        "adapter_a": 1.0,
        "adapter_b": 0.0,
        BASE: 0.4,
    }


def synthetic_prompts(tokenizer):
    """Requests about wifi (adapter_a), the calendar (adapter_b) or anything else (base), as prompt ids and labels."""
    examples, labels = [], []
    for label, topics in TOPICS.items():
        for request, topic in itertools.product(REQUESTS, topics):
            examples.append(prompt_ids(tokenizer, observation(f"{request} {topic}")))
            labels.append(label)
    return examples, labels


def moe_settings(*overrides):
    return compose_config("route", ["router.moe.epochs=30", "router.moe.lr=0.05", *overrides]).router.moe


@pytest.fixture(scope="module")
def trained(adapters):
    """(gated network's MoE, tokenizer, gates before training) after fitting the synthetic prompts."""
    network, tokenizer = load_model(model_config("tiny_random"))
    # the same seed: the gates fit_moe starts from
    untrained = gate_model(load_model(model_config("tiny_random"))[0], pairs(adapters))
    initial = {name: layer.gate.weight.clone() for name, layer in untrained.layers.items()}
    examples, labels = synthetic_prompts(tokenizer)
    return fit_moe(network, tokenizer, pairs(adapters), examples, labels, moe_settings()), tokenizer, initial


def test_training_routes_separable_prompts_and_changes_only_the_gates(trained, adapters):
    moe, tokenizer, initial = trained
    assert moe.metrics["train_accuracy"] >= 0.9, moe.metrics
    assert moe.metrics["label_counts"] == {"adapter_a": 18, "adapter_b": 18, BASE: 18}
    fresh, _ = load_model(model_config("tiny_random"))
    base_weights = {name: parameter for name, parameter in fresh.named_parameters()}
    for name, layer in moe.layers.items():
        assert not torch.equal(layer.gate.weight, initial[name])
        assert torch.equal(layer.base.weight, base_weights[name + ".weight"])
        for option, lora_a in zip(layer.options, layer.lora_A):
            assert torch.equal(lora_a, adapters[option][0][0][f"base_model.model.{name}.lora_A.weight"])
    trainable = {name for name, parameter in moe.network.named_parameters() if parameter.requires_grad}
    assert trainable == {f"{name}.gate.{key}" for name in moe.layers for key in ("weight", "bias")}
    router = MoERouter(moe, tokenizer)
    assert router.names == ["adapter_a", "adapter_b", BASE]
    held_out = [
        (observation(f"{request} {topic}"), label)
        for label, topics in TOPICS.items()
        for request in HELD_OUT
        for topic in topics
    ]
    decisions = router.route_many([item for item, _ in held_out])
    assert sum(d.choice == label for d, (_, label) in zip(decisions, held_out)) / len(held_out) > 0.5  # chance: 1/3
    alone = router.route(held_out[0][0])
    assert (alone.choice, alone.scores) == (decisions[0].choice, decisions[0].scores)
    assert alone.probabilities == pytest.approx(decisions[0].probabilities, abs=1e-6)
    assert set(decisions[0].scores) == set(decisions[0].probabilities) == set(router.names)


def test_training_is_deterministic_given_the_seed(adapters):
    _, tokenizer = load_model(model_config("tiny_random"))
    examples, labels = synthetic_prompts(tokenizer)
    settings = moe_settings("router.moe.epochs=2")
    gates = [
        fit_moe(
            load_model(model_config("tiny_random"))[0],
            tokenizer,
            pairs(adapters),
            examples[::6],
            labels[::6],
            settings,
            seed=3,
        )
        for _ in range(2)
    ]
    for name in gates[0].layers:
        assert torch.equal(gates[0].layers[name].gate.weight, gates[1].layers[name].gate.weight)


@pytest.mark.parametrize(
    "labels, message",
    [
        ([BASE] * 6, "all 6 training labels are 'base': a gate would learn a constant"),
        (["adapter_a", BASE, "phone", BASE, BASE, BASE], r"gate labels \['phone'\] are not routing options"),
    ],
)
def test_degenerate_labels_fail_loudly(adapters, labels, message):
    network, tokenizer = load_model(model_config("tiny_random"))
    examples = [prompt_ids(tokenizer, observation("hello"))] * len(labels)
    with pytest.raises(TraceRayError, match=message):
        fit_moe(network, tokenizer, pairs(adapters), examples, labels, moe_settings())


def adapter_folders(tmp_path, adapters):
    """The adapters exported as PEFT folders, as ``trace-ray train`` leaves them."""
    folders = []
    for name, ((weights, lora), _) in adapters.items():
        folder = tmp_path / "adapters" / name
        folder.mkdir(parents=True)
        save_file(weights, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps({**lora, "peft_type": "LORA"}))
        folders.append(TrainedAdapter(name, folder, "", None))
    return folders


def test_save_and_load_give_the_same_decisions_and_generations(trained, adapters, tmp_path):
    moe, tokenizer, _ = trained
    folders = adapter_folders(tmp_path, adapters)
    save_moe(tmp_path / "moe", moe, {adapter.name: str(adapter.folder) for adapter in folders})
    card = json.loads((tmp_path / "moe" / "moe.json").read_text())
    assert card["options"] == ["adapter_a", "adapter_b", BASE] and card["top_k"] == 1 and card["metrics"] == moe.metrics
    network, _ = load_model(model_config("tiny_random"))
    loaded = load_moe(tmp_path / "moe", network, pairs(adapters))
    topics = ["wifi", "calendar", "pizza", "wifi network", "a poem", "calendar"]
    observations = [observation(f"{request} {topic}") for request, topic in zip(REQUESTS, topics)]
    assert MoERouter(loaded, tokenizer).route_many(observations) == MoERouter(moe, tokenizer).route_many(observations)
    engine = moe_engine(
        model_config("tiny_random"), compose_config("score", ["engine=hf"]).engine, folders, tmp_path / "moe"
    )
    prompts = [prompt_ids(tokenizer, item) for item in observations[:3]]
    reference = HFEngine(moe.network, tokenizer)
    assert [g.token_ids for g in engine.generate(prompts, GREEDY)] == [
        g.token_ids for g in reference.generate(prompts, GREEDY)
    ]


@pytest.mark.parametrize("other_layers", [False, True], ids=["adapter missing", "adapter with other layers"])
def test_loading_gates_for_other_adapters_fails_loudly(trained, adapters, tmp_path, other_layers):
    moe, _, _ = trained
    save_moe(tmp_path, moe, {"adapter_a": "adapters/adapter_a", "adapter_b": "adapters/adapter_b"})
    given = {"adapter_a": pairs(adapters)["adapter_a"]}
    if other_layers:
        given["adapter_b"] = random_adapter(3, {**LORA_B, "target_modules": ["k_proj"]})[0]
    message = (
        "gates other layers than these adapters adapt"
        if other_layers
        else (r"mixes \['adapter_a', 'adapter_b'\], but the adapters given are \['adapter_a'\]")
    )
    network, _ = load_model(model_config("tiny_random"))
    with pytest.raises(TraceRayError, match=message):
        load_moe(tmp_path, network, given)


def test_the_hf_engine_generates_with_the_gated_model_like_with_the_adapter_loaded(adapters):
    network, tokenizer = load_model(model_config("tiny_random"))
    moe = gate_model(network, pairs(adapters))
    fix_gates(moe, "adapter_b")
    gated = HFEngine(network, tokenizer)
    plain, _ = load_model(model_config("tiny_random"))
    with_adapter = HFEngine(plain, tokenizer)
    (weights, lora), _ = adapters["adapter_b"]
    with_adapter.load_adapter("adapter_b", 1, weights, lora)
    prompts = [policy_prompt(tokenizer, text) for text in ("wifi", "calendar", "hi")]
    first = gated.generate(prompts, GREEDY)
    assert len(gated._prefix_caches) == 1  # the shared prefix was prefilled once
    assert [g.token_ids for g in first] == [
        g.token_ids for g in with_adapter.generate(prompts, GREEDY, [("adapter_b", 1)] * 3)
    ]
    follow_up = prompts[0] + first[0].token_ids + prompts[1][-3:]  # an episode's next turn
    kept = (None, tuple(prompts[0] + first[0].token_ids[:-1]))
    assert kept in gated._continuations
    expected = with_adapter.generate([follow_up], GREEDY, [("adapter_b", 1)])[0].token_ids
    assert gated.generate([follow_up], GREEDY)[0].token_ids == expected
    assert kept not in gated._continuations  # its KV cache served the follow-up


def test_trained_gates_route_the_same_with_and_without_the_engines_caches(trained):
    moe, tokenizer, _ = trained
    engine = HFEngine(moe.network, tokenizer)
    prompts = [policy_prompt(tokenizer, text) for text in ("fix my wifi", "open my calendar")]
    generations = engine.generate(prompts, GREEDY)
    assert len(engine._prefix_caches) == 1
    for prompt, generation in zip(prompts, generations):  # no cache: the whole sequence again for every token
        ids = list(prompt)
        with torch.no_grad():
            for _ in generation.token_ids:
                ids.append(int(moe.network(torch.tensor([ids]), use_cache=False).logits[0, -1].argmax()))
        assert ids[len(prompt) :] == generation.token_ids


def test_the_moe_engine_refuses_vllm(tmp_path):
    with pytest.raises(TraceRayError, match="only the HF engine can run; set engine=hf, not engine=vllm"):
        moe_engine(model_config("tiny_random"), compose_config("score", ["engine=vllm"]).engine, [], tmp_path)
