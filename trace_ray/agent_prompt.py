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

Multi-turn rollouts are token-in/token-out: the next prompt is the previous
one, the sampled tokens verbatim, then :meth:`AgentPrompt.continuation_ids`.
That renders only the turn's new messages, after a fixed conversation that
ends with an assistant turn, so earlier turns are never rendered again: a
template that rewrites them (Qwen3 drops earlier ``<think>`` blocks) cannot
break a rollout, and a turn costs the same however long the episode is.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from environments.errors import TraceRayError
from environments.protocol import Message, ToolSchema
from trace_ray.tool_call_parser import parse_assistant_text

# Concrete names, not placeholders: the embedded model copies placeholders literally (measured).
TOOL_CALL_INSTRUCTIONS = (
    "To call a tool, answer with only:\n"
    '<tool_call>{"name": "tool_name", "arguments": {"argument_name": "value"}}</tool_call>\n'
    "You will get the tool's result. When the request is done, reply to the user in plain text."
)

_SENTINEL = "\u2063TRACE_SENTINEL\u2063"
# The fixed conversation each turn's new messages are rendered after; the text past the sentinel is theirs.
_TURN_PREFIX: list[Message] = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]


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
    """An assistant message as the raw text a text-format model writes.

    A parsed model reply keeps the exact text the model wrote in ``raw_text``,
    so rendering it again reproduces what was sampled.
    """
    if "raw_text" in message:
        return message["raw_text"]
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

    @classmethod
    def for_model(cls, model, tokenizer) -> AgentPrompt:
        """The prompt configured by a ``ModelConfig``'s ``prompt`` section."""
        return cls(tokenizer, tool_format=model.prompt.tool_format, show_example=model.prompt.show_example)

    def chat(self, messages: list[Message], tools: list[ToolSchema], example: list[Message]) -> list[Message]:
        """The messages handed to the chat template: system, example, conversation."""
        system, conversation = (
            (messages[0], messages[1:]) if messages and messages[0]["role"] == "system" else (None, messages)
        )
        shown = list(example) if self.show_example else []
        if self.native:
            head = [system] if system else []
        else:
            policy = system["content"] if system else ""
            if tools:
                tool_lines = "\n".join(render_tool_line(schema) for schema in tools)
                system_text = f"{policy}\n\n# Tools\n{tool_lines}\n\n{TOOL_CALL_INSTRUCTIONS}".strip()
            else:  # a plain chat (a served request without tools): no tool section, no tool-call format
                system_text = policy
            head = [{"role": "system", "content": system_text}] if system_text else []
        return head + [self._template_message(message) for message in shown + conversation]

    def _template_message(self, message: Message) -> Message:
        """One conversation message as the chat template gets it."""
        if self.native:
            return _with_dict_arguments(message)
        if message["role"] == "assistant":
            return {"role": "assistant", "content": assistant_text(message)}
        return {"role": message["role"], "content": message.get("content") or ""}

    def prompt_ids(self, messages: list[Message], tools: list[ToolSchema], example: list[Message]) -> list[int]:
        """The first prompt of an episode, ending with the assistant generation header."""
        encoded = self.tokenizer.apply_chat_template(
            self.chat(messages, tools, example),
            tools=tools if self.native else None,
            add_generation_prompt=True,
            tokenize=True,
        )
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    @functools.cached_property
    def _closing_text(self) -> str:
        """What the template writes after an assistant turn's text (``<|im_end|>\n`` in ChatML)."""
        text = self.tokenizer.apply_chat_template(_TURN_PREFIX, tokenize=False)
        return text[text.rindex(_SENTINEL) + len(_SENTINEL) :]

    @functools.cached_property
    def assistant_closing_ids(self) -> list[int]:
        """The closing's tokens; a reply that ends with the first of them (end of turn) was closed by the model."""
        return self.tokenizer.encode(self._closing_text, add_special_tokens=False)

    def continuation_ids(
        self, new_messages: list[Message], tools: list[ToolSchema], sampled_ids: list[int]
    ) -> list[int]:
        """The tokens that follow the sampled reply before the next generation.

        ``new_messages`` are the environment's answer to the reply (tool
        results, the user's reply). Returns the rest of the assistant turn's
        closing (what the template writes after the reply that the model did
        not sample) plus the rendering of the new messages and the generation
        header, both cut from a rendering of the new messages after
        ``_TURN_PREFIX``. The cut is checked: the prefix's assistant turn must
        end exactly as it does with nothing after it.
        """
        chat = _TURN_PREFIX + [self._template_message(message) for message in new_messages]
        text = self.tokenizer.apply_chat_template(
            chat, tools=tools if self.native else None, add_generation_prompt=True, tokenize=False
        )
        cut = text.find(_SENTINEL + self._closing_text)
        if cut < 0 or text.count(_SENTINEL) != 1:
            raise TraceRayError(
                f"the chat template of {self.tokenizer.name_or_path} does not keep an assistant turn's text followed "
                "by "
                f"{self._closing_text!r} when messages follow it, so multi-turn rollouts cannot extend the sampled "
                "tokens; use a chat template that ends every assistant turn the same way"
            )
        rest = text[cut + len(_SENTINEL) + len(self._closing_text) :]
        closing = self.assistant_closing_ids
        ended_with_closing = bool(closing) and sampled_ids[-1:] == closing[:1]
        return (closing[1:] if ended_with_closing else closing) + self.tokenizer.encode(rest, add_special_tokens=False)

    def parse(self, token_ids: list[int], turn: int = 0) -> Message:
        return self.parse_text(self.tokenizer.decode(token_ids, skip_special_tokens=True), turn)

    def parse_text(self, text: str, turn: int = 0) -> Message:
        """The assistant message of a reply's decoded text (``parse`` of its tokens)."""
        message = parse_assistant_text(text, turn=turn)
        if not self.native:
            message["raw_text"] = text
        return message
