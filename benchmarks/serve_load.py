"""Serving under load and faults: many clients with some bad requests, streaming, the MoE, a killed replica.

Starts the routed agent with ``router=moe`` on a local Ray over a run
directory (``--run-dir``, which needs ``router/moe`` from ``trace-ray route``;
default: a temporary one with two random adapters and a MoE over them, gates
as seeded) and, on loopback only:

  (load)    ``--clients`` clients x ``--requests`` requests each to the
            ingress; about ``--bad-share`` of them malformed JSON, unknown
            models or bodies over ``serve.max_request_bytes``; the valid ones
            name a single adapter or the MoE in turn. Every valid request must
            get 200 and every bad one a 4xx. The same valid requests then go
            to the LLM deployments' handles with the same concurrency:
            p50/p95 of both and their ratio.
  (stream)  time to the first content chunk of a streamed text reply (no
            tools offered, sampled with a seed: greedy replies of a random
            model are mostly whitespace, which a stream holds back) against
            the whole reply's latency, 8 x ``--max-tokens`` tokens.
  (moe)     the MoE against a single adapter, one request at a time, 8 x
            ``--max-tokens`` tokens: p50 latency and tokens/s.
  (fault)   two rounds of ``--clients`` x ``--fault-requests`` requests, the
            same in both, about ``--stream-share`` of the valid ones streamed
            (8 x ``--max-tokens`` tokens, text, seeded): one undisturbed, one with an
            LLM replica killed (``ray.kill``) 2 s in. Per round: valid
            non-streamed requests answered and lost (5xx or no answer), streams
            completed, cut (an error event after text) and lost, p50/p95, and
            the longest request against ``serve.request_timeout_s``.

The LLM replicas' resident memory is printed after the load round.

    python benchmarks/serve_load.py [--model tiny_random] [--clients 16] [--requests 50] [--bad-share 0.05]
        [--max-tokens 8] [--run-dir DIR] [--llm-replicas N] [--fault-requests 10] [--stream-share 0.25]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
from serve_latency import device_requests, free_port, percentiles, write_demo_run

from trace_ray.config_compose import compose_config
from trace_ray.console import print_table

APP = "serve_load"
TIMEOUT_S = 30  # serve.request_timeout_s of the benchmark's application


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny_random", help="model config (conf/model/)")
    parser.add_argument(
        "--run-dir", default=None, help="a run directory with adapters/ and router/moe (default: a temporary one)"
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=50, help="requests per client")
    parser.add_argument("--bad-share", type=float, default=0.05, help="share of malformed or oversize requests")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=16, help="device tasks the requests cycle through")
    parser.add_argument(
        "--llm-replicas", type=int, default=None, help="serve.llm_replicas (default: conf/serve/default.yaml's)"
    )
    parser.add_argument("--fault-requests", type=int, default=10, help="requests per client in each fault round")
    parser.add_argument(
        "--stream-share", type=float, default=0.25, help="share of the fault rounds' valid requests that stream"
    )
    return parser.parse_args(argv)


def write_demo_moe(run_dir: Path, model: str) -> None:
    """A LoRA MoE over the run's described adapters, its gates as seeded (untrained: a latency subject, not a
    router)."""
    from trace_ray.models import load_model
    from trace_ray.routing.adapters import read_peft_folder, served_adapters
    from trace_ray.routing.lora_moe import gate_model, save_moe

    adapters = [adapter for adapter in served_adapters(run_dir) if adapter.description]
    network, _ = load_model(compose_config("serve", [f"model={model}"]).model)
    moe = gate_model(network, {adapter.name: read_peft_folder(adapter.folder) for adapter in adapters})
    save_moe(run_dir / "router" / "moe", moe, {adapter.name: str(adapter.folder) for adapter in adapters})


def bad_request(rng: random.Random, limit: int) -> bytes:
    kind = rng.choice(["json", "model", "oversize"])
    if kind == "json":
        return b'{"messages": [{"role": "user", "content": "hi"'
    if kind == "model":
        return json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}).encode()
    return json.dumps({"messages": [{"role": "user", "content": "x" * (limit + 1)}]}).encode()


class Load:
    """The load round's requests: (is valid, body, model) per request, the same plan for the ingress and the handles."""

    def __init__(self, args, base: str, adapters: list[str], requests: list[dict], limit: int):
        rng = random.Random(0)
        models = [f"{base}:{name}" for name in adapters] + [f"{base}:moe"]
        self.plan = []
        for number in range(args.clients * args.requests):
            if rng.random() < args.bad_share:
                self.plan.append((False, bad_request(rng, limit), None))
            else:
                model = models[number % len(models)]
                body = {**requests[number % len(requests)], "model": model, "seed": number}
                self.plan.append((True, json.dumps(body).encode(), model))

    def per_client(self, clients: int) -> list[list[tuple[bool, bytes, str | None]]]:
        return [self.plan[index::clients] for index in range(clients)]

    def fault_rounds(self, args) -> list[list[tuple[bool, bytes, bool]]]:
        """Per client, the fault rounds' requests: (is valid, body, streamed), every ``1 / --stream-share``-th valid one
        streamed as text of 8 x ``--max-tokens`` tokens."""
        every = round(1 / args.stream_share) if args.stream_share > 0 else 0
        work = []
        for number, (valid, body, _) in enumerate(self.plan[: args.clients * args.fault_requests]):
            stream = valid and every > 0 and number % every == 0
            # sampled (seeded): greedy replies of the random model are mostly whitespace, which a stream holds back
            if stream:
                body = json.dumps(
                    {
                        **json.loads(body),
                        "stream": True,
                        "tools": [],
                        "max_tokens": args.max_tokens * 8,
                        "temperature": 1.0,
                    }
                ).encode()
            work.append((valid, body, stream))
        return [work[index :: args.clients] for index in range(args.clients)]


