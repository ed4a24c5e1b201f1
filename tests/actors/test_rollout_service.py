"""The rollout service, on real Ray actors and in this process: groups with the base or a published adapter version,
switching the environment while keeping the engines, closing."""

import dataclasses

import pytest
import ray
from ray.exceptions import RayActorError

from actors.rollout_service import start_rollout_service
from tests.trace_ray.app.test_training import tiny_config
from tests.trace_ray.routing.test_adapters import LORA, random_adapter
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.engines.engine_loop import EngineClosedError

SAMPLED = SamplingParams(1.0, 1.0, 4, seed=3)


def test_the_service_plays_groups_records_the_adapter_version_and_switches_environment(ray_session):
    service = start_rollout_service(tiny_config("rollout.worker_threads=1"))
    try:
        base = service.groups("base", [0, 1], 2, SAMPLED)
        assert [[result.key for result in group] for group in base] == [
            ["base-0#0", "base-0#1"],
            ["base-1#0", "base-1#1"],
        ]
        assert {result.adapter for group in base for result in group} == {None}
        weights, _ = random_adapter(1)
        assert service.publish_adapter("cap", 1, weights, LORA) >= 0
        [group] = service.groups("cap", [0], 3, SAMPLED, adapter=("cap", 1))
        assert [result.adapter for result in group] == [("cap", 1)] * 3  # each result names the version it used
        workers, old_actors = list(service.pool.workers), list(service.pool.env_actors)
        service.switch_environment(dataclasses.replace(service.config.env, max_turns=1))
        assert service.pool.workers == workers and not set(service.pool.env_actors) & set(old_actors)
        [group] = service.groups("short", [2], 2, SAMPLED)
        assert all(result.turns <= 1 for result in group)
        with pytest.raises(RayActorError):
            ray.get(old_actors[0].ping.remote(), timeout=30)  # the last environment's actors are stopped
    finally:
        service.close()
    with pytest.raises(RayActorError):
        ray.get(workers[0].health.remote(), timeout=30)


def test_the_in_process_service_answers_the_same_calls_with_one_engine():
    config = tiny_config()
    engine = make_engine(config.model, config.engine)
    service = start_rollout_service(config, engine=engine)
    try:
        [base] = service.groups("base", [0], 2, SAMPLED)
        assert [result.adapter for result in base] == [None, None]
        weights, _ = random_adapter(1)
        assert service.publish_adapter("cap", 2, weights, LORA) >= 0 and engine.adapters() == {"cap": 2}
        [group] = service.groups("cap", [0], 2, SAMPLED, adapter=("cap", 2))
        assert [result.adapter for result in group] == [("cap", 2)] * 2
        service.switch_environment(dataclasses.replace(config.env, max_turns=1))
        [short] = service.groups("short", [1], 2, SAMPLED)
        assert all(result.turns <= 1 for result in short)
    finally:
        service.close()
    with pytest.raises(EngineClosedError):  # closing the service closes its engine
        engine.submit([1, 2], SAMPLED, None)
