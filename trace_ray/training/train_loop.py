"""The GRPO training function that every Ray Train worker runs (``TorchTrainer(train_loop_per_worker)``).

Per iteration:

1. rank 0 collects ``grpo.groups_per_batch`` groups of ``grpo.group_size``
   rollouts with the current adapter version on the Ray rollout workers
   (dynamic sampling: up to ``grpo.max_resample_batches`` more batches until
   ``grpo.min_informative_groups`` groups have unequal rewards) and turns the
   informative groups into training rows; an iteration with none is skipped;
2. the rows reach the other ranks through the Ray object store: rank 0 puts
   the batch (rows, seed cursor, metrics) there and posts its reference to the
   job's :class:`BatchMailbox` actor, which the other ranks poll while rank 0
   collects, so no rank waits in a gloo/NCCL collective for the rollouts (a
   collective's timeout, ``trainer.collective_timeout_s``, then bounds only the
   update's own collectives). The rows are sharded: every rank holds the same
   number, so DDP ranks take the same optimizer steps; gradients of the LoRA
   parameters are all-reduced by DDP (gloo on CPU, NCCL on GPU);
3. ``grpo.ppo_epochs`` passes of ``grpo.mini_batch_size`` trajectories per
   step: the clipped surrogate against the old policy's log-probs (recorded
   at sampling, or recomputed by the trainer: ``grpo.old_logprobs``; their
   gap is logged every iteration), plus the optional KL to the base (the
   adapter disabled), on log-probs of the action tokens only, each group's shared prompt encoded
   once per micro-batch (``action_logprobs.py``);
4. rank 0 publishes the new adapter version to every rollout worker and
   verifies it (``weight_sync.py``); a checkpoint is reported every
   ``grpo.checkpoint_every`` iterations; training stops early on a reward
   plateau, or when another batch would spend more than ``grpo.max_rollouts``;
   past ``grpo.iterations`` it goes on (up to ``grpo.max_iterations``) while
   the reward still rises. In a synthetic environment with
   ``grpo.level_up_success`` set, training moves to the next harder level once
   the adapter succeeds at the current one (``curriculum.py``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from trace_ray.config import EnvConfig, GRPOConfig, TraceConfig
from trace_ray.training.action_logprobs import ActionLogprobs, ScoredRow, forward_cost, pack_micro_batches
from trace_ray.training.curriculum import at_level, next_level
from trace_ray.training.grpo import kl_penalty, minibatches, policy_loss
from trace_ray.training.groups import GroupSummary, TrainingRow, shard_rows, summarize_groups, training_rows
from trace_ray.models import model_dtype
from trace_ray.training.lora_model import (
    adapter_weights, export_adapter, load_adapter_weights, lora_parameters, lora_state, peft_settings, trainable_model,
)
from trace_ray.training.parallel import distribute, is_sharded, load_optimizer_state, optimizer_state, whole

CHECKPOINT_FILES = ("adapter.pt", "optimizer.pt", "state.json", "rng.pt")
MAILBOX_POLL_S = 0.5  # how often ranks 1..N ask the mailbox for rank 0's batch


@dataclass
class TrainJob:
    name: str  # the adapter trained
    env: EnvConfig  # the environment it trains in
    output: str  # the exported PEFT folder (run_dir/adapters/<name>)


@dataclass
class TrainState:
    iteration: int = 0  # iterations finished
    seed_cursor: int = 0  # train seeds consumed (each group takes the next one)
    best_reward: float = -math.inf
    since_best: int = 0  # iterations without a mean-reward gain of grpo.plateau_delta (at the current level)
    difficulty: int | None = None  # the synthetic environment's level of the last iteration (None: none yet, or no levels)
    history: list[dict[str, Any]] = field(default_factory=list)  # the metrics of every iteration


# -- rank 0: rollouts and weight sync ---------------------------------------------------------------
class TrainingRollouts:
    """Rank 0's handle on the rollout workers and environment actors of one training job."""

    def __init__(self, config: TraceConfig, job: TrainJob):
        from actors.rollout_coordinator import RayRolloutBackend, start_pool
        from trace_ray.agent_prompt import AgentPrompt
        from trace_ray.environment_setup import environment_maker
        from trace_ray.models import load_tokenizer

        self.config, self.job = config, job
        self.pool = start_pool(config, job.env)
        self.backend = RayRolloutBackend(self.pool)
        self.prompt = AgentPrompt.for_model(config.model, load_tokenizer(config.model))
        self.env = environment_maker(job.env)()  # for its train seeds
        self.lora_config = peft_settings(config.lora)
        self.levels, self.level = [], None  # a synthetic environment's difficulty levels and the one its actors play
        if job.env.name == "synthetic":
            from environments.synthetic.factory import synthetic_levels

            self.levels, self.level = synthetic_levels(job.env.spec, job.env.difficulty)

    def level_for(self, state: TrainState) -> dict[str, int]:
        """Move the environment actors to the level the next iteration trains at; ``{"difficulty": it}`` for its
        metrics (empty: an environment without levels)."""
        if self.level is None:
            return {}
        current = self.level if state.difficulty is None else state.difficulty
        level = next_level(state.history, self.levels, current, self.config.grpo.level_up_success)
        if level != self.level:
            import dataclasses

            from actors.rollout_coordinator import start_env_actors, stop_env_actors

            stop_env_actors(self.pool.env_actors)
            self.pool.env_actors = start_env_actors(self.config, dataclasses.replace(self.job.env, difficulty=level))
            self.level = level
        return {"difficulty": level}

    def sync(self, weights: dict[str, torch.Tensor], version: int) -> float:
        """Publish the adapter's ``weights`` (:func:`adapter_weights`) as ``version`` to every rollout worker; seconds taken."""
        from trace_ray.training.weight_sync import sync_adapter

        return sync_adapter(self.pool.workers, self.job.name, version, weights, self.lora_config)

    def collect(self, state: TrainState, version: int) -> tuple[list[list], int, float]:
        """Groups with the adapter at ``version``, with dynamic sampling; (groups, seed cursor after, seconds).

        Resampling stops early where another batch would pass ``grpo.max_rollouts``.
        """
        from trace_ray.engines import SamplingParams
        from trace_ray.rollout_loop import EpisodeTask, run_rollouts

        config, grpo = self.config, self.config.grpo
        params = SamplingParams(grpo.temperature, 1.0, config.model.sampling.max_new_tokens, seed=config.seed)
        started, cursor, groups = time.perf_counter(), state.seed_cursor, []
        for batch in range(grpo.max_resample_batches + 1):
            if batch and not batch_fits(grpo, state.history, extra=len(groups) * grpo.group_size):
                break
            seeds = [self.env.train_seed(cursor + g) for g in range(grpo.groups_per_batch)]
            cursor += grpo.groups_per_batch
            tasks = [
                EpisodeTask(f"{self.job.name}-{seed}#{k}", seed, k, adapter=(self.job.name, version))
                for seed in seeds for k in range(grpo.group_size)
            ]
            results = run_rollouts(
                tasks, self.backend, self.prompt, params, config.batch_size, config.model.max_context_tokens,
                max_episode_tokens=config.rollout.max_episode_tokens,
            )
            groups += [results[i: i + grpo.group_size] for i in range(0, len(results), grpo.group_size)]
            if summarize_groups(groups).informative_groups >= grpo.min_informative_groups:
                break
        return groups, cursor, time.perf_counter() - started


