"""The OpenAI chat-completions protocol of the routed agent: request checks, model names, replies, stream chunks,
errors.

Plain functions, no Ray and no torch: the ingress deployment
(``routed_agent.py``) checks every request with :func:`parse_chat_request`
and builds every answer here. A bad request raises :class:`RequestError`,
whose body is OpenAI's ``{"error": {"message", "type", "code"}}`` and whose
message names the cause and the fix.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass

from trace_ray.config import SamplingConfig, ServeConfig

BASE = "base"  # the adapter name a base-model answer reports (the routers' name for "no adapter")
AUTO = "auto"  # <base>:auto routes the conversation
MOE = "moe"  # <base>:moe: the LoRA mixture of experts (router=moe)
ROLES = ("system", "user", "assistant", "tool")
EXAMPLE_BODY = '{"messages": [{"role": "user", "content": "Turn on wifi"}]}'
# the request parameters this server implements; any other is refused unless it asks for the default behaviour
IMPLEMENTED = {
    "model",
    "messages",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stream",
    "n",
    "user",
    "stop",
}
MAX_STOPS = 4  # as OpenAI's API
NO_OPS = {  # parameter -> the values that ask for nothing this server does not do
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "response_format": (None, {"type": "text"}),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "parallel_tool_calls": (None, True),
    "stream_options": (None,),
    "metadata": (None, {}),
    "store": (None, False),
    "service_tier": (None, "auto", "default"),
}


class RequestError(Exception):
    """A request the server refuses: HTTP status, message (cause and fix), OpenAI error code and type."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict | None = None,
    ):
        super().__init__(status, message, code, kind, headers)  # all in args, so the error pickles across Ray processes
        self.status, self.message, self.code, self.kind, self.headers = status, message, code, kind, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code}}


@dataclass
class ChatRequest:
    model: str | None  # as sent (None: route)
    messages: list[dict]  # content as text
    tools: list[dict]  # the tools the model is shown (tool_choice applied)
    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None
    stream: bool
    stop: list[str]  # the reply ends before the first of these strings


# -- requests ---------------------------------------------------------------------------------
def _number(payload: dict, key: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = payload.get(key)
    if value is None:
        return default
    in_range = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (low < value if low_open else low <= value)
        and value <= high
    )
    if not in_range:
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise RequestError(
            400,
            f"{key}={value!r} is not a number in {bound}; send a number in that range or leave {key} out",
            f"invalid_{key}",
        )
    return float(value)


def _integer(payload: dict, key: str) -> int | None:
    value = payload.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise RequestError(
            400, f"{key}={value!r} is not an integer; send a whole number or leave {key} out", f"invalid_{key}"
        )
    return value


def _stops(value) -> list[str]:
    if value is None or value == "":
        return []
    stops = [value] if isinstance(value, str) else value
    if not (
        isinstance(stops, list) and len(stops) <= MAX_STOPS and all(isinstance(stop, str) and stop for stop in stops)
    ):
        raise RequestError(
            400,
            f"stop={json.dumps(value)[:80]} is not a string or a list of at most {MAX_STOPS} "
            "non-empty strings; "
            'send e.g. "stop": ["\\n"] or leave stop out',
            "invalid_stop",
        )
    return stops


