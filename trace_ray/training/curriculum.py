"""Training moves up a synthetic environment's difficulty levels as the adapter learns (``grpo.level_up_success``).

Calibration chooses the level where the base model earns some reward. Once the
adapter succeeds there most of the time, most groups are all successes and
carry no GRPO signal, while the harder levels hold the steps the target needs
(on the device templates, level 1 adds a text whose number only the contact
search gives). So, with ``grpo.level_up_success`` set, training goes on at the
next harder level of the same environment once the success rate of its last
``LEVEL_UP_WINDOW`` iterations at the current level reaches it.

Every iteration's metrics row records its level (``difficulty``); the stopping
rules compare rewards within one level only.
"""

from __future__ import annotations

from typing import Any

LEVEL_UP_WINDOW = 2  # iterations at a level whose mean success rate must reach grpo.level_up_success


def at_level(history: list[dict[str, Any]], level: int | None) -> list[dict[str, Any]]:
    """The iterations of ``history`` trained at ``level`` (None: an environment without levels, so all of them)."""
    return [row for row in history if row.get("difficulty") == level]


def next_level(history: list[dict[str, Any]], levels: list[int], level: int, threshold: float | None) -> int:
    """The level the next iteration trains at: the next one of ``levels`` (easiest first) once the last
    ``LEVEL_UP_WINDOW`` iterations at ``level`` succeeded at a mean rate of ``threshold`` or more; else ``level``."""
    if threshold is None or level not in levels or level == levels[-1]:
        return level
    recent = at_level(history, level)[-LEVEL_UP_WINDOW:]
    if len(recent) < LEVEL_UP_WINDOW or sum(row["success_rate"] for row in recent) / len(recent) < threshold:
        return level
    return levels[levels.index(level) + 1]