def batch_fits(grpo: GRPOConfig, history: list[dict[str, Any]], extra: int = 0) -> bool:
    """Whether one more batch of rollouts stays within ``grpo.max_rollouts``.

    ``history`` holds the finished iterations' metrics; ``extra``: rollouts of the
    current iteration so far.
    """
    if grpo.max_rollouts is None:
        return True
    spent = sum(row["rollouts"] for row in history) + extra
    return spent + grpo.group_size * grpo.groups_per_batch <= grpo.max_rollouts


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


class BatchMailbox:
    """Where rank 0 posts each iteration's batch for the other ranks of one training job.

    The driver runs it as a Ray actor (no CPU) beside each multi-worker job. A
    batch is posted as ``[ObjectRef]``: in a list, so Ray hands on the reference,
    and the batch itself stays in the object store. It is dropped once each of
    the ``readers`` ranks has taken it.
    """

    def __init__(self, readers: int):
        self.readers = readers
        self.posted: dict[int, list] = {}  # iteration -> [the batch's ObjectRef]
        self.taken: dict[int, int] = {}  # iteration -> ranks that took it

    def post(self, iteration: int, batch: list) -> None:
        self.posted[iteration] = batch

    def take(self, iteration: int) -> list | None:
        """The batch of ``iteration``; None while rank 0 has not posted it."""
        batch = self.posted.get(iteration)
        if batch is not None:
            self.taken[iteration] = self.taken.get(iteration, 0) + 1
            if self.taken[iteration] == self.readers:
                del self.posted[iteration], self.taken[iteration]
        return batch