def _text(index: int, content) -> str | None:
    """A message's content as text (OpenAI text parts joined by newlines)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        kinds = sorted(
            {part.get("type") if isinstance(part, dict) else type(part).__name__ for part in content} - {"text"}
        )
        if kinds:
            raise RequestError(
                400,
                f"messages[{index}].content has {kinds[0]!r} parts; this agent reads text only: send text parts "
                "or a string",
                "unsupported_content",
            )
        return "\n".join(str(part.get("text", "")) for part in content)
    raise RequestError(
        400,
        f"messages[{index}].content is a {type(content).__name__}; send a string or a list of text parts",
        "invalid_content",
    )


def _message(index: int, message) -> dict:
    if not isinstance(message, dict):
        raise RequestError(
            400, f'messages[{index}] is not an object; send {{"role": ..., "content": ...}}', "invalid_message"
        )
    role = "system" if message.get("role") == "developer" else message.get("role")
    if role not in ROLES:
        raise RequestError(
            400,
            f"messages[{index}].role={message.get('role')!r} is not one of {', '.join(ROLES)}; fix the role",
            "invalid_role",
        )
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(_tool_name(call) for call in calls)):
        raise RequestError(
            400,
            f"messages[{index}].tool_calls must be a list of "
            f'{{"type": "function", "function": {{"name": ..., "arguments": ...}}}}',
            "invalid_tool_calls",
        )
    return {**message, "role": role, "content": _text(index, message.get("content"))}


def _tool_name(tool) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and name else None


def _offered_tools(tools, tool_choice) -> list[dict]:
    """The tools the model is shown: all for ``auto``, none for ``none``, only the named one for a named function."""
    tools = [] if tools is None else tools
    if not isinstance(tools, list):
        raise RequestError(
            400, 'tools is not a list; send a list of {"type": "function", "function": {...}}', "invalid_tools"
        )
    for index, tool in enumerate(tools):
        if _tool_name(tool) is None:
            raise RequestError(
                400,
                f"tools[{index}] is not a function tool with a name; send "
                f'{{"type": "function", "function": {{"name": ..., '
                '"parameters": {...}}}',
                "invalid_tools",
            )
    if tool_choice in (None, "auto"):
        return tools
    if tool_choice == "none":
        return []
    if isinstance(tool_choice, dict) and isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        named = [tool for tool in tools if _tool_name(tool) == name]
        if named:
            return named
        raise RequestError(
            400,
            f"tool_choice names function {name!r}, which is not in tools; name one of the tools sent",
            "invalid_tool_choice",
        )
    raise RequestError(
        400,
        f"tool_choice={tool_choice!r} is not supported (no constrained decoding); send auto, none or "
        '{"type": "function", "function": {"name": ...}}',
        "invalid_tool_choice",
    )


def parse_chat_request(body: bytes, limits: ServeConfig, sampling: SamplingConfig) -> ChatRequest:
    """A checked chat-completions request; sampling settings default to the model's, max_tokens to
    ``limits.default_max_tokens``."""
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(
            400,
            f"the request body is not valid JSON ({exc}); send a JSON object such as {EXAMPLE_BODY}",
            "invalid_json",
        ) from None
    if not isinstance(payload, dict):
        kind = type(payload).__name__
        raise RequestError(
            400,
            f"the request body is a JSON {kind}, not an object; send an object such as {EXAMPLE_BODY}",
            "invalid_json",
        )
    unsupported = sorted(
        key for key, value in payload.items() if key not in IMPLEMENTED and value not in NO_OPS.get(key, (None,))
    )
    if unsupported:
        name = unsupported[0]
        raise RequestError(
            400,
            f"{name}={json.dumps(payload[name])[:80]} is not supported by this server (it would be ignored); "
            f"remove {name} "
            f"from the request (implemented: {', '.join(sorted(IMPLEMENTED))})",
            f"unsupported_{name}",
        )
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(
            400, f"messages is missing or empty; send at least one message, e.g. {EXAMPLE_BODY}", "missing_messages"
        )
    if payload.get("n", 1) != 1:
        raise RequestError(
            400,
            f"n={payload['n']!r} is not supported: this server returns one choice; send n=1 or leave n out",
            "unsupported_n",
        )
    model = payload.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, f"model={model!r} is not a string; send a name from GET /v1/models", "invalid_model")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, f"stream={stream!r} is not a boolean; send true or false", "invalid_stream")
    max_tokens = _integer(payload, "max_completion_tokens")
    max_tokens = _integer(payload, "max_tokens") if max_tokens is None else max_tokens
    max_tokens = limits.default_max_tokens if max_tokens is None else max_tokens
    if not 1 <= max_tokens <= limits.max_tokens_limit:
        raise RequestError(
            400,
            f"max_tokens={max_tokens} is outside this server's range 1..{limits.max_tokens_limit} "
            "(serve.max_tokens_limit); "
            "ask for fewer tokens",
            "invalid_max_tokens",
        )
    return ChatRequest(
        model=model,
        messages=[_message(index, message) for index, message in enumerate(messages)],
        tools=_offered_tools(payload.get("tools"), payload.get("tool_choice")),
        temperature=_number(payload, "temperature", sampling.temperature, 0.0, 2.0),
        top_p=_number(payload, "top_p", sampling.top_p, 0.0, 1.0, low_open=True),
        max_tokens=max_tokens,
        seed=_integer(payload, "seed"),
        stream=stream,
        stop=_stops(payload.get("stop")),
    )


# -- model names ------------------------------------------------------------------------------
def model_ids(base: str, adapters: list[str], routed: bool, moe: bool = False) -> list[str]:
    """``<base>``, ``<base>:<adapter>`` per adapter, ``<base>:moe`` when the MoE is served, ``<base>:auto`` when a
    router is."""
    return [
        base,
        *(f"{base}:{name}" for name in adapters),
        *([f"{base}:{MOE}"] if moe else []),
        *([f"{base}:{AUTO}"] if routed else []),
    ]


def resolve_model(requested: str | None, base: str, adapters: list[str], routed: bool = True, moe: bool = False) -> str:
    """The adapter a request's model names: :data:`BASE`, an adapter, :data:`MOE`, or :data:`AUTO` (omitted or
    ``<base>:auto``: route; ``<base>:auto`` is refused where no router runs, omitted means the base model there)."""
    served = ", ".join(model_ids(base, adapters, routed, moe))
    if requested == f"{base}:{AUTO}" and not routed:
        raise RequestError(
            404,
            f"model {requested!r} routes conversations, but this server runs no router (router=none); send one "
            f"of: {served}",
            "model_not_found",
        )
    if requested == f"{base}:{MOE}" and not moe:
        raise RequestError(
            404,
            f"model {requested!r} is the LoRA mixture of experts, which this server runs only with "
            "router=moe; "
            f"send one of: {served}",
            "model_not_found",
        )
    if requested in (None, "", f"{base}:{AUTO}"):
        return AUTO
    if requested == base:
        return BASE
    name = requested[len(base) + 1 :] if requested.startswith(f"{base}:") else None
    if name in adapters or name == MOE:
        return name
    raise RequestError(
        404, f"unknown model {requested!r}; send one of: {served} (GET /v1/models lists them)", "model_not_found"
    )


# -- routing keys -----------------------------------------------------------------------------
def first_observation(messages: list[dict]) -> list[dict] | None:
    """The conversation up to and including its first user message (None: it has no user message)."""
    for index, message in enumerate(messages):
        if message["role"] == "user":
            return messages[: index + 1]
    return None


def conversation_key(messages: list[dict]) -> str:
    """A hash of the system messages and the first user message: the same for every turn of one conversation."""
    head = [
        (m["role"], m["content"]) for m in first_observation(messages) or messages if m["role"] in ("system", "user")
    ]
    return hashlib.sha256(json.dumps(head).encode()).hexdigest()


# -- replies ----------------------------------------------------------------------------------
def reply_message(parsed: dict, text: str, tools_offered: bool) -> dict:
    """The assistant message a client gets from a reply parsed by the agent prompt.

    Tool calls in OpenAI format when tools were offered and every call could
    be read; otherwise the reply's text (an unreadable call stays visible as text).
    """
    calls = parsed.get("tool_calls") or []
    if tools_offered and calls and all(call["function"]["name"] for call in calls):
        return {
            "role": "assistant",
            "content": parsed.get("content"),
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
                }
                for call in calls
            ],
        }
    return {"role": "assistant", "content": text.strip()}


def chat_completion(
    reply: dict, finish_reason: str, model: str, adapter: str, prompt_tokens: int, completion_tokens: int
) -> dict:
    """A ``chat.completion`` object; ``finish_reason`` is ``tool_calls`` whenever the reply calls tools."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "adapter": adapter,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": "tool_calls" if reply.get("tool_calls") else finish_reason,
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class ReplyText:
    """What a client may be shown of a reply while it is generated, one decoded text at a time.

    ``update(text)`` takes the reply's whole text so far and returns what is
    new to send: the text cut before the first stop string (``stopped`` is
    then set), without leading whitespace, holding back what the finished
    reply could still drop: trailing whitespace (replies are stripped), an
    ending that may begin a stop string, a half-decoded character, and, when
    tools are offered, everything from where a tool call could begin (its
    tag or fence, or a reply opening with JSON). ``sent`` is what was shown.
    """

    CALL_MARKERS = ("<", "`")

    def __init__(self, stops: list[str], tools_offered: bool):
        self.stops, self.tools_offered = stops, tools_offered
        self.text, self.sent, self.stopped = "", "", False

    def cut(self, text: str) -> tuple[str, bool]:
        """``text`` before its first stop string, and whether it had one."""
        cuts = [text.find(stop) for stop in self.stops if stop in text]
        return (text[: min(cuts)], True) if cuts else (text, False)

    def update(self, text: str) -> str:
        self.text, self.stopped = self.cut(text)
        shown = self._safe(self.text.lstrip())
        if not shown.startswith(self.sent):
            return ""
        delta, self.sent = shown[len(self.sent) :], shown
        return delta

    def _safe(self, visible: str) -> str:
        if self.tools_offered:
            if visible.startswith(("{", "[")):
                return ""
            starts = [visible.find(marker) for marker in self.CALL_MARKERS if marker in visible]
            visible = visible[: min(starts)] if starts else visible
        if not self.stopped:
            held = max((n for stop in self.stops for n in range(1, len(stop)) if visible.endswith(stop[:n])), default=0)
            visible = visible[: len(visible) - held]
        return visible.split("\ufffd", 1)[0].rstrip()


def _chunk(head: dict, delta: dict, finish_reason: str | None = None) -> dict:
    return {
        **head,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def stream_head(model: str, adapter: str) -> dict:
    """The fields every chunk of one streamed completion shares."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model, "adapter": adapter}


def first_chunk(head: dict) -> dict:
    return _chunk(head, {"role": "assistant", "content": ""})


def content_chunk(head: dict, text: str) -> dict:
    return _chunk(head, {"content": text})


def closing_chunks(head: dict, reply: dict, finish_reason: str, sent: str) -> list[dict]:
    """The chunks after the text ``sent`` so far: the rest of the content, one per tool call, the finish reason."""
    content = reply.get("content") or ""
    rest = content[len(sent) :] if content.startswith(sent) else ""
    chunks = [content_chunk(head, rest)] if rest else []
    chunks += [
        _chunk(head, {"tool_calls": [{"index": index, **call}]})
        for index, call in enumerate(reply.get("tool_calls") or [])
    ]
    return chunks + [_chunk(head, {}, "tool_calls" if reply.get("tool_calls") else finish_reason)]


def server_sent_event(chunk: dict) -> str:
    return f"data: {json.dumps(chunk)}\n\n"


STREAM_END = "data: [DONE]\n\n"
