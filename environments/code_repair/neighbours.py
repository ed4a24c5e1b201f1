"""Inputs next to a given one, where bugs show: the boundaries a mutation moves, empty values, an element changed.

Used to search for calls on which a bug and its fix differ: the template
tasks' hidden calls (``synthetic_templates.py``) and the package tasks'
differential checks (``differential.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def neighbours(argument: Any) -> list[Any]:
    """Arguments next to ``argument``: the boundaries a bug moves (one either side, zero, empty), an element changed,
    dropped or added, the order reversed."""
    if isinstance(argument, bool):
        return [not argument]
    if isinstance(argument, int):
        return [argument + delta for delta in (-2, -1, 1, 2)] + [0, -argument]
    if isinstance(argument, str):
        return ["", argument[:-1], argument + argument[-1:], argument * 2, argument[::-1]]
    if isinstance(argument, list):
        changed = [
            [*argument[:index], item + delta, *argument[index + 1 :]]
            for index, item in enumerate(argument)
            if isinstance(item, int)
            for delta in (-1, 1)
        ]
        ends = [argument[:-1], argument[1:], argument + argument[-1:], [0, *argument], argument[::-1]]
        return [[], *changed, *ends]
    return []


def moved_calls(calls: list[Sequence]) -> list[tuple]:
    """Each of ``calls`` (argument sequences) with one argument moved to a neighbour: distinct, in the order found, none
    of ``calls`` themselves."""
    seen = {repr(tuple(call)) for call in calls}
    found: dict[str, tuple] = {}
    for call in calls:
        for position, argument in enumerate(call):
            for neighbour in neighbours(argument):
                moved = (*call[:position], neighbour, *call[position + 1 :])
                if repr(moved) not in seen:
                    found.setdefault(repr(moved), moved)
    return list(found.values())
