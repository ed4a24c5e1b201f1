"""The GRPO iteration as plain functions, apart from Ray: when to stop, the update, checkpoints.

The Ray Train worker function (``actors/train_worker.py``) runs one iteration as: rank 0 collects the
groups (``actors/rollout_service.py``), ``training_rows`` (``groups.py``) turns the informative ones into
rows, every rank runs :func:`update` on its shard, rank 0 publishes the new adapter version, and
:func:`record_iteration` decides whether to go on. A unit test drives these without Ray.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from environments.errors import TraceRayError
from trace_ray.config import EnvConfig, GRPOConfig
from trace_ray.rollout_loop import EpisodeResult
from trace_ray.training.action_logprobs import ScoredRow, forward_cost, pack_micro_batches
from trace_ray.training.curriculum import at_level
from trace_ray.training.groups import GroupSummary, TrainingRow, summarize_groups
from trace_ray.training.grpo import LOG_RATIO_LIMIT, kl_penalty, minibatches, policy_loss
from trace_ray.training.lora_model import lora_parameters
from trace_ray.training.parallel import whole

CHECKPOINT_FILES = ("adapter.pt", "optimizer.pt", "state.json", "rng.pt")


@dataclass
class TrainJob:
    name: str  # the adapter trained
    env: EnvConfig  # the environment it trains in
    output: str  # the exported PEFT folder (run_dir/adapters/<name>)
    grpo: GRPOConfig  # its GRPO settings: the config's, or the baseline's matched budget


@dataclass
class TrainState:
    iteration: int = 0  # iterations finished
    seed_cursor: int = 0  # train seeds consumed (each group takes the next one)
    best_reward: float = -math.inf
    since_best: int = 0  # iterations without a mean-reward gain of grpo.plateau_delta (at the current level)
    # the synthetic environment's level of the last iteration (None: none yet, or no levels)
    difficulty: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # the metrics of every iteration


def batch_fits(grpo: GRPOConfig, history: list[dict[str, Any]], extra: int = 0) -> bool:
    """Whether one more batch of rollouts stays within ``grpo.max_rollouts``.

    ``history`` holds the finished iterations' metrics; ``extra``: rollouts of the
    current iteration so far.
    """
    if grpo.max_rollouts is None:
        return True
    spent = sum(row["rollouts"] for row in history) + extra
    return spent + grpo.group_size * grpo.groups_per_batch <= grpo.max_rollouts


def collect_groups(
    grpo: GRPOConfig,
    state: TrainState,
    train_seed: Callable[[int], int],
    play: Callable[[list[int]], list[list[EpisodeResult]]],
) -> tuple[list[list[EpisodeResult]], int]:
    """An iteration's groups, with dynamic sampling; (groups, seed cursor after them).

    ``play(seeds)`` plays one group per seed. A batch is ``grpo.groups_per_batch`` groups of the next train seeds
    (``train_seed(i)`` for the i-th); up to ``grpo.max_resample_batches`` more batches follow until
    ``grpo.min_informative_groups`` groups have unequal rewards, unless another batch would pass ``grpo.max_rollouts``.
    """
    cursor, groups = state.seed_cursor, []
    for batch in range(grpo.max_resample_batches + 1):
        if batch and not batch_fits(grpo, state.history, extra=len(groups) * grpo.group_size):
            break
        seeds = [train_seed(cursor + g) for g in range(grpo.groups_per_batch)]
        cursor += grpo.groups_per_batch
        groups += play(seeds)
        if summarize_groups(groups).informative_groups >= grpo.min_informative_groups:
            break
    return groups, cursor


RISING_WINDOW = 3  # past grpo.iterations, training goes on while one of this many latest iterations set a new best


def still_rising(history: list[dict[str, Any]], delta: float, window: int = RISING_WINDOW) -> bool:
    """Whether the best mean reward of the last ``window`` iterations beats every earlier one by more than ``delta``."""
    if len(history) <= window:
        return True
    recent = max(row["reward_mean"] for row in history[-window:])
    return recent > max(row["reward_mean"] for row in history[:-window]) + delta


def iterations_done(grpo: GRPOConfig, iteration: int, history: list[dict[str, Any]]) -> bool:
    """Whether ``iteration`` iterations are enough: ``grpo.iterations``, or past them (up to ``grpo.max_iterations``)
    once the reward stopped rising."""
    if iteration < grpo.iterations:
        return False
    if grpo.max_iterations is None or iteration >= grpo.max_iterations:
        return True
    return not still_rising(history, grpo.plateau_delta)


def training_finished(grpo: GRPOConfig, state: TrainState) -> bool:
    """Whether a (resumed) run has nothing left to train: enough iterations at its level, or no budget for a batch."""
    return iterations_done(grpo, state.iteration, at_level(state.history, state.difficulty)) or not batch_fits(
        grpo, state.history
    )


def begin_iteration(state: TrainState, batch: dict[str, Any]) -> dict[str, Any]:
    """Take rank 0's ``batch`` (rows, seed cursor, rollout metrics) into ``state``; the iteration's metrics so far.

    A new difficulty level starts the plateau rule over: its rewards are not comparable with the last level's.
    """
    state.seed_cursor = batch["cursor"]
    metrics = dict(batch["metrics"], skipped=not batch["rows"])
    if metrics.get("difficulty", state.difficulty) != state.difficulty and state.difficulty is not None:
        state.best_reward, state.since_best = -math.inf, 0
    state.difficulty = metrics.get("difficulty")
    return metrics


def end_iteration(state: TrainState, metrics: dict[str, Any], grpo: GRPOConfig) -> bool:
    """Record the finished iteration's ``metrics`` in ``state`` (best reward, plateau count, history, stop reasons);
    whether training stops."""
    improved = metrics["reward_mean"] > state.best_reward + grpo.plateau_delta
    state.best_reward = max(state.best_reward, metrics["reward_mean"])
    state.since_best = 0 if improved else state.since_best + 1
    metrics["stopped_on_plateau"] = state.since_best >= grpo.plateau_patience
    metrics["finished_at"] = time.time()
    state.history.append(metrics)
    metrics["stopped_on_budget"] = not batch_fits(grpo, state.history)
    return (
        iterations_done(grpo, state.iteration, at_level(state.history, state.difficulty))
        or metrics["stopped_on_plateau"]
        or metrics["stopped_on_budget"]
    )


# -- every rank: the update -----------------------------------------------------------------------
def scored_row(row: TrainingRow) -> ScoredRow:
    actions = [position for position, flag in enumerate(row.action_mask) if flag]
    if actions and actions[0] == 0:
        raise ValueError("a trajectory's first token is an action, but nothing predicts it")
    return ScoredRow(row.token_ids, actions, row.group)


def per_row(values: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Flat per-action values -> ``[rows, most actions]``, zero-padded (the layout of the GRPO losses' action mask)."""
    return torch.nn.utils.rnn.pad_sequence(list(torch.split(values, counts)), batch_first=True)


