"""Seeds <-> τ²-bench tasks, and the benchmark splits.

- A benchmark seed is the task's id: τ²'s ids are the integers 0..49
  (airline) and 0..113 (retail), so seed ``n`` plays task ``"n"``.
- Splits come from the package's split file (``get_tasks_split()``):
  ``analysis`` = its ``train`` tasks (30 airline, 74 retail) and ``eval`` =
  its ``test`` tasks (20 airline, 40 retail); together they are the full
  ``base`` set the published pass rates are measured on.
- ``train_seed(index)`` = ``TRAIN_SEED_OFFSET + index`` plays the analysis
  task ``analysis_seeds[index % len(analysis_seeds)]`` (never an eval task);
  only a sampling user simulator makes two train seeds of one task differ,
  since the user's sampling is seeded by the episode's seed.
"""

from __future__ import annotations

import functools
from typing import Any

from environments.tau2.package import domain_module

TRAIN_SEED_OFFSET = 1_000_000
PACKAGE_SPLITS = {"analysis": "train", "eval": "test"}  # our split -> the package's split name


@functools.cache
def domain_tasks(domain: str) -> dict[int, Any]:
    """Seed -> the package's ``Task`` of the domain's benchmark (``base``) set; shared, never mutate."""
    return {int(task.id): task for task in domain_module(domain).get_tasks("base")}


@functools.cache
def split_seeds(domain: str, split: str) -> tuple[int, ...]:
    if split == "train":
        raise ValueError("the train split has unlimited seeds; use train_seed(index)")
    if split not in PACKAGE_SPLITS:
        raise ValueError(f"unknown split {split!r}; choose analysis, eval or train")
    return tuple(sorted(int(task_id) for task_id in domain_module(domain).get_tasks_split()[PACKAGE_SPLITS[split]]))


def train_seed(index: int) -> int:
    if index < 0:
        raise ValueError("train seed index must be >= 0")
    return TRAIN_SEED_OFFSET + index


def task_for_seed(domain: str, seed: int) -> Any:
    """The task a seed plays (see the module docstring)."""
    if seed >= TRAIN_SEED_OFFSET:
        analysis = split_seeds(domain, "analysis")
        seed = analysis[(seed - TRAIN_SEED_OFFSET) % len(analysis)]
    tasks = domain_tasks(domain)
    if seed not in tasks:
        raise ValueError(
            f"seed {seed} is no τ²-bench {domain} task; use task ids 0..{max(tasks)} or train_seed(index) (>= "
            f"{TRAIN_SEED_OFFSET})"
        )
    return tasks[seed]
