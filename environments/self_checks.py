"""Self-checks that every environment of the protocol must pass.

- tool schemas are valid OpenAI function schemas;
- the oracle solves every task with reward exactly 1.0;
- a do-nothing agent and a wrong-action agent (the oracle's calls with every
  argument corrupted, and no facts reported) stay below 1.0 on every task;
- the same seed gives the identical task; different seeds give different tasks.

``trace-ray check-env`` prints them; the tests run them too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from environments.protocol import Environment, Message, ToolSchema

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_JSON_SCHEMA_TYPES = {"string", "integer", "number", "boolean", "array", "object"}


@dataclass
class CheckResult:
    name: str
    passed: bool
    detail: str


Policy = Callable[[Environment], Message]


def schema_problems(tools: list[ToolSchema]) -> list[str]:
    problems, names = [], set()
    for tool in tools:
        function = tool.get("function", {}) if tool.get("type") == "function" else {}
        name = function.get("name", "")
        if not _TOOL_NAME.match(name or ""):
            problems.append(f"tool {name!r}: type must be 'function' with a name of [A-Za-z0-9_-]{{1,64}}")
            continue
        if name in names:
            problems.append(f"tool {name}: defined twice")
        names.add(name)
        if not function.get("description"):
            problems.append(f"tool {name}: no description")
        parameters = function.get("parameters", {})
        properties = parameters.get("properties", {})
        if parameters.get("type") != "object" or not isinstance(properties, dict):
            problems.append(f"tool {name}: parameters must be an object schema with properties")
            continue
        for argument, spec in properties.items():
            if spec.get("type") not in _JSON_SCHEMA_TYPES and "enum" not in spec:
                problems.append(f"tool {name}: argument {argument} has no valid type")
        missing = set(parameters.get("required", [])) - set(properties)
        if missing:
            problems.append(f"tool {name}: required {sorted(missing)} not among properties")
    return problems


def play(env: Environment, seed: int, policy: Policy, max_steps: int = 100) -> tuple[float, dict[str, Any]]:
    """Run one episode with a scripted policy; (final reward, final info)."""
    env.reset(seed)
    for _ in range(max_steps):
        result = env.step(policy(env))
        if result.done:
            return result.reward, result.info
    raise RuntimeError(f"seed {seed}: episode did not end within {max_steps} steps")


def oracle(env: Environment) -> Message:
    return env.oracle_message()


def do_nothing(env: Environment) -> Message:
    return {"role": "assistant", "content": "OK."}


def _corrupt(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7
    if isinstance(value, str):
        return value[::-1] if value != value[::-1] else value + "zzz"
    if isinstance(value, list):
        return [_corrupt(item) for item in value]
    if isinstance(value, dict):
        return {key: _corrupt(item) for key, item in value.items()}
    return value


def wrong_action(env: Environment) -> Message:
    """The oracle's tool calls with every argument corrupted; plain replies say nothing useful."""
    message = env.oracle_message()
    calls = message.get("tool_calls") or []
    if not calls:
        return {"role": "assistant", "content": "Done."}
    corrupted = []
    for call in calls:
        arguments = json.loads(call["function"]["arguments"] or "{}")
        function = {**call["function"], "arguments": json.dumps(_corrupt(arguments))}
        corrupted.append({**call, "function": function})
    return {"role": "assistant", "content": None, "tool_calls": corrupted}


def _failures(seeds: list[int], failed: list[int]) -> str:
    if not failed:
        return f"{len(seeds)}/{len(seeds)} tasks"
    shown = ", ".join(str(seed) for seed in failed[:8])
    return f"{len(seeds) - len(failed)}/{len(seeds)} tasks; failing seeds: {shown}{' ...' if len(failed) > 8 else ''}"


def run_self_checks(make_env: Callable[[], Environment], seeds: list[int]) -> list[CheckResult]:
    env = make_env()
    results = []

    tools = env.reset(seeds[0]).tools
    problems = schema_problems(tools)
    results.append(CheckResult("tool schemas valid", not problems, "; ".join(problems) or f"{len(tools)} tools"))

    for name, policy, wanted in (
        ("oracle scores 1.0", oracle, lambda reward: reward == 1.0),
        ("do-nothing agent scores < 1.0", do_nothing, lambda reward: reward < 1.0),
        ("wrong-action agent scores < 1.0", wrong_action, lambda reward: reward < 1.0),
    ):
        failed = [seed for seed in seeds if not wanted(play(env, seed, policy)[0])]
        results.append(CheckResult(name, not failed, _failures(seeds, failed)))

    fresh = make_env()
    differing = [seed for seed in seeds if _reset_key(env, seed) != _reset_key(fresh, seed)]
    results.append(CheckResult("same seed, same task", not differing, _failures(seeds, differing)))

    first_seen: dict[str, int] = {}
    duplicates = []
    for seed in seeds:
        key = _reset_key(env, seed)
        if key in first_seen:
            duplicates.append(seed)
        first_seen.setdefault(key, seed)
    results.append(CheckResult("different seeds, different tasks", not duplicates, _failures(seeds, duplicates)))
    return results


def _reset_key(env: Environment, seed: int) -> str:
    """Everything that defines the task: what the agent sees and the environment's fingerprint."""
    reset = env.reset(seed)
    info = {key: value for key, value in reset.info.items() if key not in ("seed", "task_id")}
    return json.dumps([reset.messages, reset.tools, info, env.task_fingerprint()], sort_keys=True, default=str)
