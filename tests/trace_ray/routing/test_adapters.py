"""LoRA adapters in the HF engine and the rollout worker: per-request selection, versions, errors."""

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

from tests.conftest import model_config
from tests.trace_ray.engines.test_hf_engine import forward_logprobs, prompts_for
from trace_ray.config_compose import compose_config
from trace_ray.engines import SamplingParams
from trace_ray.engines.hf import AdapterNotLoadedError, HFEngine
from trace_ray.models import load_model

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"], "lora_dropout": 0.0}
GREEDY = SamplingParams(0.0, 1.0, 8)


def random_adapter(seed):
    """A PEFT state dict with non-zero B (so the adapter changes the model), and the model it makes."""
    network, _ = load_model(model_config("tiny_random"))
    torch.manual_seed(seed)
    peft_model = get_peft_model(network, LoraConfig(**LORA, init_lora_weights=False), adapter_name="trained")
    return get_peft_model_state_dict(peft_model, adapter_name="trained"), peft_model


@pytest.fixture()
def engine():
    network, tokenizer = load_model(model_config("tiny_random"))
    return HFEngine(network, tokenizer)


def test_each_request_uses_the_adapter_it_names(engine):
    weights_a, reference_a = random_adapter(1)
    weights_b, _ = random_adapter(2)
    engine.load_adapter("permission_recovery", 1, weights_a, LORA)
    engine.load_adapter("datetime", 3, weights_b, LORA)
    assert engine.adapters() == {"permission_recovery": 1, "datetime": 3}
    prompts = prompts_for(engine.tokenizer, ["turn on wifi", "remind me tomorrow", "hi"])
    mixed = engine.generate(prompts, GREEDY, [("permission_recovery", 1), ("datetime", 3), None])
    base = engine.generate(prompts, GREEDY)
    only_a = engine.generate(prompts, GREEDY, [("permission_recovery", 1)] * 3)
    assert mixed[2].token_ids == base[2].token_ids  # None = the base model, adapters disabled
    assert mixed[0].token_ids == only_a[0].token_ids
    assert only_a[0].token_ids != base[0].token_ids or only_a[0].logprobs != base[0].logprobs
    expected = forward_logprobs(reference_a, prompts[0], mixed[0].token_ids, 1.0)  # the adapter's own model
    assert torch.allclose(torch.tensor(mixed[0].logprobs), expected, atol=1e-3)


def test_new_version_replaces_the_old_and_stale_versions_are_refused(engine):
    weights_a, _ = random_adapter(1)
    weights_b, reference_b = random_adapter(2)
    prompt = prompts_for(engine.tokenizer, ["text Ann"])
    engine.load_adapter("cap", 1, weights_a, LORA)
    engine.load_adapter("cap", 2, weights_b, LORA)
    assert engine.adapters() == {"cap": 2}
    with pytest.raises(AdapterNotLoadedError, match="adapter 'cap' version 1 is not loaded \\(loaded: cap v2\\)"):
        engine.generate(prompt, GREEDY, [("cap", 1)])
    [generation] = engine.generate(prompt, GREEDY, [("cap", 2)])
    assert torch.allclose(
        torch.tensor(generation.logprobs),
        forward_logprobs(reference_b, prompt[0], generation.token_ids, 1.0),
        atol=1e-3,
    )


