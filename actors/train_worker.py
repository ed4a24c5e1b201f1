"""The GRPO training function that every Ray Train worker runs (``TorchTrainer(train_loop_per_worker)``).

Per iteration:

1. rank 0 collects ``grpo.groups_per_batch`` groups of ``grpo.group_size``
   rollouts with the current adapter version on the Ray rollout workers
   (dynamic sampling: up to ``grpo.max_resample_batches`` more batches until
   ``grpo.min_informative_groups`` groups have unequal rewards) and turns the
   informative groups into training rows; an iteration with none is skipped.
   With ``grpo.max_staleness`` k > 0 it then launches the next k batches, played
   in the background during the update with the newest version published
   (``training/rollouts_ahead.py``): a later iteration takes rollouts at most k
   versions older than the version it trains, each with that version's
   behaviour log-probs. Every rollout, with its adapter version, goes to the
   adapter's ``trajectories/`` (Parquet);
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
   verifies it (``actors/weight_sync.py``; the workers keep the k versions
   before it for the rollouts playing ahead); a checkpoint is reported every
   ``grpo.checkpoint_every`` iterations; training stops early on a reward
   plateau, or when another batch would spend more than ``grpo.max_rollouts``;
   past ``grpo.iterations`` it goes on (up to ``grpo.max_iterations``) while
   the reward still rises. In a synthetic environment with
   ``grpo.level_up_success`` set, training moves to the next harder level once
   the adapter succeeds at the current one (``curriculum.py``).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch

from actors.rollout_service import start_rollout_service
from environments.synthetic.factory import synthetic_levels
from trace_ray.config import TraceConfig
from trace_ray.cpu_affinity import pin_process
from trace_ray.engines import SamplingParams
from trace_ray.environment_setup import environment_maker
from trace_ray.models import model_dtype
from trace_ray.training.action_logprobs import ActionLogprobs
from trace_ray.training.curriculum import next_level
from trace_ray.training.groups import shard_rows, summarize_groups, training_rows
from trace_ray.training.grpo_iteration import (
    Checkpoint,
    TrainJob,
    TrainState,
    begin_iteration,
    end_iteration,
    iteration_metrics,
    replica_difference,
    training_finished,
    update,
)
from trace_ray.training.lora_model import (
    adapter_weights,
    export_adapter,
    load_adapter_weights,
    lora_parameters,
    lora_state,
    peft_settings,
    trainable_model,
)
from trace_ray.training.parallel import distribute, is_sharded, load_optimizer_state, optimizer_state
from trace_ray.training.rollouts_ahead import BatchSource
from trace_ray.training.staleness import staleness_counts
from trace_ray.training.training_log import TrainingLog
from trace_ray.trajectory_store import TrajectoryStore, episode_row

MAILBOX_POLL_S = 0.5  # how often ranks 1..N ask the mailbox for rank 0's batch


# -- rank 0: rollouts, weight sync, the training log -------------------------------------------------
class LeadRank:
    """Everything rank 0 does beside the update: the rollout service, the rollouts played ahead, the environment's
    level, publishing the adapter, the training log, the training rollouts and the exported adapter."""

    def __init__(self, config: TraceConfig, job: TrainJob, with_rollouts: bool):
        self.config, self.job = config, job
        self.log = TrainingLog(Path(job.output))
        self.lora_config = peft_settings(config.lora)
        # a finished run (resumed from its last checkpoint) only exports its adapter
        self.rollouts, self.source, self.store = None, None, None
        self.levels, self.level = [], None  # a synthetic environment's difficulty levels and the one its actors play
        self.published = 0  # the newest adapter version the rollout workers serve
        if with_rollouts:
            self.rollouts = start_rollout_service(config, job.env)
            train_seed = environment_maker(job.env)().train_seed
            self.source = BatchSource(job.grpo, train_seed, self.play, lambda: self.published)
            if job.env.name == "synthetic":
                self.levels, self.level = synthetic_levels(job.env.spec, job.env.difficulty)
            sampling = config.model.sampling
            self.store = TrajectoryStore(
                job.output,
                {
                    "env": job.env.name,
                    "split": "train",
                    "model": config.model.name,
                    "temperature": job.grpo.temperature,
                    "top_p": 1.0,
                    "max_new_tokens": sampling.max_new_tokens,
                },
            )

    def level_for(self, state: TrainState) -> tuple[dict[str, int], int]:
        """Move the environment actors to the level the next iteration trains at: ``{"difficulty": it}`` for its
        metrics (empty: an environment without levels), and the rollouts played ahead at the level left, dropped."""
        if self.level is None:
            return {}, 0
        current = self.level if state.difficulty is None else state.difficulty
        level = next_level(state.history, self.levels, current, self.job.grpo.level_up_success)
        dropped = 0
        if level != self.level:
            dropped = self.source.discard()
            self.rollouts.switch_environment(dataclasses.replace(self.job.env, difficulty=level))
            self.level = level
        return {"difficulty": level}, dropped

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> float:
        """Publish the adapter's ``weights`` (:func:`adapter_weights`) as ``version`` to every rollout worker, which
        keep the ``grpo.max_staleness`` versions before it for the rollouts playing ahead; seconds taken."""
        seconds = self.rollouts.publish_adapter(
            self.job.name, version, weights, self.lora_config, self.job.grpo.max_staleness + 1
        )
        self.published = version
        return seconds

    def play(self, seeds: list[int], version: int) -> list[list]:
        """One group of ``grpo.group_size`` rollouts per seed with adapter ``version`` (``grpo.adapter_switch=turn``:
        each turn with the newest version published when it starts)."""
        grpo = self.job.grpo
        params = SamplingParams(grpo.temperature, 1.0, self.config.model.sampling.max_new_tokens, seed=self.config.seed)
        newest = (lambda _: (self.job.name, self.published)) if grpo.adapter_switch == "turn" else None
        return self.rollouts.groups(
            self.job.name, seeds, grpo.group_size, params, (self.job.name, version), adapter_at_turn=newest
        )

    def batch(self, state: TrainState, iteration: int) -> dict[str, Any]:
        """The iteration's training rows (it trains version ``state.iteration``), the seed cursor after them and the
        rollout metrics; its rollouts are written to the adapter's ``trajectories/``."""
        grpo = self.job.grpo
        started_at = time.time()
        level, dropped_at_switch = self.level_for(state)
        batch = self.source.collect(state)
        if batch.groups:
            self.store.write_shard([episode_row(result, self.store.run) for group in batch.groups for result in group])
        rows = training_rows(batch.groups, grpo.advantage, grpo.advantage_eps, grpo.max_tokens_per_trajectory)
        summary = summarize_groups(batch.groups)
        dropped = dropped_at_switch + batch.dropped
        metrics = dict(
            iteration_metrics(iteration, summary, batch.played_s),
            rollout_wait_s=batch.waited_s,
            dropped_rollouts=dropped,
            dropped_fraction=dropped / max(1, dropped + summary.rollouts),
            **staleness_counts(batch.groups, state.iteration, grpo.max_staleness),
            started_at=started_at,
            **level,
        )
        return {"rows": rows, "cursor": batch.cursor, "metrics": metrics}

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
        if self.rollouts is not None:
            self.rollouts.close()


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
    if mailbox is None:
        return payload
    if rank == 0:
        ray.get(mailbox.post.remote(iteration, [ray.put(payload)]))
        return payload
    while (posted := ray.get(mailbox.take.remote(iteration))) is None:
        time.sleep(MAILBOX_POLL_S)
    return ray.get(posted[0])


