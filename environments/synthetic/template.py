"""One capability's template in a target's synthetic environment (``synthesis=templates``).

Each target (``device``, ``tau2``, ``code_repair``) keeps a ``TEMPLATES`` table of these in its
``synthetic_templates.py``: the capability's name and description, how a task is built from a seeded draft of the
target's world at a difficulty level, and the levels there are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

Draft = TypeVar("Draft")
Task = TypeVar("Task")


@dataclass(frozen=True)
class CapabilityTemplate(Generic[Draft, Task]):
    capability: str
    description: str
    # (draft, difficulty) -> the task: the user's request (device, τ²-bench), or the repair task (code_repair;
    # None: this draw cannot hold the capability's task, draw again)
    build: Callable[[Draft, int], Task]
    difficulties: tuple[int, ...]  # the levels, easiest first
    default_difficulty: int = 2
