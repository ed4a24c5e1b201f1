"""Raw model text -> one OpenAI assistant message.

Accepts the chat templates' native format (``<tool_call>{json}</tool_call>``,
as Qwen and SmolLM2 write it, several per turn, the last one possibly left
unclosed), and lenient fallbacks: a fenced JSON block or a bare JSON object
(or list of objects) with a ``name``. Never raises: a call whose JSON cannot
be read is kept as a tool call with no name and the raw text as arguments,
which the environment answers with an error observation.
"""

from __future__ import annotations

import json
import re
from typing import Any

from environments.protocol import Message

_TAGGED = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_FENCED = re.compile(r"```(?:json|tool_call)?\s*(.*?)```", re.DOTALL)


def _first_json_value(text: str) -> Any:
    """The first JSON object or list in ``text`` (None if there is none)."""
    decoder = json.JSONDecoder()
    for start, char in enumerate(text):
        if char in "{[":
            try:
                value, _ = decoder.raw_decode(text, start)
                return value
            except json.JSONDecodeError:
                continue
    return None


def _as_call(value: Any) -> tuple[str, str] | None:
    """(name, JSON-string arguments) if ``value`` looks like a tool call."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        return name.strip(), arguments
    return name.strip(), json.dumps(arguments, ensure_ascii=False)


def _calls_in(value: Any) -> list[tuple[str, str]] | None:
    values = value if isinstance(value, list) else [value]
    calls = [_as_call(item) for item in values]
    if not calls or any(call is None for call in calls):
        return None
    return calls


def parse_assistant_text(text: str, turn: int = 0) -> Message:
    calls: list[tuple[str, str]] = []
    content = text
    tagged = list(_TAGGED.finditer(text))
    if tagged:
        for match in tagged:
            block = match.group(1).strip()
            value = _first_json_value(block)
            found = _calls_in(value) if value is not None else None
            calls.extend(found if found else [("", block)])
        content = _TAGGED.sub("", text)
    else:
        for match in _FENCED.finditer(text):
            found = _calls_in(_first_json_value(match.group(1)))
            if found:
                calls.extend(found)
                content = content.replace(match.group(0), "")
        if not calls and text.lstrip().startswith(("{", "[")):
            found = _calls_in(_first_json_value(text))
            if found:
                calls.extend(found)
                content = ""
    content = content.strip()
    message: Message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{turn}_{index}", "type": "function", "function": {"name": name, "arguments": arguments}}
            for index, (name, arguments) in enumerate(calls)
        ]
    elif message["content"] is None:
        message["content"] = ""
    return message
