"""The agent prompt: one renderer and parser shared by collection, training,
evaluation and serving, so that what is trained is what is served.

It renders the environment's messages (system policy + conversation), its
tool schemas and a worked example of the tool-call format into the model's
chat template, and parses the model's raw reply back into an OpenAI
assistant message. Two renderings:

- ``native``: the chat template renders ``tools=`` itself (Qwen3 and other
  tool-aware templates);
- ``text``: for templates without tool support (SmolLM2): the tools are
  listed compactly in the system message, one line each, with the exact
  ``<tool_call>`` format; assistant tool calls become ``<tool_call>`` text.
"""

from __future__ import annotations

import json
from typing import Any

from environments.protocol import Message, ToolSchema
from trace_ray.tool_call_parser import parse_assistant_text

TOOL_CALL_INSTRUCTIONS = (
    "To call a tool, answer with only:\n"
    '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>\n'
    "You will get the tool's result. When the request is done, reply to the user in plain text."
)


def template_supports_tools(tokenizer) -> bool:
    return "tools" in (tokenizer.chat_template or "")


def _type_label(spec: dict[str, Any]) -> str:
    if "enum" in spec:
        return "|".join(json.dumps(value) for value in spec["enum"])
    return str(spec.get("type", "any"))


def render_tool_line(schema: ToolSchema) -> str:
    """``- name(arg: type, optional?: type): description`` — compact, one line per tool."""
    function = schema["function"]
    parameters = function.get("parameters", {})
    required = set(parameters.get("required", []))
    arguments = ", ".join(
        f"{name}{'' if name in required else '?'}: {_type_label(spec)}"
        for name, spec in parameters.get("properties", {}).items()
    )
    return f"- {function['name']}({arguments}): {function.get('description', '').strip()}"


def render_tool_call(name: str, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {arguments}}}</tool_call>'
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


def assistant_text(message: Message) -> str:
    """An assistant message as the raw text a text-format model writes."""
    parts = [message["content"]] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        parts.append(render_tool_call(call["function"]["name"], call["function"].get("arguments", {})))
    return "\n".join(parts)


def _with_dict_arguments(message: Message) -> Message:
    """Native templates expect tool-call arguments as objects, not JSON strings."""
    calls = []
    for call in message.get("tool_calls") or []:
        arguments = call["function"].get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        calls.append({**call, "function": {**call["function"], "arguments": arguments}})
    return {**message, "tool_calls": calls} if calls else message


class AgentPrompt:
    def __init__(self, tokenizer, tool_format: str = "auto", show_example: bool = True):
        self.tokenizer = tokenizer
        self.native = tool_format == "native" or (tool_format == "auto" and template_supports_tools(tokenizer))
        self.show_example = show_example

    def chat(self, messages: list[Message], tools: list[ToolSchema], example: list[Message]) -> list[Message]:
        """The messages handed to the chat template: system, example, conversation."""
        system, conversation = (messages[0], messages[1:]) if messages and messages[0]["role"] == "system" else (None, messages)
        shown = list(example) if self.show_example else []
        if self.native:
            head = [system] if system else []
            return head + [_with_dict_arguments(message) for message in shown + conversation]
        tool_lines = "\n".join(render_tool_line(schema) for schema in tools)
        policy = system["content"] if system else ""
        system_text = f"{policy}\n\n# Tools\n{tool_lines}\n\n{TOOL_CALL_INSTRUCTIONS}".strip()
        rendered = [{"role": "system", "content": system_text}]
        for message in shown + conversation:
            if message["role"] == "assistant":
                rendered.append({"role": "assistant", "content": assistant_text(message)})
            else:
                rendered.append({"role": message["role"], "content": message.get("content") or ""})
        return rendered

    def prompt_ids(self, messages: list[Message], tools: list[ToolSchema], example: list[Message]) -> list[int]:
        chat = self.chat(messages, tools, example)
        encoded = self.tokenizer.apply_chat_template(
            chat, tools=tools if self.native else None, add_generation_prompt=True, tokenize=True
        )
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    def parse(self, token_ids: list[int], turn: int = 0) -> Message:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        return parse_assistant_text(text, turn=turn)
