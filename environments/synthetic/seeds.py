"""The seeds of a synthetic template environment: fixed analysis and eval tasks, unlimited train tasks from an
offset."""

from __future__ import annotations


class TemplateSeeds:
    """Mixin for a target's template environment, listed before the environment class. The target sets
    ``split_seeds`` and ``train_seed_offset``, disjoint from its benchmark's seeds and from the other targets'."""

    split_seeds: dict[str, tuple[int, ...]]
    train_seed_offset: int

    def task_seeds(self, split: str) -> list[int]:
        if split not in self.split_seeds:
            raise ValueError(
                f"unknown split {split!r}; a synthetic environment has analysis and eval seeds (train: train_seed)"
            )
        return list(self.split_seeds[split])

    def train_seed(self, index: int) -> int:
        if index < 0:
            raise ValueError("train seed index must be >= 0")
        return self.train_seed_offset + index
