"""Shared machinery for environments whose actions are OpenAI tool calls.

:class:`ToolEnvironment` implements ``step`` once for every tool-using
environment: it decodes and validates each tool call against the tool's
JSON schema, runs it, turns every failure (unknown tool, malformed JSON,
wrong argument, a tool's own error) into an error observation for the agent,
enforces the turn and per-turn tool-call limits, and scores the episode when
it ends. Subclasses provide the task (``start_episode``), the tools, the
user's side of the conversation (``on_agent_reply``) and the score.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from environments.protocol import Environment, Message, ResetResult, StepResult, ToolSchema

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


class ToolError(Exception):
    """A tool's own failure, shown to the agent as the tool's result."""


@dataclass
class Tool:
    """An OpenAI function tool and the Python callable that executes it."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]

    @property
    def schema(self) -> ToolSchema:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class ToolCallRecord:
    """One executed (or rejected) tool call, in episode order."""

    turn: int
    name: str
    arguments: dict[str, Any] | None
    ok: bool
    result: str


@dataclass
class EpisodeLog:
    turns: int = 0
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    termination: str | None = None

    @property
    def tool_errors(self) -> list[ToolCallRecord]:
        return [call for call in self.tool_calls if not call.ok]


def check_arguments(arguments: Any, parameters: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the JSON schema ``parameters`` (None if they do)."""
    if not isinstance(arguments, dict):
        return "arguments must be a JSON object"
    properties = parameters.get("properties", {})
    unknown = sorted(set(arguments) - set(properties))
    if unknown:
        return f"unknown argument(s) {', '.join(unknown)}; expected {', '.join(properties) or 'none'}"
    missing = [name for name in parameters.get("required", []) if name not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(missing)}"
    for name, value in arguments.items():
        spec = properties[name]
        expected = spec.get("type")
        if expected in _JSON_TYPES:
            ok = isinstance(value, _JSON_TYPES[expected])
            if expected in ("integer", "number") and isinstance(value, bool):
                ok = False
            if expected == "integer" and isinstance(value, float) and value.is_integer():
                ok = True
            if not ok:
                return f"argument {name} must be of type {expected}, got {json.dumps(value)}"
        if "enum" in spec and value not in spec["enum"]:
            return f"argument {name} must be one of {spec['enum']}, got {json.dumps(value)}"
    return None


def corrupt(value: Any) -> Any:
    """A wrong value of the same shape: booleans flipped, strings reversed, numbers shifted beyond any tolerance a
    grader may allow (by 7, and by a thousandth of their size: a timestamp moves by weeks, a price by 7)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7 + abs(value) // 1000
    if isinstance(value, str):
        return value[::-1] if value != value[::-1] else value + "zzz"
    if isinstance(value, list):
        return [corrupt(item) for item in value]
    if isinstance(value, dict):
        return {key: corrupt(item) for key, item in value.items()}
    return value


def broken_message(message: Message) -> Message:
    """``message`` done wrong: every tool call's arguments corrupted, or a reply that tells nothing."""
    calls = message.get("tool_calls") or []
    if not calls:
        return {"role": "assistant", "content": "Done."}
    broken = []
    for call in calls:
        arguments = json.loads(call["function"]["arguments"] or "{}")
        broken.append({**call, "function": {**call["function"], "arguments": json.dumps(corrupt(arguments))}})
    return {"role": "assistant", "content": None, "tool_calls": broken}


def format_tool_result(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


class ToolEnvironment(Environment):
    def __init__(self, max_turns: int = 50, max_tool_calls_per_turn: int = 8):
        if max_turns < 1 or max_tool_calls_per_turn < 1:
            raise ValueError("max_turns and max_tool_calls_per_turn must be >= 1")
        self.max_turns = max_turns
        self.max_tool_calls_per_turn = max_tool_calls_per_turn
        self.log = EpisodeLog()
        self._tools: dict[str, Tool] = {}
        self._done = True

    # -- what a subclass provides -------------------------------------------------
    @abc.abstractmethod
    def start_episode(self, seed: int) -> tuple[list[Message], list[Tool], dict[str, Any]]:
        """Build the task for ``seed``: initial messages, its tools, reset info."""

    @abc.abstractmethod
    def on_agent_reply(self, text: str) -> tuple[list[Message], bool]:
        """The user's answer to a plain-text agent turn, and whether the episode ends."""

    @abc.abstractmethod
    def score(self) -> tuple[float, dict[str, Any]]:
        """Reward in [0, 1] of the episode so far, and its breakdown for ``info``."""

    # -- the protocol ---------------------------------------------------------------
    def reset(self, seed: int) -> ResetResult:
        messages, tools, info = self.start_episode(seed)
        self._tools = {tool.name: tool for tool in tools}
        self.log = EpisodeLog()
        self._done = False
        return ResetResult(messages=messages, tools=[tool.schema for tool in tools], info=info)

    def step(self, assistant_message: Message) -> StepResult:
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset(seed) first")
        self.log.turns += 1
        tool_calls = assistant_message.get("tool_calls") or []
        if tool_calls:
            messages = [self._run_tool_call(index, call) for index, call in enumerate(tool_calls)]
            done = False
        else:
            text = assistant_message.get("content") or ""
            self.log.replies.append(text)
            messages, done = self.on_agent_reply(text)
            if done:
                self.log.termination = "agent_reply"
        if not done and self.log.turns >= self.max_turns:
            done = True
            self.log.termination = "max_turns"
        turn_errors = [
            {"name": call.name, "error": call.result}
            for call in self.log.tool_calls
            if call.turn == self.log.turns and not call.ok
        ]
        info: dict[str, Any] = {"turn": self.log.turns, "tool_errors": turn_errors}
        reward = 0.0
        if done:
            self._done = True
            reward, breakdown = self.score()
            info.update(breakdown, termination=self.log.termination)
        return StepResult(messages=messages, reward=reward, done=done, info=info)

    def end_early(self, result: StepResult, termination: str) -> StepResult:
        """End the episode at this step for a reason of the subclass (a submit tool, too many errors): scored now."""
        self._done = True
        self.log.termination = termination
        reward, breakdown = self.score()
        result.info.update(breakdown, termination=termination)
        return StepResult(messages=result.messages, reward=reward, done=True, info=result.info)

    def _run_tool_call(self, index: int, call: Message) -> Message:
        call_id = call.get("id") or f"call_{self.log.turns}_{index}"
        function = call.get("function") or {}
        name = function.get("name") or ""
        raw_arguments = function.get("arguments")
        arguments: dict[str, Any] | None = None
        if index >= self.max_tool_calls_per_turn:
            error = f"too many tool calls in one turn; at most {self.max_tool_calls_per_turn} run per turn"
        elif name not in self._tools:
            known = ", ".join(sorted(self._tools))
            error = f"unknown tool {name!r}; available tools: {known}" if name else "malformed tool call: no tool name"
        else:
            error = None
            if isinstance(raw_arguments, str):
                try:
                    raw_arguments = json.loads(raw_arguments) if raw_arguments.strip() else {}
                except json.JSONDecodeError as exc:
                    error = f"arguments are not valid JSON ({exc.msg} at position {exc.pos})"
            elif raw_arguments is None:
                raw_arguments = {}
            if error is None:
                error = check_arguments(raw_arguments, self._tools[name].parameters)
            if error is None:
                arguments = raw_arguments
                try:
                    result = format_tool_result(self._tools[name].fn(**arguments))
                except ToolError as exc:
                    error = str(exc)
        if error is None:
            record = ToolCallRecord(self.log.turns, name, arguments, True, result)
        else:
            record = ToolCallRecord(self.log.turns, name, arguments, False, f"Error: {error}")
        self.log.tool_calls.append(record)
        return {"role": "tool", "tool_call_id": call_id, "name": name, "content": record.result}