def update(
    scorer, policy, optimizer, rows: list[TrainingRow], grpo: GRPOConfig, generator: torch.Generator
) -> dict[str, float]:
    """``grpo.ppo_epochs`` passes over ``rows``, one optimizer step per minibatch.

    A minibatch's rows, members of a group side by side, are packed into
    micro-batches of at most ``grpo.max_tokens_per_micro_batch`` forward
    tokens; ``scorer`` (:class:`ActionLogprobs`, DDP-wrapped on several ranks)
    gives each micro-batch's action log-probs, each group's shared prompt
    encoded once (``grpo.shared_prefix``). Each micro-batch's loss, a mean
    over its trajectories, is weighted by its share of the minibatch, so the
    gradient is that of the mean over the minibatch's trajectories. DDP
    all-reduces the gradients on the minibatch's last backward only.

    The ratio's old policy is the engine's log-probs recorded at sampling
    (``grpo.old_logprobs=engine``) or the trainer's own, recomputed before the
    first step (``trainer``: no bf16-engine or kernel difference in the ratio,
    one more forward pass). Either way :func:`lag_metrics` compares the
    trainer's log-probs before the update with the engine's per action token:
    over every row with ``trainer``, over the first minibatch (before its step)
    with ``engine``. With rollouts sampled by an older version
    (``grpo.max_staleness``) the engine's are that version's, and the ratio
    corrects for it, truncated at ``grpo.importance_cap``.
    """
    parameters = lora_parameters(policy)
    totals: dict[str, float] = {
        "clip_fraction": 0.0,
        "capped_fraction": 0.0,
        "approx_kl": 0.0,
        "entropy": 0.0,
        "kl_to_base": 0.0,
        "loss": 0.0,
        "grad_norm": 0.0,
    }
    rows_seen, steps, tokens, forward_tokens = 0, 0, 0, 0
    lags: list[torch.Tensor] = []  # trainer - behaviour per action token, with the weights before the update
    trainer_old = trainer_logprobs(scorer, rows, grpo) if grpo.old_logprobs == "trainer" else None
    if trainer_old is not None:
        lags += [trainer_old[i] - engine_logprobs(row, trainer_old[i].device) for i, row in enumerate(rows)]
    for _ in range(grpo.ppo_epochs):
        for indices in minibatches(len(rows), grpo.mini_batch_size, generator):
            optimizer.zero_grad(set_to_none=True)
            order = sorted(indices.tolist(), key=lambda i: rows[i].group)
            chosen = [rows[i] for i in order]
            scored = [scored_row(row) for row in chosen]
            packs = pack_micro_batches(scored, grpo.max_tokens_per_micro_batch, grpo.shared_prefix)
            for position, pack in enumerate(packs):
                part, part_rows = [scored[i] for i in pack], [chosen[i] for i in pack]
                counts = [len(row.actions) for row in part]
                last = position == len(packs) - 1
                sync_context = scorer.no_sync() if hasattr(scorer, "no_sync") and not last else contextlib.nullcontext()
                share = len(part) / len(chosen)
                with sync_context:
                    new, entropy = scorer(part, shared_prefix=grpo.shared_prefix)
                    if trainer_old is None:
                        old = torch.cat([engine_logprobs(row, new.device) for row in part_rows])
                        if steps == 0:  # the weights before the update
                            lags.append(new.detach() - old)
                    else:
                        old = torch.cat([trainer_old[order[i]] for i in pack])
                    mask = per_row(torch.ones_like(new), counts)
                    advantages = torch.tensor([row.advantage for row in part_rows], device=new.device)
                    new_rows = per_row(new, counts)
                    loss, stats = policy_loss(
                        new_rows,
                        per_row(old, counts),
                        advantages,
                        mask,
                        grpo.clip_eps,
                        grpo.clip_eps_high,
                        grpo.importance_cap,
                    )
                    if grpo.kl_coef > 0:
                        with torch.no_grad():
                            base = scorer(part, shared_prefix=grpo.shared_prefix, reference=True)[0]
                        kl = kl_penalty(new_rows, per_row(base, counts), mask)
                        loss = loss + grpo.kl_coef * kl
                        totals["kl_to_base"] += float(kl.detach()) * len(part)
                    (loss * share).backward()
                totals["clip_fraction"] += stats["clip_fraction"] * len(part)
                totals["capped_fraction"] += stats["capped_fraction"] * len(part)
                totals["approx_kl"] += stats["approx_kl"] * len(part)
                totals["entropy"] += float(entropy.mean()) * len(part) if entropy.numel() else 0.0
                totals["loss"] += float(loss.detach()) * len(part)
                rows_seen += len(part)
                tokens += int(sum(counts))
                forward_tokens += forward_cost(part, grpo.shared_prefix)
            totals["grad_norm"] += float(whole(torch.nn.utils.clip_grad_norm_(parameters, grpo.max_grad_norm)))
            optimizer.step()
            steps += 1
    metrics = {key: value / max(1, rows_seen) for key, value in totals.items() if key != "grad_norm"}
    metrics.update(
        grad_norm=totals["grad_norm"] / max(1, steps),
        optimizer_steps=steps,
        trained_tokens=tokens,
        forward_tokens=forward_tokens,
    )
    metrics.update(lag_metrics(torch.cat(lags) if lags else torch.zeros(0)))
    return metrics


