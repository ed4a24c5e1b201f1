"""The prompt-injection baseline (GEPA-style): the selected capabilities' descriptions in the system prompt.

The target environment is wrapped so that every episode's system message ends
with a note listing the capabilities identification found lacking; the base
model then plays the tasks as usual. No weights change.
"""

from __future__ import annotations

from collections.abc import Callable

from environments.protocol import Environment, ResetResult

NOTE_HEADER = "Skills this task may need (take care with each):"


def capability_note(capabilities: list[dict]) -> str:
    """The note appended to the system prompt: one line per capability, name and description."""
    lines = [f"- {entry['name'].replace('_', ' ')}: {entry.get('description', '').strip()}" for entry in capabilities]
    return "\n".join([NOTE_HEADER, *lines])


class SystemNoteEnvironment:
    """An environment whose first system message (or a new one, if it has none) ends with ``note``."""

    def __init__(self, env: Environment, note: str):
        self.env, self.note = env, note

    def reset(self, seed: int) -> ResetResult:
        result = self.env.reset(seed)
        messages = [dict(message) for message in result.messages]
        system = next((message for message in messages if message.get("role") == "system"), None)
        if system is None:
            messages.insert(0, {"role": "system", "content": self.note})
        else:
            system["content"] = f"{(system.get('content') or '').rstrip()}\n\n{self.note}"
        return ResetResult(messages, result.tools, result.info)

    def __getattr__(self, name):  # step, score, task_seeds, example_exchange, ... of the wrapped environment
        return getattr(self.env, name)


def with_system_note(make_env: Callable[[], Environment], note: str) -> Callable[[], SystemNoteEnvironment]:
    return lambda: SystemNoteEnvironment(make_env(), note)
