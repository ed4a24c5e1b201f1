"""From groups of rollouts to GRPO training rows (pure: no Ray, no model).

A group is K rollouts of one task seed. Its advantages come from
``grpo.group_advantages``; groups whose rewards are all equal carry no signal
and are dropped. Each kept rollout becomes one row: its exact token ids, the
action mask (every sampled token of every agent turn, tool-call turns and
end-of-turn tokens included; never system, user or tool tokens) and the
behavior log-probs recorded when it was sampled.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from trace_ray.rollout_loop import EpisodeResult
from trace_ray.training.grpo import group_advantages


@dataclass
class TrainingRow:
    token_ids: list[int]
    action_mask: list[int]
    logprobs: list[float]
    advantage: float
    group: int = -1  # its group's index in the iteration (rows of a group share their prompt); -1: none


@dataclass
class GroupSummary:
    """What a set of groups says about the policy (reported every iteration)."""

    groups: int = 0
    informative_groups: int = 0
    rollouts: int = 0
    reward_mean: float = 0.0
    reward_std: float = 0.0
    success_rate: float = 0.0
    action_tokens: int = 0
    rewards: list[float] = field(default_factory=list)


def summarize_groups(groups: list[list[EpisodeResult]]) -> GroupSummary:
    rewards = [result.reward for group in groups for result in group]
    if not rewards:
        return GroupSummary()
    informative = int(
        group_advantages(torch.tensor([[r.reward for r in g] for g in groups], dtype=torch.float64))[1].sum()
    )
    return GroupSummary(
        groups=len(groups),
        informative_groups=informative,
        rollouts=len(rewards),
        reward_mean=statistics.fmean(rewards),
        reward_std=statistics.pstdev(rewards),
        success_rate=sum(result.success for group in groups for result in group) / len(rewards),
        action_tokens=sum(result.record.action_tokens for group in groups for result in group),
        rewards=rewards,
    )


def truncate(record_ids: list[int], mask: list[int], logprobs: list[float], max_tokens: int | None):
    """The first ``max_tokens`` tokens of a trajectory (its later turns get no loss)."""
    if max_tokens is None or len(record_ids) <= max_tokens:
        return record_ids, mask, logprobs
    return record_ids[:max_tokens], mask[:max_tokens], logprobs[:max_tokens]


def training_rows(
    groups: list[list[EpisodeResult]],
    normalize: str,
    eps: float,
    max_tokens: int | None = None,
) -> list[TrainingRow]:
    """One row per rollout of every informative group, with its group-relative advantage."""
    if not groups:
        return []
    sizes = {len(group) for group in groups}
    if len(sizes) != 1:
        raise ValueError(f"groups must all hold the same number of rollouts, got sizes {sorted(sizes)}")
    rewards = torch.tensor([[result.reward for result in group] for group in groups], dtype=torch.float64)
    advantages, informative = group_advantages(rewards, normalize=normalize, eps=eps)
    rows = []
    for g, group in enumerate(groups):
        if not informative[g]:
            continue
        for k, result in enumerate(group):
            record = result.record
            ids, mask, logprobs = truncate(record.token_ids, record.action_mask, record.logprobs, max_tokens)
            if sum(mask) == 0:
                continue  # nothing the agent generated survives (e.g. it hit the context limit at once)
            rows.append(TrainingRow(list(ids), list(mask), list(logprobs), float(advantages[g, k]), g))
    return rows


def shard_rows(rows: list[TrainingRow], world_size: int, rank: int) -> list[TrainingRow]:
    """This rank's share: every rank gets the same number of rows, so DDP ranks take the same number of steps.

    Rows beyond the last full round of ``world_size`` are dropped (at most
    ``world_size - 1``); fewer rows than ranks are repeated round robin.
    """
    if not rows:
        return []
    if len(rows) < world_size:
        rows = [rows[i % len(rows)] for i in range(world_size)]
    usable = len(rows) - len(rows) % world_size
    return rows[rank:usable:world_size]
