"""Serving latency: the routed agent's HTTP ingress (with routing) against the LLM deployment's handle, same prompts.

Starts the routed agent on a local Ray (``serve_apps/routed_agent.py``) over a
run directory (``--run-dir``; default: a temporary one with two capability
adapters of random non-zero LoRA weights, their descriptions and template
environments) and sends the first observations of device tasks (system
policy, user request, tool schemas), greedily, ``--max-tokens`` each:

  (ingress) ``POST /v1/chat/completions`` over loopback HTTP with
            ``model=<base>:auto`` (router=logit) when the run has adapters with
            descriptions, else ``model=<base>:<first adapter>``: request checks,
            routing, the LLM deployment, the OpenAI response;
  (direct)  the LLM deployment's handle from this process, ``generate`` with the
            same checked request and the adapter the ingress answered with.

Both paths generate with the same adapter. Four rounds: ``first turn`` (the
router decides each new conversation; the direct call, which needs its
choice, plays a twin of the task, its request tagged apart, so that both
paths meet a prompt new to the engine's caches), ``repeated turn`` (the same
conversations again: the decision comes from the ingress's cache; per task the
paths alternate which goes first, so the caches favour neither), ``forced
adapter`` (the same conversations naming the adapter they were routed to: the
cost of HTTP and the ingress without routing) and ``concurrent``
(``--concurrency`` clients at once, repeated conversations).
Prints p50/p95 latency of each path and the router's overhead at p50,
ingress / direct - 1 (target: under 10%).

    python benchmarks/serve_latency.py [--model tiny_random|smollm2_135m] [--run-dir DIR] [--requests 16]
        [--concurrency 8] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from trace_ray.config_compose import compose_config
from trace_ray.console import print_table

CAPABILITIES = ["tool_calling_precision", "datetime_reasoning"]
APP = "serve_latency"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny_random", help="model config (conf/model/)")
    parser.add_argument(
        "--run-dir",
        default=None,
        help="a run directory with adapters/ (default: a temporary one with two random adapters)",
    )
    parser.add_argument("--requests", type=int, default=16, help="conversations (device tasks)")
    parser.add_argument("--concurrency", type=int, default=8, help="clients at once in the concurrent round")
    parser.add_argument("--max-tokens", type=int, default=16)
    return parser.parse_args(argv)


def write_demo_run(run_dir: Path, model: str) -> None:
    """Two READY capabilities with descriptions, template environments and adapters of random non-zero LoRA B."""
    from trace_ray.training.lora_model import export_adapter, trainable_model

    config = compose_config("train", [f"model={model}", "lora.rank=4", "lora.alpha=8"])
    entries = [
        {
            "name": n,
            "description": f"the {n.replace('_', ' ')} skill",
            "status": "READY",
            "environment": f"synthetic/{n}",
        }
        for n in CAPABILITIES
    ]
    (run_dir / "capabilities").mkdir(parents=True)
    (run_dir / "capabilities" / "selected.json").write_text(json.dumps(entries))
    for seed, name in enumerate(CAPABILITIES):
        (run_dir / "environments" / name).mkdir(parents=True)
        spec = {"capability": name, "target": "device", "source": "templates", "difficulty": 1}
        (run_dir / "environments" / name / "spec.json").write_text(json.dumps(spec))
        policy, _ = trainable_model(config.model, config.lora, seed=seed)
        with torch.no_grad():
            for parameter_name, parameter in policy.named_parameters():
                if "lora_B" in parameter_name:
                    parameter.normal_(0, 0.05)
        export_adapter(policy, run_dir / "adapters" / name)


def device_requests(count: int, max_tokens: int) -> list[dict]:
    """Chat requests of the device environment's first ``count`` eval tasks: policy, user request, tools; greedy."""
    from environments.device.environment import DeviceEnvironment

    env = DeviceEnvironment()
    requests = []
    for seed in env.task_seeds("eval")[:count]:
        reset = env.reset(seed)
        requests.append(
            {"messages": list(reset.messages), "tools": list(reset.tools), "temperature": 0, "max_tokens": max_tokens}
        )
    return requests


