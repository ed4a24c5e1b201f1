"""``AdapterRegistry``: the adapters a pool of rollout workers serves, so that a restarted worker serves them again.

Ray restarts a rollout worker whose process died and re-runs its
constructor, which starts an engine without adapters. The pool's registry
(one small actor, created with the pool and handed to every worker)
remembers the versions the workers hold of each adapter (the current one,
and the ones before it that a rollout overlapping training still uses):
name, version, the ObjectRef of its weights and its LoRA settings. A worker records every
adapter the weight sync gives it, and its constructor loads every recorded
one before the worker serves a call, so calls Ray retries on the restarted
worker find the version they ask for. Holding the ObjectRef keeps the
weights in the object store until newer versions replace them.
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
        # name -> {version: (weights, LoRA settings)}, and how many of the newest versions the workers hold
        self._versions: dict[str, dict[int, tuple[StoredWeights, dict]]] = {}
        self._kept: dict[str, int] = {}

    def record(
        self, name: str, version: int, weights: StoredWeights, lora_config: dict, keep_versions: int = 1
    ) -> None:
        """Remember ``name`` at ``version`` beside its newest ``keep_versions - 1`` others (every worker records each
        load; recording an older version than those kept changes nothing)."""
        versions = self._versions.setdefault(name, {})
        versions[version] = (weights, lora_config)
        self._kept[name] = keep_versions
        for old in sorted(versions)[:-keep_versions]:
            del versions[old]

    def forget(self, name: str) -> None:
        self._versions.pop(name, None)
        self._kept.pop(name, None)

    def current(self) -> list[tuple[str, int, StoredWeights, dict, int]]:
        """(name, version, weights, LoRA settings, versions kept) of every adapter version the pool serves, oldest
        version first."""
        return [
            (name, version, *self._versions[name][version], self._kept[name])
            for name in self._versions
            for version in sorted(self._versions[name])
        ]