def through_ingress(url: str, work: list, results: list, stop: threading.Event | None = None) -> None:
    with httpx.Client(timeout=TIMEOUT_S * 3) as client:
        for valid, body, _ in work:
            if stop is not None and stop.is_set():
                return
            start = time.perf_counter()
            try:
                status = client.post(
                    f"{url}/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
                ).status_code
            except httpx.HTTPError:
                status = 0  # the connection failed: counted with the server errors
            results.append((valid, status, time.perf_counter() - start, time.monotonic()))


def through_handles(config, handles: dict, work: list, latencies: list) -> None:
    from serve_apps.openai_chat import MOE, parse_chat_request

    for valid, body, model in work:
        if not valid:
            continue
        chat = parse_chat_request(body, config.serve, config.model.sampling)
        adapter = model.partition(":")[2]
        start = time.perf_counter()
        if adapter == MOE:
            handles["moe"].generate.remote(chat, None).result()
        else:
            handles["llm"].generate.remote(chat, adapter).result()
        latencies.append(time.perf_counter() - start)


def run_clients(clients: int, target, per_client: list) -> float:
    start = time.perf_counter()
    threads = [threading.Thread(target=target, args=(work,)) for work in per_client]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def time_to_first_token(url: str, request: dict, model: str) -> tuple[float, float, int]:
    """(seconds to the first content chunk, seconds to the end, content chunks) of one streamed reply."""
    start, first, pieces = time.perf_counter(), None, 0
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={**request, "model": model, "stream": True}, timeout=TIMEOUT_S * 3
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                pieces += 1
                first = first or time.perf_counter() - start
    return (first if first is not None else time.perf_counter() - start), time.perf_counter() - start, pieces


def outcome(client: httpx.Client, url: str, body: bytes, stream: bool) -> str:
    """How one request ended: "200", "4xx", "cut" (a stream ended by its replica's death after showing text) or "lost"
    (a 5xx, no answer, a stream without its [DONE] or ended by another error, such as the timeout)."""
    headers = {"Content-Type": "application/json"}
    try:
        if not stream:
            status = client.post(f"{url}/v1/chat/completions", content=body, headers=headers).status_code
            return "200" if status == 200 else "4xx" if 400 <= status < 500 else "lost"
        with client.stream("POST", f"{url}/v1/chat/completions", content=body, headers=headers) as response:
            if response.status_code != 200:
                return "4xx" if 400 <= response.status_code < 500 else "lost"
            events = [line for line in response.iter_lines() if line]
    except httpx.HTTPError:
        return "lost"
    if not events or events[-1] != "data: [DONE]":
        return "lost"
    errors = [json.loads(line[len("data: ") :])["error"] for line in events if line.startswith('data: {"error"')]
    return "200" if not errors else "cut" if errors[0]["code"] == "replica_died" else "lost"


def fault_round(url: str, per_client: list, kill: bool) -> tuple[list, float, str | None]:
    """(valid, streamed, outcome, seconds) of every request of one fault round, its seconds, and the replica killed 2 s
    in."""
    results, killed = [], []

    def client_work(work: list) -> None:
        with httpx.Client(timeout=TIMEOUT_S * 3) as client:
            for valid, body, stream in work:
                start = time.perf_counter()
                ended = outcome(client, url, body, stream)
                results.append((valid, stream, ended, time.perf_counter() - start))

    killer = threading.Timer(2.0, lambda: killed.append(kill_llm_replica()))
    if kill:
        killer.start()
    seconds = run_clients(len(per_client), client_work, per_client)
    if kill:
        killer.join()
    return results, seconds, killed[0] if killed else None


