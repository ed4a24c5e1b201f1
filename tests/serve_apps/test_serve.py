"""The routed agent on Ray Serve over loopback HTTP: model names, adapters, routing, streaming, errors, API key, load.

Five applications of ``serve_apps/routed_agent.py`` run on one Serve
instance with the tiny random model and two trained-looking adapters
(non-zero LoRA B) plus one adapter folder that no capability names: ``plain``
(router=none, no API key), ``routed`` (router=logit over the two
capabilities, API key set), ``moe`` (router=moe: the LoRA mixture of experts
saved in the run), ``limited`` (one request at a time, a 1 s timeout) and
``replicated`` (two LLM replicas of one request each, whose processes the
fault tests kill).
"""

import asyncio
import json
import shutil
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from ray.exceptions import ActorDiedError

from serve_apps.openai_chat import (
    BASE,
    ReplyText,
    RequestError,
    chat_completion,
    closing_chunks,
    conversation_key,
    reply_message,
    resolve_model,
    stream_head,
)
from serve_apps.routed_agent import ADAPTER_HEADER, ReplicaDeaths, RouteCache, app_builder, build_app
from tests.run_dirs import write_capability_run
from trace_ray.app.cli import main
from trace_ray.config_compose import compose_config

CAPABILITIES = ["tool_calling_precision", "datetime_reasoning"]
EXTRA = "extra_adapter"  # a PEFT folder no capability names: served when forced, never routed
KEY = "test-key-123"
TINY = ["model=tiny_random", "lora.rank=4", "lora.alpha=8"]
HELLO = [{"role": "system", "content": "You control a phone."}, {"role": "user", "content": "Turn on wifi please"}]


def write_run(run_dir: Path) -> None:
    """Two READY capabilities (description, template environment spec, exported non-zero adapter), one extra adapter,
    and a LoRA MoE over the two capabilities (its gates as seeded, untrained) in router/moe."""
    from trace_ray.models import load_model
    from trace_ray.routing.adapters import read_peft_folder
    from trace_ray.routing.lora_moe import gate_model, save_moe

    write_capability_run(run_dir, CAPABILITIES)
    shutil.copytree(run_dir / "adapters" / CAPABILITIES[1], run_dir / "adapters" / EXTRA)
    folders = {name: run_dir / "adapters" / name for name in CAPABILITIES}
    network, _ = load_model(compose_config("serve", TINY).model)
    moe = gate_model(network, {name: read_peft_folder(folder) for name, folder in folders.items()})
    save_moe(run_dir / "router" / "moe", moe, {name: str(folder) for name, folder in folders.items()})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def servers(ray_session, tmp_path_factory):
    """{application name: base URL} of the four running applications, and "run_dir"."""
    from ray import serve

    run_dir = tmp_path_factory.mktemp("serve_run")
    write_run(run_dir)
    port = free_port()
    settings = [
        *TINY,
        f"run_dir={run_dir}",
        f"serve.port={port}",
        "serve.llm_threads=1",
        "serve.max_request_bytes=4096",
        "model.max_context_tokens=1024",
        "serve.llm_num_cpus=0.25",
    ]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TRACE_RAY_API_KEY", KEY)  # read when the app is built
            routed = build_app(compose_config("serve", [*settings, "router=logit"]), run_dir)
        serve.run(routed, name="routed", route_prefix="/routed", blocking=False)
        apps = {
            "plain": ["router=none"],
            "moe": ["router=moe"],
            "limited": [
                "router=none",
                "serve.max_concurrent_requests=1",
                "serve.request_timeout_s=1",
                "serve.retry_after_s=2",
            ],
            "replicated": [
                "router=none",
                "serve.llm_replicas=2",
                "serve.max_ongoing_requests=1",
                "serve.request_timeout_s=60",
                "model.max_context_tokens=8192",
                "serve.max_request_bytes=65536",
            ],
        }
        for name, overrides in apps.items():
            serve.run(
                build_app(compose_config("serve", [*settings, *overrides]), run_dir),
                name=name,
                route_prefix=f"/{name}",
                blocking=False,
            )
        yield {**{name: f"http://127.0.0.1:{port}/{name}" for name in ("plain", "routed", *apps)}, "run_dir": run_dir}
    finally:
        serve.shutdown()


