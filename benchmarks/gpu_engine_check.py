"""The vLLM engine with LoRA on a GPU: adapter versions swap under one name without stale cache, log-probs agree with
the trainer's, and throughput. Part of ``benchmarks/gpu_check.sh``; needs a CUDA GPU and vLLM (the GPU image).

Checks, each printed as a figure with its verdict:

1. the engine's version registry: adapter ``skill`` v1 loaded, then v2 under the same name;
2. cache isolation across versions: v2's greedy log-probs on ~800-token device prompts (many KV blocks), right after
   v1 ran the same prompts, equal v2's on the same prompts after the prefix cache saw only v2 (a fresh engine);
3. the engine-trainer gap: the engine's (bf16) log-probs of v2's tokens against the trainer's forward of the same
   PEFT model on the GPU (what ``grpo.old_logprobs=trainer`` would remove from the ratio);
4. generation throughput of 64 device prompts with v2 (tokens/s).
"""

from __future__ import annotations

import copy
import sys
import time

import torch

from trace_ray.config_compose import compose_config
from trace_ray.engines import SamplingParams, make_engine

LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "lora_dropout": 0.0}
SETTINGS = [
    "model=smollm2_135m",
    "engine=vllm",
    "engine.memory_fraction=0.3",
    "engine.max_lora_rank=8",
    "model.dtype=auto",
]
NEW_TOKENS = 32


def device_prompts(config, count: int) -> list[list[int]]:
    from environments.device.environment import DeviceEnvironment
    from trace_ray.agent_prompt import AgentPrompt
    from trace_ray.models import load_tokenizer

    prompt = AgentPrompt.for_model(config.model, load_tokenizer(config.model))
    env = DeviceEnvironment()
    prompts = []
    for index in range(count):
        reset = env.reset(env.train_seed(index))
        prompts.append(prompt.prompt_ids(reset.messages, reset.tools, env.example_exchange()))
    return prompts


def random_adapter(network, seed: int):
    """(PEFT state dict, PEFT model on the GPU in float32) of a random non-zero LoRA adapter."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    torch.manual_seed(seed)
    model = get_peft_model(copy.deepcopy(network), LoraConfig(**LORA, init_lora_weights=False), adapter_name="skill")
    return get_peft_model_state_dict(model, adapter_name="skill"), model.to("cuda").eval()


def trainer_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens], device="cuda")
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens, device="cuda")[:, None]).squeeze(-1).cpu()


def greedy(engine, prompts, version):
    return engine.generate(prompts, SamplingParams(0.0, 1.0, NEW_TOKENS), [("skill", version)] * len(prompts))


def main() -> int:
    from trace_ray.models import load_model

    if not torch.cuda.is_available():
        print("gpu_engine_check: no CUDA GPU here; run it on a GPU machine")
        return 2
    config = compose_config("score", SETTINGS)
    network = load_model(config.model, "cpu", torch.float32)[0]
    weights_1, _ = random_adapter(network, 1)
    weights_2, model_2 = random_adapter(network, 2)
    prompts = device_prompts(config, 64)
    failures = []

    engine = make_engine(config.model, config.engine)
    engine.load_adapter("skill", 1, weights_1, LORA)
    first = greedy(engine, prompts[:8], 1)
    engine.load_adapter("skill", 2, weights_2, LORA)
    versions = engine.adapters()
    print(
        f"1. adapters after loading v1 then v2 under one name: {versions}",
        "ok" if versions == {"skill": 2} else "FAILED",
    )
    failures += [] if versions == {"skill": 2} else ["versions"]
    after_v1 = greedy(engine, prompts[:8], 2)
    started = time.perf_counter()
    timed = greedy(engine, prompts, 2)
    seconds = time.perf_counter() - started
    engine.close()

    fresh = make_engine(config.model, config.engine)
    fresh.load_adapter("skill", 2, weights_2, LORA)
    alone = greedy(fresh, prompts[:8], 2)
    fresh.close()
    same_tokens = all(a.token_ids == b.token_ids for a, b in zip(after_v1, alone))
    cache_gap = max(max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) for a, b in zip(after_v1, alone))
    changed = sum(a.token_ids != b.token_ids for a, b in zip(first, after_v1))
    print(
        f"2. v2 after v1 on the same {len(prompts[0])}-token prompts vs v2 alone: same tokens {same_tokens}, "
        f"max log-prob difference {cache_gap:.2e}; v1 and v2 differ on {changed}/8 prompts",
        "ok" if same_tokens and cache_gap < 1e-3 and changed else "FAILED",
    )
    failures += [] if same_tokens and cache_gap < 1e-3 and changed else ["cache isolation"]

    gaps = torch.cat(
        [
            (torch.tensor(g.logprobs) - trainer_logprobs(model_2, prompt, g.token_ids)).abs()
            for prompt, g in zip(prompts[:8], after_v1)
        ]
    )
    print(
        f"3. engine-trainer log-prob gap (engine {config.model.dtype} on GPU vs trainer float32): mean "
        f"{gaps.mean():.2e}, "
        f"max {gaps.max():.2e} over {gaps.numel()} tokens"
    )
    tokens = sum(len(g.token_ids) for g in timed)
    print(
        f"4. throughput: {len(prompts)} prompts x up to {NEW_TOKENS} tokens with the adapter: {tokens / seconds:.0f} "
        "tokens/s "
        f"({seconds:.2f} s)"
    )
    print("gpu_engine_check:", "all checks passed" if not failures else f"FAILED: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
