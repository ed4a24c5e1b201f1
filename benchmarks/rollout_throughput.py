"""Rollout throughput: the Ray path against a plain sequential loop and the raw batched engine.

On the same tasks, model and token budget (greedy decoding, so every path
generates the same episodes), measures generated tokens/s and episodes/s of:
  (a) the Ray path of `trace-ray collect`: rollout worker + environment actor, batched;
  (b) a plain sequential loop: one episode at a time, transformers' ``generate`` in this process;
  (c) the Ray path with the vLLM engine, when vLLM is installed (``vllm_engine=vllm_cpu``
      here, ``vllm_engine=vllm`` on GPU machines);
  (d) the raw engine in this process generating the same batches as (a), no Ray.
Prints a/b (target >= 3 on 2 cores) and the orchestration overhead of a over d
(target < 15%).

    python benchmarks/rollout_throughput.py [model=smollm2_135m] [tasks=16] [max_new_tokens=64] [batch_size=8]
    [vllm_engine=vllm_cpu]

Use at least twice as many tasks as the batch size: with tasks == batch_size
no slot is ever refilled and the batch only drains, which is not what a
collection does.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from concurrent.futures import Future

import torch

from actors.rollout_service import start_rollout_service
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.config_compose import compose_config
from trace_ray.console import print_table
from trace_ray.engines import Generation, SamplingParams, make_engine
from trace_ray.environment_setup import environment_maker
from trace_ray.rollout_loop import LocalBackend, benchmark_tasks, run_rollouts


class PlainGenerate:
    """The baseline: transformers' own ``generate``, one prompt at a time, no batching, no prefix cache."""

    def __init__(self, engine):
        self.model, self.stop_token_ids = engine.base_model, sorted(engine.stop_token_ids)

    @torch.no_grad()
    def submit(self, prompt, params, adapter=None):
        output = self.model.generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.stop_token_ids,
            return_dict_in_generate=True,
            output_logits=True,
        )
        tokens = output.sequences[0, len(prompt) :].tolist()
        logprobs = [float(torch.log_softmax(logits[0], -1)[token]) for logits, token in zip(output.logits, tokens)]
        future = Future()
        future.set_result(Generation(tokens, logprobs, "stop" if tokens[-1] in self.stop_token_ids else "length"))
        return future


def measure(name, play):
    """``play()``'s episodes, timed."""
    started = time.perf_counter()
    results = play()
    seconds = time.perf_counter() - started
    tokens = sum(result.record.action_tokens for result in results)
    print(f"{name}: {len(results)} episodes, {tokens} tokens in {seconds:.1f} s", flush=True)
    return {
        "name": name,
        "seconds": seconds,
        "tokens": tokens,
        "episodes": len(results),
        "rewards": [r.reward for r in results],
    }


def main() -> None:
    options = dict(argument.split("=", 1) for argument in sys.argv[1:])
    count = int(options.pop("tasks", 16))
    max_new_tokens = int(options.pop("max_new_tokens", 64))
    batch_size = int(options.pop("batch_size", 8))
    vllm_engine = options.pop("vllm_engine", "vllm_cpu")
    overrides = [f"{key}={value}" for key, value in options.items()]
    config = compose_config("collect", overrides)
    make_env = environment_maker(config.env)
    tasks = benchmark_tasks(make_env(), "analysis", limit=count)
    params = SamplingParams(0.0, 1.0, max_new_tokens)
    engine = make_engine(config.model, config.engine)
    prompt = AgentPrompt.for_model(config.model, engine.tokenizer)
    max_context = config.model.max_context_tokens

    rows = []

    def local(backend, size):
        return lambda: run_rollouts(tasks, backend, prompt, params, size, max_context)

    sequential = measure(
        "(b) sequential, one episode at a time", local(LocalBackend(make_env, PlainGenerate(engine)), 1)
    )
    raw = measure("(d) raw engine, same batches, no Ray", local(LocalBackend(make_env, engine), batch_size))
    del engine

    rollouts = start_rollout_service(compose_config("collect", [*overrides, f"batch_size={batch_size}"]))
    ray_path = measure("(a) Ray path (collect)", lambda: rollouts.episodes(tasks, params))
    rollouts.close()
    runs = [ray_path, sequential, raw]
    vllm_path = None
    if importlib.util.find_spec("vllm"):
        engine_config = compose_config("collect", [*overrides, f"batch_size={batch_size}", f"engine={vllm_engine}"])
        rollouts = start_rollout_service(engine_config)
        vllm_path = measure(f"(c) Ray path, engine={vllm_engine}", lambda: rollouts.episodes(tasks, params))
        rollouts.close()
        runs.append(vllm_path)
    for run in runs:
        rows.append(
            (
                run["name"],
                run["episodes"],
                run["tokens"],
                f"{run['seconds']:.1f}",
                f"{run['tokens'] / run['seconds']:.1f}",
                f"{run['episodes'] / run['seconds']:.3f}",
            )
        )
    if vllm_path is None:
        rows.append(("(c) vLLM engine: not installed", "-", "-", "-", "-", "-"))
    print_table(
        f"rollout throughput: {count} device tasks, {config.model.name}, greedy, max_new_tokens={max_new_tokens}",
        ["path", "episodes", "tokens", "seconds", "tokens/s", "episodes/s"],
        rows,
    )
    speedup = (ray_path["tokens"] / ray_path["seconds"]) / (sequential["tokens"] / sequential["seconds"])
    overhead = ray_path["seconds"] / raw["seconds"] - 1
    print(f"a/b tokens/s ratio: {speedup:.2f}x (target >= 3)")
    if vllm_path:
        vllm_speedup = (vllm_path["tokens"] / vllm_path["seconds"]) / (sequential["tokens"] / sequential["seconds"])
        print(f"c/b tokens/s ratio: {vllm_speedup:.2f}x (vLLM's tokens may differ: its kernels round differently)")
    print(f"Ray orchestration overhead, a vs d: {overhead * 100:+.1f}% (target < 15%)")
    print(f"same rewards on every path: {ray_path['rewards'] == sequential['rewards'] == raw['rewards']}")


if __name__ == "__main__":
    main()
