"""A rollout worker Ray restarts serves the pool's current adapter versions before it serves a call again."""

import dataclasses
import os

import psutil
import pytest
import ray
import torch

from actors.adapter_registry import AdapterRegistry, StoredWeights
from actors.rollout_pool import start_pool
from actors.rollout_worker import RolloutWorker
from actors.weight_sync import sync_adapter
from tests.conftest import model_config
from tests.scripted_environments import ParityEnvironment
from tests.trace_ray.app.test_training import metrics_of, parity_config, tiny_config
from tests.trace_ray.engines.test_hf_engine import forward_logprobs, prompts_for
from tests.trace_ray.routing.test_adapters import GREEDY, LORA, random_adapter
from trace_ray.app import train
from trace_ray.models import load_tokenizer

KILLER = "rollout-worker-killer"
# the first train seed of iteration 2 (ParityEnvironment's train seeds: 1000 + index; 2 groups an iteration)
KILL_SEED = 1002
_killed_here = False  # in the environment actor's process: the worker is killed once


def test_the_registry_keeps_the_newest_versions_of_each_adapter():
    registry = AdapterRegistry()
    registry.record("a", 2, StoredWeights("a2"), LORA)
    registry.record("b", 1, StoredWeights("b1"), LORA)
    registry.record("a", 1, StoredWeights("a1"), LORA)  # a worker recording late: older than what is recorded
    registry.record("b", 3, StoredWeights("b3"), LORA)
    assert registry.current() == [("a", 2, StoredWeights("a2"), LORA, 1), ("b", 3, StoredWeights("b3"), LORA, 1)]
    registry.forget("a")
    assert [entry[:2] for entry in registry.current()] == [("b", 3)]
    # rollouts overlapping training: the workers hold the newest two versions, and a restart loads both
    for version in (4, 5, 6):
        registry.record("b", version, StoredWeights(f"b{version}"), LORA, keep_versions=2)
    assert [entry[:2] for entry in registry.current()] == [("b", 5), ("b", 6)]
    assert {entry[4] for entry in registry.current()} == {2}


def test_new_and_restarted_workers_serve_the_version_synced_last(ray_session):
    config = tiny_config("rollout.worker_threads=1")
    pool = start_pool(config)
    (weights_1, _), (weights_2, model_2) = random_adapter(1), random_adapter(2)
    sync_adapter(pool.workers, "cap", 1, weights_1, LORA)
    sync_adapter(pool.workers, "cap", 2, weights_2, LORA)
    [worker] = pool.workers
    prompt = prompts_for(load_tokenizer(model_config("tiny_random")), ["hi there"])[0]

    def serves_version_2(actor):
        [generation] = ray.get(actor.generate.remote([prompt], GREEDY, [("cap", 2)]))
        expected = forward_logprobs(model_2, prompt, generation.token_ids, 1.0)  # version 2's weights, not 1's
        return torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-3)

    newcomer = ray.remote(RolloutWorker).options(num_cpus=0.5).remote(config.model, config.engine, 1, pool.registry)
    assert ray.get(newcomer.adapters.remote()) == {"cap": 2} and serves_version_2(newcomer)
    pid = ray.get(worker.health.remote())["pid"]
    ray.kill(worker, no_restart=False)
    assert serves_version_2(worker)  # the call waits for the restart, which loads version 2 first
    assert ray.get(worker.health.remote())["pid"] != pid and ray.get(worker.adapters.remote()) == {"cap": 2}
    for actor in (newcomer, worker, *pool.env_actors, pool.registry):
        ray.kill(actor)


class WorkerKiller:
    """SIGKILLs a rollout worker process of this Ray node (a child of the raylet, as this actor is); remembers its
    pid."""

    def __init__(self):
        self.killed: list[int] = []

    def kill_one(self) -> int:
        titles = {p: (p.cmdline() or [""])[0] for p in psutil.Process(os.getppid()).children()}  # ray::Class[.method]
        worker = next(p for p, title in titles.items() if title.split(".")[0] == "ray::RolloutWorker")
        worker.kill()
        self.killed.append(worker.pid)
        return worker.pid

    def pids(self) -> list[int]:
        return self.killed


class KillingParityEnvironment(ParityEnvironment):
    """Parity of the second of two replies; the first step of iteration 2 kills a rollout worker between the two
    turns."""

    name = "killing_parity"

    def on_agent_reply(self, text: str):
        return ([], True) if len(self.log.replies) == 2 else ([{"role": "user", "content": "Once more."}], False)

    def step(self, assistant_message):
        global _killed_here
        result = super().step(assistant_message)
        if self.seed >= KILL_SEED and not _killed_here:
            _killed_here = True
            ray.get(ray.get_actor(KILLER).kill_one.remote())
        return result


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_training_completes_when_a_rollout_worker_dies_mid_iteration(tmp_path, ray_session, max_staleness):
    """Iteration 2's first-turn generations come from version 1 (played ahead: version 0); the worker dies; the second
    turns need that version on the restarted worker, which loads every version the pool keeps; the syncs of
    versions 2 and 3 are verified on both workers."""
    killer = ray.remote(num_cpus=0)(WorkerKiller).options(name=KILLER).remote()
    config = parity_config(
        tmp_path,
        "grpo.iterations=3",
        "grpo.max_resample_batches=0",
        "rollout.num_workers=2",
        "rollout.worker_threads=1",
        f"grpo.max_staleness={max_staleness}",
        "adapter=parity",
    )
    config = dataclasses.replace(
        config, env=dataclasses.replace(config.env, name=f"{__name__}:KillingParityEnvironment")
    )
    train.run(config)  # raises if a rollout or a weight sync fails
    assert len(ray.get(killer.pids.remote())) == 1
    history = metrics_of(tmp_path)
    assert [row["iteration"] for row in history] == [1, 2, 3]
    # each sync saw every worker on its version
    assert all(row["rollouts"] == 8 and row["sync_s"] > 0 for row in history)
    ray.kill(killer)