def test_kept_versions_serve_side_by_side_until_newer_ones_push_them_out(engine):
    """Rollouts overlapping training: episodes started with version v finish with it after v + 1 is published."""
    (weights_1, reference_1), (weights_2, reference_2) = random_adapter(1), random_adapter(2)
    weights_3, _ = random_adapter(3)
    prompt = prompts_for(engine.tokenizer, ["text Ann"])
    engine.load_adapter("cap", 1, weights_1, LORA, keep_versions=2)
    engine.load_adapter("cap", 2, weights_2, LORA, keep_versions=2)
    assert engine.adapters() == {"cap": 2} and engine.held_versions() == {"cap": [1, 2]}
    first, second = engine.generate(prompt * 2, GREEDY, [("cap", 1), ("cap", 2)])
    for generation, reference in ((first, reference_1), (second, reference_2)):
        expected = forward_logprobs(reference, prompt[0], generation.token_ids, 1.0)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-3)
    engine.load_adapter("cap", 3, weights_3, LORA, keep_versions=2)
    assert engine.held_versions() == {"cap": [2, 3]}
    refused = "adapter 'cap' version 1 is not loaded \\(loaded: cap v2, cap v3\\)"
    with pytest.raises(AdapterNotLoadedError, match=refused):
        engine.generate(prompt, GREEDY, [("cap", 1)])
    engine.load_adapter("cap", 4, weights_1, LORA)  # keep_versions=1 again: only the newest
    assert engine.held_versions() == {"cap": [4]}
    engine.unload_adapter("cap")
    assert engine.held_versions() == {} and engine.peft_model is None


def test_unloading_the_last_adapter_restores_the_base_model(engine):
    prompt = prompts_for(engine.tokenizer, ["hello there"])
    before = engine.generate(prompt, GREEDY)[0]
    weights, _ = random_adapter(3)
    engine.load_adapter("cap", 1, weights, LORA)
    engine.unload_adapter("cap")
    assert engine.adapters() == {} and engine.peft_model is None
    assert engine.generate(prompt, GREEDY)[0].token_ids == before.token_ids
    with pytest.raises(KeyError, match="not loaded"):
        engine.unload_adapter("cap")
    with pytest.raises(AdapterNotLoadedError, match="loaded: none"):
        engine.generate(prompt, GREEDY, [("cap", 1)])


def test_a_running_generation_keeps_the_version_it_started_with(engine):
    from tests.trace_ray.engines.test_hf_engine import wait_until

    weights_a, reference_a = random_adapter(1)
    weights_b, _ = random_adapter(2)
    engine.load_adapter("cap", 1, weights_a, LORA)
    prompt = prompts_for(engine.tokenizer, ["text Ann"])[0]
    running = engine.submit(prompt, SamplingParams(0.0, 1.0, 500), ("cap", 1))
    wait_until(lambda: engine._rows)
    engine.load_adapter("cap", 2, weights_b, LORA)  # replaced while version 1 is generating
    engine.unload_adapter("cap")
    assert not running.done()
    generation = running.result()
    assert len(generation.token_ids) > 1
    expected = forward_logprobs(reference_a, prompt, generation.token_ids, 1.0)
    assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-3)  # version 1 to the end
    assert engine.adapters() == {} and engine.peft_model is None  # its weights went once it ended


def test_rollout_worker_actor_loads_and_verifies_adapters(ray_session):
    import ray

    from actors.rollout_pool import RayRolloutBackend, RolloutPool
    from actors.rollout_worker import RolloutWorker
    from environments.errors import TraceRayError

    config = compose_config("score", ["model=tiny_random"])
    worker = ray.remote(RolloutWorker).options(num_cpus=0.5).remote(config.model, config.engine, 1)
    weights, _ = random_adapter(4)
    assert ray.get(worker.load_adapter.remote("cap", 7, weights, LORA)) == {"cap": 7}
    assert ray.get(worker.health.remote())["adapters"] == {"cap": 7}
    backend = RayRolloutBackend(RolloutPool([worker], []))
    prompt = prompts_for(load_model(model_config("tiny_random"))[1], ["hi"])
    assert len(backend.submit(prompt[0], GREEDY, ("cap", 7)).result().token_ids) > 0
    with pytest.raises(
        TraceRayError, match="^adapter 'missing' version 1 is not loaded \\(loaded: cap v7\\); load it first$"
    ):
        backend.submit(prompt[0], GREEDY, ("missing", 1)).result()
    assert ray.get(worker.unload_adapter.remote("cap")) == {}
