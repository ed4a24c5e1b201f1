"""``trace-ray train``: the GRPO update on a LoRA policy, weight sync, Ray Train runs (2 workers, resume), bad
inputs."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from actors.train_worker import BatchMailbox, train_loop_per_worker
from actors.weight_sync import WeightSyncError, sync_adapter
from environments.errors import TraceRayError
from trace_ray.app import train
from trace_ray.app.cli import main
from trace_ray.config_compose import compose_config
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.training.action_logprobs import ActionLogprobs, ScoredRow
from trace_ray.training.groups import TrainingRow
from trace_ray.training.grpo import policy_loss
from trace_ray.training.grpo_iteration import TrainJob, batch_fits, iterations_done, update
from trace_ray.training.lora_model import peft_settings, trainable_model

TINY = ["model=tiny_random", "lora.rank=4", "lora.alpha=8"]
PARITY = "tests.scripted_environments:ParityEnvironment"
SLOW_TWO_TURNS = "tests.scripted_environments:SlowTwoTurnParityEnvironment"


def tiny_config(*overrides):
    return compose_config("train", [*TINY, *overrides])


def teacher_forced_rows(policy, advantages, length=12, seed=0, group=-1):
    """Random token rows whose second half is the action, with the policy's own log-probs (ratio 1); rows of a group
    (``group`` >= 0) share their first half."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(5, 200, (length // 2,), generator=generator).tolist()
    rows = []
    for advantage in advantages:
        ids = prompt if group >= 0 else torch.randint(5, 200, (length // 2,), generator=generator).tolist()
        ids = ids + torch.randint(5, 200, (length - length // 2,), generator=generator).tolist()
        mask = [0] * (length // 2) + [1] * (length - length // 2)
        with torch.no_grad():
            logits = policy(input_ids=torch.tensor([ids])).logits[0]
            logprobs = torch.log_softmax(logits, dim=-1)[torch.arange(length - 1), torch.tensor(ids[1:])].tolist()
        recorded = [0.0] + [lp if m else 0.0 for lp, m in zip(logprobs, mask[1:])]
        rows.append(TrainingRow(ids, mask, recorded, advantage, group))
    return rows


def run_update(config, policy, rows, optimizer_class=torch.optim.AdamW):
    optimizer = optimizer_class([p for p in policy.parameters() if p.requires_grad], lr=config.grpo.lr)
    scorer = ActionLogprobs(policy, config.grpo.temperature, config.trainer.gradient_checkpointing)
    return update(scorer, policy, optimizer, rows, config.grpo, torch.Generator().manual_seed(0))


def test_update_changes_every_lora_parameter_and_nothing_else():
    config = tiny_config("grpo.mini_batch_size=2", "grpo.lr=1e-2", "grpo.temperature=1.0")
    policy, _ = trainable_model(config.model, config.lora, seed=0)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    rows = teacher_forced_rows(policy, [1.0, -1.0, 1.0, -1.0])
    metrics = run_update(config, policy, rows)
    assert metrics["optimizer_steps"] == 2 and metrics["trained_tokens"] == 4 * 6  # 6 action tokens per row
    lora, base = [], []
    for name, parameter in policy.named_parameters():
        (lora if "lora_" in name else base).append((name, not torch.equal(parameter, before[name])))
    assert lora and all(changed for _, changed in lora), [name for name, changed in lora if not changed]
    assert not any(changed for _, changed in base)
    assert all(p.grad is None for name, p in policy.named_parameters() if "lora_" not in name)


@pytest.mark.parametrize(
    "settings",
    [
        ("grpo.shared_prefix=false", "grpo.max_tokens_per_micro_batch=24", "trainer.gradient_checkpointing=true"),
        ("grpo.shared_prefix=true", "grpo.max_tokens_per_micro_batch=1"),
        ("grpo.shared_prefix=true", "grpo.max_tokens_per_micro_batch=100000", "trainer.gradient_checkpointing=true"),
        ("grpo.shared_prefix=true", "grpo.max_tokens_per_micro_batch=100000", "grpo.kl_coef=0.5", "grpo.ppo_epochs=2"),
    ],
)
def test_micro_batches_shared_prefixes_and_checkpointing_give_the_same_steps(settings):
    """Every row alone and whole (the reference) and micro-batches of other sizes, shared prompts, recomputed
    activations:
    the same optimizer steps (groups of shared prompts, of different lengths; with the KL and two epochs too). SGD, so
    that equal steps mean equal gradients (Adam divides tiny gradients by their own size and magnifies float noise)."""
    results = []
    extra = [s for s in settings if s.startswith(("grpo.kl_coef", "grpo.ppo_epochs"))]
    for overrides in (("grpo.shared_prefix=false", "grpo.max_tokens_per_micro_batch=1", *extra), settings):
        config = tiny_config("grpo.mini_batch_size=5", "grpo.lr=1e-2", "grpo.temperature=1.0", *overrides)
        policy, _ = trainable_model(config.model, config.lora, seed=0)
        initial = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}
        rows = teacher_forced_rows(policy, [1.0, -1.0, 0.5], length=12, group=0) + teacher_forced_rows(
            policy, [0.5, -0.5], length=7, seed=1, group=1
        )
        metrics = run_update(config, policy, rows, torch.optim.SGD)
        results.append(({n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}, metrics))
    (single, single_metrics), (other, other_metrics) = results
    changed = max((single[n] - before).abs().max() for n, before in initial.items())
    assert changed > 1e-4  # the step is not nothing
    assert all(torch.allclose(single[n], other[n], atol=1e-6) for n in single)
    assert abs(single_metrics["loss"] - other_metrics["loss"]) < 1e-6
    if "grpo.shared_prefix=true" in settings and "grpo.max_tokens_per_micro_batch=100000" in settings:
        # one micro-batch: the 6-token prompt of group 0 once (6 + 3 x 6) and group 1's 3 tokens once (3 + 2 x 4)
        assert (
            other_metrics["forward_tokens"]
            == single_metrics["forward_tokens"] - (2 * 6 + 1 * 3) * config.grpo.ppo_epochs
        )


def shifted(rows, by):
    """``rows`` as an engine whose recorded log-probs are ``by`` lower than the trainer's would give them."""
    return [
        dataclasses.replace(row, logprobs=[lp - by if m else lp for lp, m in zip(row.logprobs, row.action_mask)])
        for row in rows
    ]


@pytest.mark.parametrize("old_logprobs", ["engine", "trainer"])
def test_the_engine_trainer_gap_is_logged_and_trainer_old_logprobs_remove_it_from_the_ratio(old_logprobs):
    """Recorded log-probs 0.3 below the trainer's: both modes report the gap; with ``engine`` the ratio starts at
    exp(0.3) = 1.35 and clipping acts on the first step, with ``trainer`` the step is that of exact recorded
    log-probs."""

    def step(rows, mode):
        config = tiny_config(
            "grpo.mini_batch_size=4", "grpo.lr=1e-2", "grpo.temperature=1.0", f"grpo.old_logprobs={mode}"
        )
        policy, _ = trainable_model(config.model, config.lora, seed=0)
        metrics = run_update(config, policy, rows(policy), torch.optim.SGD)
        return {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" in n}, metrics

    def rows(policy, by=0.0):
        return shifted(teacher_forced_rows(policy, [1.0, -1.0, 1.0, -1.0], group=0), by)

    weights, metrics = step(lambda policy: rows(policy, by=0.3), old_logprobs)
    assert abs(metrics["old_logprob_gap"] - 0.3) < 1e-4 and abs(metrics["old_logprob_gap_max"] - 0.3) < 1e-4
    exact, exact_metrics = step(rows, "engine")
    assert exact_metrics["old_logprob_gap"] < 1e-5 and exact_metrics["clip_fraction"] == 0.0
    if old_logprobs == "engine":
        assert metrics["clip_fraction"] > 0.0  # the ratio's start at 1.35 is past 1 + clip_eps
    else:
        assert metrics["clip_fraction"] == 0.0
        assert all(torch.allclose(weights[n], exact[n], atol=1e-6) for n in exact)


def test_the_first_steps_importance_ratio_is_exp_of_new_minus_behaviour_at_the_action_tokens():
    """Rollouts sampled by an older version: behaviour log-probs below the trainer's by a different amount on each
    action token. The logged ratio is exp(trainer - behaviour) over exactly those tokens, and the first step's loss
    is the clipped surrogate of that ratio."""
    config = tiny_config("grpo.mini_batch_size=4", "grpo.temperature=1.0", "grpo.importance_cap=1.5")
    policy, _ = trainable_model(config.model, config.lora, seed=0)
    rows = teacher_forced_rows(policy, [1.0, -1.0, 1.0, -1.0], group=0)
    generator = torch.Generator().manual_seed(3)
    stale, lags = [], []
    for row in rows:
        lag = [float(torch.rand(1, generator=generator)) * 0.8 if m else 0.0 for m in row.action_mask]
        lags += [d for d, m in zip(lag, row.action_mask) if m]
        stale.append(dataclasses.replace(row, logprobs=[lp - d for lp, d in zip(row.logprobs, lag)]))
    metrics = run_update(config, policy, stale, torch.optim.SGD)
    ratios = torch.exp(torch.tensor(lags))
    assert metrics["importance_ratio_mean"] == pytest.approx(float(ratios.mean()), abs=1e-4)
    assert metrics["importance_ratio_max"] == pytest.approx(float(ratios.max()), abs=1e-4)
    advantages = torch.tensor([row.advantage for row in stale])
    clipped = (advantages[:, None] > 0) & (ratios.view(4, -1) > 1 + config.grpo.clip_eps)
    capped = (advantages[:, None] < 0) & (ratios.view(4, -1) > 1.5)
    assert metrics["clip_fraction"] == pytest.approx(float(clipped.float().mean()), abs=1e-6)
    assert metrics["capped_fraction"] == pytest.approx(float(capped.float().mean()), abs=1e-6) and capped.any()


def test_recorded_sampling_logprobs_give_ratio_one():
    """The engine's behavior log-probs and the trainer's agree, so the ratio starts at 1 and clipping can act later."""
    config = tiny_config()
    engine = make_engine(config.model, config.engine)
    policy, tokenizer = trainable_model(config.model, config.lora, seed=0)  # fresh LoRA: B = 0, the base policy
    prompt = tokenizer.encode("The user says hi and the agent answers")
    [generation] = engine.generate([prompt], SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=10, seed=3))
    ids = prompt + generation.token_ids
    actions = list(range(len(prompt), len(ids)))
    with torch.no_grad():
        new, _ = ActionLogprobs(policy, temperature=0.7)([ScoredRow(ids, actions)])
    old = torch.tensor(generation.logprobs)
    loss, stats = policy_loss(new[None], old[None], torch.tensor([1.0]), torch.ones(1, len(actions)))
    assert abs(stats["ratio_mean"] - 1.0) < 1e-4 and stats["approx_kl"] < 1e-7 and stats["clip_fraction"] == 0.0


# -- weight sync -------------------------------------------------------------------------------------
class RefusingWorker:
    """A rollout worker whose engine cannot take the adapter."""

    def load_adapter(self, name, version, weights, lora_config, keep_versions=1):
        raise RuntimeError("out of LoRA slots")


class StaleWorker:
    """A rollout worker that answers with the old version."""

    def load_adapter(self, name, version, weights, lora_config, keep_versions=1):
        return {name: version - 1}


def test_weight_sync_delivers_the_version_and_stops_on_a_failed_worker(ray_session):
    import ray

    from actors.rollout_worker import RolloutWorker

    config = tiny_config()
    policy, _ = trainable_model(config.model, config.lora, seed=0)
    from trace_ray.training.lora_model import adapter_weights

    weights, settings = adapter_weights(policy), peft_settings(config.lora)
    worker = ray.remote(RolloutWorker).options(num_cpus=0.5).remote(config.model, config.engine, 1)
    assert sync_adapter([worker], "skill", 1, weights, settings) > 0
    assert ray.get(worker.adapters.remote()) == {"skill": 1}
    sync_adapter([worker], "skill", 2, weights, settings)
    assert ray.get(worker.adapters.remote()) == {"skill": 2}
    refusing = ray.remote(RefusingWorker).options(num_cpus=0.1).remote()
    with pytest.raises(WeightSyncError) as error:
        sync_adapter([worker, refusing], "skill", 3, weights, settings)
    assert "rollout worker 1 failed to load adapter 'skill' version 3" in str(
        error.value
    ) and "out of LoRA slots" in str(error.value)
    stale = ray.remote(StaleWorker).options(num_cpus=0.1).remote()
    with pytest.raises(WeightSyncError, match="serves adapter 'skill' version 3 after loading version 4"):
        sync_adapter([stale], "skill", 4, weights, settings)
    for actor in (worker, refusing, stale):
        ray.kill(actor)


# -- Ray Train runs ----------------------------------------------------------------------------------
def parity_config(run_dir, *overrides):
    config = tiny_config(
        f"run_dir={run_dir}",
        "train_on=env",
        "grpo.group_size=4",
        "grpo.groups_per_batch=2",
        "grpo.mini_batch_size=4",
        "grpo.lr=1e-3",
        "grpo.checkpoint_every=1",
        "model.sampling.max_new_tokens=6",
        "grpo.temperature=1.0",
        "trainer.cpus_per_worker=0.5",
        *overrides,
    )
    return dataclasses.replace(config, env=dataclasses.replace(config.env, name=PARITY, max_turns=2))


def metrics_of(run_dir, name="parity"):
    import pyarrow.parquet as pq

    return pq.read_table(run_dir / "adapters" / name / "metrics.parquet").to_pylist()


SLOW_ROLLOUT_S = 20  # rank 0's extra time per batch of rollouts: past the collective timeout the test below sets


def train_loop_with_slow_rollouts(loop_config: dict) -> None:
    """``train_loop_per_worker`` with each batch of rank 0's rollouts ``SLOW_ROLLOUT_S`` slower (run by every Ray Train
    worker)."""
    from actors.rollout_service import RolloutService

    groups = RolloutService.groups

    def slow_groups(self, *args, **kwargs):
        time.sleep(SLOW_ROLLOUT_S)
        return groups(self, *args, **kwargs)

    RolloutService.groups = slow_groups  # in this worker's process only, which ends with the run
    train_loop_per_worker(loop_config)


@pytest.mark.slow
def test_two_ray_train_workers_keep_identical_replicas(tmp_path, ray_session, monkeypatch):
    """While rank 0 rolls out, rank 1 waits for the batch longer than trainer.collective_timeout_s: in the mailbox,
    which has no timeout (waiting in a gloo broadcast, as ranks did before, it fails the run with a collective
    timeout)."""
    monkeypatch.setattr("trace_ray.app.train.train_loop_per_worker", train_loop_with_slow_rollouts)
    timeout = SLOW_ROLLOUT_S - 8  # room for the update's own collectives on a loaded machine (6 s once timed out)
    config = parity_config(
        tmp_path,
        "grpo.iterations=2",
        "trainer.num_workers=2",
        "adapter=parity",
        f"trainer.collective_timeout_s={timeout}",
    )
    train.run(config)
    history = metrics_of(tmp_path)
    assert [row["iteration"] for row in history] == [1, 2]
    # the slow rollouts ran
    assert all(row["finished_at"] - row["started_at"] > SLOW_ROLLOUT_S > timeout for row in history)
    updated = [row for row in history if not row["skipped"]]
    assert updated, "no iteration had an informative group"
    for row in updated:
        assert row["optimizer_steps"] >= 1 and row["replica_max_diff"] == 0.0 and row["sync_s"] > 0
    folder = tmp_path / "adapters" / "parity"
    assert json.loads((folder / "adapter_config.json").read_text())["r"] == 4
    weights = load_file(folder / "adapter_model.safetensors")
    assert any("lora_B" in key and weights[key].abs().sum() > 0 for key in weights)  # B starts at 0: it was trained
    assert (folder / "reward_curve.png").stat().st_size > 0 and any((folder / "tensorboard").iterdir())


@pytest.mark.slow
def test_resumed_run_ends_with_the_same_adapter_as_an_uninterrupted_one(tmp_path, ray_session):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train.run(parity_config(whole, "grpo.iterations=3", "adapter=parity"))
    train.run(parity_config(parts, "grpo.iterations=2", "adapter=parity"))  # stops after iteration 2 ...
    train.run(parity_config(parts, "grpo.iterations=3", "adapter=parity"))  # ... and resumes from its checkpoint
    assert [row["iteration"] for row in metrics_of(parts)] == [1, 2, 3]
    assert [row["reward_mean"] for row in metrics_of(parts)] == [row["reward_mean"] for row in metrics_of(whole)]
    expected = load_file(whole / "adapters" / "parity" / "adapter_model.safetensors")
    resumed = load_file(parts / "adapters" / "parity" / "adapter_model.safetensors")
    assert expected.keys() == resumed.keys()
    # equal up to float rounding: the uninterrupted run's engine reuses cached prefix KV (another summation
    # order) where the resumed one prefills afresh, so behavior log-probs differ in the last digits
    assert all(torch.allclose(expected[key], resumed[key], rtol=0, atol=1e-4) for key in expected)
    assert any(expected[key].abs().max() > 1e-2 for key in expected)  # and the adapter really moved


def training_rollouts(run_dir, columns: list[str], name="parity") -> list[list[dict]]:
    """``columns`` of every training rollout, per iteration (one Parquet shard each, in order)."""
    import pyarrow.parquet as pq

    shards = sorted((run_dir / "adapters" / name / "trajectories").glob("part-*.parquet"))
    return [pq.read_table(shard, columns=columns).to_pylist() for shard in shards]


def rollout_versions(run_dir, name="parity") -> list[list[int]]:
    """The adapter version of every training rollout, per iteration."""
    batches = training_rollouts(run_dir, ["adapter_version"], name)
    return [[row["adapter_version"] for row in batch] for batch in batches]


def test_rollouts_overlapping_the_update_stay_within_the_staleness_bound(tmp_path, ray_session):
    config = parity_config(
        tmp_path,
        "grpo.iterations=4",
        "grpo.max_staleness=1",
        "grpo.importance_cap=3.0",
        "grpo.max_resample_batches=0",
        "adapter=parity",
    )
    train.run(config)
    history, versions = metrics_of(tmp_path), rollout_versions(tmp_path)
    assert [row["iteration"] for row in history] == [1, 2, 3, 4] and len(versions) == 4
    for iteration, (row, played) in enumerate(zip(history, versions), start=1):
        trained = iteration - 1
        assert all(trained - 1 <= version <= trained for version in played), (iteration, played)
        assert row["staleness_0"] == sum(v == trained for v in played)
        assert row["staleness_1"] == sum(v == trained - 1 for v in played)
        assert row["dropped_rollouts"] == 0 and row["rollouts"] == len(played) == 8
    assert versions[0] == [0] * 8  # nothing to play ahead of the first update
    assert sum(row["staleness_1"] for row in history) > 0  # later batches played during the update before them
    # the ratio of the first step is taken against the stale version's log-probs: not 1 where the adapter moved
    stale = [
        row
        for before, row in zip(history, history[1:])
        if row["staleness_1"] == row["rollouts"] and not row["skipped"] and not before["skipped"]
    ]  # sampled by the version before the last update, which changed the adapter
    assert stale and all(row["importance_ratio_max"] > 1.0 + 1e-4 for row in stale)


@pytest.mark.slow
def test_rollouts_switching_adapter_between_turns_record_each_turns_version_within_the_bound(tmp_path, ray_session):
    config = parity_config(
        tmp_path,
        "grpo.iterations=3",
        "grpo.max_staleness=1",
        "grpo.adapter_switch=turn",
        "grpo.max_resample_batches=0",
        "adapter=parity",
    )
    train.run(dataclasses.replace(config, env=dataclasses.replace(config.env, name=SLOW_TWO_TURNS)))
    batches = training_rollouts(tmp_path, ["adapter_version", "turn_adapter_versions", "turns"])
    history = metrics_of(tmp_path)
    assert [row["iteration"] for row in history] == [1, 2, 3] and len(batches) == 3
    for iteration, (row, batch) in enumerate(zip(history, batches), start=1):
        trained = iteration - 1
        for rollout in batch:
            versions = rollout["turn_adapter_versions"]
            assert len(versions) == rollout["turns"] and versions == sorted(versions), rollout
            assert rollout["adapter_version"] == versions[0]  # the oldest turn's
            assert trained - 1 <= versions[0] and versions[-1] <= trained, (iteration, rollout)
        assert row["dropped_rollouts"] == 0
    # a batch played ahead started with one version and took up the next, published during its episodes
    switched = [r["turn_adapter_versions"] for b in batches for r in b if len(set(r["turn_adapter_versions"])) > 1]
    assert switched, batches


@pytest.mark.slow
def test_a_resumed_run_plays_its_first_batch_with_the_version_it_restored(tmp_path, ray_session):
    settings = ["grpo.max_staleness=1", "grpo.max_resample_batches=0", "adapter=parity"]
    train.run(parity_config(tmp_path, "grpo.iterations=2", *settings))
    train.run(parity_config(tmp_path, "grpo.iterations=4", *settings))  # resumes from iteration 2's checkpoint
    versions = rollout_versions(tmp_path)
    assert len(versions) == 4 and versions[2] == [2] * 8  # nothing played ahead survives the restart
    assert all(3 - 1 <= version <= 3 for version in versions[3])


@pytest.mark.slow
def test_fsdp_workers_train_and_resume_to_the_adapter_of_ddp_workers(tmp_path, ray_session):
    """Two workers sharding the base and adapter (FSDP, per-parameter) and stopped after iteration 1, then resumed from
    their gathered checkpoint, end where two DDP replicas trained without a stop end: up to float rounding, which
    Adam turns into a step of either sign on the few weights whose gradient is rounding noise (at most 2 x lr per
    step)."""
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    two = ("adapter=parity", "trainer.num_workers=2")
    train.run(parity_config(ddp, "grpo.iterations=2", *two, "trainer.strategy=ddp"))
    train.run(parity_config(fsdp, "grpo.iterations=1", *two, "trainer.strategy=fsdp"))
    train.run(parity_config(fsdp, "grpo.iterations=2", *two, "trainer.strategy=fsdp"))
    sharded = metrics_of(fsdp)
    assert [row["iteration"] for row in sharded] == [1, 2] and "replica_max_diff" not in sharded[-1]
    assert [row["reward_mean"] for row in sharded] == [row["reward_mean"] for row in metrics_of(ddp)]
    expected = load_file(ddp / "adapters" / "parity" / "adapter_model.safetensors")
    resumed = load_file(fsdp / "adapters" / "parity" / "adapter_model.safetensors")
    assert expected.keys() == resumed.keys()
    assert all(expected[key].shape == resumed[key].shape for key in expected)  # whole tensors, not one worker's shard
    differences = torch.cat([(expected[key] - resumed[key]).abs().flatten() for key in expected])
    lr = 1e-3  # parity_config's
    assert differences.max() <= 6 * lr  # no more than sign flips of near-zero gradients over two Adam steps
    # and almost every weight equal: a lost optimizer state or an unsharded gradient would move most of them
    assert (differences <= 1e-4).float().mean() >= 0.98, (differences > 1e-4).float().mean()
    assert any(expected[key].abs().max() > 1e-2 for key in expected)


@pytest.mark.slow
def test_changed_settings_in_one_run_dir_start_afresh_instead_of_resuming(tmp_path, ray_session):
    train.run(parity_config(tmp_path, "grpo.iterations=1", "adapter=parity"))
    [first] = metrics_of(tmp_path)
    train.run(parity_config(tmp_path, "grpo.iterations=1", "adapter=parity", "grpo.lr=2e-3"))
    [second] = metrics_of(tmp_path)
    # resumed, it would have found iteration 1 done and exported the first run's adapter with its metrics
    assert second["iteration"] == 1 and second["started_at"] > first["finished_at"]
    runs = sorted((tmp_path / "train_state").iterdir())
    assert len(runs) == 2 and all(run.name.startswith("grpo-parity-") for run in runs)
    assert all(any(path.name.startswith("checkpoint_") for path in run.iterdir()) for run in runs)


def test_a_rollout_cap_stops_resampling_and_training_at_the_budget(tmp_path, ray_session):
    # up to 3 batches of 2 rollouts per iteration (dynamic sampling wants 2 informative groups), capped at 10 in all
    config = parity_config(
        tmp_path,
        "grpo.iterations=10",
        "grpo.group_size=2",
        "grpo.groups_per_batch=1",
        "grpo.mini_batch_size=2",
        "grpo.min_informative_groups=2",
        "grpo.max_resample_batches=2",
        "grpo.max_rollouts=10",
        "adapter=parity",
    )
    train.run(config)
    history = metrics_of(tmp_path)
    spent = sum(row["rollouts"] for row in history)
    assert spent <= 10 < spent + 2  # within the cap, and no further batch fitted
    assert (
        len(history) < 10
        and history[-1]["stopped_on_budget"]
        and not any(row["stopped_on_budget"] for row in history[:-1])
    )


@pytest.mark.parametrize(
    "cap, spent, extra, fits",
    [
        (None, [100], 0, True),
        (8, [], 0, True),
        (8, [4], 0, True),
        (8, [4], 2, False),
        (8, [2, 4], 0, False),
        (7, [4], 0, False),
    ],
)
def test_batch_fits_counts_finished_and_current_rollouts_against_the_cap(cap, spent, extra, fits):
    grpo = tiny_config(
        f"grpo.max_rollouts={'null' if cap is None else cap}", "grpo.group_size=2", "grpo.groups_per_batch=2"
    ).grpo
    assert batch_fits(grpo, [{"rollouts": n} for n in spent], extra) is fits


@pytest.mark.parametrize(
    "maximum, rewards, done",
    [
        (None, [0.1, 0.2], False),  # below grpo.iterations
        (None, [0.1, 0.2, 0.3, 0.4], True),  # grpo.iterations reached, no extension
        (6, [0.1, 0.2, 0.3, 0.4], False),  # still rising: a new best in the last 3
        (6, [0.5, 0.1, 0.3, 0.4], True),  # the best (0.5) is older than the last 3
        (6, [0.1, 0.2, 0.3, 0.305], False),  # 0.305 beats 0.1 (the best before the last 3) by more than 0.01
        (6, [0.3, 0.1, 0.2, 0.305], True),  # ... 0.3 by less
        (6, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], True),  # max_iterations reached, rising or not
    ],
)
def test_past_iterations_training_goes_on_while_the_reward_rises_up_to_max_iterations(maximum, rewards, done):
    grpo = tiny_config(
        "grpo.iterations=4", f"grpo.max_iterations={'null' if maximum is None else maximum}", "grpo.plateau_delta=0.01"
    ).grpo
    assert iterations_done(grpo, len(rewards), [{"reward_mean": reward} for reward in rewards]) is done


def test_the_mailbox_hands_each_batch_to_every_reader_then_drops_it():
    mailbox = BatchMailbox(readers=2)
    assert mailbox.take(1) is None  # rank 0 is still rolling out
    mailbox.post(1, ["rows of 1"])
    mailbox.post(2, ["rows of 2"])
    assert mailbox.take(1) == ["rows of 1"] and mailbox.take(2) == ["rows of 2"] and mailbox.take(1) == ["rows of 1"]
    # both readers took 1; 2 waits for its second
    assert 1 not in mailbox.posted and mailbox.posted == {2: ["rows of 2"]}
    assert mailbox.take(2) == ["rows of 2"] and mailbox.posted == {} and mailbox.taken == {}


def test_the_torch_trainer_waits_the_configured_collective_timeout(tmp_path):
    assert tiny_config().trainer.collective_timeout_s == 6 * 3600  # conf/config.yaml: hours, not Ray Train's 30 minutes
    config = tiny_config(f"run_dir={tmp_path}", "train_on=env", "trainer.collective_timeout_s=42")
    [job] = train.train_jobs(config)
    assert train.torch_trainer(config, job, mailbox=None).backend_config.timeout_s == 42


def env_run_name(run_dir, *overrides):
    config = tiny_config(f"run_dir={run_dir}", "train_on=env", *overrides)
    [job] = train.train_jobs(config)
    return train.run_name(config, job)


def test_the_run_name_changes_with_every_setting_that_shapes_the_adapter(tmp_path):
    name = env_run_name(tmp_path)
    assert name.startswith("grpo-device-")
    # stopping later, checkpointing more often, other resources or another checkpoint store: the same run, resumed
    for override in [
        "grpo.iterations=99",
        "grpo.max_rollouts=1000",
        "grpo.plateau_patience=2",
        "grpo.checkpoint_every=3",
        "trainer.num_workers=2",
        "rollout.num_workers=3",
        "batch_size=3",
        "trainer.storage_path=/elsewhere",
    ]:
        assert env_run_name(tmp_path, override) == name, override
    others = [
        env_run_name(tmp_path, override)
        for override in [
            "lora.alpha=4",
            "lora.target_modules=[q_proj]",
            "grpo.lr=2e-3",
            "grpo.group_size=8",
            "seed=1",
            "model.sampling.max_new_tokens=7",
            "model.dtype=bfloat16",
            "env.max_turns=3",
            "rollout.max_episode_tokens=64",
        ]
    ]
    assert len({name, *others}) == 1 + len(others)


def test_a_new_optional_setting_at_its_null_default_keeps_run_names_and_stage_fingerprints(tmp_path):
    from trace_ray.app.pipeline import STAGES, fingerprint
    from trace_ray.run_manifest import RunManifest

    config = tiny_config(f"run_dir={tmp_path}", "train_on=env")
    grown = dataclasses.make_dataclass(
        "GrownEnv", [("new_option", str | None, dataclasses.field(default=None))], bases=(type(config.env),)
    )
    later = dataclasses.replace(config, env=grown(**dataclasses.asdict(config.env)))
    [job], [later_job] = train.train_jobs(config), train.train_jobs(later)
    # the checkpoints of a finished run still resume
    assert train.run_name(later, later_job) == train.run_name(config, job)
    manifest = RunManifest(tmp_path, {"model": "tiny_random", "env": "device"})
    assert [fingerprint(later, stage, manifest) for stage in STAGES] == [
        fingerprint(config, stage, manifest) for stage in STAGES
    ]
    set_later = dataclasses.replace(later, env=dataclasses.replace(later.env, new_option="on"))
    assert [fingerprint(set_later, stage, manifest) for stage in STAGES][0] != fingerprint(config, STAGES[0], manifest)


def test_a_synthetic_environment_is_fingerprinted_by_its_spec_not_its_path(tmp_path):
    for run_dir, difficulty in (("a", 0), ("b", 0), ("c", 1)):
        write_template_spec(tmp_path / run_dir, "tool_calling_precision", difficulty)
    names = [env_run_name(tmp_path / run_dir, "env=synthetic/tool_calling_precision") for run_dir in "abc"]
    assert names[0] == names[1] != names[2]  # a copied run directory resumes; another difficulty starts afresh


def sweep_plan(run_dir, *combinations):
    configs = [
        compose_config("train", ["model=tiny_random", f"run_dir={run_dir}", "train_on=env", *c]) for c in combinations
    ]
    return [
        [(job.name, Path(job.output).name) for job in jobs]
        for _, jobs in train.distinct_outputs([(c, train.train_jobs(c)) for c in configs])
    ]


def test_sweep_combinations_that_would_share_an_adapter_folder_get_one_each(tmp_path):
    assert sweep_plan(tmp_path, ["adapter=sweep", "lora.rank=4"], ["adapter=sweep", "lora.rank=8"]) == [
        [("sweep__lora.rank-4", "sweep__lora.rank-4")],
        [("sweep__lora.rank-8", "sweep__lora.rank-8")],
    ]
    grid = sweep_plan(
        tmp_path, *(["adapter=sweep", f"lora.rank={r}", f"grpo.lr={lr}"] for r in (4, 8) for lr in ("1e-3", "2e-3"))
    )
    assert [name for [(name, _)] in grid] == [
        "sweep__grpo.lr-0.001__lora.rank-4",
        "sweep__grpo.lr-0.002__lora.rank-4",
        "sweep__grpo.lr-0.001__lora.rank-8",
        "sweep__grpo.lr-0.002__lora.rank-8",
    ]
    # adapters named apart already keep their names
    assert sweep_plan(tmp_path, ["adapter=a", "lora.rank=4"], ["adapter=b", "lora.rank=8"]) == [
        [("a", "a")],
        [("b", "b")],
    ]


def test_a_worker_failure_of_any_kind_is_one_line():
    from ray.train import WorkerGroupError

    shapes = RuntimeError(
        "Error(s) in loading state_dict for PeftModelForCausalLM:\n\tsize mismatch for lora_A: [4, 64] vs [8, 64]"
    )
    error = train.training_error(
        WorkerGroupError("[Rank 0 Error Snippet]: ...", {0: shapes}), TrainJob("skill", None, "out", None)
    )
    assert isinstance(error, TraceRayError) and "\n" not in str(error)
    assert str(error).startswith(
        "training skill failed: RuntimeError: Error(s) in loading state_dict for PeftModelForCausalLM:"
    )
    assert "the worker's traceback is in the Ray logs" in str(error)


SWEEP = [
    "train_on=env",
    "env=device",
    "model=tiny_random",
    "adapter=sweep",
    "lora.rank=4,8",
    "grpo.iterations=1",
    "grpo.group_size=2",
    "grpo.groups_per_batch=1",
    "grpo.max_resample_batches=0",
    "model.sampling.max_new_tokens=6",
]


@pytest.mark.slow
def test_a_lora_rank_sweep_trains_an_adapter_of_each_rank_and_a_rerun_resumes_them(tmp_path):
    """``trace-ray train -m ... lora.rank=4,8`` in a fresh process, twice (the second job used to die with the first
    job's thread, which had started the local Ray, with exit status 1 and no message)."""
    command = [sys.executable, "-m", "trace_ray.app.cli", "train", "-m", f"run_dir={tmp_path}", *SWEEP]
    folders = {rank: tmp_path / "adapters" / f"sweep__lora.rank-{rank}" for rank in (4, 8)}
    started = {}
    for attempt in range(2):
        marker = f"sweep-{uuid.uuid4().hex}"  # inherited by every process the command starts (Ray's included)
        environment = {**os.environ, "TRACE_RAY_TEST_MARK": marker}
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=environment)
        assert done.returncode == 0, done.stderr[-2000:]
        assert processes_marked(marker) == [], f"run {attempt + 1} left processes behind"
        for rank, folder in folders.items():
            assert f"-> {folder}" in done.stdout  # the console says where each adapter went
            assert json.loads((folder / "adapter_config.json").read_text())["r"] == rank
            [row] = metrics_of(tmp_path, folder.name)
            assert started.setdefault(rank, row["started_at"]) == row["started_at"]  # the rerun trained nothing again
    runs = sorted(path.name for path in (tmp_path / "train_state").iterdir())
    assert [run.rsplit("-", 1)[0] for run in runs] == ["grpo-sweep__lora.rank-4", "grpo-sweep__lora.rank-8"]


@pytest.mark.slow
def test_one_ctrl_c_stops_training_within_seconds_and_leaves_no_process_behind(tmp_path):
    """A first Ctrl-C used to wait for the whole training job (leaving the job pool waited on its thread); a second
    one was needed to stop."""
    settings = [setting for setting in SWEEP if not setting.startswith(("adapter=", "lora.rank=", "grpo.iterations="))]
    command = [sys.executable, "-m", "trace_ray.app.cli", "train", f"run_dir={tmp_path}", *settings]
    command += ["adapter=long", "grpo.iterations=1000", "grpo.checkpoint_every=1"]
    marker = f"interrupt-{uuid.uuid4().hex}"
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        process = subprocess.Popen(
            command, stdout=stdout, stderr=stderr, env={**os.environ, "TRACE_RAY_TEST_MARK": marker}
        )
    try:
        deadline = time.monotonic() + 600
        while not (tmp_path / "adapters" / "long" / "metrics.parquet").is_file():  # an iteration done
            assert process.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
            assert time.monotonic() < deadline, "no iteration finished in 10 minutes"
            time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) != 0
    finally:
        process.kill()
    assert "trace-ray: error: interrupted" in (tmp_path / "stderr").read_text()
    assert processes_marked(marker) == []


def processes_marked(marker: str) -> list[str]:
    """``pid name`` of every process started with ``marker`` in its environment, once the command has exited (its
    children may take a moment to end: at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        found = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                if marker.encode() in environ.read_bytes():
                    found.append(f"{environ.parent.name} {(environ.parent / 'comm').read_text().strip()}")
            except OSError:  # ended meanwhile, or not ours to read
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


# -- bad inputs ----------------------------------------------------------------------------------------
def write_selection(run_dir, entries):
    (run_dir / "capabilities").mkdir(parents=True)
    (run_dir / "capabilities" / "selected.json").write_text(json.dumps(entries))


@pytest.mark.parametrize(
    "entries, overrides, message",
    [
        (None, [], "run trace-ray identify and trace-ray synthesize"),
        ([{"name": "a", "status": "PENDING"}], [], "no READY capability"),
        ([{"name": "a", "status": "FAILED"}], ["capability=a"], "capability 'a' is FAILED, not READY"),
        ([{"name": "a", "status": "READY"}], ["capability=b"], "capability='b' is not in"),
        (
            [{"name": "a", "status": "READY"}, {"name": "b", "status": "READY"}],
            ["adapter=x"],
            "adapter= names one adapter",
        ),
        (
            [{"name": "a", "status": "OUT_OF_BAND"}, {"name": "b", "status": "READY"}],
            ["capability=a"],
            "(a: OUT_OF_BAND,",
        ),
        ([{"name": "a", "status": "READY"}], ["synthesis.accept_out_of_band=maybe"], "synthesis.accept_out_of_band"),
        ([], ["env=synthetic/a"], "run trace-ray synthesize"),
        (None, ["grpo.max_staleness=-1"], "grpo.max_staleness must be >= 0"),
        (None, ["grpo.max_staleness=1", "grpo.old_logprobs=trainer"], "needs grpo.old_logprobs=engine"),
        (None, ["grpo.importance_cap=1.2"], "grpo.importance_cap must be above 1 + the upper clip (1.28)"),
        (None, ["grpo.adapter_switch=step"], "grpo.adapter_switch='step' is not one of episode, turn"),
        (None, ["trainer.cpu_cores=[]"], "trainer.cpu_cores must list distinct core numbers"),
        (None, ["rollout.cpu_cores=[0,0]"], "rollout.cpu_cores must list distinct core numbers"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path, capsys, entries, overrides, message):
    if entries is not None:
        write_selection(tmp_path, entries)
    assert main(["train", f"run_dir={tmp_path}", *TINY, *overrides]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "adapters").exists()


def test_out_of_band_capabilities_are_skipped_with_their_reason_unless_accepted(tmp_path, capsys):
    reason = (
        "no difficulty level tried was in the calibration band; the nearest, 3, is too_hard (mean reward 0.05 < 0.20)"
    )
    write_selection(
        tmp_path,
        [
            {"name": "a", "status": "READY"},
            {"name": "b", "status": "OUT_OF_BAND", "reason": reason},
            {"name": "c", "status": "FAILED"},
            {"name": "d", "status": "OUT_OF_BAND", "reason": reason},
        ],
    )
    skipping = train.train_jobs(tiny_config(f"run_dir={tmp_path}"))
    assert [(job.name, job.env.capability) for job in skipping] == [("a", "a")]
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"b: OUT_OF_BAND, skipped: {reason}", f"d: OUT_OF_BAND, skipped: {reason}"]  # one line each
    accepting = train.train_jobs(tiny_config(f"run_dir={tmp_path}", "synthesis.accept_out_of_band=true"))
    assert [(job.name, job.env.capability) for job in accepting] == [("a", "a"), ("b", "b"), ("d", "d")]
    assert (
        capsys.readouterr().out.splitlines()[0]
        == f"b: OUT_OF_BAND, trained anyway (synthesis.accept_out_of_band=true): {reason}"
    )
    [job] = train.train_jobs(tiny_config(f"run_dir={tmp_path}", "synthesis.accept_out_of_band=true", "capability=d"))
    assert job.output == str(tmp_path.resolve() / "adapters" / "d")


def test_no_trainable_capability_names_the_cause_and_both_fixes(tmp_path, capsys):
    write_selection(
        tmp_path, [{"name": "a", "status": "OUT_OF_BAND", "reason": "r"}, {"name": "b", "status": "FAILED"}]
    )
    assert main(["train", f"run_dir={tmp_path}", *TINY]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "(a: OUT_OF_BAND, calibration found no difficulty in band)" in err
    assert "synthesis.accept_out_of_band=true" in err and "trace-ray synthesize run_dir=" in err
    assert not (tmp_path / "adapters").exists()


def test_pinning_to_a_core_the_machine_lacks_names_the_setting_and_the_cores_it_has():
    from trace_ray.cpu_affinity import pin_process

    cores = sorted(os.sched_getaffinity(0))
    expected = f"trainer.cpu_cores=[0, 4096] names cores [4096] this machine does not offer (it has {cores}); pick"
    with pytest.raises(TraceRayError, match="^" + re.escape(expected)):
        pin_process([0, 4096], "trainer.cpu_cores")
    assert sorted(os.sched_getaffinity(0)) == cores  # nothing was pinned


def test_a_pinned_process_runs_every_thread_on_its_cores():
    script = (
        "import os, threading, time\n"
        "from trace_ray.cpu_affinity import pin_process\n"
        "earlier = threading.Thread(target=time.sleep, args=(3,)); earlier.start()\n"
        "pin_process([0], 'rollout.cpu_cores')\n"
        "later = []\n"
        "worker = threading.Thread(target=lambda: later.append(os.sched_getaffinity(0)))\n"
        "worker.start(); worker.join()\n"
        "tasks = [os.sched_getaffinity(int(t)) for t in os.listdir('/proc/self/task')]\n"
        "print(all(mask == {0} for mask in tasks + later), len(tasks) >= 2)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True"], done.stderr  # the thread started before the pinning included


def test_an_engine_must_hold_the_versions_the_staleness_bound_keeps():
    overrides = ["model=smollm2_135m", "engine=vllm", "engine.max_loras=1"]
    with pytest.raises(
        TraceRayError,
        match="grpo.max_staleness=1 keeps 2 versions of the adapter in each engine, more "
        "than engine.max_loras=1; raise engine.max_loras or lower grpo.max_staleness",
    ):
        compose_config("train", [*overrides, "grpo.max_staleness=1"])
    assert compose_config("train", [*overrides, "grpo.max_staleness=0"]).grpo.max_staleness == 0


def test_training_error_unwraps_a_worker_error():
    wrapped = RuntimeError("worker group failed")
    wrapped.__cause__ = TraceRayError("rollout worker 0 failed to load adapter")
    job = TrainJob("skill", None, "out", None)
    error = train.training_error(wrapped, job)
    assert (
        isinstance(error, TraceRayError)
        and str(error) == "training skill failed: rollout worker 0 failed to load adapter"
    )


def write_template_spec(run_dir, capability, difficulty):
    folder = run_dir / "environments" / capability
    folder.mkdir(parents=True)
    spec = {"capability": capability, "target": "device", "source": "templates", "difficulty": difficulty}
    (folder / "spec.json").write_text(json.dumps(spec))


def capability_config(run_dir, *overrides):
    return tiny_config(
        f"run_dir={run_dir}",
        "grpo.iterations=1",
        "grpo.group_size=2",
        "grpo.groups_per_batch=1",
        "grpo.max_resample_batches=0",
        "model.sampling.max_new_tokens=6",
        "trainer.cpus_per_worker=0.5",
        *overrides,
    )


def test_every_ready_capability_trains_in_its_synthetic_environment(tmp_path, ray_session):
    entries = [
        {"name": "tool_calling_precision", "status": "READY"},
        {"name": "datetime_reasoning", "status": "FAILED"},
    ]
    write_selection(tmp_path, entries)
    write_template_spec(tmp_path, "tool_calling_precision", 0)
    train.run(capability_config(tmp_path))
    [row] = metrics_of(tmp_path, "tool_calling_precision")
    assert row["iteration"] == 1 and row["rollouts"] == 2 and row["sync_s"] > 0
    assert (tmp_path / "adapters" / "tool_calling_precision" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "adapters" / "datetime_reasoning").exists()  # FAILED capabilities are not trained


def test_training_moves_to_the_next_level_once_the_current_one_is_learned(tmp_path, ray_session):
    # level_up_success=0: any two iterations at a level count as learned, so the third plays level 1
    write_selection(tmp_path, [{"name": "tool_calling_precision", "status": "READY"}])
    write_template_spec(tmp_path, "tool_calling_precision", 0)
    train.run(capability_config(tmp_path, "grpo.iterations=3", "grpo.level_up_success=0"))
    assert [row["difficulty"] for row in metrics_of(tmp_path, "tool_calling_precision")] == [0, 0, 1]


# how long a job waits for the others at the barrier: far beyond a worker group's start-up on a busy machine
BARRIER_S = 240


def train_loop_after_every_job_arrived(loop_config: dict) -> None:
    """The GRPO training loop, entered by each job only once every job of the run has reached it.

    Runs in the Ray Train workers in place of ``train_loop_per_worker``: a job marks ``RUN_DIR/barrier/<job>``
    with the time it arrived, then waits for the marks of every job named in ``RUN_DIR/barrier/jobs.json``.
    Jobs trained one after another never meet: the first gives up after ``BARRIER_S`` and its training fails.
    """
    folder = Path(loop_config["config"].run_dir) / "barrier"
    (folder / loop_config["job"].name).write_text(repr(time.time()))
    names = json.loads((folder / "jobs.json").read_text())
    deadline = time.monotonic() + BARRIER_S
    while missing := [name for name in names if not (folder / name).exists()]:
        if time.monotonic() > deadline:
            raise TraceRayError(f"waited {BARRIER_S} s for {missing} to start: the jobs did not train at the same time")
        time.sleep(0.2)
    train_loop_per_worker(loop_config)


@pytest.mark.slow
def test_capabilities_train_concurrently_when_the_cluster_holds_two_jobs(tmp_path, ray_session, monkeypatch):
    names = ["tool_calling_precision", "datetime_reasoning"]
    write_selection(tmp_path, [{"name": name, "status": "READY"} for name in names])
    for name in names:
        write_template_spec(tmp_path, name, 1)
    (tmp_path / "barrier").mkdir()
    (tmp_path / "barrier" / "jobs.json").write_text(json.dumps(names))
    monkeypatch.setattr("trace_ray.app.train.train_loop_per_worker", train_loop_after_every_job_arrived)
    config = capability_config(tmp_path, "trainer.concurrent_jobs=2")
    # 1.6 CPUs a job; the session's Ray has 4 once earlier tests' actors are gone, which on a busy machine takes a while
    need, deadline = 2 * train.job_resources(config)["CPU"], time.monotonic() + 300
    while (free := ray_session.available_resources().get("CPU", 0)) < need:
        assert time.monotonic() < deadline, f"Ray never freed {need} CPUs for two jobs ({free} free after 300 s)"
        time.sleep(1)
    train.run(config)  # each job trains only once both have arrived: run one after the other, the first would fail
    arrived = {name: float((tmp_path / "barrier" / name).read_text()) for name in names}
    finished = {name: metrics_of(tmp_path, name)[-1]["finished_at"] for name in names}
    first, second = names
    assert arrived[first] < finished[second] and arrived[second] < finished[first]  # the two jobs' work overlapped


@pytest.mark.parametrize(
    "requested, jobs, available, expected",
    [
        (4, 3, {"CPU": 16.0, "GPU": 8.0}, 3),  # no more slots than jobs
        (4, 7, {"CPU": 16.0, "GPU": 8.0}, 4),  # no more than asked
        (4, 7, {"CPU": 16.0, "GPU": 5.0}, 2),  # GPUs bound it: 2 per job
        (4, 7, {"CPU": 5.0, "GPU": 8.0}, 1),  # CPUs bound it: 3.5 per job
        (4, 7, {"CPU": 2.0}, 1),  # never below one (it waits for resources)
    ],
)
def test_concurrent_slots_fit_the_available_resources(requested, jobs, available, expected):
    config = tiny_config(
        "trainer.num_workers=1",
        "trainer.use_gpu=true",
        "trainer.cpus_per_worker=2",
        "rollout.worker_cpus=1",
        "rollout.worker_gpus=1",
        "rollout.env_actor_cpus=0.5",
    )
    need = train.job_resources(config)
    assert need == {"CPU": 3.5, "GPU": 2}
    assert train.concurrent_slots(requested, jobs, need, available) == expected


def test_concurrent_jobs_split_the_default_threads():
    config = tiny_config("trainer.num_workers=1", "rollout.num_workers=1")
    shared = train.sharing_cores(config, 2)
    cores = __import__("os").cpu_count()
    assert shared.trainer.torch_threads == max(1, cores // 2) and shared.rollout.worker_threads == max(1, cores // 2)
    assert train.sharing_cores(config, 1) is config
    pinned = train.sharing_cores(tiny_config("trainer.torch_threads=3"), 2)
    assert pinned.trainer.torch_threads == 3  # an explicit setting is kept
