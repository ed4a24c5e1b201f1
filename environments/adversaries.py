"""Reward farmers: agents that know nothing about the task but try to collect its reward anyway.

Every environment's self-checks play them (``environments/self_checks.py``)
and require them to score near 0 on average and below 1.0 on every task:

- :class:`DumpAgent` reads everything it can without task-specific arguments
  (every tool that needs no argument), then replies with every observation
  (the request and every tool result) plus distractors of every kind a grader
  may look for: all weekdays and months, every calendar date, numbers, clock
  times, amounts, yes/no, on/off.
- :class:`SprayAgent` reads like the dump agent, then calls every tool with
  arguments copied from what it has seen (values under the argument's own
  name first, else any seen value of the argument's type; booleans both
  ways), and finally replies like the dump agent.

Both see only what the protocol shows an agent: the reset's messages and
tools, and the messages each step returns.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from environments.protocol import Environment, Message, ResetResult, ToolSchema

WEEKDAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTH_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
CALLS_PER_TURN = 6  # tool calls the agents put in one message (below every environment's per-turn limit)
VARIANTS_PER_TOOL = 6  # argument sets the spray agent tries per tool
MAX_STEPS = 200  # a bound on one adversarial episode


def distractors() -> list[str]:
    """Every kind of value a grader may look for, each value once."""
    words = [*WEEKDAY_NAMES, *MONTH_NAMES, "yes", "no", "true", "false", "on", "off", "none", "noon", "midnight"]
    dates = [f"{month} {day}" for month in MONTH_NAMES for day in range(1, 32)]
    numbers = [str(number) for number in range(0, 101)]
    clock = [
        f"{hour}:{minute:02d} {half}" for half in ("am", "pm") for hour in range(1, 13) for minute in (0, 15, 30, 45)
    ]
    clock += [f"{hour:02d}:{minute:02d}" for hour in range(24) for minute in (0, 15, 30, 45)]
    amounts = [f"${amount}.00" for amount in (*range(0, 101, 5), 150, 200, 250, 500, 1000)]
    return words + dates + numbers + clock + amounts


def _call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _required(tool: ToolSchema) -> list[str]:
    return list(tool["function"].get("parameters", {}).get("required", []))


def _walk(value: Any, key: str | None = None) -> Iterator[tuple[str | None, Any]]:
    """Every (key, scalar) pair of a JSON value, nested ones included."""
    if isinstance(value, dict):
        for inner_key, inner in value.items():
            yield from _walk(inner, inner_key)
    elif isinstance(value, list):
        for inner in value:
            yield from _walk(inner, key)
    elif value is not None:
        yield key, value


_PHONE = re.compile(r"\+?\(?\d[\d\s().\-]{5,}\d")
_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.])")
_NAME = re.compile(r"\b[A-Z][a-z]+(?: [A-Z][a-z]+)+\b")
_IDENTIFIER = re.compile(r"#?\b(?:(?=\w*[\d_])\w{4,}|[A-Z]{5,})\b")  # user ids, order and reservation numbers, codes


class _Observer:
    """Keeps every observation and the (key, value) pairs found in them."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.pairs: list[tuple[str | None, Any]] = []

    def see(self, messages: list[Message]) -> None:
        for message in messages:
            content = message.get("content")
            if not isinstance(content, str) or not content or message.get("role") == "system":
                continue
            self.texts.append(content)
            try:
                self.pairs += list(_walk(json.loads(content)))
            except (json.JSONDecodeError, ValueError):
                text_values = [*_PHONE.findall(content), *_NAME.findall(content), *_IDENTIFIER.findall(content)]
                self.pairs += [(None, value.strip()) for value in text_values]
                self.pairs += [(None, int(number)) for number in _NUMBER.findall(content)]

    def reply(self) -> Message:
        return {"role": "assistant", "content": "\n".join([*self.texts, *distractors()])}


class DumpAgent:
    """Reads with every argument-free tool, one call at a time, then says everything it saw and every distractor."""

    name = "dump"

    def __init__(self, reset: ResetResult):
        self.observer = _Observer()
        self.observer.see(reset.messages)
        self.pending = [
            _call(tool["function"]["name"], {}, f"call_dump_{index}")
            for index, tool in enumerate(reset.tools)
            if not _required(tool)
        ]

    def act(self, observed: list[Message]) -> Message:
        self.observer.see(observed)
        if self.pending:
            batch, self.pending = self.pending[:CALLS_PER_TURN], self.pending[CALLS_PER_TURN:]
            return {"role": "assistant", "content": None, "tool_calls": batch}
        return self.observer.reply()


class SprayAgent(DumpAgent):
    """The dump agent's reads, then every tool with arguments copied from the observations, then the dump's reply."""

    name = "spray"

    def __init__(self, reset: ResetResult):
        super().__init__(reset)
        self.tools = reset.tools
        self.sprayed = False

    def act(self, observed: list[Message]) -> Message:
        self.observer.see(observed)
        if not self.pending and not self.sprayed:
            self.sprayed = True
            self.pending = [
                _call(name, arguments, f"call_spray_{index}")
                for index, (name, arguments) in enumerate(self.spray_calls())
            ]
        return super().act([])

    def spray_calls(self) -> list[tuple[str, dict[str, Any]]]:
        calls = []
        for tool in self.tools:
            function = tool["function"]
            properties = function.get("parameters", {}).get("properties", {})
            choices = {name: self._candidates(name, spec) for name, spec in properties.items()}
            if any(not choices[name] for name in _required(tool) if name in choices):
                continue
            for variant in range(VARIANTS_PER_TOOL):
                arguments = {name: values[variant % len(values)] for name, values in choices.items() if values}
                if (function["name"], arguments) not in calls:
                    calls.append((function["name"], arguments))
        return calls

    def _candidates(self, name: str, spec: dict[str, Any]) -> list[Any]:
        """Seen values for argument ``name``: those seen under that key first, then any of its type."""
        kind = spec.get("type")
        if "enum" in spec:
            return list(spec["enum"])
        if kind == "boolean":
            return [True, False]

        def fits(value: Any) -> bool:
            if kind == "string":
                return isinstance(value, str)
            if kind in ("integer", "number"):
                return isinstance(value, (int, float)) and not isinstance(value, bool)
            return False

        keyed = [value for key, value in self.observer.pairs if key == name and fits(value)]
        anywhere = [value for _, value in self.observer.pairs if fits(value)]
        unique: list[Any] = []
        for value in keyed + anywhere:
            if value not in unique:
                unique.append(value)
        return unique[:VARIANTS_PER_TOOL]


ADVERSARIES = (DumpAgent, SprayAgent)


def play_adversary(env: Environment, seed: int, agent_class: type[DumpAgent]) -> float:
    """One episode of an adversary; its final reward."""
    reset = env.reset(seed)
    agent = agent_class(reset)
    observed: list[Message] = []
    for _ in range(MAX_STEPS):
        step = env.step(agent.act(observed))
        if step.done:
            return step.reward
        observed = step.messages
    raise RuntimeError(f"seed {seed}: the {agent_class.name} agent's episode did not end within {MAX_STEPS} steps")
