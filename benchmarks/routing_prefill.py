"""The logit router's decision time with the shared head's keys and values reused, against running each prompt whole.

Builds ``router=logit`` over a run directory's adapters as ``trace-ray serve``
does (``--run-dir``; default: a temporary run with two capability adapters,
their descriptions and template environments, as ``serve_latency.py`` makes)
and routes the first observations of device eval tasks with two routers on
the same model: one reusing the cached head of its prompts (the options and
the task's policy: the product path) and one with ``reuse_prefix=False``. Two rounds: ``one at a time`` (a new
conversation's decision, as the Serve router makes it) and ``batched``
(``route_many``, as ``trace-ray route`` and ``evaluate`` do). Prints the
prompt's shared and per-task tokens, p50 per decision, the ratio whole /
reused, and the largest score difference between the two (the decisions must
agree).

    python benchmarks/routing_prefill.py [--model smollm2_135m|tiny_random] [--run-dir DIR] [--tasks 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from serve_latency import device_requests, write_demo_run

from trace_ray.config_compose import compose_config
from trace_ray.console import print_table


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2_135m", help="model config (conf/model/)")
    parser.add_argument(
        "--run-dir", default=None, help="a run directory with adapters/ (default: a temporary one with two)"
    )
    parser.add_argument("--tasks", type=int, default=16, help="device eval tasks to route")
    return parser.parse_args(argv)


def timed(call) -> tuple[float, object]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> None:
    from trace_ray.models import load_model
    from trace_ray.routing.adapters import served_adapters
    from trace_ray.routing.logit_router import LogitRouter
    from trace_ray.routing.routers import logit_router

    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="routing-prefill-") as scratch:
        run_dir = Path(args.run_dir or scratch)
        if not args.run_dir:
            write_demo_run(run_dir, args.model)
        config = compose_config("serve", [f"model={args.model}", f"run_dir={run_dir}", "router=logit"])
        model, tokenizer = load_model(config.model)
        adapters = [adapter for adapter in served_adapters(run_dir) if adapter.description]
        reused = logit_router(config, model, tokenizer, adapters)
    whole = LogitRouter(model, tokenizer, reused.options[:-1], reused.max_example_chars, reuse_prefix=False)
    observations = [request["messages"] for request in device_requests(args.tasks, 1)]
    prompts = [reused.prompt(observation) for observation in observations]
    print(
        f"settings: model={config.model.name}, {len(adapters)} adapters + base, {len(observations)} device tasks, "
        f"prompt {statistics.mean(len(ids) for ids, _ in prompts):.0f} tokens on average, "
        f"{statistics.mean(head for _, head in prompts):.0f} of them the head (options + policy), "
        f"{len({tuple(ids[:head]) for ids, head in prompts})} distinct heads, {os.cpu_count()} cores",
        flush=True,
    )
    first, _ = timed(lambda: reused.route(observations[0]))  # runs the head once
    whole.route(observations[0])  # warm-up
    routers = {"reused": reused, "whole": whole}
    single = {name: [] for name in routers}
    for index, observation in enumerate(observations):
        for name in sorted(routers, reverse=index % 2 == 1):  # alternate which goes first
            single[name].append(timed(lambda router=routers[name], observation=observation: router.route(observation)))
    batched = {name: timed(lambda router=router: router.route_many(observations)) for name, router in routers.items()}
    rows, largest, agree = [], 0.0, True
    for (_, a), (_, b) in zip(single["reused"], single["whole"]):
        agree &= a.choice == b.choice
        largest = max(largest, max(abs(a.scores[k] - b.scores[k]) for k in a.scores))
    p50 = {name: statistics.median(seconds for seconds, _ in timings) for name, timings in single.items()}
    rows.append(
        (
            "one at a time (p50 per decision)",
            f"{p50['whole'] * 1000:.0f}",
            f"{p50['reused'] * 1000:.0f}",
            f"{p50['whole'] / p50['reused']:.2f}x",
        )
    )
    per_task = {name: seconds / len(observations) for name, (seconds, _) in batched.items()}
    rows.append(
        (
            f"batched, {reused.batch_size} per pass (per decision)",
            f"{per_task['whole'] * 1000:.0f}",
            f"{per_task['reused'] * 1000:.0f}",
            f"{per_task['whole'] / per_task['reused']:.2f}x",
        )
    )
    print_table(
        "logit router decision time, ms",
        ["round", "whole prompt", "head reused", "whole / reused"],
        rows,
    )
    print(
        f"the first decision, with its head's run: {first * 1000:.0f} ms (in neither row); "
        f"decisions agree: {agree}; largest score difference {largest:.2e}"
    )


if __name__ == "__main__":
    main()