def train_loop_per_worker(loop_config: dict) -> None:
    config: TraceConfig = loop_config["config"]
    job: TrainJob = loop_config["job"]
    grpo = job.grpo
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    # rollouts and updates alternate: while rank 0 waits for rollouts nothing computes here, so the
    # update may use the machine's cores (Ray would pin a fractional-CPU worker to one thread), unless
    # it is given cores of its own (rollouts overlapping the update: grpo.max_staleness)
    cores = config.trainer.cpu_cores
    if cores:
        pin_process(cores, "trainer.cpu_cores")
    shared = max(1, (os.cpu_count() or 1) // world_size)
    torch.set_num_threads(config.trainer.torch_threads or len(cores or []) or shared)

    device = ray.train.torch.get_device()
    sharded = is_sharded(config.trainer.strategy, world_size)
    # sharded, the whole model stays on the CPU: fully_shard moves each worker's shards to its device
    policy, _ = trainable_model(
        config.model,
        config.lora,
        config.seed,
        device="cpu" if sharded else str(device),
        dtype=model_dtype(config.model.dtype, str(device)),
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

    stop = training_finished(grpo, state)
    lead = LeadRank(config, job, with_rollouts=not stop) if rank == 0 else None
    try:
        if not stop:
            weights = adapter_weights(policy)  # every worker: a sharded adapter is gathered
            if lead:
                lead.publish(weights, state.iteration)
        if lead:
            lead.log.write(state.history)
        while not stop:
            iteration = state.iteration + 1
            payload = hand_out(lead.batch(state, iteration) if lead else None, iteration, rank, loop_config["mailbox"])
            metrics = begin_iteration(state, payload)
            started = time.perf_counter()
            if payload["rows"]:
                generator = torch.Generator().manual_seed(config.seed * 1_000_003 + iteration)
                shard = shard_rows(payload["rows"], world_size, rank)
                metrics.update(update(scorer, policy, optimizer, shard, grpo, generator))
                if not sharded:
                    metrics["replica_max_diff"] = replica_difference(policy, world_size)
            metrics["update_s"] = time.perf_counter() - started
            state.iteration = iteration
            weights = adapter_weights(policy)
            if lead:
                metrics["sync_s"] = lead.publish(weights, state.iteration)
            stop = end_iteration(state, metrics, grpo)
            if lead:
                lead.log.write(state.history)
            report(
                metrics,
                stop or state.iteration % grpo.checkpoint_every == 0,
                weights,
                scorer,
                optimizer,
                sharded,
                state,
                rank,
            )
        exported = lora_state(policy)  # every worker: a sharded adapter is gathered
        if lead:
            export_adapter(policy, Path(job.output), exported)
            lead.log.finish(state.history)
    finally:
        if lead:
            lead.close()


def report(
    metrics: dict[str, Any],
    with_checkpoint: bool,
    weights,
    scorer,
    optimizer,
    sharded: bool,
    state: TrainState,
    rank: int,
) -> None:
    """``ray.train.report`` of the iteration's metrics (every rank: it is a barrier), with a checkpoint when due."""
    if not with_checkpoint:
        ray.train.report(_reportable(metrics))
        return
    saved = Checkpoint(weights, optimizer_state(scorer, optimizer, sharded), state)
    with tempfile.TemporaryDirectory() as folder:
        if rank == 0:
            saved.save(Path(folder))
        ray.train.report(
            _reportable(metrics), checkpoint=ray.train.Checkpoint.from_directory(folder) if rank == 0 else None
        )


def _reportable(metrics: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in metrics.items() if isinstance(value, (int, float, bool))}
