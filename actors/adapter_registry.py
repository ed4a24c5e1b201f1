"""``AdapterRegistry``: the adapters a pool of rollout workers serves, so that a restarted worker serves them again.

Ray restarts a rollout worker whose process died and re-runs its
constructor, which starts an engine without adapters. The pool's registry
(one small actor, created with the pool and handed to every worker)
remembers the current version of each adapter: name, version, the
ObjectRef of its weights and its LoRA settings. A worker records every
adapter the weight sync gives it, and its constructor loads every recorded
one before the worker serves a call, so calls Ray retries on the restarted
worker find the version they ask for. Holding the ObjectRef keeps the
weights in the object store until a newer version replaces them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray


@dataclass(frozen=True)
class StoredWeights:
    """An adapter's tensors in the Ray object store.

    Ray resolves an ObjectRef passed bare as a call's argument; wrapped, the
    reference itself reaches the actor, which can keep it for later.
    """

    reference: Any  # ray.ObjectRef of {parameter name: tensor}

    def fetch(self) -> dict:
        return ray.get(self.reference)


class AdapterRegistry:
    def __init__(self):
        self._current: dict[str, tuple[int, StoredWeights, dict]] = {}  # name -> (version, weights, LoRA settings)

    def record(self, name: str, version: int, weights: StoredWeights, lora_config: dict) -> None:
        """Remember ``name`` at ``version`` unless a newer version is already recorded (every worker records each
        load)."""
        if name not in self._current or self._current[name][0] <= version:
            self._current[name] = (version, weights, lora_config)

    def forget(self, name: str) -> None:
        self._current.pop(name, None)

    def current(self) -> list[tuple[str, int, StoredWeights, dict]]:
        """(name, version, weights, LoRA settings) of every adapter the pool serves."""
        return [(name, *entry) for name, entry in self._current.items()]