def fault_summary(results: list) -> tuple:
    """(valid non-streamed: count, lost, p50, p95; streams: count, cut, lost, p50, p95; the longest request)."""
    posted = [(ended, seconds) for valid, stream, ended, seconds in results if valid and not stream]
    streamed = [(ended, seconds) for valid, stream, ended, seconds in results if stream]
    posted_p = percentiles([seconds for _, seconds in posted])
    streamed_p = percentiles([seconds for _, seconds in streamed]) if streamed else (0.0, 0.0)
    return (
        len(posted),
        sum(ended == "lost" for ended, _ in posted),
        *posted_p,
        len(streamed),
        sum(ended == "cut" for ended, _ in streamed),
        sum(ended == "lost" for ended, _ in streamed),
        *streamed_p,
        max(seconds for *_, seconds in results),
    )


def replica_memory_mb(app: str) -> list[float]:
    """Resident memory of each LLM replica of ``app`` (Ray titles a replica's process after its deployment)."""
    title = f"ray::ServeReplica:{app}:ChatLLM"
    return [
        process.memory_info().rss / 2**20
        for process in psutil.process_iter(["cmdline"])
        if (process.info["cmdline"] or [""])[0].split(".")[0] == title
    ]


def kill_llm_replica() -> str:
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if "ChatLLM" in actor["name"] and actor["name"].startswith("SERVE_REPLICA"):
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
            return actor["name"]
    raise RuntimeError("no ChatLLM replica found to kill")


