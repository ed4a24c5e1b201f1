"""Self-checks that every environment of the protocol must pass.

- tool schemas are valid OpenAI function schemas;
- the oracle solves every task with reward exactly 1.0;
- a do-nothing agent and a wrong-action agent (the oracle's calls with every
  argument corrupted, and no facts reported) stay below 1.0 on every task,
  and they and a random-action agent (random tools with random arguments)
  stay clearly below on average (mean <= ``WEAK_MEAN``);
- the reward farmers of ``environments/adversaries.py`` (the dump agent: read
  everything, say everything; the spray agent: call every tool with values
  copied from what it saw) score near 0 (mean <= ``FARMER_MEAN``) and below
  1.0 on every task;
- every reward lies in [0, 1];
- the same seed gives the identical task; different seeds give different tasks.

A synthetic capability environment (``target_tools`` given) must also
- offer the target's tools unchanged (a subset is fine), and
- need its capability: the oracle with the turns of ``capability_turns()``
  broken scores below 1.0 on every task. A turn is broken by the
  environment's own ``broken_step`` where it gives one (the templates here:
  e.g. a reminder a day late), else by the checks: its calls' arguments
  corrupted beyond any tolerance, or its reply emptied. Model-written
  environments never choose: the sandbox answers no ``broken_step``.

``trace-ray check-env`` prints them; ``trace-ray synthesize`` admits an
environment only when all pass; the tests run them too.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from environments.adversaries import ADVERSARIES, play_adversary
from environments.protocol import Environment, Message, ResetResult, StepResult, ToolSchema
from environments.tool_environment import broken_message

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_JSON_SCHEMA_TYPES = {"string", "integer", "number", "boolean", "array", "object"}
WEAK_MEAN = 0.5  # the most a weak agent may score on average
FARMER_MEAN = 0.05  # the most a reward farmer (environments/adversaries.py) may score on average
RANDOM_TURNS = 4  # tool-call turns of the random-action agent before it replies


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


def tool_schema_mismatches(tools: list[ToolSchema], target_tools: list[ToolSchema]) -> list[str]:
    """Tools of a synthetic environment that the target lacks or defines differently."""
    target = {tool["function"]["name"]: tool["function"] for tool in target_tools}
    problems = []
    for tool in tools:
        function = tool.get("function", {})
        name = function.get("name")
        if name not in target:
            problems.append(f"tool {name!r} is not a tool of the target")
        elif function.get("parameters") != target[name].get("parameters"):
            problems.append(f"tool {name}: parameters differ from the target's")
    return problems


def play(env: Environment, seed: int, policy: Policy, max_steps: int = 100) -> tuple[float, dict[str, Any]]:
    """Run one episode with a scripted policy; (final reward, final info)."""
    env.reset(seed)
    return _finish(env, seed, policy, max_steps)


def play_recorded(
    env: Environment, seed: int, policy: Policy, max_steps: int = 100
) -> tuple[list[Message], ResetResult, StepResult]:
    """Run one episode with a scripted policy, keeping every message; (messages, the reset's result, the last
    step's)."""
    reset = env.reset(seed)
    messages = list(reset.messages)
    for _ in range(max_steps):
        action = policy(env)
        step = env.step(action)
        messages += [action, *step.messages]
        if step.done:
            return messages, reset, step
    raise RuntimeError(f"seed {seed}: episode did not end within {max_steps} steps")


def _finish(env: Environment, seed: int, policy: Policy, max_steps: int) -> tuple[float, dict[str, Any]]:
    for _ in range(max_steps):
        result = env.step(policy(env))
        if result.done:
            return result.reward, result.info
    raise RuntimeError(f"seed {seed}: episode did not end within {max_steps} steps")


def oracle(env: Environment) -> Message:
    return env.oracle_message()


def do_nothing(env: Environment) -> Message:
    return {"role": "assistant", "content": "OK."}


def wrong_action(env: Environment) -> Message:
    """The oracle's tool calls with every argument corrupted; plain replies say nothing useful."""
    return broken_message(env.oracle_message())


def play_broken_oracle(env: Environment, seed: int, max_steps: int = 100) -> tuple[float, dict[str, Any]]:
    """The oracle's script with the capability's turns broken: the messages of a clean oracle episode, replayed with
    each turn of ``capability_turns()`` replaced by ``broken_step`` or corrupted (an oracle that reads the state would
    otherwise redo the broken step right after); when the script runs out, "Done." until the episode ends."""
    messages, _, _ = play_recorded(env, seed, oracle, max_steps)
    script = [message for message in messages if message.get("role") == "assistant"]
    env.reset(seed)
    turns = set(env.capability_turns())
    broken = [
        (env.broken_step(turn) or broken_message(message)) if turn in turns else message
        for turn, message in enumerate(script)
    ]
    return _finish(env, seed, lambda env: broken.pop(0) if broken else do_nothing(env), max_steps)


def _random_value(spec: dict[str, Any], rng: random.Random) -> Any:
    if "enum" in spec:
        return rng.choice(spec["enum"])
    kind = spec.get("type")
    if kind == "boolean":
        return rng.random() < 0.5
    if kind in ("integer", "number"):
        return rng.randint(0, 2_000_000_000)
    if kind == "array":
        return [_random_value(spec.get("items", {"type": "string"}), rng) for _ in range(rng.randint(0, 2))]
    if kind == "object":
        return {}
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 ") for _ in range(rng.randint(1, 12)))


def random_action(tools: list[ToolSchema], rng: random.Random) -> Policy:
    """Random tools with random (schema-shaped) arguments for ``RANDOM_TURNS`` turns, then a short reply."""

    def policy(env: Environment) -> Message:
        if policy.turns >= RANDOM_TURNS or not tools:
            return {"role": "assistant", "content": "Done."}
        policy.turns += 1
        function = rng.choice(tools)["function"]
        properties = function.get("parameters", {}).get("properties", {})
        arguments = {name: _random_value(spec, rng) for name, spec in properties.items() if rng.random() < 0.8}
        call = {
            "id": f"call_random_{policy.turns}",
            "type": "function",
            "function": {"name": function["name"], "arguments": json.dumps(arguments)},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    policy.turns = 0
    return policy


def play_random(env: Environment, seed: int, max_steps: int = 100) -> tuple[float, dict[str, Any]]:
    tools = env.reset(seed).tools
    return _finish(env, seed, random_action(tools, random.Random(seed)), max_steps)


def _failures(seeds: list[int], failed: list[int]) -> str:
    if not failed:
        return f"{len(seeds)}/{len(seeds)} tasks"
    shown = ", ".join(str(seed) for seed in failed[:8])
    return f"{len(seeds) - len(failed)}/{len(seeds)} tasks; failing seeds: {shown}{' ...' if len(failed) > 8 else ''}"


def _weak_agent_check(
    name: str, seeds: list[int], rewards: list[float], every_task: bool, at_most: float = WEAK_MEAN
) -> CheckResult:
    """Mean reward at most ``at_most``; with ``every_task`` also below 1.0 on every task."""
    mean = sum(rewards) / len(rewards)
    if not every_task:
        return CheckResult(name, mean <= at_most, f"mean {mean:.3f} (at most {at_most})")
    failed = [seed for seed, reward in zip(seeds, rewards) if reward >= 1.0]
    return CheckResult(
        name, not failed and mean <= at_most, f"mean {mean:.3f} (at most {at_most}); " + _failures(seeds, failed)
    )


def run_self_checks(
    make_env: Callable[[], Environment],
    seeds: list[int],
    target_tools: list[ToolSchema] | None = None,
    workers: int = 1,
    on_check: Callable[[CheckResult], None] | None = None,
    on_episode: Callable[[str], None] | None = None,
    agents: list[str] | None = None,
) -> list[CheckResult]:
    """Every check on ``seeds``; ``target_tools`` marks a synthetic environment of that target.

    ``agents``: play only these of the weak agents and reward farmers (None: all); the oracle always plays, and the
    checks that play no agent (schemas, reward range, determinism) always run. An unknown name raises ValueError.

    ``workers`` episodes are played at once, each worker on its own environment from ``make_env`` (worth it where an
    episode waits on subprocesses, as code_repair's pytest runs do); the results do not depend on it. ``on_check`` gets
    each result as soon as it is decided, ``on_episode`` each agent's name as one of its episodes ends.
    """
    env = make_env()
    results: list[CheckResult] = []

    def add(result: CheckResult) -> None:
        results.append(result)
        if on_check is not None:
            on_check(result)

    tools = env.reset(seeds[0]).tools
    problems = schema_problems(tools)
    add(CheckResult("tool schemas valid", not problems, "; ".join(problems) or f"{len(tools)} tools"))
    if target_tools is not None:
        mismatches = tool_schema_mismatches(tools, target_tools)
        add(CheckResult("tools match the target's", not mismatches, "; ".join(mismatches) or f"{len(tools)} tools"))

    rewards: dict[str, list[float]] = {}
    with _EpisodePool(env, make_env, workers) as pool:

        def score(agent: str, episode: Callable[[Environment, int], float]) -> list[float]:
            rewards[agent] = pool.play(seeds, episode, (lambda: on_episode(agent)) if on_episode else None)
            return rewards[agent]

        scored = score("oracle", lambda env, seed: play(env, seed, oracle)[0])
        failed = [seed for seed, reward in zip(seeds, scored) if reward != 1.0]
        add(CheckResult("oracle scores 1.0", not failed, _failures(seeds, failed)))
        weak = [
            (agent, lambda env, seed, policy=policy: play(env, seed, policy)[0])
            for agent, policy in (("do-nothing", do_nothing), ("wrong-action", wrong_action))
        ]
        # the reward farmers of every environment, then the environment's own (each episode takes its policy from
        # the environment it plays on: a policy may keep state for its episode)
        farmers = [
            (farmer.name, lambda env, seed, farmer=farmer: play_adversary(env, seed, farmer)) for farmer in ADVERSARIES
        ]
        farmers += [
            (name, lambda env, seed, name=name: play(env, seed, dict(env.adversaries())[name])[0])
            for name, _ in env.adversaries()
        ]
        known = [name for name, _ in weak] + ["random-action"] + [name for name, _ in farmers]
        unknown = sorted(set(agents or ()) - set(known))
        if unknown:
            raise ValueError(
                f"no self-check agent named {', '.join(unknown)}; this environment's agents: {', '.join(known)}"
            )
        wanted = set(known if agents is None else agents)
        for agent, episode in weak:
            if agent in wanted:
                add(
                    _weak_agent_check(
                        f"{agent} agent scores < 1.0, mean <= {WEAK_MEAN}",
                        seeds,
                        score(agent, episode),
                        every_task=True,
                    )
                )
        # a random agent may luck into a one-bit task (a setting on or off): judged on its mean only
        if "random-action" in wanted:
            scored = score("random-action", lambda env, seed: play_random(env, seed)[0])
            add(_weak_agent_check(f"random-action agent mean <= {WEAK_MEAN}", seeds, scored, every_task=False))
        for name, episode in farmers:
            if name in wanted:
                add(
                    _weak_agent_check(
                        f"{name} agent scores < 1.0, mean <= {FARMER_MEAN}",
                        seeds,
                        score(name, episode),
                        every_task=True,
                        at_most=FARMER_MEAN,
                    )
                )
        if target_tools is not None:
            broken = score("broken-step", lambda env, seed: play_broken_oracle(env, seed)[0])
            failed = [seed for seed, reward in zip(seeds, broken) if reward >= 1.0]
            add(CheckResult("capability necessary (broken step scores < 1.0)", not failed, _failures(seeds, failed)))
    outside = sorted(
        {seed for values in rewards.values() for seed, reward in zip(seeds, values) if not 0.0 <= reward <= 1.0}
    )
    add(CheckResult("rewards within [0, 1]", not outside, _failures(seeds, outside)))

    fresh = make_env()
    differing = [seed for seed in seeds if _reset_key(env, seed) != _reset_key(fresh, seed)]
    add(CheckResult("same seed, same task", not differing, _failures(seeds, differing)))

    first_seen: dict[str, int] = {}
    duplicates = []
    for seed in seeds:
        key = _reset_key(env, seed)
        if key in first_seen:
            duplicates.append(seed)
        first_seen.setdefault(key, seed)
    add(CheckResult("different seeds, different tasks", not duplicates, _failures(seeds, duplicates)))
    return results


class _EpisodePool:
    """Threads that play episodes, each on an environment no other thread is using (one holds one episode at a time):
    the caller's first, another from ``make_env`` only when every one is busy, so at most ``workers`` in all."""

    def __init__(self, env: Environment, make_env: Callable[[], Environment], workers: int):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.make_env = make_env
        self.idle = [env]
        self.lock = threading.Lock()
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="self-check")

    def __enter__(self) -> _EpisodePool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)

    def play(
        self, seeds: list[int], episode: Callable[[Environment, int], float], on_done: Callable[[], None] | None
    ) -> list[float]:
        """``episode(env, seed)`` for every seed; the rewards in the order of ``seeds``."""

        def run(seed: int) -> float:
            with self.lock:
                env = self.idle.pop() if self.idle else self.make_env()
            try:
                return episode(env, seed)
            finally:
                with self.lock:
                    self.idle.append(env)

        futures = [self.executor.submit(run, seed) for seed in seeds]
        if on_done is not None:
            for future in as_completed(futures):
                if future.exception() is None:
                    on_done()
        return [future.result() for future in futures]


def _reset_key(env: Environment, seed: int) -> str:
    """Everything that defines the task: what the agent sees and the environment's fingerprint."""
    reset = env.reset(seed)
    info = {key: value for key, value in reset.info.items() if key not in ("seed", "task_id")}
    return json.dumps([reset.messages, reset.tools, info, env.task_fingerprint()], sort_keys=True, default=str)
