"""The judge of a task's natural-language assertions (``env.judge``): any model behind a :class:`Responder`.

τ²-bench grades NL assertions with an LLM; its own grader needs litellm, so
the prompt here is our own: the conversation, the numbered assertions, and
a JSON answer with one verdict per assertion, in order.
"""

from __future__ import annotations

import json
from typing import Any

from environments.responder import Responder

SYSTEM_PROMPT = (
    "You grade a conversation between a customer-service agent and a customer against expected outcomes. "
    "Grade each expected outcome on its own, from what the agent said and did. Answer with a JSON object "
    '{"results": [{"met": true or false, "reason": "<one sentence>"}]} holding one result per expected outcome, in the '
    "given order."
)


def render_conversation(trajectory: list[Any]) -> str:
    """One line per message of the package's message list; tool calls shown as name(arguments)."""
    lines = []
    for message in trajectory:
        if message.role == "tool":
            lines.append(f"tool result: {message.content}")
            continue
        if message.content:
            lines.append(f"{message.role}: {message.content}")
        for call in getattr(message, "tool_calls", None) or []:
            lines.append(f"{message.role} calls {call.name}({json.dumps(call.arguments, sort_keys=True)})")
    return "\n".join(lines)


class NLAssertionJudge:
    def __init__(self, client: Responder):
        self.client = client

    def check(self, assertions: list[str], trajectory: list[Any]) -> list[dict[str, Any]] | None:
        """One ``{"assertion", "met", "reason"}`` per assertion, or None when the answer is not the requested JSON."""
        outcomes = "\n".join(f"{index}. {assertion}" for index, assertion in enumerate(assertions, 1))
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {
                "role": "user",
                "content": f"Conversation:\n{render_conversation(trajectory)}\n\nExpected outcomes:\n{outcomes}",
            },
        ]
        answer = self.client.chat(messages, seed=0, temperature=0.0)
        try:
            results = json.loads(answer)["results"]
        except (json.JSONDecodeError, KeyError, TypeError):
            return None
        if not isinstance(results, list) or len(results) != len(assertions):
            return None
        if not all(isinstance(result, dict) and isinstance(result.get("met"), bool) for result in results):
            return None
        return [
            {"assertion": assertion, "met": result["met"], "reason": str(result.get("reason", ""))}
            for assertion, result in zip(assertions, results)
        ]
