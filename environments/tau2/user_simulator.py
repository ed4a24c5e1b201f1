"""The task's user, one of three kinds (``env.user.kind``).

- ``scripted``: deterministic, for tests and gold replay. It opens with the
  scenario's reason for calling and known info; it answers a request to
  confirm with a yes and any other question with its known info; it ends
  with ``###TRANSFER###`` after the agent transferred it to a human agent,
  and with ``###STOP###`` when the agent's reply asks nothing (the task is
  done) or after ``SCRIPTED_USER_TURNS`` replies.
- ``model``: a local model (a ``conf/model`` name, e.g. the agent's own base
  model as in the paper), loaded once per process by whoever builds the
  environment (``trace_ray/responders.py``) and passed in as a
  :class:`~environments.responder.Responder`.
- ``endpoint``: any OpenAI-compatible endpoint, passed in the same way.

``model`` and ``endpoint`` play the scenario under τ²-bench's user-simulator
guidelines (the package's ``simulation_guidelines.md``) and end the
conversation with its stop tokens. Every user answers τ²'s opening agent
message (``GREETING``) first.
"""

from __future__ import annotations

import re
from typing import Any

from environments.responder import Responder
from environments.tau2.package import tau2_module

GREETING = "Hi! How can I help you today?"  # τ²-bench's first agent message of every conversation
SCRIPTED_USER_TURNS = 10
TRANSFER_TOOL = "transfer_to_human_agents"
_CONFIRMATION = re.compile(r"\b(confirm|proceed|go ahead|shall i|should i|would you like me to)\b", re.IGNORECASE)


def stop_tokens() -> tuple[str, ...]:
    """The package's user stop tokens: done, transferred to a human, out of scope."""
    base = tau2_module("user.base")
    return base.STOP, base.TRANSFER, base.OUT_OF_SCOPE


def transferred(conversation: list[Any]) -> bool:
    """Whether the agent transferred the user to a human agent since the user's last message."""
    since_user = []
    for message in conversation:
        since_user = [] if message.role == "user" else since_user + [message]
    transfer_ids = {
        call.id
        for message in since_user
        for call in (getattr(message, "tool_calls", None) or [])
        if call.name == TRANSFER_TOOL
    }
    return any(message.role == "tool" and message.id in transfer_ids and not message.error for message in since_user)


class ScriptedUser:
    def __init__(self, max_turns: int = SCRIPTED_USER_TURNS):
        self.max_turns = max_turns
        self.known_info = ""
        self.turns = 0

    def start(self, task: Any, seed: int) -> str:
        self.turns = 0
        instructions = task.user_scenario.instructions
        if isinstance(instructions, str):
            self.known_info = instructions
            return instructions
        self.known_info = instructions.known_info or "I don't know."
        return "\n\n".join(part for part in (instructions.reason_for_call, instructions.known_info) if part)

    def reply(self, conversation: list[Any]) -> str:
        stop, transfer, _ = stop_tokens()
        self.turns += 1
        if transferred(conversation):
            return transfer
        agent_text = conversation[-1].content or ""
        if "?" not in agent_text or self.turns > self.max_turns:
            return stop
        if _CONFIRMATION.search(agent_text):
            return "Yes, I confirm. Please go ahead."
        return self.known_info


def guidelines() -> str:
    """τ²-bench's user-simulator guidelines (users without tools), read from the package's data."""
    path = tau2_module("utils").DATA_DIR / "tau2" / "user_simulator" / "simulation_guidelines.md"
    return path.read_text()


def user_view(conversation: list[Any]) -> list[dict[str, str]]:
    """The conversation as the simulated user's own chat: the agent's texts are its prompts, its messages its
    replies."""
    chat = []
    for message in conversation:
        if message.role in ("assistant", "user") and message.content:
            chat.append({"role": "user" if message.role == "assistant" else "assistant", "content": message.content})
    return chat


class GuidedUser:
    """A model (a :class:`Responder`) playing the task's scenario under the package's guidelines."""

    def __init__(self, responder: Responder, temperature: float):
        self.responder = responder
        self.temperature = temperature
        self.system = ""
        self.seed = 0
        self.turns = 0

    def start(self, task: Any, seed: int) -> str:
        self.system = f"{guidelines()}\n\n<scenario>\n{task.user_scenario}\n</scenario>"
        self.seed, self.turns = seed, 0
        return self._say([{"role": "user", "content": GREETING}])

    def reply(self, conversation: list[Any]) -> str:
        return self._say(user_view(conversation))

    def _say(self, chat: list[dict[str, str]]) -> str:
        self.turns += 1
        messages = [{"role": "system", "content": self.system}, *chat]
        return self.responder.chat(messages, seed=self.seed * 1000 + self.turns, temperature=self.temperature).strip()


def make_user(responder: Responder | None, temperature: float = 0.0) -> ScriptedUser | GuidedUser:
    """The scripted user (``responder`` None), or ``responder`` playing the user at ``temperature``."""
    return ScriptedUser() if responder is None else GuidedUser(responder, temperature)
