"""LLM environment synthesis: the sandbox, admission by the self-checks, and the generate -> check -> feedback loop."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from environments.errors import TraceRayError
from environments.synthetic.sandbox import SandboxedEnvironment, SandboxError, SandboxLimits
from tests.trace_ray.capabilities.test_llm_labeler import server  # noqa: F401  (the fixture of a replaying OpenAI-compatible endpoint)
from trace_ray.synthesis.llm_synthesis import (
    GenerationRequest,
    SynthesisError,
    default_protocol_text,
    extract_module,
    generation_messages,
    sandbox_admission,
    synthesize_module,
)

# -- generated modules ----------------------------------------------------------------------
VALID = '''\
"""Set values: the user asks for settings; the agent sets each with set_value and reports them."""
import json
import random
import re

from environments.tool_environment import Tool, ToolEnvironment, ToolError

DIFFICULTIES = (1, 2, 3)
KEYS = ("volume", "brightness", "alarm", "timer", "contrast")
KEY = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
KEY_VALUE = {"type": "object", "properties": {"key": {"type": "string"}, "value": {"type": "integer"}},
             "required": ["key", "value"]}


class SetValues(ToolEnvironment):
    name = "synthetic/set_values"

    def __init__(self, difficulty, max_turns, max_tool_calls_per_turn, success_threshold):
        super().__init__(max_turns=max_turns, max_tool_calls_per_turn=max_tool_calls_per_turn)
        self.difficulty, self.success_threshold = difficulty, success_threshold
        self.targets, self.values = {}, {}

    def task_seeds(self, split):
        return list(range(100, 108)) if split == "analysis" else list(range(200, 208))

    def train_seed(self, index):
        return 10_000 + index

    def start_episode(self, seed):
        rng = random.Random(seed)
        self.targets = {key: rng.randint(1, 100) for key in rng.sample(KEYS, self.difficulty)}
        self.values = {key: 0 for key in KEYS}
        print("noise on stdout must not reach the channel")
        request = " and ".join(f"set {key} to {value}" for key, value in self.targets.items())
        tools = [Tool("get_value", "Read a setting.", KEY, self.get_value),
                 Tool("set_value", "Change a setting.", KEY_VALUE, self.set_value)]
        messages = [{"role": "system", "content": "You control settings."}, {"role": "user", "content": f"Please \
{request}."}]
        return messages, tools, {"seed": seed}

    def get_value(self, key):
        if key not in self.values:
            raise ToolError(f"no setting {key!r}")
        return self.values[key]

    def set_value(self, key, value):
        if key not in self.values:
            raise ToolError(f"no setting {key!r}")
        self.values[key] = value
        return "ok"

    def on_agent_reply(self, text):
        return [{"role": "user", "content": "Thanks."}], True

    def score(self):
        correct = sum(self.values[key] == value for key, value in self.targets.items())
        reply = self.log.replies[-1] if self.log.replies else ""
        numbers = {int(number) for number in re.findall(r"\\d+", reply)}
        reported = numbers == set(self.targets.values())  # every value, and no other number
        reward = 0.8 * correct / len(self.targets) + 0.2 * reported
        return reward, {"correct": correct, "success": reward >= self.success_threshold}

    def task_fingerprint(self):
        return json.dumps(self.targets, sort_keys=True)

    def oracle_message(self):
        for key, value in self.targets.items():
            if self.values[key] != value:
                arguments = json.dumps({"key": key, "value": value})
                call = {"id": f"call_{key}", "type": "function", "function": {"name": "set_value", "arguments": \
arguments}}
                return {"role": "assistant", "content": None, "tool_calls": [call]}
        done = ", ".join(f"{key} is {value}" for key, value in self.targets.items())
        return {"role": "assistant", "content": f"Done: {done}."}

    def capability_turns(self):
        return list(range(len(self.targets)))  # the set_value calls


def make_environment(difficulty, max_turns, max_tool_calls_per_turn, success_threshold):
    return SetValues(difficulty, max_turns, max_tool_calls_per_turn, success_threshold)
'''

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_value",
            "description": "Read a setting.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "set_value",
            "description": "Change a setting.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}, "value": {"type": "integer"}},
                "required": ["key", "value"],
            },
        },
    },
]


def variant(method: str, body: str) -> str:
    """VALID with one method of the environment replaced."""
    return (
        VALID
        + f"""