def chat(url: str, **body) -> httpx.Response:
    headers = body.pop("headers", {})
    return httpx.post(f"{url}/v1/chat/completions", json={"messages": HELLO, **body}, headers=headers, timeout=60)


def test_models_list_the_base_every_adapter_and_auto_when_routed(servers):
    plain = httpx.get(f"{servers['plain']}/v1/models", timeout=30)
    assert plain.status_code == 200
    ids = [entry["id"] for entry in plain.json()["data"]]
    assert ids == ["tiny_random", *(f"tiny_random:{name}" for name in [*CAPABILITIES, EXTRA])]
    routed = httpx.get(f"{servers['routed']}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert [entry["id"] for entry in routed.json()["data"]] == [*ids, "tiny_random:auto"]


def test_forced_adapters_answer_and_change_the_output(servers):
    answers = {}
    for model in ["tiny_random", *(f"tiny_random:{name}" for name in [*CAPABILITIES, EXTRA])]:
        response = chat(servers["plain"], model=model, temperature=0, max_tokens=12)
        assert response.status_code == 200, response.text
        body = response.json()
        adapter = model.partition(":")[2] or BASE
        assert body["adapter"] == response.headers[ADAPTER_HEADER] == adapter and body["model"] == model
        assert body["usage"]["completion_tokens"] >= 1
        answers[adapter] = body["choices"][0]["message"]["content"]
    assert all(answers[name] != answers[BASE] for name in CAPABILITIES)
    assert answers[EXTRA] == answers[CAPABILITIES[1]]  # the same weights in another folder
    again = chat(servers["plain"], model="tiny_random", temperature=0, max_tokens=12).json()
    assert again["choices"][0]["message"]["content"] == answers[BASE]  # greedy: deterministic
    unrouted = chat(servers["plain"], temperature=0, max_tokens=12)  # router=none: no model routes to the base
    assert (
        unrouted.headers[ADAPTER_HEADER] == BASE
        and unrouted.json()["choices"][0]["message"]["content"] == answers[BASE]
    )


def test_routing_picks_an_option_and_keeps_it_for_the_conversation(servers):
    auth = {"Authorization": f"Bearer {KEY}"}
    first = chat(servers["routed"], model="tiny_random:auto", temperature=0, max_tokens=4, headers=auth)
    assert first.status_code == 200, first.text
    chosen = first.json()["adapter"]
    assert chosen in [*CAPABILITIES, BASE] and first.headers[ADAPTER_HEADER] == chosen
    later_turn = [*HELLO, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "And bluetooth?"}]
    for messages in (HELLO, later_turn):
        again = httpx.post(
            f"{servers['routed']}/v1/chat/completions",
            json={"messages": messages, "max_tokens": 4},
            headers=auth,
            timeout=60,
        )
        assert again.status_code == 200 and again.json()["adapter"] == chosen


def stream_events(url: str, **body) -> list[dict]:
    """The chunks of a streamed reply (checked to be server-sent events ending with [DONE])."""
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", timeout=60, json={"messages": HELLO, **body, "stream": True}
    ) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events) and events[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in events[:-1]]


def streamed_content(chunks: list[dict]) -> str:
    return "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)


