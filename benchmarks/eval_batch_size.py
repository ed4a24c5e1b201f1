"""Greedy evaluation episodes per second against ``batch_size`` (live episodes generated together).

``route`` and ``evaluate`` play one greedy episode per held-out task and
option on one engine, ``batch_size`` at a time; on a CPU a decode step of
more rows costs less per row, so a larger batch may finish the same
episodes sooner. This plays the same held-out device tasks at the baseline
batch size (8) and at each size asked for, in this process, and prints the
episodes per second of each side by side with the baseline as a ratio, and
how many rewards agree with the baseline's (greedy decoding: batching may
change float sums, so a few episodes may differ).

    python benchmarks/eval_batch_size.py [tasks=32] [sizes=16,32] [model=smollm2_135m] [rollout.max_episode_tokens=512]
"""

from __future__ import annotations

import sys
import time

from trace_ray.agent_prompt import AgentPrompt
from trace_ray.config_compose import compose_config
from trace_ray.console import print_table
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.environment_setup import environment_maker
from trace_ray.rollout_loop import LocalBackend, benchmark_tasks, run_rollouts

BASELINE = 8  # the default batch_size


def main() -> None:
    options = dict(argument.split("=", 1) for argument in sys.argv[1:])
    count = int(options.pop("tasks", 32))
    sizes = [BASELINE] + [int(size) for size in options.pop("sizes", "16,32").split(",") if int(size) != BASELINE]
    config = compose_config("evaluate", ["env=device", *(f"{key}={value}" for key, value in options.items())])
    make_env = environment_maker(config.env)
    tasks = benchmark_tasks(make_env(), "eval", limit=count)
    engine = make_engine(config.model, config.engine)
    prompt = AgentPrompt.for_model(config.model, engine.tokenizer)
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=config.model.sampling.max_new_tokens)
    rows, baseline = [], None
    for size in sizes:
        started = time.perf_counter()
        results = run_rollouts(
            tasks,
            LocalBackend(make_env, engine),
            prompt,
            greedy,
            size,
            config.model.max_context_tokens,
            max_episode_tokens=config.rollout.max_episode_tokens,
        )
        seconds = time.perf_counter() - started
        rewards = [result.reward for result in results]
        baseline = baseline or (seconds, rewards)
        agree = sum(a == b for a, b in zip(rewards, baseline[1]))
        rows.append(
            (
                size,
                f"{seconds:.0f}",
                f"{len(tasks) / seconds:.3f}",
                f"{baseline[0] / seconds:.2f}",
                f"{sum(rewards) / len(rewards):.3f}",
                f"{agree}/{len(tasks)}",
            )
        )
    print_table(
        f"greedy device episodes ({len(tasks)} eval tasks, {config.model.name}, max_episode_tokens "
        f"{config.rollout.max_episode_tokens})",
        ["batch_size", "seconds", "episodes/s", f"speed vs {BASELINE}", "mean reward", f"rewards as at {BASELINE}"],
        rows,
    )


if __name__ == "__main__":
    main()