def tagged(request: dict, tag: str) -> dict:
    """The request with ``tag`` appended to its last user message: a new conversation of the same length, nearly."""
    messages = [dict(message) for message in request["messages"]]
    last = max(index for index, message in enumerate(messages) if message["role"] == "user")
    messages[last]["content"] = f"{messages[last]['content']} ({tag})"
    return {**request, "messages": messages}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def percentiles(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return statistics.median(ordered), ordered[max(0, round(0.95 * len(ordered)) - 1)]


class Paths:
    """The two ways to one reply: HTTP through the ingress, or the LLM deployment's handle."""

    def __init__(self, url: str, model: str, config, llm):
        self.url, self.model, self.config, self.llm = url, model, config, llm
        self.adapters: dict[int, str] = {}  # task -> the adapter the ingress answered with

    def ingress(self, task: int, request: dict, client: httpx.Client, forced: bool = False) -> float:
        """One request through HTTP; ``forced`` names the adapter the task was routed to, so the router is not asked."""
        from serve_apps.openai_chat import BASE

        model = self.model
        if forced:
            adapter = self.adapters[task]
            model = self.config.model.name if adapter == BASE else f"{self.config.model.name}:{adapter}"
        start = time.perf_counter()
        response = client.post(f"{self.url}/v1/chat/completions", json={**request, "model": model})
        elapsed = time.perf_counter() - start
        response.raise_for_status()
        self.adapters[task] = response.json()["adapter"]
        return elapsed

    def direct(self, task: int, request: dict) -> float:
        from serve_apps.openai_chat import BASE, parse_chat_request

        chat = parse_chat_request(json.dumps(request).encode(), self.config.serve, self.config.model.sampling)
        adapter = self.adapters[task]
        start = time.perf_counter()
        self.llm.generate.remote(chat, None if adapter == BASE else adapter).result()
        return time.perf_counter() - start

    def first_turn(self, task: int, request: dict, client: httpx.Client) -> tuple[float, float]:
        """(ingress s, direct s) of a conversation new to the router and to the engine on both paths.

        The direct call plays a twin of the task (its request tagged apart) with
        the adapter the ingress answered with, so it gets no more from the
        engine's prompt caches than the ingress did.
        """
        through_ingress = self.ingress(task, request, client)
        return through_ingress, self.direct(task, tagged(request, "twin"))

    def pair(self, task: int, request: dict, client: httpx.Client, forced: bool = False) -> tuple[float, float]:
        """(ingress s, direct s) of one task: a new conversation through the ingress first; else even tasks ingress
        first, odd ones direct first."""
        if task % 2 == 0 or task not in self.adapters:
            through_ingress = self.ingress(task, request, client, forced)
            return through_ingress, self.direct(task, request)
        direct = self.direct(task, request)
        return self.ingress(task, request, client, forced), direct


def main(argv: list[str] | None = None) -> None:
    import ray
    from ray import serve

    from actors.ray_connection import connect_ray
    from serve_apps.routed_agent import build_app, serve_plan

    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="serve-latency-") as scratch:
        run_dir = Path(args.run_dir or scratch)
        if not args.run_dir:
            write_demo_run(run_dir, args.model)
        port = free_port()
        config = compose_config(
            "serve", [f"model={args.model}", f"run_dir={run_dir}", "router=logit", f"serve.port={port}"]
        )
        plan = serve_plan(config, run_dir)
        routed = plan.router != "none"
        model = f"{config.model.name}:auto" if routed else f"{config.model.name}:{plan.adapters[0].name}"
        requests = device_requests(args.requests, args.max_tokens)
        print(
            f"settings: model={config.model.name}, {len(plan.adapters)} adapters, ingress model={model} "
            f"({'router=logit' if routed else 'forced adapter'}), {len(requests)} device tasks, greedy, "
            f"max_tokens={args.max_tokens}, "
            f"{args.concurrency} concurrent clients, {os.cpu_count()} cores",
            flush=True,
        )
        connect_ray(config)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(build_app(config, run_dir), name=APP, route_prefix="/", blocking=False)
            paths = Paths(
                f"http://127.0.0.1:{port}", model, config, serve.get_deployment_handle("ChatLLM", app_name=APP)
            )
            rows = []
            with httpx.Client(timeout=600) as client:
                paths.pair(0, tagged(requests[0], "warm-up"), client)  # first calls of both paths
                timings = [paths.first_turn(task, request, client) for task, request in enumerate(requests)]
                rows.append(("first turn", [t[0] for t in timings], [t[1] for t in timings]))
                timings = [paths.pair(task, request, client) for task, request in enumerate(requests)]
                rows.append(("repeated turn", [t[0] for t in timings], [t[1] for t in timings]))
                timings = [paths.pair(task, request, client, forced=True) for task, request in enumerate(requests)]
                rows.append(("forced adapter", [t[0] for t in timings], [t[1] for t in timings]))
            with ThreadPoolExecutor(args.concurrency) as pool, httpx.Client(timeout=600) as client:
                timings = list(pool.map(lambda item: paths.pair(item[0], item[1], client), enumerate(requests)))
            rows.append((f"concurrent x{args.concurrency}", [t[0] for t in timings], [t[1] for t in timings]))
        finally:
            serve.shutdown()
            ray.shutdown()
    chosen = sorted(set(paths.adapters.values()))
    table = []
    for name, ingress, direct in rows:
        (ingress_p50, ingress_p95), (direct_p50, direct_p95) = percentiles(ingress), percentiles(direct)
        overhead = ingress_p50 / direct_p50 - 1
        table.append(
            (
                name,
                f"{ingress_p50 * 1000:.0f}",
                f"{ingress_p95 * 1000:.0f}",
                f"{direct_p50 * 1000:.0f}",
                f"{direct_p95 * 1000:.0f}",
                f"{overhead:+.1%}",
                "met" if overhead < 0.10 else "NOT met",
            )
        )
    print_table(
        f"latency per request, ms ({len(requests)} requests per path and round); ingress answered with: "
        f"{', '.join(chosen)}",
        ["round", "ingress p50", "ingress p95", "direct p50", "direct p95", "overhead at p50", "target < 10%"],
        table,
    )
    print(
        "ingress = HTTP + request checks + router (+ its decision cache) + LLM deployment; direct = the LLM "
        "deployment's handle"
    )
    print(
        "first turn: the router reads each new conversation; repeated turn and concurrent: its cached decision; "
        "forced adapter: the request names the adapter, no routing (HTTP and the ingress alone)"
    )


if __name__ == "__main__":
    main()