def lag_metrics(lag: torch.Tensor) -> dict[str, float]:
    """What the policy before the update says of the rollouts' tokens, from ``lag`` = its log-prob minus the
    behaviour log-prob per action token: ``old_logprob_gap`` (mean |lag|) and ``old_logprob_gap_max`` (the engine's
    and the trainer's numerics, plus any staleness), ``importance_ratio_mean`` and ``importance_ratio_max``
    (exp(lag): the importance ratio of the first optimizer step; about 1 for synchronous rollouts)."""
    if not lag.numel():
        return {
            "old_logprob_gap": 0.0,
            "old_logprob_gap_max": 0.0,
            "importance_ratio_mean": 1.0,
            "importance_ratio_max": 1.0,
        }
    ratio = torch.exp(lag.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    return {
        "old_logprob_gap": float(lag.abs().mean()),
        "old_logprob_gap_max": float(lag.abs().max()),
        "importance_ratio_mean": float(ratio.mean()),
        "importance_ratio_max": float(ratio.max()),
    }


def engine_logprobs(row: TrainingRow, device: torch.device) -> torch.Tensor:
    """The log-probs the engine recorded for ``row``'s action tokens at sampling."""
    return torch.tensor(
        [row.logprobs[t] for t, flag in enumerate(row.action_mask) if flag], dtype=torch.float32, device=device
    )


@torch.no_grad()
def trainer_logprobs(scorer, rows: list[TrainingRow], grpo: GRPOConfig) -> list[torch.Tensor]:
    """The policy's own log-probs of each row's action tokens before the update (``grpo.old_logprobs=trainer``),
    in eval mode (no dropout), micro-batched like the update."""
    order = sorted(range(len(rows)), key=lambda i: rows[i].group)
    scored = [scored_row(rows[i]) for i in order]
    result: list[torch.Tensor] = [torch.zeros(0)] * len(rows)
    was_training = scorer.training
    scorer.eval()
    try:
        for pack in pack_micro_batches(scored, grpo.max_tokens_per_micro_batch, grpo.shared_prefix):
            part = [scored[i] for i in pack]
            logprobs = scorer(part, shared_prefix=grpo.shared_prefix)[0].float()
            for i, values in zip(pack, torch.split(logprobs, [len(row.actions) for row in part])):
                result[order[i]] = values
    finally:
        scorer.train(was_training)
    return result


def replica_difference(policy, world_size: int) -> float:
    """Largest difference between the ranks' LoRA checksums after an update (0.0: DDP kept them identical)."""
    if world_size == 1:
        return 0.0
    checksum = float(sum(parameter.detach().double().sum() for parameter in lora_parameters(policy)))
    checksums = [None] * world_size
    torch.distributed.all_gather_object(checksums, checksum)
    difference = max(checksums) - min(checksums)
    if difference > 1e-6 * max(1.0, abs(checksum)):
        raise TraceRayError(
            f"the LoRA replicas of the Ray Train workers diverged (checksums {checksums}); check the DDP setup"
        )
    return difference


# -- checkpoints ----------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """What a Ray Train checkpoint holds: the whole adapter and optimizer state (however the workers shard them)."""

    adapter: dict[str, torch.Tensor]
    optimizer: dict
    state: TrainState

    def save(self, folder: Path) -> None:
        torch.save(self.adapter, folder / "adapter.pt")
        torch.save(self.optimizer, folder / "optimizer.pt")
        (folder / "state.json").write_text(json.dumps(asdict(self.state), default=str))
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, folder / "rng.pt")

    @classmethod
    def load(cls, folder: Path) -> Checkpoint:
        """The saved checkpoint; restores the random generators as they were."""
        missing = [name for name in CHECKPOINT_FILES if not (folder / name).is_file()]
        if missing:
            raise RuntimeError(f"checkpoint {folder} lacks {', '.join(missing)}; delete it to start over")
        saved = json.loads((folder / "state.json").read_text())
        saved["best_reward"] = float(saved["best_reward"])
        rng = torch.load(folder / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        return cls(
            torch.load(folder / "adapter.pt", weights_only=True),
            torch.load(folder / "optimizer.pt", weights_only=True),
            TrainState(**saved),
        )


# -- the training function ------------------------------------------------------------------------
def iteration_metrics(iteration: int, summary: GroupSummary, rollout_s: float) -> dict[str, Any]:
    return {
        "iteration": iteration,
        "reward_mean": summary.reward_mean,
        "reward_std": summary.reward_std,
        "success_rate": summary.success_rate,
        "groups": summary.groups,
        "informative_groups": summary.informative_groups,
        "rollouts": summary.rollouts,
        "rollout_s": rollout_s,
        "rollout_tokens_per_s": summary.action_tokens / rollout_s if rollout_s > 0 else 0.0,
    }