def hand_out(payload: Any, iteration: int, rank: int, mailbox) -> Any:
    """Rank 0's ``payload`` of ``iteration`` on every rank (``mailbox`` None: rank 0 is the only one).

    The other ranks poll the mailbox every ``MAILBOX_POLL_S`` instead of waiting in a collective,
    however long rank 0's rollouts take.
    """
    import ray

    if mailbox is None:
        return payload
    if rank == 0:
        ray.get(mailbox.post.remote(iteration, [ray.put(payload)]))
        return payload
    while (posted := ray.get(mailbox.take.remote(iteration))) is None:
        time.sleep(MAILBOX_POLL_S)
    return ray.get(posted[0])


# -- every rank: the update -----------------------------------------------------------------------
def scored_row(row: TrainingRow) -> ScoredRow:
    actions = [position for position, flag in enumerate(row.action_mask) if flag]
    if actions and actions[0] == 0:
        raise ValueError("a trajectory's first token is an action, but nothing predicts it")
    return ScoredRow(row.token_ids, actions, row.group)


def per_row(values: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Flat per-action values -> ``[rows, most actions]``, zero-padded (the layout of the GRPO losses' action mask)."""
    return torch.nn.utils.rnn.pad_sequence(list(torch.split(values, counts)), batch_first=True)


def update(scorer, policy, optimizer, rows: list[TrainingRow], config: TraceConfig, generator: torch.Generator) -> dict[str, float]:
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
    one more forward pass). Either way ``old_logprob_gap`` (mean) and
    ``old_logprob_gap_max`` measure |trainer - engine| per action token with
    the weights the rollouts used: over every row with ``trainer``, over the
    first minibatch (before its step) with ``engine``.
    """
    grpo = config.grpo
    parameters = lora_parameters(policy)
    totals: dict[str, float] = {"clip_fraction": 0.0, "approx_kl": 0.0, "entropy": 0.0, "kl_to_base": 0.0, "loss": 0.0, "grad_norm": 0.0}
    rows_seen, steps, tokens, forward_tokens = 0, 0, 0, 0
    gaps: list[torch.Tensor] = []  # |trainer - engine| per action token, the rollouts' weights
    trainer_old = trainer_logprobs(scorer, rows, grpo) if grpo.old_logprobs == "trainer" else None
    if trainer_old is not None:
        gaps += [(trainer_old[i] - engine_logprobs(row, trainer_old[i].device)).abs() for i, row in enumerate(rows)]
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
                        if steps == 0:  # the weights the rollouts used
                            gaps.append((new.detach() - old).abs())
                    else:
                        old = torch.cat([trainer_old[order[i]] for i in pack])
                    mask = per_row(torch.ones_like(new), counts)
                    advantages = torch.tensor([row.advantage for row in part_rows], device=new.device)
                    new_rows = per_row(new, counts)
                    loss, stats = policy_loss(new_rows, per_row(old, counts), advantages, mask, grpo.clip_eps, grpo.clip_eps_high)
                    if grpo.kl_coef > 0:
                        with torch.no_grad():
                            base = scorer(part, shared_prefix=grpo.shared_prefix, reference=True)[0]
                        kl = kl_penalty(new_rows, per_row(base, counts), mask)
                        loss = loss + grpo.kl_coef * kl
                        totals["kl_to_base"] += float(kl.detach()) * len(part)
                    (loss * share).backward()
                totals["clip_fraction"] += stats["clip_fraction"] * len(part)
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
    metrics.update(grad_norm=totals["grad_norm"] / max(1, steps), optimizer_steps=steps, trained_tokens=tokens, forward_tokens=forward_tokens)
    gap = torch.cat(gaps) if gaps else torch.zeros(0)
    metrics.update(old_logprob_gap=float(gap.mean()) if gap.numel() else 0.0, old_logprob_gap_max=float(gap.max()) if gap.numel() else 0.0)
    return metrics


def engine_logprobs(row: TrainingRow, device: torch.device) -> torch.Tensor:
    """The log-probs the engine recorded for ``row``'s action tokens at sampling."""
    return torch.tensor([row.logprobs[t] for t, flag in enumerate(row.action_mask) if flag], dtype=torch.float32, device=device)


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
        from trace_ray.errors import TraceRayError

        raise TraceRayError(f"the LoRA replicas of the Ray Train workers diverged (checksums {checksums}); check the DDP setup")
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
            torch.load(folder / "adapter.pt", weights_only=True), torch.load(folder / "optimizer.pt", weights_only=True),
            TrainState(**saved),
        )