class Variant(SetValues):
    def {method}(self, *args):
{body}


def make_environment(difficulty, max_turns, max_tool_calls_per_turn, success_threshold):
    return Variant(difficulty, max_turns, max_tool_calls_per_turn, success_threshold)
"""
    )


LOOPS = variant("step", "        while True:\n            pass")
HOGS = variant("reset", "        hog = []\n        while True:\n            hog.append(bytes(10_000_000))")
NO_ORACLE = variant("oracle_message", '        return {"role": "assistant", "content": "I give up."}')


def calls_home(port: int, quietly: bool) -> str:
    """Connects to the port in reset: with a socket, or through urllib swallowing the error."""
    if quietly:
        body = f"""\
        import urllib.request
        try:
            urllib.request.urlopen("http://127.0.0.1:{port}/", timeout=1)
        except OSError:
            pass
"""
    else:
        body = f'        import socket\n        socket.create_connection(("127.0.0.1", {port}), timeout=1)\n'
    return variant("reset", body + "        return SetValues.reset(self, *args)")


SEEDS = [1, 2, 3, 4, 5, 6]
LIMITS = SandboxLimits(call_timeout_s=2.0, memory_mb=400, start_timeout_s=20.0)
OPTIONS = {"max_turns": 10}


def write(folder: Path, name: str, code: str) -> Path:
    path = folder / name
    path.write_text(code)
    return path


def admit(path: Path) -> list[str]:
    return sandbox_admission(TOOLS, SEEDS, LIMITS, env_options=OPTIONS)(path)


# -- the sandbox ----------------------------------------------------------------------------
def test_valid_module_runs_in_the_sandbox_and_is_admitted(tmp_path):
    path = write(tmp_path, "valid.py", VALID)
    with SandboxedEnvironment(path, None, limits=LIMITS) as env:
        assert env.difficulties() == (1, 2, 3) and env.difficulty == 2 and env.name == "synthetic/set_values"
        assert env.task_seeds("analysis")[:2] == [100, 101] and env.train_seed(3) == 10_003
        reset = env.reset(7)
        assert [tool["function"]["name"] for tool in reset.tools] == ["get_value", "set_value"]
        assert reset.info == {"seed": 7}
        result = env.step(env.oracle_message())
        assert result.messages[0]["content"] == "ok" and not result.done
        while not result.done:
            result = env.step(env.oracle_message())
        assert result.reward == 1.0 and result.info["success"] is True
        with pytest.raises(
            SandboxError,
            match=r"valid\.py: step\(message\) raised RuntimeError: step\(\) called on a "
            r"finished episode",
        ):
            env.step({"role": "assistant", "content": "again"})
        assert env.example_exchange() == []  # the module lives on after its own exception
        scratch = Path(env._scratch)
        assert scratch.is_dir()
    assert not scratch.exists()
    with pytest.raises(SandboxError, match="stopped sandbox"):
        env.reset(1)
    env.close()  # idempotent
    assert admit(path) == []


def test_broken_contract_is_one_line_sandbox_error(tmp_path):
    bad_levels = write(tmp_path, "levels.py", VALID.replace("DIFFICULTIES = (1, 2, 3)", "DIFFICULTIES = [1, 2, 3]"))
    with pytest.raises(
        SandboxError, match=r"levels\.py: start .* DIFFICULTIES must be a non-empty tuple of ints"
    ) as error:
        SandboxedEnvironment(bad_levels, None, limits=LIMITS)
    assert isinstance(error.value, TraceRayError) and "\n" not in str(error.value)
    with pytest.raises(SandboxError, match="difficulty 9 is not one of DIFFICULTIES"):
        SandboxedEnvironment(write(tmp_path, "valid.py", VALID), 9, limits=LIMITS)
    syntax = write(tmp_path, "syntax.py", VALID.replace("def score(self):", "def score(self)"))
    line = VALID.splitlines().index("    def score(self):") + 1
    assert admit(syntax) == [
        "synthetic module syntax.py: start (import and make_environment) raised SyntaxError: expected ':' (syntax.py, "
        f"line {line})"
    ]


def test_endless_loop_is_stopped_within_the_call_time_limit(tmp_path):
    started = time.monotonic()
    (problem,) = admit(write(tmp_path, "loops.py", LOOPS))
    assert time.monotonic() - started < 10
    assert problem.startswith("synthetic module loops.py: step(message) did not return within 2 s")
    assert admit(write(tmp_path, "valid.py", VALID)) == []  # the rest goes on


def test_unbounded_allocation_is_stopped_by_the_memory_limit(tmp_path):
    (problem,) = admit(write(tmp_path, "hogs.py", HOGS))
    assert problem.startswith("synthetic module hogs.py: reset(1) exceeded the memory limit of 400 MB")
    assert admit(write(tmp_path, "valid.py", VALID)) == []


@pytest.mark.parametrize("quietly", [False, True], ids=["socket", "urllib-swallowing-the-error"])
def test_network_access_is_refused_and_rejects_the_module(tmp_path, quietly):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    try:
        (problem,) = admit(write(tmp_path, "calls_home.py", calls_home(listener.getsockname()[1], quietly)))
        assert problem.startswith(
            "synthetic module calls_home.py: reset(1) attempted network access (socket.create_connection)"
        )
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    finally:
        listener.close()
    assert admit(write(tmp_path, "valid.py", VALID)) == []


def test_crash_stops_the_sandbox_and_names_the_exit(tmp_path):
    crashes = variant("step", '        print("about to leave", flush=True)\n        import os\n        os._exit(3)')
    with SandboxedEnvironment(write(tmp_path, "crashes.py", crashes), 1, limits=LIMITS) as env:
        env.reset(1)
        with pytest.raises(
            SandboxError,
            match=r"crashes\.py: step\(message\) crashed: .* exited with status 3 \(last "
            r"output: about to leave\)",
        ):
            env.step({"role": "assistant", "content": "hi"})
        with pytest.raises(SandboxError, match=r"reset\(1\) called on a stopped sandbox"):
            env.reset(1)


def isolation_this_machine_allows() -> str | None:
    """The network isolation the kernel grants this user, probed apart from the sandbox's code: util-linux's
    unshare(1), or where it is missing the unshare(2) call in a throwaway Python process. None: no network namespace."""

    def can_unshare(*flags: str) -> bool:
        tool = shutil.which("unshare")
        if tool:
            return subprocess.run([tool, *flags, "true"], capture_output=True).returncode == 0
        bits = sum({"--net": 0x40000000, "--user": 0x10000000}[flag] for flag in flags)  # CLONE_NEWNET, CLONE_NEWUSER
        probe = f"import ctypes, sys; sys.exit(ctypes.CDLL(None, use_errno=True).unshare({bits}) != 0)"
        return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0

    if can_unshare("--net"):
        return "network namespace"
    if can_unshare("--user", "--net"):
        return "user and network namespaces"
    return None


def test_the_weak_sandbox_cuts_the_network_as_far_as_this_machine_allows(tmp_path):
    expected = isolation_this_machine_allows()
    weak = SandboxLimits(call_timeout_s=2.0, memory_mb=400, start_timeout_s=20.0, mode="weak")
    with SandboxedEnvironment(write(tmp_path, "valid.py", VALID), 1, limits=weak) as env:
        if expected is None:
            assert env.network_isolation.startswith("socket functions disabled (no network namespace: ")
        else:
            assert env.network_isolation == expected
            # and the child really left this process's network namespace
            assert os.readlink(f"/proc/{env._process.pid}/ns/net") != os.readlink("/proc/self/ns/net")


# -- extract_module -------------------------------------------------------------------------
def test_extract_module():
    assert extract_module("Here:\n```python\nx = 1\n```\nand\n```python\ny = 2\n```") == "x = 1\n"
    assert extract_module("```json\n{}\n```\n```py\nx = 1\n```") == "x = 1\n"
    assert extract_module("```\nx = 1\n```") == "x = 1\n"
    assert extract_module("x = 1\nprint(x)\n") == "x = 1\nprint(x)\n"
    with pytest.raises(ValueError, match="not closed"):
        extract_module("```python\nx = 1\n")
    with pytest.raises(ValueError, match="no ```python code block and is not Python"):
        extract_module("I cannot write this environment.")
    with pytest.raises(ValueError, match="no ```python code block"):
        extract_module("```json\n{}\n```")
    with pytest.raises(ValueError, match="empty"):
        extract_module("```python\n\n```")


# -- generate -> check -> feedback ----------------------------------------------------------
REQUEST = GenerationRequest(
    capability="report_values",
    description="Tell the user the values that were set.",
    failed_examples=["trajectory t#1: failure\nuser: set volume to 3\nfinal reply: Done."],
    target_tools=TOOLS,
    policy="You control settings.",
    target="device",
)


def fenced(code: str) -> str:
    return f"Here is the module.\n```python\n{code}```\n"


def test_prompt_names_the_capability_tools_policy_and_protocol():
    system, user = generation_messages(REQUEST, "PROTOCOL TEXT")
    assert system["role"] == "system" and "```python" in system["content"]
    for part in (
        "report_values",
        "Tell the user the values",
        "final reply: Done.",
        '"set_value"',
        "You control settings.",
        "PROTOCOL TEXT",
        "capability_turns",
        "DIFFICULTIES",
        "ONE ```python code block",
    ):
        assert part in user["content"]
    protocol_text = default_protocol_text()
    assert protocol_text.startswith("The generated module's contract") and "The sandbox" not in protocol_text
    assert "class Environment(abc.ABC)" in protocol_text and "class ToolEnvironment(Environment)" in protocol_text


def test_rejected_module_is_fed_back_and_the_next_admitted(server, tmp_path):  # noqa: F811 (the fixture, imported)
    server.reply(fenced(NO_ORACLE), fenced(VALID))
    client = server.client(response_format="text")
    module = synthesize_module(
        client, REQUEST, tmp_path / "env", admit, max_attempts=3, seed=4, temperature=0.5, protocol_text="PROTOCOL"
    )
    assert module == tmp_path / "env" / "module.py" and module.read_text() == VALID
    assert (tmp_path / "env" / "attempt_01.py").read_text() == NO_ORACLE
    first, second = (request["body"] for request in server.requests)
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"]
    assert "response_format" not in second and (first["seed"], second["seed"]) == (4, 5)
    feedback = second["messages"][-1]["content"]
    assert feedback.startswith("Your module was rejected:\n- oracle scores 1.0: 0/6 tasks")
    assert feedback.endswith("Fix it and reply with the whole corrected module.")
    log = (tmp_path / "env" / "check_log.md").read_text()
    assert "## Attempt 1 (`attempt_01.py`)\n\nrejected:\n- oracle scores 1.0: 0/6 tasks" in log
    assert "## Attempt 2 (`attempt_02.py`)\n\nadmitted" in log


def test_all_attempts_rejected_is_one_line_synthesis_error(server, tmp_path):  # noqa: F811 (the fixture, imported)
    server.reply("I would rather not.", fenced(VALID.replace("def score(self):", "def score(self)")))
    folder = tmp_path / "env"
    with pytest.raises(SynthesisError) as error:
        synthesize_module(
            server.client(response_format="text"),
            REQUEST,
            folder,
            admit,
            max_attempts=2,
            seed=0,
            temperature=0.7,
            protocol_text="PROTOCOL",
        )
    message = str(error.value)
    assert "\n" not in message and isinstance(error.value, TraceRayError)
    assert "'report_values'" in message and "none of 2 generated module(s)" in message and "SyntaxError" in message
    assert "synthesis.model" in message and "synthesis.max_attempts" in message and "template" in message
    assert not (folder / "module.py").exists()
    assert (folder / "attempt_01.txt").read_text() == "I would rather not."
    log = (folder / "check_log.md").read_text()
    assert "no module in the answer: the answer has no ```python code block and is not Python itself" in log
    assert "SyntaxError" in log and "admitted" not in log