def test_streaming_sends_chunks_whose_content_equals_the_full_reply(servers):
    model = f"tiny_random:{CAPABILITIES[0]}"
    full = chat(servers["plain"], model=model, temperature=0, max_tokens=16).json()
    chunks = stream_events(servers["plain"], model=model, temperature=0, max_tokens=16)
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"} and len(
        {chunk["id"] for chunk in chunks}
    ) == 1
    assert {chunk["adapter"] for chunk in chunks} == {CAPABILITIES[0]}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert streamed_content(chunks) == full["choices"][0]["message"]["content"]
    # token by token, not one piece
    assert len([chunk for chunk in chunks if chunk["choices"][0]["delta"].get("content")]) > 1
    assert chunks[-1]["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]


def test_stop_strings_cut_the_reply_streamed_or_not(servers):
    model = f"tiny_random:{CAPABILITIES[0]}"
    full = chat(servers["plain"], model=model, temperature=0, max_tokens=24).json()
    content = full["choices"][0]["message"]["content"]
    words = [word for word in content.split() if len(word) >= 2]
    assert len(words) >= 3, content
    stop = words[2]  # no whitespace in it: the raw reply's first occurrence is the content's
    cut = chat(servers["plain"], model=model, temperature=0, max_tokens=24, stop=[stop, "never-appears"]).json()
    assert cut["choices"][0]["message"]["content"] == content[: content.find(stop)].strip()
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] < full["usage"]["completion_tokens"]  # the engine stopped there
    chunks = stream_events(servers["plain"], model=model, temperature=0, max_tokens=24, stop=stop)
    assert streamed_content(chunks) == cut["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_the_moe_is_served_and_answers_as_evaluate_plays_it(servers):
    """router=moe: <base>:moe and <base>:auto are the mixture of experts, greedy replies those of evaluate's MoE
    engine."""
    from trace_ray.agent_prompt import AgentPrompt
    from trace_ray.engines import SamplingParams
    from trace_ray.routing.adapters import served_adapters
    from trace_ray.routing.lora_moe import moe_engine

    ids = [entry["id"] for entry in httpx.get(f"{servers['moe']}/v1/models", timeout=30).json()["data"]]
    assert ids == [
        "tiny_random",
        *(f"tiny_random:{name}" for name in [*CAPABILITIES, EXTRA]),
        "tiny_random:moe",
        "tiny_random:auto",
    ]
    served = chat(servers["moe"], model="tiny_random:moe", temperature=0, max_tokens=12)
    assert served.status_code == 200, served.text
    assert served.json()["adapter"] == served.headers[ADAPTER_HEADER] == "moe"
    config = compose_config("evaluate", [*TINY, f"run_dir={servers['run_dir']}", "router=moe"])
    routable = [adapter for adapter in served_adapters(servers["run_dir"]) if adapter.description]
    engine = moe_engine(config.model, config.engine, routable, servers["run_dir"] / "router" / "moe")
    prompt = AgentPrompt.for_model(config.model, engine.tokenizer)
    [generation] = engine.generate([prompt.prompt_ids(HELLO, [], [])], SamplingParams(0.0, 1.0, 12))
    expected = reply_message(
        prompt.parse(generation.token_ids),
        engine.tokenizer.decode(generation.token_ids, skip_special_tokens=True),
        False,
    )
    assert served.json()["choices"][0]["message"]["content"] == expected["content"]
    routed = chat(servers["moe"], temperature=0, max_tokens=12).json()  # no model: the router in use, the MoE
    assert routed["adapter"] == "moe" and routed["choices"][0]["message"] == served.json()["choices"][0]["message"]
    forced = chat(servers["moe"], model=f"tiny_random:{CAPABILITIES[0]}", temperature=0, max_tokens=12).json()
    assert forced["adapter"] == CAPABILITIES[0]  # single adapters stay selectable beside the MoE
    assert chat(servers["plain"], model="tiny_random:moe", max_tokens=2).json()["error"]["code"] == "model_not_found"


def test_over_the_concurrency_limit_429_with_retry_after_and_slow_replies_time_out(servers):
    url = servers["limited"]
    long_reply = {"temperature": 0, "max_tokens": 900, "messages": [{"role": "user", "content": "hi"}]}
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=long_reply, timeout=60)
        time.sleep(0.3)  # the first is being answered
        refused = httpx.post(f"{url}/v1/chat/completions", json={**long_reply, "max_tokens": 2}, timeout=60)
        timed_out = slow.result()
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "2"
    assert (
        refused.json()["error"]["type"] == "rate_limit_error"
        and "serve.max_concurrent_requests" in refused.json()["error"]["message"]
    )
    assert timed_out.status_code == 504 and timed_out.json()["error"]["code"] == "request_timeout"
    # the slot was given back: 504, not 429
    again = httpx.post(f"{url}/v1/chat/completions", json=long_reply, timeout=60)
    assert again.status_code == 504
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={**long_reply, "stream": True}, timeout=60
    ) as response:
        assert response.status_code == 200  # streaming had begun: the timeout ends the stream with an error event
        events = [line for line in response.iter_lines() if line]
    assert (
        events[-1] == "data: [DONE]" and json.loads(events[-2][len("data: ") :])["error"]["code"] == "request_timeout"
    )


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"model": "tiny_random"}', 400, "messages is missing"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4"}', 404, "unknown model 'gpt-4'"),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "model": "tiny_random:nope"}',
            404,
            "tiny_random:tool_calling_precision",
        ),
        (b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', 400, "send n=1"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}', 400, "serve.max_tokens_limit"),
        (b'{"messages": [{"role": "wizard", "content": "hi"}]}', 400, "is not one of system, user"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', 400, "temperature='hot'"),
        (b'{"messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}', 413, "serve.max_request_bytes"),
        # parameters this server would otherwise ignore are refused by name
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}',
            400,
            "at most 4 non-empty strings",
        ),
        (b'{"messages": [{"role": "user", "content": "hi"}], "stop": [""]}', 400, 'stop=[""]'),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "logprobs": true}',
            400,
            "remove logprobs from the request",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}',
            400,
            "response_format=",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "model": "tiny_random:auto"}',
            404,
            "this server runs no router",
        ),
    ],
)
def test_bad_requests_get_a_clear_4xx_and_the_server_keeps_serving(servers, body, status, words):
    response = httpx.post(
        f"{servers['plain']}/v1/chat/completions",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert words in error["message"] and "; " in error["message"] and error["type"] == "invalid_request_error"
    assert chat(servers["plain"], max_tokens=2).status_code == 200


def test_a_chunked_body_over_the_limit_is_refused_while_reading_and_defaults_pass(servers):
    def chunks():  # no Content-Length: the server can only count as it reads
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(64):
            yield b"x" * 65536
        yield b'"}]}'

    response = httpx.post(
        f"{servers['plain']}/v1/chat/completions",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 413 and "reading stopped at" in response.json()["error"]["message"]
    # parameters that ask for the default behaviour are accepted
    assert (
        chat(servers["plain"], max_tokens=2, logprobs=False, stop=None, response_format={"type": "text"}).status_code
        == 200
    )


def test_unknown_paths_and_context_overflow_are_refused_in_openai_format(servers):
    missing = httpx.get(f"{servers['plain']}/v1/nothing", timeout=30)
    assert missing.status_code == 404 and "POST /v1/chat/completions" in missing.json()["error"]["message"]
    # any prompt plus 1024 tokens exceed the test's 1024-token context
    overflow = chat(servers["plain"], max_tokens=1024)
    assert overflow.status_code == 400 and overflow.json()["error"]["code"] == "context_length_exceeded"
    assert "lower max_tokens" in overflow.json()["error"]["message"]
    assert chat(servers["plain"], max_tokens=2).status_code == 200


def test_api_key_is_required_when_set(servers):
    url = servers["routed"]
    assert httpx.get(f"{url}/healthz", timeout=30).status_code == 200
    missing = chat(url, model="tiny_random", max_tokens=2)
    assert missing.status_code == 401 and "Authorization: Bearer" in missing.json()["error"]["message"]
    assert missing.json()["error"]["type"] == "authentication_error"
    wrong = chat(url, model="tiny_random", max_tokens=2, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "wrong API key" in wrong.json()["error"]["message"]
    assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 401
    assert chat(url, model="tiny_random", max_tokens=2, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_concurrent_load_has_no_errors(servers):
    url, clients, per_client = servers["plain"], 8, 20
    models = ["tiny_random", *(f"tiny_random:{name}" for name in CAPABILITIES)]

    def client(index: int) -> list[float]:
        latencies = []
        with httpx.Client(timeout=60) as session:
            for number in range(per_client):
                start = time.perf_counter()
                response = session.post(
                    f"{url}/v1/chat/completions",
                    json={
                        "model": models[(index + number) % len(models)],
                        "messages": HELLO,
                        "max_tokens": 4,
                        "seed": number,
                    },
                )
                assert response.status_code == 200, response.text
                latencies.append(time.perf_counter() - start)
        return latencies

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        latencies = sorted(value for values in pool.map(client, range(clients)) for value in values)
    seconds = time.perf_counter() - start
    assert len(latencies) == clients * per_client
    p50, p95 = statistics.median(latencies), latencies[int(0.95 * len(latencies)) - 1]
    print(
        f"\nload: {clients} clients x {per_client} requests, max_tokens 4: p50 {p50 * 1000:.0f} ms, "
        f"p95 {p95 * 1000:.0f} ms, {len(latencies) / seconds:.1f} requests/s"
    )


def test_the_official_openai_client_chats_calls_tools_streams_and_reads_errors(servers):
    import openai

    client = openai.OpenAI(base_url=f"{servers['routed']}/v1", api_key=KEY, max_retries=0, timeout=60)
    assert [model.id for model in client.models.list()][-1] == "tiny_random:auto"
    reply = client.chat.completions.create(model="tiny_random", messages=HELLO, temperature=0, max_tokens=8)
    assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens >= 1
    assert reply.model_extra["adapter"] == BASE
    tools = [
        {
            "type": "function",
            "function": {
                "name": "set_wifi_status",
                "description": "Turn wifi on or off",
                "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}},
            },
        }
    ]
    with_tools = client.chat.completions.create(
        model="tiny_random", messages=HELLO, tools=tools, tool_choice="auto", max_tokens=8, seed=1
    )
    message = with_tools.choices[0].message
    assert (with_tools.choices[0].finish_reason == "tool_calls") == bool(message.tool_calls)
    stream = client.chat.completions.create(
        model="tiny_random", messages=HELLO, temperature=0, max_tokens=8, stream=True
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream]
    assert "".join(pieces) == reply.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="remove logprobs"):
        client.chat.completions.create(model="tiny_random", messages=HELLO, logprobs=True)
    with pytest.raises(openai.NotFoundError, match="unknown model 'gpt-4'"):
        client.chat.completions.create(model="gpt-4", messages=HELLO)
    with pytest.raises(openai.AuthenticationError, match="wrong API key"):
        openai.OpenAI(base_url=f"{servers['routed']}/v1", api_key="nope", max_retries=0).models.list()


# -- replicas that die ------------------------------------------------------------------------
REPLICA_RESTART_S = 240


def llm_replicas(app: str) -> list[psutil.Process]:
    """The processes of ``app``'s LLM replicas (Ray titles a replica's process after its deployment, then the method it
    runs)."""
    title = f"ray::ServeReplica:{app}:ChatLLM"
    return [
        process
        for process in psutil.process_iter(["cmdline"])
        if (process.info["cmdline"] or [""])[0].split(".")[0] == title
    ]


def wait_for_replicas(app: str, count: int = 2) -> None:
    """Until Serve runs ``count`` LLM replicas of ``app`` again (the controller replaces a killed one). A new replica
    loads its model while the other test worker runs on the same 2 cores, which has taken over 60 s in CI."""
    from ray import serve

    deadline = time.monotonic() + REPLICA_RESTART_S
    while time.monotonic() < deadline:
        states = serve.status().applications[app].deployments["ChatLLM"].replica_states
        if states.get("RUNNING") == count and sum(states.values()) == count and len(llm_replicas(app)) == count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{app} did not get back to {count} LLM replicas in {REPLICA_RESTART_S} s: {states}")


def busiest_replica(app: str, windows: int = 6) -> psutil.Process:
    """The LLM replica of ``app`` generating a reply: the one that used by far the most CPU in a half-second window
    (up to ``windows`` tries: beside the other test worker the generating replica has had as little as 0.1 s)."""
    processes = llm_replicas(app)
    for _ in range(windows):
        before = [sum(process.cpu_times()[:2]) for process in processes]
        time.sleep(0.5)
        used = sorted(
            (sum(process.cpu_times()[:2]) - start, index)
            for index, (process, start) in enumerate(zip(processes, before))
        )
        if used[-1][0] >= 0.05 and used[-1][0] > 3 * used[-2][0]:
            return processes[used[-1][1]]
    raise AssertionError(f"no replica stands out as the busy one in {windows} half-second windows: {used}")


def sse(line: str) -> dict | str:
    return line if line == "data: [DONE]" else json.loads(line[len("data: ") :])


def test_a_request_whose_replica_is_killed_is_answered_by_another_with_its_adapter(servers):
    url, app = servers["replicated"], "replicated"
    wait_for_replicas(app)
    body = {"model": f"tiny_random:{CAPABILITIES[0]}", "messages": HELLO, "temperature": 0, "max_tokens": 600}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=body, timeout=60)
        busiest_replica(app).kill()  # SIGKILL, mid-generation
        answered = pending.result()
    assert answered.status_code == 200, answered.text
    expected = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()  # undisturbed
    assert answered.json()["adapter"] == answered.headers[ADAPTER_HEADER] == CAPABILITIES[0]
    # the same adapter answered again
    assert answered.json()["choices"][0]["message"] == expected["choices"][0]["message"]


def test_a_stream_cut_after_showing_text_ends_with_an_error_event_and_done(servers):
    url, app = servers["replicated"], "replicated"
    wait_for_replicas(app)
    body = {"messages": HELLO, "temperature": 0, "max_tokens": 900, "stream": True}
    start = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = (line for line in response.iter_lines() if line)
        for line in lines:
            if sse(line)["choices"][0]["delta"].get("content"):
                break
        busiest_replica(app).kill()
        rest = [sse(line) for line in lines]
    assert time.monotonic() - start < 20  # ended soon after the kill, long before the 60 s timeout: no hang
    assert rest[-1] == "data: [DONE]" and rest[-2]["error"]["code"] == "replica_died"
    assert "send the request again" in rest[-2]["error"]["message"] and rest[-2]["error"]["type"] == "server_error"
    assert all(event["choices"][0]["finish_reason"] is None for event in rest[:-2])  # text pieces, no false finish


def test_a_stream_whose_replica_dies_before_showing_text_is_sent_again(servers):
    """One replica holds a long reply (each takes one request), so the stream goes to the other; that one is killed as
    soon as the client has the stream's first chunk (the role), while it still reads the long prompt."""
    url, app = servers["replicated"], "replicated"
    wait_for_replicas(app)
    with ThreadPoolExecutor(1) as pool:
        long_reply = {"messages": HELLO, "temperature": 0, "max_tokens": 400}
        occupying = pool.submit(httpx.post, f"{url}/v1/chat/completions", json=long_reply, timeout=60)
        busy = busiest_replica(app)
        [free] = [process for process in llm_replicas(app) if process.pid != busy.pid]
        body = {
            "model": f"tiny_random:{CAPABILITIES[1]}",
            "messages": [{"role": "user", "content": "bluetooth off " * 1500}],
            "temperature": 0,
            "max_tokens": 64,
        }
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as response:
            lines = (line for line in response.iter_lines() if line)
            first = sse(next(lines))
            free.kill()
            events = [first, *(sse(line) for line in lines)]
        assert occupying.result().status_code == 200
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1] == "data: [DONE]" and not any("error" in event for event in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert {event["adapter"] for event in events[:-1]} == {CAPABILITIES[1]}
    expected = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    assert streamed_content(events[:-1]) == expected["choices"][0]["message"]["content"]


def test_replicas_are_health_checked_often_and_drain_for_the_request_timeout_when_removed(servers):
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details()["applications"]
    for app, timeout in (("replicated", 60), ("plain", 120)):
        for name, deployment in details[app]["deployments"].items():
            config = deployment["deployment_config"]
            assert (
                config["graceful_shutdown_timeout_s"] == timeout and config["graceful_shutdown_wait_loop_s"] == 0.5
            ), name
            assert config["health_check_period_s"] == 2, name


# -- without Serve ----------------------------------------------------------------------------
def test_tool_calls_come_back_in_openai_format():
    parsed = {
        "role": "assistant",
        "content": None,
        "raw_text": "<tool_call>...</tool_call>",
        "tool_calls": [
            {
                "id": "call_1_0",
                "type": "function",
                "function": {"name": "set_wifi_status", "arguments": '{"on": true}'},
            },
        ],
    }
    reply = reply_message(
        parsed, '<tool_call>{"name": "set_wifi_status", "arguments": {"on": true}}</tool_call>', tools_offered=True
    )
    assert reply == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1_0",
                "type": "function",
                "function": {"name": "set_wifi_status", "arguments": '{"on": true}'},
            },
        ],
    }
    completion = chat_completion(reply, "stop", "tiny_random:x", "x", 10, 5)
    assert completion["choices"][0]["finish_reason"] == "tool_calls" and completion["usage"]["total_tokens"] == 15
    chunks = closing_chunks(stream_head("tiny_random:x", "x"), reply, "stop", sent="")
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert (
        calls == [{"index": 0, **reply["tool_calls"][0]}] and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    )
    unreadable = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "", "arguments": "{"}}],
    }
    assert reply_message(unreadable, " <tool_call>{ ", tools_offered=True) == {
        "role": "assistant",
        "content": "<tool_call>{",
    }
    assert reply_message(parsed, "text", tools_offered=False) == {"role": "assistant", "content": "text"}


