"""Model work of ``route`` and ``evaluate`` as Ray tasks: the job's driver loads no model weights.

A GPU-less head node runs the driver; the greedy episodes of every option,
the logit router's scores and the learned gate's and the MoE's training run
in a task holding a rollout worker's resources (``rollout.worker_cpus``,
``rollout.worker_gpus``), or one GPU when ``trainer.use_gpu`` (the gates
train there). The task's model goes to its GPU when Ray gave it one
(``models.assigned_device``). What a task writes (the router's files) must be
on storage the driver reads, as ``run_dir`` is on a cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.progress import Progress

from actors.ray_connection import connect_ray
from actors.remote_errors import task_error
from actors.rollout_service import start_rollout_service
from environments.protocol import Environment
from trace_ray.config import TraceConfig
from trace_ray.console import console
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.evaluation.played_episodes import Played
from trace_ray.resources import Role, check_placement, cluster_nodes
from trace_ray.rollout_loop import EpisodeTask
from trace_ray.routing.adapters import read_peft_folder
from trace_ray.routing.logit_router import BASE

ADAPTER_VERSION = 1  # every adapter a model task loads is the exported one


def model_task_resources(config: TraceConfig) -> dict[str, float]:
    gpus = max(config.rollout.worker_gpus, 1.0 if config.trainer.use_gpu else 0.0)
    return {"num_cpus": config.rollout.worker_cpus, "num_gpus": gpus}


def on_model_worker(config: TraceConfig, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` run as a Ray task with :func:`model_task_resources`; its one-line errors stay one line."""
    import ray

    connect_ray(config)
    resources = model_task_resources(config)
    role = Role(
        "model task", 1, resources["num_cpus"], resources["num_gpus"], "rollout.worker_cpus / rollout.worker_gpus"
    )
    check_placement(getattr(function, "__name__", "the model work"), [role], cluster_nodes())
    task = ray.remote(function).options(max_retries=0, **resources)
    try:
        return ray.get(task.remote(*args))
    except ray.exceptions.RayTaskError as exc:
        raise task_error(exc) from None


def play_options_here(
    config: TraceConfig,
    make_env: Callable[[], Environment],
    adapters: dict[str, Path],
    pairs: list[tuple[int, str]],
    make_engine_here: Callable[[], Any] | None,
) -> Played:
    """Each (seed, option) of ``pairs``: its greedy episode, through an in-process rollout service (the body of
    :func:`play_options`'s Ray task). One engine holds the base model and every adapter, all played in one batched
    run; ``make_engine_here`` builds another engine than the configured one."""
    engine = make_engine_here() if make_engine_here else make_engine(config.model, config.engine)
    rollouts = start_rollout_service(config, engine=engine, make_env=make_env)
    try:
        for name, folder in adapters.items():
            rollouts.publish_adapter(name, ADAPTER_VERSION, *read_peft_folder(folder))
        tasks = [
            EpisodeTask(f"{name}-{seed}", seed, 0, adapter=None if name == BASE else (name, ADAPTER_VERSION))
            for seed, name in pairs
        ]
        greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=config.model.sampling.max_new_tokens)
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task(f"greedy episodes: {len(tasks)}", total=len(tasks))
            results = rollouts.episodes(tasks, greedy, lambda _: progress.advance(bar))
    finally:
        rollouts.close()
    played: Played = {}
    for task, result in zip(tasks, results):
        played.setdefault(task.seed, {})[task.key.rsplit("-", 1)[0]] = result
    return played


def play_options(
    config: TraceConfig,
    make_env: Callable[[], Environment],
    adapters: dict[str, Path],
    seeds: list[int],
    with_base: bool = True,
    make_engine_here: Callable[[], Any] | None = None,
    known: Played | None = None,
) -> Played:
    """Seed -> option (``base`` and each adapter name) -> its greedy episode, played on a Ray model worker (the driver
    loads no weights). With greedy decoding and an adapter chosen at the start of the conversation, a router's score
    on a task is the score of the option it picks, so routers are scored from these episodes without playing again.

    ``make_engine_here``: builds the engine to use in the worker (for instance a gated mixture-of-experts engine)
    instead of the configured one. ``known``: episodes already played (:mod:`trace_ray.evaluation.played_episodes`);
    only the others are played.
    """
    names = ([BASE] if with_base else []) + list(adapters)
    known = known or {}
    pairs = [(seed, name) for seed in seeds for name in names if name not in known.get(seed, {})]
    reused = len(seeds) * len(names) - len(pairs)
    console.print(
        f"greedy episodes: {len(seeds)} tasks x {len(names)} options"
        + (f", {reused} already played, {len(pairs)} to play" if reused else "")
        + " on a Ray model worker"
    )
    played: Played = {
        seed: {name: known[seed][name] for name in names if name in known.get(seed, {})} for seed in seeds
    }
    if pairs:
        fresh = on_model_worker(config, play_options_here, config, make_env, adapters, pairs, make_engine_here)
        for seed, results in fresh.items():
            played[seed].update(results)
    return played
