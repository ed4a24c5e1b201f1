"""The Ray side of the rollout loop: a pool of rollout workers and environment actors.

:class:`RayRolloutBackend` implements the rollout loop's backend over actor
handles. Each episode is pinned to one environment actor (round robin at
reset); each generation goes, as its own call, to the rollout worker with
the fewest generations in flight. Workers are threaded actors, so
concurrent calls meet in the worker's engine and are batched there.

Failures: Ray restarts a dead rollout worker and retries its calls
(``max_task_retries``); the restarted worker first loads the pool's current
adapters from the pool's :class:`AdapterRegistry`. Environment actors hold
episode state, so Ray restarts a dead one empty and its episodes come back
as lost (``None``); the loop reruns them from the start.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from actors.adapter_registry import AdapterRegistry
from actors.environment_actor import EnvironmentActor
from actors.remote_errors import task_error
from actors.rollout_worker import RolloutWorker
from environments.errors import TraceRayError
from environments.protocol import Message, ResetResult, StepResult
from trace_ray.config import EnvConfig, TraceConfig
from trace_ray.engines import AdapterRef, SamplingParams
from trace_ray.resources import check_rollout_pool, cluster_nodes, rollout_roles, wait_ready
from trace_ray.rollout_loop import EpisodeTask

WORKER_CALL_RETRIES = 3
WORKER_CONCURRENCY = 256  # generation calls a worker holds at once (its engine batches them)


def wait_until_alive(actor, timeout_s: float = 120.0) -> None:
    """Block until a (restarting) actor answers again."""
    import ray
    from ray.exceptions import ActorUnavailableError, RayActorError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(actor.ping.remote(), timeout=10)
            return
        except (RayActorError, ActorUnavailableError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:
                raise TraceRayError(
                    f"an environment actor did not come back within {timeout_s:.0f} s; check the Ray "
                    "cluster (ray status)"
                ) from None
            time.sleep(0.5)


@dataclass
class RolloutPool:
    workers: list
    env_actors: list
    registry: object = None  # the AdapterRegistry actor the workers restore their adapters from (None: not restored)


def start_pool(config: TraceConfig, env: EnvConfig | None = None) -> RolloutPool:
    """Rollout workers and environment actors (of ``env``, default ``config.env``) sized by ``config.rollout``."""
    import ray

    rollout = config.rollout
    check_rollout_pool(config, cluster_nodes())
    cores = len(rollout.cpu_cores or [])  # pinned: a thread per core of its own
    threads = rollout.worker_threads or cores or max(1, (os.cpu_count() or 1) // rollout.num_workers)
    registry = ray.remote(num_cpus=0)(AdapterRegistry).remote()
    worker_class = ray.remote(
        max_restarts=-1, max_task_retries=WORKER_CALL_RETRIES, max_concurrency=WORKER_CONCURRENCY
    )(RolloutWorker)
    workers = [
        worker_class.options(num_cpus=rollout.worker_cpus, num_gpus=rollout.worker_gpus).remote(
            config.model, config.engine, threads, registry, rollout.cpu_cores
        )
        for _ in range(rollout.num_workers)
    ]
    env_actors = start_env_actors(config, env or config.env)
    wait_ready(
        [worker.health.remote() for worker in workers],
        "rollout workers",
        rollout_roles(config)[:1],
        config.ray.placement_timeout_s,
    )
    return RolloutPool(workers, env_actors, registry)


def start_env_actors(config: TraceConfig, env: EnvConfig) -> list:
    """``config.rollout.num_env_actors`` environment actors of ``env``, alive when returned."""
    import ray

    rollout = config.rollout
    env_class = ray.remote(max_restarts=-1, max_task_retries=0)(EnvironmentActor)
    env_actors = [env_class.options(num_cpus=rollout.env_actor_cpus).remote(env) for _ in range(rollout.num_env_actors)]
    try:
        wait_ready(
            [actor.ping.remote() for actor in env_actors],
            "environment actors",
            rollout_roles(config)[1:],
            config.ray.placement_timeout_s,
        )
    except ray.exceptions.RayActorError as exc:
        raise task_error(exc) from None
    return env_actors


def stop_actors(actors: list, wait_s: float = 60.0) -> None:
    """Kill ``actors`` for good and return once each is gone (its CPUs free for the next stage's actors).

    ``ray.kill`` only asks for the death: a call sent just after it may still be answered, so each actor is
    asked until it no longer answers."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    for actor in actors:
        ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + wait_s
    for actor in actors:
        while time.monotonic() < deadline:
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except (RayActorError, GetTimeoutError):
                break
            time.sleep(0.05)


class RayRolloutBackend:
    def __init__(self, pool: RolloutPool):
        self.pool = pool
        self.home: dict[str, int] = {}  # episode key -> index of its environment actor
        self._next_actor = 0
        self.in_flight = [0] * len(pool.workers)  # generations running on each rollout worker
        self._lock = threading.Lock()

    def example_exchange(self) -> list[Message]:
        import ray

        return ray.get(self.pool.env_actors[0].example_exchange.remote())

    def _by_actor(self, keys: list[str]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for position, key in enumerate(keys):
            groups.setdefault(self.home[key], []).append(position)
        return groups

    def _call_actors(self, method: str, keys: list[str], items: list) -> list:
        """Call ``method`` on every episode's actor with its items; a dead actor's episodes answer None."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        answers: list = [None] * len(items)
        groups = self._by_actor(keys)
        calls = {
            index: getattr(self.pool.env_actors[index], method).remote([items[p] for p in positions])
            for index, positions in groups.items()
        }
        for index, reference in calls.items():
            try:
                results = ray.get(reference)
            except (RayActorError, ActorUnavailableError):
                wait_until_alive(self.pool.env_actors[index])  # Ray restarts it empty: its episodes are rerun
                continue
            for position, result in zip(groups[index], results):
                answers[position] = result
        return answers

    def reset(self, tasks: list[EpisodeTask]) -> list[ResetResult | None]:
        for task in tasks:
            self.home[task.key] = self._next_actor
            self._next_actor = (self._next_actor + 1) % len(self.pool.env_actors)
        return self._call_actors("reset", [task.key for task in tasks], tasks)

    def step(self, steps: list[tuple[str, Message]]) -> list[StepResult | None]:
        return self._call_actors("step", [key for key, _ in steps], steps)

    def release(self, keys: list[str]) -> None:
        for index, positions in self._by_actor(keys).items():
            self.pool.env_actors[index].release.remote([keys[p] for p in positions])
        for key in keys:
            self.home.pop(key, None)

    def submit(self, prompt: list[int], params: SamplingParams, adapter: AdapterRef | None) -> Future:
        """Send one generation to the least busy rollout worker; its engine batches it with the others."""
        with self._lock:
            index = min(range(len(self.pool.workers)), key=self.in_flight.__getitem__)
            self.in_flight[index] += 1
        result: Future = Future()

        def settle(reference_future: Future) -> None:  # runs on a Ray thread
            with self._lock:
                self.in_flight[index] -= 1
            try:
                result.set_result(reference_future.result()[0])
            except BaseException as exc:  # e.g. an adapter the worker does not hold: one clear line
                result.set_exception(task_error(exc))

        self.pool.workers[index].generate.remote([prompt], params, [adapter]).future().add_done_callback(settle)
        return result