def main(argv: list[str] | None = None) -> None:
    import ray
    from ray import serve

    from actors.ray_connection import connect_ray
    from serve_apps.routed_agent import build_app, serve_plan

    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="serve-load-") as scratch:
        run_dir = Path(args.run_dir or scratch)
        if not args.run_dir:
            write_demo_run(run_dir, args.model)
            write_demo_moe(run_dir, args.model)
        port = free_port()
        replicas = [f"serve.llm_replicas={args.llm_replicas}"] if args.llm_replicas else []
        config = compose_config(
            "serve",
            [
                f"model={args.model}",
                f"run_dir={run_dir}",
                "router=moe",
                f"serve.port={port}",
                f"serve.request_timeout_s={TIMEOUT_S}",
                "serve.max_request_bytes=65536",
                *replicas,
            ],
        )
        plan = serve_plan(config, run_dir)
        adapters = [adapter.name for adapter in plan.routable]
        requests = device_requests(args.tasks, args.max_tokens)
        load = Load(args, config.model.name, adapters, requests, config.serve.max_request_bytes)
        print(
            f"settings: model={config.model.name}, adapters {', '.join(adapters)} and the MoE, {args.clients} "
            "clients x "
            f"{args.requests} requests ({sum(not valid for valid, _, _ in load.plan)} bad), greedy, "
            f"max_tokens={args.max_tokens}, "
            f"{args.tasks} device tasks, {os.cpu_count()} cores, {config.serve.llm_replicas} LLM and MoE replicas of "
            f"{config.serve.llm_num_cpus} CPUs, serve.request_timeout_s={TIMEOUT_S}",
            flush=True,
        )
        url = f"http://127.0.0.1:{port}"
        connect_ray(config)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(build_app(config, run_dir), name=APP, route_prefix="/", blocking=False)
            handles = {
                "llm": serve.get_deployment_handle("ChatLLM", app_name=APP),
                "moe": serve.get_deployment_handle("ChatMoE", app_name=APP),
            }
            warm = [
                (True, json.dumps({**requests[0], "model": model}).encode(), model)
                for model in [f"{config.model.name}:{name}" for name in adapters] + [f"{config.model.name}:moe"]
            ]
            through_ingress(url, warm, [])
            results: list = []
            ingress_s = run_clients(
                args.clients, lambda work: through_ingress(url, work, results), load.per_client(args.clients)
            )
            memory = replica_memory_mb(APP)
            direct: list = []
            direct_s = run_clients(
                args.clients, lambda work: through_handles(config, handles, work, direct), load.per_client(args.clients)
            )
            streams = [
                time_to_first_token(
                    url,
                    {**request, "tools": [], "max_tokens": args.max_tokens * 8, "temperature": 1.0, "seed": seed},
                    f"{config.model.name}:{adapters[0]}",
                )
                # no tools offered, sampled: the reply is text, streamed as it is sampled
                for seed, request in enumerate(requests[:8])
            ]
            single, mixed = [], []
            with httpx.Client(timeout=TIMEOUT_S * 3) as client:
                for request in requests[:8]:
                    for model, into in (
                        (f"{config.model.name}:{adapters[0]}", single),
                        (f"{config.model.name}:moe", mixed),
                    ):
                        start = time.perf_counter()
                        body = client.post(
                            f"{url}/v1/chat/completions",
                            json={**request, "model": model, "max_tokens": args.max_tokens * 8},
                        ).json()
                        into.append((time.perf_counter() - start, body["usage"]["completion_tokens"]))
            rounds = {kill: fault_round(url, load.fault_rounds(args), kill) for kill in (False, True)}
        finally:
            serve.shutdown()
            ray.shutdown()

    valid = [(status, seconds) for ok, status, seconds, _ in results if ok]
    bad = [status for ok, status, _, _ in results if not ok]
    server_errors = sum(status >= 500 or status == 0 for status, _ in valid)
    (in_p50, in_p95), (di_p50, di_p95) = percentiles([s for _, s in valid]), percentiles(direct)
    print_table(
        f"load: {len(results)} requests through the ingress in {ingress_s:.1f} s; {len(direct)} valid ones "
        f"through the handles in {direct_s:.1f} s",
        ["path", "p50 ms", "p95 ms", "requests/s"],
        [
            ("ingress (HTTP)", f"{in_p50 * 1000:.0f}", f"{in_p95 * 1000:.0f}", f"{len(results) / ingress_s:.1f}"),
            ("direct (handles)", f"{di_p50 * 1000:.0f}", f"{di_p95 * 1000:.0f}", f"{len(direct) / direct_s:.1f}"),
            ("ratio ingress/direct", f"{in_p50 / di_p50:.2f}", f"{in_p95 / di_p95:.2f}", ""),
        ],
    )
    print(
        f"valid requests: {len(valid)}, 200: {sum(status == 200 for status, _ in valid)}, server errors (5xx or no "
        f"answer): {server_errors}"
    )
    print(f"bad requests: {len(bad)}, 4xx: {sum(400 <= status < 500 for status in bad)}, statuses {sorted(set(bad))}")
    first, whole = percentiles([f for f, _, _ in streams]), percentiles([w for _, w, _ in streams])
    print(
        f"streaming ({len(streams)} replies of up to {args.max_tokens * 8} tokens, "
        f"{statistics.mean([p for _, _, p in streams]):.1f} content chunks each): "
        f"time to first token p50 {first[0] * 1000:.0f} ms, whole reply p50 {whole[0] * 1000:.0f} ms, ratio "
        f"{first[0] / whole[0]:.2f}"
    )
    for name, rows in ((f"single adapter ({adapters[0]})", single), ("MoE", mixed)):
        p50 = percentiles([s for s, _ in rows])[0]
        print(
            f"{name}: p50 {p50 * 1000:.0f} ms, {sum(t for _, t in rows) / sum(s for s, _ in rows):.1f} tokens/s (one "
            "request at a time)"
        )
    print(
        "MoE / single adapter latency at p50: "
        f"{percentiles([s for s, _ in mixed])[0] / percentiles([s for s, _ in single])[0]:.2f}"
    )
    print(f"LLM replicas' resident memory after the load: {', '.join(f'{mb:.0f} MB' for mb in memory)}")
    rows = []
    for kill, (outcomes, seconds, killed) in rounds.items():
        posted, lost, p50, p95, streams, cut, streams_lost, s50, s95, longest = fault_summary(outcomes)
        rows.append(
            (
                "killed 2 s in" if kill else "undisturbed",
                f"{seconds:.1f}",
                f"{posted - lost}/{posted}",
                f"{lost}",
                f"{p50 * 1000:.0f} / {p95 * 1000:.0f}",
                f"{streams - cut - streams_lost}/{streams}",
                f"{cut}",
                f"{streams_lost}",
                f"{s50 * 1000:.0f} / {s95 * 1000:.0f}",
                f"{longest:.1f}",
            )
        )
        if kill:
            print(f"fault: killed {killed or 'nothing'}")
    print_table(
        f"fault rounds: {args.clients} clients x {args.fault_requests} requests (timeout {TIMEOUT_S} s)",
        [
            "round",
            "s",
            "valid 200",
            "lost",
            "p50 / p95 ms",
            "streams done",
            "cut",
            "lost",
            "stream p50 / p95 ms",
            "longest s",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
