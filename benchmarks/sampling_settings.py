"""Measure which sampling settings make the embedded model call tools.

For one task of every family of the device analysis split, K samples of the
agent's first turn per setting: how often it emits a tool call, a valid call
(known tool, arguments fit the schema) and the oracle's first tool. Greedy
decoding is the baseline; the last column is each setting's valid-call rate
over greedy's (greedy is one sample, so its rate is 0 or 1 per task).

    python benchmarks/sampling_settings.py [model=smollm2_135m] [samples=4] [max_new_tokens=96]
"""

from __future__ import annotations

import json
import sys
import time

from environments.tool_environment import check_arguments
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.config_compose import compose_config
from trace_ray.console import print_table
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.environment_setup import environment_maker

SETTINGS = [(0.0, 1.0), (0.5, 0.9), (0.7, 0.9), (1.0, 0.9), (1.0, 1.0)]


def main() -> None:
    options = dict(argument.split("=", 1) for argument in sys.argv[1:])
    samples = int(options.pop("samples", 4))
    max_new_tokens = int(options.pop("max_new_tokens", 96))  # enough for a first tool call
    config = compose_config("score", [f"{key}={value}" for key, value in options.items()])
    make_env = environment_maker(config.env)
    engine = make_engine(config.model, config.engine)
    prompt = AgentPrompt.for_model(config.model, engine.tokenizer)
    tasks = []
    for seed in make_env().task_seeds("analysis")[:7]:  # one task of each family
        env = make_env()
        reset = env.reset(seed)
        oracle_tool = env.oracle_message()["tool_calls"][0]["function"]["name"]
        schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in reset.tools}
        tasks.append((prompt.prompt_ids(reset.messages, reset.tools, env.example_exchange()), schemas, oracle_tool))
    rows, greedy_rate = [], None
    for temperature, top_p in SETTINGS:
        count = 1 if temperature == 0 else samples
        prompts = [ids for ids, _, _ in tasks for _ in range(count)]
        started = time.perf_counter()
        generations = engine.generate(prompts, SamplingParams(temperature, top_p, max_new_tokens, seed=0))
        seconds = time.perf_counter() - started
        replies = [prompt.parse(generation.token_ids) for generation in generations]
        called = valid = right = 0
        for index, reply in enumerate(replies):
            _, schemas, oracle_tool = tasks[index // count]
            calls = reply.get("tool_calls") or []
            called += bool(calls)
            for call in calls[:1]:
                name, arguments = call["function"]["name"], call["function"]["arguments"]
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    continue
                valid += name in schemas and check_arguments(arguments, schemas[name]) is None
                right += name == oracle_tool
        rate = valid / len(replies)
        greedy_rate = rate if greedy_rate is None else greedy_rate
        ratio = f"{rate / greedy_rate:.2f}x" if greedy_rate else ("n/a (greedy 0)" if temperature else "1.00x")
        print(f"T={temperature} top_p={top_p}: valid call rate {rate:.2f} ({seconds:.0f} s)", flush=True)
        rows.append(
            (
                f"T={temperature} top_p={top_p}",
                len(replies),
                f"{called / len(replies):.2f}",
                f"{rate:.2f}",
                f"{right / len(replies):.2f}",
                f"{sum(len(g.token_ids) for g in generations) / seconds:.0f}",
                ratio,
            )
        )
    print_table(
        f"first-turn tool calls of {config.model.name} on {config.env.name} (7 tasks, one per family)",
        ["setting", "samples", "called", "valid call", "oracle's tool", "tokens/s", "valid vs greedy"],
        rows,
    )


if __name__ == "__main__":
    main()
