"""The LLM labeler against a small OpenAI-compatible server that replays recorded answers."""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import pytest

from environments.errors import TraceRayError
from trace_ray.capabilities.llm_labeler import (
    CUT_MARKER,
    LabelerError,
    compact_trajectory,
    label_trajectories_llm,
    labeling_request,
    propose_candidates,
)
from trace_ray.capabilities.trajectories import LACKING, NA, PRESENT, Trajectory
from trace_ray.llm_client import LLMClient, LLMEndpointError


# -- a replaying server -----------------------------------------------------------------------
class Replay(ThreadingHTTPServer):
    """Answers each POST with the next queued (status, body); records what it got."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answers: list[tuple[int, dict | str]] = []
        self.requests: list[dict] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"

    def reply(self, *contents: str) -> None:
        """Queue successful completions with these contents."""
        self.answers += [
            (200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": c}}]}) for c in contents
        ]

    def client(self, **options) -> LLMClient:
        return LLMClient(
            self.url, "analyst", options.pop("api_key", None), config_key="labeler", backoff_s=0.01, **options
        )


class Handler(BaseHTTPRequestHandler):
    server: Replay

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        status, answer = self.server.answers.pop(0)
        data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    replay = Replay()
    thread = threading.Thread(target=replay.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield replay
    replay.shutdown()
    replay.server_close()
    thread.join()


# -- trajectories ---------------------------------------------------------------------------
def call(name: str, arguments: dict) -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": function}]}


def trajectory(task: str, sample: int, success: bool, result: str = "1803854437") -> Trajectory:
    messages = [
        {"role": "system", "content": "You are a phone assistant."},
        {"role": "user", "content": f"Remind me to call the dentist ({task})."},
        call("get_current_timestamp", {}),
        {"role": "tool", "tool_call_id": "c", "name": "get_current_timestamp", "content": result},
        call("add_reminder", {"title": "call the dentist", "timestamp": 1803861637}),
        {"role": "tool", "tool_call_id": "c", "name": "add_reminder", "content": "reminder 7 added"},
        {"role": "assistant", "content": "Done: I will remind you at 14:00."},
    ]
    return Trajectory(
        id=f"{task}#{sample}",
        task_id=task,
        env="device",
        seed=0,
        family="reminders",
        success=success,
        reward=1.0 if success else 0.25,
        messages=messages,
        reward_info={},
        termination="reply",
    )


TRAJECTORIES = [
    trajectory("t1", 0, True),
    trajectory("t1", 1, False),
    trajectory("t2", 0, True),
    trajectory("t2", 1, False),
]
CAPABILITIES = {"datetime_reasoning": "Compute timestamps.", "error_recovery": "Retry after a tool error."}


def candidates_answer(*names: str, examples: tuple[str, ...] = ("t1#1", "t2#1")) -> str:
    return json.dumps(
        {
            "candidates": [
                {"name": name, "description": f"The {name} skill.", "example_trajectories": list(examples)}
                for name in names
            ]
        }
    )


def propose(server: Replay, max_candidates: int = 3, max_repairs: int = 2) -> dict[str, dict]:
    return propose_candidates(
        server.client(), TRAJECTORIES, max_candidates, seed=5, temperature=0.7, max_chars=2000, max_repairs=max_repairs
    )


def label(server: Replay, trajectories: list[Trajectory] = TRAJECTORIES, seed: int = 11) -> dict[str, dict[str, str]]:
    return label_trajectories_llm(
        server.client(), trajectories, CAPABILITIES, seed=seed, temperature=0.0, max_chars=2000
    )


def user_text(request: dict) -> str:
    return request["body"]["messages"][-1]["content"]


# -- the client -----------------------------------------------------------------------------
def test_request_is_an_openai_chat_completion(server):
    server.reply('{"ok": true}')
    messages = [{"role": "user", "content": "hi"}]
    assert server.client().chat(messages, seed=3, temperature=0.5) == '{"ok": true}'
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["body"] == {
        "model": "analyst",
        "messages": messages,
        "seed": 3,
        "temperature": 0.5,
        "response_format": {"type": "json_object"},
    }


def test_schema_sent_as_structured_output_unless_json_object_chosen(server):
    server.reply("{}", "{}")
    schema = {"type": "object"}
    server.client(max_tokens=64).chat([], seed=0, temperature=0.0, schema=schema)
    server.client(response_format="json_object").chat([], seed=0, temperature=0.0, schema=schema)
    structured, plain = (request["body"] for request in server.requests)
    assert structured["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    assert structured["max_tokens"] == 64
    assert plain["response_format"] == {"type": "json_object"} and "max_tokens" not in plain


def test_api_key_header_sent_only_when_given(server):
    server.reply("{}", "{}")
    server.client(api_key="sk-test").chat([], seed=0, temperature=0.0)
    server.client().chat([], seed=0, temperature=0.0)
    with_key, without_key = (request["headers"] for request in server.requests)
    assert with_key["Authorization"] == "Bearer sk-test"
    assert "Authorization" not in without_key


def test_server_error_is_retried(server):
    server.answers.append((500, {"error": {"message": "engine overloaded"}}))
    server.reply("{}")
    assert server.client().chat([], seed=0, temperature=0.0) == "{}"
    assert len(server.requests) == 2


def test_retries_run_out_on_server_errors(server):
    server.answers += [(503, {"error": {"message": "busy"}})] * 2
    with pytest.raises(LLMEndpointError) as error:
        server.client(max_retries=2).chat([], seed=0, temperature=0.0)
    assert "HTTP 503: busy" in str(error.value) and "after 2 tries" in str(error.value)


def test_connection_refused_names_endpoint_and_tries():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(LLMEndpointError) as error:
        LLMClient(url, "analyst", None, config_key="labeler", backoff_s=0.01).chat([], seed=0, temperature=0.0)
    message = str(error.value)
    assert isinstance(error.value, TraceRayError) and "\n" not in message
    assert message == (
        f"cannot reach the labeler endpoint {url} (Connection refused) after 3 tries; start the server or fix "
        "labeler.base_url"
    )


def test_client_error_fails_at_once_with_the_server_message(server):
    server.answers.append((400, {"error": {"message": "model 'analyst' does not exist " + "x" * 500}}))
    with pytest.raises(LLMEndpointError) as error:
        server.client().chat([], seed=0, temperature=0.0)
    message = str(error.value)
    assert len(server.requests) == 1 and "\n" not in message
    assert "HTTP 400: model 'analyst' does not exist" in message
    server_message = message.split("HTTP 400: ")[1].split("); fix")[0]
    assert len(server_message) == 200 and server_message.endswith("xxx...")


# -- proposing candidates -------------------------------------------------------------------
def test_valid_candidates_parsed_in_order(server):
    server.reply(candidates_answer("tool_error_recovery", "datetime_reasoning"))
    found = propose(server)
    assert list(found) == ["tool_error_recovery", "datetime_reasoning"]
    assert found["datetime_reasoning"] == {
        "description": "The datetime_reasoning skill.",
        "example_trajectories": ["t1#1", "t2#1"],
    }
    (request,) = server.requests
    prompt = user_text(request)
    assert all(t.id in prompt for t in TRAJECTORIES)
    assert prompt.index("Failed trajectories") < prompt.index("Successful trajectories")
    assert request["body"]["seed"] == 5 and request["body"]["temperature"] == 0.7


def test_proposal_schema_admits_valid_answers_and_rejects_invalid_ones(server):
    server.reply(candidates_answer("datetime_reasoning"))
    propose(server)
    schema = server.requests[0]["body"]["response_format"]["json_schema"]["schema"]
    jsonschema.validate(json.loads(candidates_answer("tool_error_recovery", "datetime_reasoning")), schema)
    for invalid in (
        candidates_answer("datetime_reasoning", examples=("t1#1", "t9#0")),
        candidates_answer("Datetime Reasoning"),
        candidates_answer("a", "b", "c", "d"),
        json.dumps({"capabilities": []}),
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(invalid), schema)


def test_invalid_json_repaired_once(server):
    server.reply("{not json", candidates_answer("datetime_reasoning"))
    assert list(propose(server)) == ["datetime_reasoning"]
    assert len(server.requests) == 2
    repair = server.requests[1]["body"]["messages"]
    assert repair[:2] == server.requests[0]["body"]["messages"]
    assert repair[2] == {"role": "assistant", "content": "{not json"}
    assert repair[3]["role"] == "user"
    assert "not valid JSON" in repair[3]["content"] and "corrected JSON only" in repair[3]["content"]


@pytest.mark.parametrize(
    "answer, problem",
    [
        (candidates_answer("datetime_reasoning", examples=("t1#1", "t9#0")), "unknown trajectory ids ['t9#0']"),
        (candidates_answer("Datetime Reasoning"), "'Datetime Reasoning' is not snake_case"),
        (candidates_answer("a", "b", "c", "d"), "give 1 to 3 candidates, not 4"),
        (candidates_answer("a", "a"), "'a' appears twice"),
        (
            json.dumps({"candidates": [{"name": "a", "description": " ", "example_trajectories": ["t1#1"]}]}),
            "non-empty description",
        ),
        (json.dumps({"capabilities": []}), '{"candidates": [...]}'),
    ],
)
def test_schema_violation_repaired(server, answer, problem):
    server.reply(answer, candidates_answer("datetime_reasoning"))
    assert list(propose(server)) == ["datetime_reasoning"]
    assert problem in user_text(server.requests[1])


def test_repairs_exhausted_raise_one_line(server):
    server.reply(*[candidates_answer("Bad-Name")] * 3)
    with pytest.raises(LabelerError) as error:
        propose(server, max_repairs=2)
    message = str(error.value)
    assert len(server.requests) == 3 and "\n" not in message
    assert "after 2 repairs" in message and "'Bad-Name' is not snake_case" in message


# -- labeling -------------------------------------------------------------------------------
def labels_answer(**labels: str) -> str:
    return json.dumps({"labels": labels})


def test_labels_every_capability_and_trajectory(server):
    server.reply(*[labels_answer(datetime_reasoning="LACKING", error_recovery="NA")] * 2)
    found = label(server, TRAJECTORIES[:2])
    assert found == {
        "datetime_reasoning": {"t1#0": LACKING, "t1#1": LACKING},
        "error_recovery": {"t1#0": NA, "t1#1": NA},
    }
    prompt = server.requests[0]["body"]["messages"]
    assert "NA: the task does not need" in prompt[0]["content"]
    assert "Retry after a tool error." in prompt[1]["content"]
    assert "user: Remind me to call the dentist (t1)." in prompt[1]["content"]


def test_labeling_prompts_are_blind_to_the_outcome(server):
    """A success and a failure of identical conversation get the very same labeling prompt, naming no outcome."""
    success, failure = trajectory("t1", 0, True), trajectory("t1", 0, False)  # rewards 1.00 and 0.25
    failure = Trajectory(**{**failure.__dict__, "termination": "max_turns"})
    server.reply(*[labels_answer(datetime_reasoning="PRESENT", error_recovery="NA")] * 2)
    label(server, [success, failure])
    sent = [user_text(request) for request in server.requests]
    # what is sent is what is checked
    assert sent == [labeling_request(CAPABILITIES, t, 2000) for t in (success, failure)]
    assert sent[0] == sent[1]
    for prompt in sent:
        assert "add_reminder" in prompt  # the conversation is there
        assert not re.search(r"success|failure|passed|failed|reward|score|max_turns", prompt, flags=re.IGNORECASE)
        assert not re.search(r"\b(1\.00|0\.25)\b", prompt)


def test_proposal_prompt_keeps_the_outcomes(server):
    server.reply(candidates_answer("datetime_reasoning"))
    propose(server)
    prompt = user_text(server.requests[0])
    assert "trajectory t1#1: failure (reward 0.25, reply)" in prompt
    assert "trajectory t1#0: success (reward 1.00, reply)" in prompt


def test_labeling_schema_requires_every_capability_and_a_known_label(server):
    server.reply(labels_answer(datetime_reasoning="NA", error_recovery="NA"))
    label(server, TRAJECTORIES[:1])
    schema = server.requests[0]["body"]["response_format"]["json_schema"]["schema"]
    jsonschema.validate(json.loads(labels_answer(datetime_reasoning="LACKING", error_recovery="PRESENT")), schema)
    for invalid in (
        labels_answer(datetime_reasoning="LACKING"),
        labels_answer(datetime_reasoning="LACKING", error_recovery="MAYBE"),
        labels_answer(datetime_reasoning="NA", error_recovery="NA", other="NA"),
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(invalid), schema)


def test_missing_capability_repaired(server):
    server.reply(
        labels_answer(datetime_reasoning="PRESENT"), labels_answer(datetime_reasoning="PRESENT", error_recovery="NA")
    )
    assert label(server, TRAJECTORIES[:1]) == {"datetime_reasoning": {"t1#0": PRESENT}, "error_recovery": {"t1#0": NA}}
    assert "missing capabilities ['error_recovery']" in user_text(server.requests[1])


def test_unknown_capability_and_bad_value_repaired(server):
    server.reply(
        labels_answer(datetime_reasoning="NA", error_recovery="NA", planning="NA"),
        labels_answer(datetime_reasoning="maybe", error_recovery="NA"),
        labels_answer(datetime_reasoning="NA", error_recovery="NA"),
    )
    assert label(server, TRAJECTORIES[:1]) == {"datetime_reasoning": {"t1#0": NA}, "error_recovery": {"t1#0": NA}}
    assert "unknown capabilities ['planning']" in user_text(server.requests[1])
    assert "label 'maybe' of 'datetime_reasoning' is not one of NA, PRESENT, LACKING" in user_text(server.requests[2])


def test_label_values_case_insensitive(server):
    server.reply(labels_answer(datetime_reasoning="present", error_recovery=" Lacking "))
    assert label(server, TRAJECTORIES[:1]) == {
        "datetime_reasoning": {"t1#0": PRESENT},
        "error_recovery": {"t1#0": LACKING},
    }
    assert len(server.requests) == 1


def test_seeds_differ_per_trajectory_and_are_stable(server):
    answer = labels_answer(datetime_reasoning="NA", error_recovery="NA")
    server.reply(*[answer] * 7)
    label(server)
    label(server, TRAJECTORIES[2:3])
    label(server, TRAJECTORIES[:2], seed=12)
    seeds = [request["body"]["seed"] for request in server.requests]
    assert len(set(seeds[:4])) == 4
    assert seeds[4] == seeds[2]  # t2#0: the same seed whatever else is labeled
    assert seeds[5:] == [seeds[0] + 1, seeds[1] + 1]  # runs differ only by the seed


# -- compacting -----------------------------------------------------------------------------
def test_compact_trajectory_content():
    text = compact_trajectory(trajectory("t1", 1, False), max_chars=10_000)
    assert text.splitlines()[0] == "trajectory t1#1: failure (reward 0.25, reply)"
    assert "You are a phone assistant" not in text
    assert "user: Remind me to call the dentist (t1)." in text
    assert "call get_current_timestamp({})" in text and "  -> 1803854437" in text
    assert 'call add_reminder({"title": "call the dentist", "timestamp": 1803861637})' in text
    assert "  -> reminder 7 added" in text
    assert text.endswith("final reply: Done: I will remind you at 14:00.")


def test_compact_trajectory_truncates():
    long = trajectory("t1", 0, True, result="r" * 5000)
    full = compact_trajectory(long, max_chars=100_000)
    assert "r" * 300 + "..." in full and "r" * 301 not in full  # a long tool result is clipped
    short = compact_trajectory(long, max_chars=400)
    assert len(short) == 400 and CUT_MARKER in short
    assert short.startswith("trajectory t1#0: success") and short.endswith(
        "final reply: Done: I will remind you at 14:00."
    )