def shown(texts, stops=(), tools=False):
    """What a client sees, piece by piece, of a reply decoded as ``texts`` (each the whole text so far)."""
    reply = ReplyText(list(stops), tools)
    return [reply.update(text) for text in texts], reply


def test_streamed_text_is_cut_at_stop_strings_and_never_shows_what_the_reply_may_drop():
    pieces, reply = shown([" Hel", " Hello ", " Hello wor", " Hello world"])
    # leading and trailing spaces held back
    assert pieces == ["Hel", "lo", " wor", "ld"] and reply.sent == "Hello world"
    pieces, reply = shown(["One E", "One EN", "One ENX", "One ENX two END", "One ENX two END more"], stops=["END"])
    assert pieces == ["One", "", " ENX", " two", ""] and reply.stopped and reply.text == "One ENX two "
    assert shown(["caf\ufffd", "café"])[0] == ["caf", "é"]  # a half-decoded character waits
    pieces, reply = shown(["Sure", "Sure <tool", 'Sure <tool_call>{"name": "x"}'], tools=True)
    assert pieces == ["Sure", "", ""]  # from where a call may begin, nothing until the reply is parsed
    assert shown(['{"na', '{"name": "x"}'], tools=True)[0] == ["", ""]
    assert shown(["a <b>"])[0] == ["a <b>"]  # without tools a tag is text
    head = stream_head("m", "base")
    rest = closing_chunks(head, {"role": "assistant", "content": "Sure, done."}, "length", sent="Sure")
    assert [c["choices"][0]["delta"] for c in rest] == [{"content": ", done."}, {}] and rest[-1]["choices"][0][
        "finish_reason"
    ] == "length"