# -- the training function ------------------------------------------------------------------------
def iteration_metrics(iteration: int, summary: GroupSummary, rollout_s: float) -> dict[str, Any]:
    return {
        "iteration": iteration, "reward_mean": summary.reward_mean, "reward_std": summary.reward_std,
        "success_rate": summary.success_rate, "groups": summary.groups, "informative_groups": summary.informative_groups,
        "rollouts": summary.rollouts, "rollout_s": rollout_s,
        "rollout_tokens_per_s": summary.action_tokens / rollout_s if rollout_s > 0 else 0.0,
    }


def train_loop_per_worker(loop_config: dict) -> None:
    import ray.train
    import ray.train.torch

    from trace_ray.training.training_log import TrainingLog

    config: TraceConfig = loop_config["config"]
    job: TrainJob = loop_config["job"]
    grpo = config.grpo
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    # rollouts and updates alternate: while rank 0 waits for rollouts nothing computes here, so the
    # update may use the machine's cores (Ray would pin a fractional-CPU worker to one thread)
    torch.set_num_threads(config.trainer.torch_threads or max(1, (os.cpu_count() or 1) // world_size))

    device = ray.train.torch.get_device()
    sharded = is_sharded(config.trainer.strategy, world_size)
    # sharded, the whole model stays on the CPU: fully_shard moves each worker's shards to its device
    policy, _ = trainable_model(
        config.model, config.lora, config.seed, device="cpu" if sharded else str(device), dtype=model_dtype(config.model.dtype, str(device)),
    )
    restored = None
    if (checkpoint := ray.train.get_checkpoint()) is not None:
        with checkpoint.as_directory() as folder:
            restored = Checkpoint.load(Path(folder))
        load_adapter_weights(policy, restored.adapter)
    scorer = ActionLogprobs(policy, grpo.temperature, config.trainer.gradient_checkpointing)
    scorer = distribute(scorer, config.trainer.strategy, world_size, device)
    optimizer = torch.optim.AdamW(lora_parameters(policy), lr=grpo.lr, weight_decay=grpo.weight_decay)
    state = TrainState()
    if restored is not None:
        load_optimizer_state(scorer, optimizer, restored.optimizer, sharded)
        state = restored.state

    stop = iterations_done(grpo, state.iteration, at_level(state.history, state.difficulty)) or not batch_fits(grpo, state.history)
    # a finished run (resumed from its last checkpoint) only exports its adapter: no rollout workers
    rollouts = TrainingRollouts(config, job) if rank == 0 and not stop else None
    log = TrainingLog(Path(job.output)) if rank == 0 else None
    if not stop:
        weights = adapter_weights(policy)  # every worker: a sharded adapter is gathered
        if rollouts is not None:
            rollouts.sync(weights, state.iteration)
    if rank == 0:
        log.write(state.history)
    while not stop:
        iteration = state.iteration + 1
        if rank == 0:
            started_at = time.time()
            level = rollouts.level_for(state)
            groups, cursor, rollout_s = rollouts.collect(state, version=state.iteration)
            rows = training_rows(groups, grpo.advantage, grpo.advantage_eps, grpo.max_tokens_per_trajectory)
            metrics = dict(iteration_metrics(iteration, summarize_groups(groups), rollout_s), started_at=started_at, **level)
            payload = {"rows": rows, "cursor": cursor, "metrics": metrics}
        payload = hand_out(payload if rank == 0 else None, iteration, rank, loop_config["mailbox"])
        state.seed_cursor = payload["cursor"]
        metrics = dict(payload["metrics"], skipped=not payload["rows"])
        if metrics.get("difficulty", state.difficulty) != state.difficulty and state.difficulty is not None:
            state.best_reward, state.since_best = -math.inf, 0  # rewards of a new level start over
        state.difficulty = metrics.get("difficulty")
        started = time.perf_counter()
        if payload["rows"]:
            generator = torch.Generator().manual_seed(config.seed * 1_000_003 + iteration)
            shard = shard_rows(payload["rows"], world_size, rank)
            metrics.update(update(scorer, policy, optimizer, shard, config, generator))
            if not sharded:
                metrics["replica_max_diff"] = replica_difference(policy, world_size)
        metrics["update_s"] = time.perf_counter() - started
        state.iteration = iteration
        weights = adapter_weights(policy)
        if rank == 0:
            metrics["sync_s"] = rollouts.sync(weights, state.iteration)
        improved = metrics["reward_mean"] > state.best_reward + grpo.plateau_delta
        state.best_reward = max(state.best_reward, metrics["reward_mean"])
        state.since_best = 0 if improved else state.since_best + 1
        metrics["stopped_on_plateau"] = state.since_best >= grpo.plateau_patience
        metrics["finished_at"] = time.time()
        state.history.append(metrics)
        metrics["stopped_on_budget"] = not batch_fits(grpo, state.history)
        stop = (iterations_done(grpo, state.iteration, at_level(state.history, state.difficulty))
                or metrics["stopped_on_plateau"] or metrics["stopped_on_budget"])
        if rank == 0:
            log.write(state.history)
        if stop or state.iteration % grpo.checkpoint_every == 0:
            saved = Checkpoint(weights, optimizer_state(scorer, optimizer, sharded), state)
            with tempfile.TemporaryDirectory() as folder:
                if rank == 0:
                    saved.save(Path(folder))
                ray.train.report(_reportable(metrics), checkpoint=ray.train.Checkpoint.from_directory(folder) if rank == 0 else None)
        else:
            ray.train.report(_reportable(metrics))
    exported = lora_state(policy)  # every worker: a sharded adapter is gathered
    if rank == 0:
        export_adapter(policy, Path(job.output), exported)
        log.finish(state.history)


def _reportable(metrics: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in metrics.items() if isinstance(value, (int, float, bool))}
