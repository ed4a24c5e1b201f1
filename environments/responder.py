"""What an environment needs from a language model: text in answer to a chat.

The τ²-bench user simulator and the judge of natural-language assertions ask a
:class:`Responder`; whoever builds the environment passes one in (a local model,
an OpenAI-compatible endpoint, or a scripted one in tests), so this package needs
no engine of its own.
"""

from __future__ import annotations

from typing import Protocol


class Responder(Protocol):
    def chat(self, messages: list[dict[str, str]], seed: int, temperature: float) -> str:
        """The answer's text to ``messages`` (OpenAI chat format), sampled at ``temperature`` with ``seed``."""
        ...
