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

from typing import Any, Callable

from trace_ray.config import TraceConfig


def model_task_resources(config: TraceConfig) -> dict[str, float]:
    gpus = max(config.rollout.worker_gpus, 1.0 if config.trainer.use_gpu else 0.0)
    return {"num_cpus": config.rollout.worker_cpus, "num_gpus": gpus}


def on_model_worker(config: TraceConfig, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` run as a Ray task with :func:`model_task_resources`; its one-line errors stay one line."""
    import ray

    from actors.rollout_coordinator import connect_ray, task_error
    from trace_ray.resources import Role, check_placement, cluster_nodes

    connect_ray(config)
    resources = model_task_resources(config)
    role = Role("model task", 1, resources["num_cpus"], resources["num_gpus"], "rollout.worker_cpus / rollout.worker_gpus")
    check_placement(getattr(function, "__name__", "the model work"), [role], cluster_nodes())
    task = ray.remote(function).options(max_retries=0, **resources)
    try:
        return ray.get(task.remote(*args))
    except ray.exceptions.RayTaskError as exc:
        raise task_error(exc) from None
