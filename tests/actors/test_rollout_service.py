"""The rollout service on real Ray actors: groups with the base or a published adapter version, switching the
environment while keeping the workers, closing."""

import dataclasses

import pytest
import ray
from ray.exceptions import RayActorError

from actors.rollout_service import start_rollout_service
from tests.trace_ray.app.test_training import tiny_config
from tests.trace_ray.routing.test_adapters import LORA, random_adapter
from trace_ray.engines import SamplingParams

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
        assert service.publish_adapter("cap", 1, weights, LORA) >= 0 and service.published == {"cap": 1}
        [group] = service.groups("cap", [0], 3, SAMPLED, adapter=("cap", 1))
        assert [result.adapter for result in group] == [("cap", 1)] * 3  # each result names the version it used
        workers, old_actors = list(service.pool.workers), list(service.pool.env_actors)
        service.switch_environment(dataclasses.replace(service.env, max_turns=1))
        assert service.pool.workers == workers and not set(service.pool.env_actors) & set(old_actors)
        [group] = service.groups("short", [2], 2, SAMPLED)
        assert all(result.turns <= 1 for result in group)
        with pytest.raises(RayActorError):
            ray.get(old_actors[0].ping.remote(), timeout=30)  # the last environment's actors are stopped
    finally:
        service.close()
    with pytest.raises(RayActorError):
        ray.get(workers[0].health.remote(), timeout=30)
