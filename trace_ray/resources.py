"""What a job asks Ray for, and whether the cluster can place it: checked before anything waits.

A job's actors and workers (:class:`Role`: how many, the CPUs and GPUs of
each) are placed on the cluster's nodes first-fit, largest first. A job that
cannot be placed fails at once with one line naming the demand and what the
cluster has. A training job first shrinks what it can: its Ray Train workers
and its rollout workers take turns (rollouts, then the update), so the train
workers' CPU share is lowered (down to ``MIN_TRAIN_WORKER_CPUS``) until the
job fits, as on a 2-core machine where two train workers, a rollout worker
and an environment actor ask for 2.1 CPUs.

:func:`wait_ready` then bounds the wait for actors that the check let
through but that do not come up (another job holds the resources, a node
left): it reports what is missing every ``REPORT_EVERY_S`` and gives up after
``ray.placement_timeout_s``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from environments.errors import TraceRayError
from trace_ray.config import TraceConfig
from trace_ray.console import console

MIN_TRAIN_WORKER_CPUS = 0.05  # the least CPU share a Ray Train worker is lowered to
REPORT_EVERY_S = 60.0  # how often a wait for actors that are not up says so


@dataclass(frozen=True)
class Role:
    """``count`` actors of one kind, each asking for ``cpus`` CPUs and ``gpus`` GPUs; ``setting``: the key of the
    count."""

    name: str
    count: int
    cpus: float
    gpus: float
    setting: str

    def describe(self) -> str:
        each = f"{self.cpus:g} CPU" + (f" + {self.gpus:g} GPU" if self.gpus else "")
        return f"{self.count} {self.name} x {each} ({self.setting})"


def rollout_roles(config: TraceConfig) -> list[Role]:
    rollout = config.rollout
    return [
        Role("rollout worker", rollout.num_workers, rollout.worker_cpus, rollout.worker_gpus, "rollout.num_workers"),
        Role("environment actor", rollout.num_env_actors, rollout.env_actor_cpus, 0.0, "rollout.num_env_actors"),
    ]


def training_roles(config: TraceConfig) -> list[Role]:
    trainer = config.trainer
    gpus = trainer.gpus_per_worker if trainer.use_gpu else 0.0
    train_workers = Role("Ray Train worker", trainer.num_workers, trainer.cpus_per_worker, gpus, "trainer.num_workers")
    return [train_workers, *rollout_roles(config)]


def unplaced(roles: list[Role], nodes: list[dict[str, float]]) -> Role | None:
    """The first role with an actor that finds no node when every actor is placed first-fit, largest first (None: all
    fit)."""
    free = [{"CPU": node.get("CPU", 0.0), "GPU": node.get("GPU", 0.0)} for node in nodes]
    actors = sorted(
        (role for role in roles for _ in range(role.count)), key=lambda role: (role.gpus, role.cpus), reverse=True
    )
    for role in actors:
        node = next(
            (node for node in free if node["CPU"] + 1e-9 >= role.cpus and node["GPU"] + 1e-9 >= role.gpus), None
        )
        if node is None:
            return role
        node["CPU"] -= role.cpus
        node["GPU"] -= role.gpus
    return None


def cluster_summary(nodes: list[dict[str, float]]) -> str:
    cpus, gpus = sum(node.get("CPU", 0.0) for node in nodes), sum(node.get("GPU", 0.0) for node in nodes)
    return f"{cpus:g} CPUs and {gpus:g} GPUs on {len(nodes)} node{'s' if len(nodes) != 1 else ''}"


def placement_error(what: str, roles: list[Role], nodes: list[dict[str, float]], role: Role) -> TraceRayError:
    demand = ", ".join(role.describe() for role in roles if role.count)
    return TraceRayError(
        f"{what} cannot be placed: it needs {demand}; the cluster has {cluster_summary(nodes)}, and a {role.name} "
        "finds no "
        f"node with room; lower {role.setting} or the CPUs/GPUs each asks for, or add nodes (ray status)"
    )


def check_placement(what: str, roles: list[Role], nodes: list[dict[str, float]]) -> None:
    """Raise the one-line :func:`placement_error` when ``roles`` cannot all be placed on ``nodes``."""
    role = unplaced(roles, nodes)
    if role is not None:
        raise placement_error(what, roles, nodes, role)


def check_rollout_pool(config: TraceConfig, nodes: list[dict[str, float]]) -> None:
    """Raise when the rollout workers and environment actors cannot all be placed on ``nodes``."""
    check_placement("the rollout pool", rollout_roles(config), nodes)


def fit_training(config: TraceConfig, nodes: list[dict[str, float]]) -> TraceConfig:
    """``config`` whose training job fits on ``nodes``: as it is, or with the Ray Train workers' CPU share lowered
    (they and the rollout workers take turns); raises when even the least share does not place the job."""
    trainer = config.trainer
    cpus = trainer.cpus_per_worker
    while True:
        candidate = dataclasses.replace(config, trainer=dataclasses.replace(trainer, cpus_per_worker=cpus))
        role = unplaced(training_roles(candidate), nodes)
        if role is None:
            return candidate
        if cpus <= MIN_TRAIN_WORKER_CPUS:
            break
        cpus = max(MIN_TRAIN_WORKER_CPUS, round(cpus / 2, 4))
    raise placement_error("the training job", training_roles(config), nodes, role)


def cluster_nodes() -> list[dict[str, float]]:
    """The resources of the cluster's live nodes."""
    import ray

    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]


def wait_ready(references: list, what: str, roles: list[Role], timeout_s: float | None) -> list:
    """``ray.get(references)``, saying every ``REPORT_EVERY_S`` what is not up yet and what the cluster has free;
    a TraceRayError after ``timeout_s`` (None: wait on, still reporting)."""
    import ray

    started = time.monotonic()
    pending = list(references)
    while True:
        waited = time.monotonic() - started
        limit = REPORT_EVERY_S if timeout_s is None else max(0.0, min(REPORT_EVERY_S, timeout_s - waited))
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=limit)
        if not pending:
            return ray.get(references)
        waited = time.monotonic() - started
        free = ray.available_resources()
        status = (
            f"{len(pending)} of {len(references)} {what} not up after {waited:.0f} s (loading, or waiting for "
            f"{'; '.join(role.describe() for role in roles if role.count)}); free now: {free.get('CPU', 0.0):g} CPUs, "
            f"{free.get('GPU', 0.0):g} GPUs"
        )
        if timeout_s is not None and waited >= timeout_s:
            raise TraceRayError(
                f"{status}; gave up after ray.placement_timeout_s={timeout_s:g} (ray status shows pending demands)"
            )
        console.print(f"[yellow]{status}[/yellow]", soft_wrap=True)