def test_resends_after_replica_deaths_stop_at_the_limit_or_the_deadline():
    async def deaths_until_refused(limits, seconds_left: float) -> tuple[int, RequestError]:
        deaths = ReplicaDeaths(limits, time.monotonic() + seconds_left)
        with pytest.raises(RequestError) as refused:
            while True:
                await deaths.pause_before_resending(ActorDiedError(), "generation")
        return deaths.count, refused.value

    limits = compose_config("serve", [*TINY, "serve.replica_retries=2", "serve.retry_after_s=3"]).serve
    count, error = asyncio.run(deaths_until_refused(limits, 60))
    assert (
        count == 3
        and error.status == 503
        and error.code == "replica_unavailable"
        and error.headers == {"Retry-After": "3"}
    )
    assert "3 replica(s) died" in error.message and "serve.replica_retries" in error.message
    count, _ = asyncio.run(deaths_until_refused(limits, 0.15))  # the second pause (0.2 s) would pass the deadline
    assert count == 2


def test_model_names_route_cache_and_conversation_keys():
    adapters = ["a", "b"]
    assert resolve_model(None, "m", adapters) == resolve_model("m:auto", "m", adapters) == "auto"
    assert resolve_model("m", "m", adapters) == BASE and resolve_model("m:b", "m", adapters) == "b"
    with pytest.raises(RequestError, match="unknown model 'm:c'; send one of: m, m:a, m:b, m:auto"):
        resolve_model("m:c", "m", adapters)
    with pytest.raises(
        RequestError, match="'m:auto' routes conversations, but this server runs no router .*send one of: m, m:a, m:b\""
    ):
        resolve_model("m:auto", "m", adapters, routed=False)
    assert resolve_model(None, "m", adapters, routed=False) == "auto"  # omitted: the ingress answers with the base
    assert resolve_model("m:moe", "m", adapters, moe=True) == "moe"
    with pytest.raises(RequestError, match="only with router=moe"):
        resolve_model("m:moe", "m", adapters)
    later = [*HELLO, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    assert conversation_key(HELLO) == conversation_key(later) != conversation_key(HELLO[1:])
    cache = RouteCache(2)
    cache.put("x", "a"), cache.put("y", "b")
    assert cache.get("x") == "a"  # x is now the most recent
    cache.put("z", "base")
    assert cache.get("y") is None and cache.get("x") == "a" and cache.get("z") == "base"


def test_config_out_writes_a_serve_config_that_recomposes_the_same_config(tmp_path):
    out = tmp_path / "serve.yaml"
    overrides = [
        *TINY,
        "router=none",
        "serve.port=9123",
        "model.sampling.max_new_tokens=7",
        "serve.autoscaling={min_replicas: 1, max_replicas: 3, target_ongoing_requests: 4}",
        f"run_dir={tmp_path}",
    ]
    assert main(["serve", *overrides, f"serve.config_out={out}"]) == 0
    document = yaml.safe_load(out.read_text())
    assert document["http_options"] == {"host": "127.0.0.1", "port": 9123}
    [application] = document["applications"]
    assert application["import_path"] == "serve_apps.routed_agent:app_builder" and application["route_prefix"] == "/"
    args = application["args"]
    assert args["run_dir"] == str(tmp_path) and "model=tiny_random" in args["overrides"]
    recomposed = compose_config("serve", [*args["overrides"], f"run_dir={args['run_dir']}"])
    assert recomposed == compose_config("serve", overrides)
    assert type(app_builder(args)).__name__ == "Application"


def test_bad_serve_inputs_are_one_line_errors(tmp_path, capsys):
    assert main(["serve", *TINY, f"run_dir={tmp_path}", "router=logit"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "adapters" in error and "router=none" in error
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert main(["serve", *TINY, f"run_dir={tmp_path}", "router=none", f"serve.port={port}"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "serve.port" in error and str(port) in error
    assert main(["serve", *TINY, "serve.max_tokens_limit=8", "serve.default_max_tokens=16"]) == 1
    assert "serve.default_max_tokens (16) exceeds serve.max_tokens_limit (8)" in capsys.readouterr().err
    assert main(["serve", *TINY, "serve.router_threads=0"]) == 1
    assert "serve.router_threads must be >= 1 or null, got 0" in capsys.readouterr().err
    assert main(["serve", *TINY, "serve.replica_retries=-1"]) == 1
    assert "serve.replica_retries must be >= 0" in capsys.readouterr().err


def test_a_replica_that_fails_to_start_is_reported_in_one_line():
    from trace_ray.app.serve import deployment_error

    failure = RuntimeError(
        "Deploying application routed_agent failed:\nTraceback (most recent call last):\n  File "
        "...\n"
        "environments.errors.TraceRayError: no synthetic environment for capability 'x'; run "
        "trace-ray synthesize first\n"
    )
    assert str(deployment_error(failure)) == (
        "the routed agent failed to start: no synthetic environment for capability 'x'; run trace-ray synthesize first"
    )
    assert "see the Serve logs" in str(
        deployment_error(RuntimeError("Deploying failed:\nActorDiedError: out of memory"))
    )
