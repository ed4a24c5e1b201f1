"""``trace-ray train run_dir=DIR``: one LoRA adapter per READY capability, GRPO on Ray Train (TRACE step 3).

Jobs: every READY capability of ``DIR/capabilities/selected.json`` in its
synthetic environment (``capability=NAME``: that one; an OUT_OF_BAND capability, whose calibration
found no difficulty in band, is skipped with its reason unless
``synthesis.accept_out_of_band=true``), or ``env=`` itself
(``env=synthetic/<capability>``, or ``train_on=env`` for a target such as
``env=device``: the GRPO-on-target baseline). Each job is a
``TorchTrainer`` run (``actors/train_worker.py``) named
``grpo-<name>-<fingerprint>``, the fingerprint a hash of every setting that
shapes the adapter (model, lora, grpo, seed, the environment: ``TRAINING_KEYS``);
its checkpoints live under ``trainer.storage_path/<run name>`` (default
``DIR/train_state``). Rerunning the same command resumes a job from its latest
checkpoint (a larger ``grpo.iterations``, ``grpo.max_iterations`` or ``grpo.max_rollouts`` continues
it); changed settings start a run of their own and never resume another's
checkpoint. The adapter is exported to ``DIR/adapters/<name>/`` as a PEFT
folder, beside ``metrics.parquet``, ``tensorboard/`` and ``reward_curve.png``.

``-m`` sweeps (``lora.rank=4,8``) train the combinations one after another;
where several combinations would write the same adapter folder, each writes
``DIR/adapters/<name>__<key-value__key-value>/`` instead, named by the keys in
which they differ (as ``trace-ray pipeline -m`` names its run directories).

Capabilities train one after another, or ``trainer.concurrent_jobs`` at once
as far as the cluster's free CPUs and GPUs hold that many jobs (each job: its
Ray Train workers, rollout workers and environment actors).
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.progress import Progress

from actors.ray_connection import connect_ray
from actors.train_worker import BatchMailbox, train_loop_per_worker
from environments.errors import TraceRayError
from trace_ray.app.sweeps import job_name
from trace_ray.capabilities.selection_file import (
    OUT_OF_BAND,
    READY,
    informative_fraction,
    read_selection,
    selection_path,
    trainable,
)
from trace_ray.config import GRPOConfig, TraceConfig
from trace_ray.console import console, print_table
from trace_ray.environment_setup import synthetic_env_config
from trace_ray.resources import cluster_nodes, cluster_summary, fit_training, training_roles
from trace_ray.run_manifest import config_values, digest, tree_hash
from trace_ray.training.grpo_iteration import TrainJob
from trace_ray.training.training_log import read_metrics

HELP = "train one LoRA adapter per READY capability with GRPO on Ray Train (run_dir/adapters/<name>/)"
POLL_S = 2.0
# grpo keys a resumed run may change: when it stops and how often it checkpoints
RESUMABLE_GRPO_KEYS = (
    "iterations",
    "max_iterations",
    "max_rollouts",
    "plateau_patience",
    "plateau_delta",
    "checkpoint_every",
)
# the settings that shape an adapter (with its name and environment): a change starts another Ray Train run
TRAINING_KEYS = (
    "model",
    "lora",
    "seed",
    "rollout.max_episode_tokens",
    "trainer.strategy",
    *(f"grpo.{f.name}" for f in dataclasses.fields(GRPOConfig) if f.name not in RESUMABLE_GRPO_KEYS),
)


def trainable_entries(config: TraceConfig, run_dir: Path, capability: str | None) -> list[dict]:
    """The READY capabilities (``capability``: that one), and the OUT_OF_BAND ones under
    ``synthesis.accept_out_of_band=true``; one console line per OUT_OF_BAND capability, trained or skipped."""
    path = selection_path(run_dir)
    entries = read_selection(run_dir, "run trace-ray identify and trace-ray synthesize run_dir=DIR first")
    if capability:
        entries = [entry for entry in entries if entry.get("name") == capability]
        if not entries:
            raise TraceRayError(f"capability={capability!r} is not in {path}; choose one of its names")
        if entries[0].get("status") not in (READY, OUT_OF_BAND):
            raise TraceRayError(
                f"capability {capability!r} is {entries[0].get('status')}, not READY; run trace-ray synthesize "
                f"run_dir={run_dir}"
            )
    accept = config.synthesis.accept_out_of_band
    outside = [entry for entry in entries if entry.get("status") == OUT_OF_BAND]
    for entry in outside:
        if trainable(entry, config.synthesis):
            verdict = "trained anyway (synthesis.accept_out_of_band=true)"
        else:
            verdict = (
                "skipped"
                if not accept
                else (
                    f"skipped, too little GRPO signal ({informative_fraction(entry):.2f} of its calibration groups "
                    "informative, "
                    f"synthesis.min_informative_fraction={config.synthesis.min_informative_fraction or 0}; "
                    "synthesis.train_without_signal=true trains it)"
                )
            )
        console.print(
            f"{entry['name']}: {OUT_OF_BAND}, {verdict}: {entry.get('reason', 'no difficulty level in band')}",
            soft_wrap=True,
        )
    chosen = [entry for entry in entries if trainable(entry, config.synthesis)]
    if not chosen and outside:
        names = ", ".join(entry["name"] for entry in outside)
        anyway = "" if accept else "train them anyway with synthesis.accept_out_of_band=true, or "
        signal = ", and too few groups of its nearest level had unequal rewards" if accept else ""
        raise TraceRayError(
            f"no capability of {path} is trainable ({names}: {OUT_OF_BAND}, calibration found no difficulty in "
            f"band{signal}); "
            f"{anyway}re-synthesize them (trace-ray synthesize run_dir={run_dir} with other calibration.band or "
            "calibration.max_rounds) or synthesize other capabilities"
        )
    if not chosen:
        raise TraceRayError(f"no READY capability in {path}; run trace-ray synthesize run_dir={run_dir} first")
    return chosen


def capability_jobs(config: TraceConfig, capability: str | None = None, adapter: str | None = None) -> list[TrainJob]:
    """A job per trainable capability of run_dir's selection (``capability``: that one, under the name ``adapter``
    if given), each in its synthetic environment."""
    run_dir = Path(config.run_dir).resolve()
    entries = trainable_entries(config, run_dir, capability)
    if adapter and len(entries) > 1:
        raise TraceRayError("adapter= names one adapter; add capability=NAME to train one capability under it")
    jobs = []
    for entry in entries:
        name = adapter or entry["name"]
        jobs.append(
            TrainJob(name, synthetic_env_config(config, entry["name"]), str(run_dir / "adapters" / name), config.grpo)
        )
    return jobs


def environment_job(config: TraceConfig, name: str, grpo: GRPOConfig) -> TrainJob:
    """A job training ``config.env`` itself (a target, or one synthetic environment) into the adapter ``name``."""
    env = config.env
    if env.name == "synthetic":
        env = dataclasses.replace(env, spec=str(Path(env.spec).resolve()))
    return TrainJob(name, env, str(Path(config.run_dir).resolve() / "adapters" / name), grpo)


def train_jobs(config: TraceConfig) -> list[TrainJob]:
    """``trace-ray train``'s jobs: ``env=synthetic/<capability>`` or ``train_on=env``, one job in ``config.env``;
    else one per trainable capability of the run directory (``capability=``, ``adapter=``)."""
    if config.env.name == "synthetic" or config.train_on == "env":
        name = config.adapter or (config.env.capability if config.env.name == "synthetic" else config.env.name)
        return [environment_job(config, name, config.grpo)]
    return capability_jobs(config, config.capability, config.adapter)


def job_resources(config: TraceConfig) -> dict[str, float]:
    """The CPUs and GPUs one training job holds: its Ray Train workers, rollout workers and environment actors."""
    roles = training_roles(config)
    return {"CPU": sum(role.count * role.cpus for role in roles), "GPU": sum(role.count * role.gpus for role in roles)}


def fit_cluster(config: TraceConfig) -> TraceConfig:
    """``config`` as the cluster can place its training job (one line on what was lowered); raises when it cannot."""
    nodes = cluster_nodes()
    fitted = fit_training(config, nodes)
    before, after = config.trainer.cpus_per_worker, fitted.trainer.cpus_per_worker
    if after != before:
        console.print(
            f"trainer.cpus_per_worker={before:g} lowered to {after:g}: the training job asks for "
            f"{job_resources(config)['CPU']:g} "
            f"CPUs, the cluster has {cluster_summary(nodes)}; the Ray Train workers share cores with the rollout "
            "workers, "
            "which take turns with them",
            soft_wrap=True,
        )
    return fitted


def concurrent_slots(requested: int, jobs: int, need: dict[str, float], available: dict[str, float]) -> int:
    """How many jobs run at once: at most ``requested`` and ``jobs``, as many as ``available`` holds, at least 1."""
    fits = min(
        (math.floor(available.get(key, 0.0) / amount + 1e-9) for key, amount in need.items() if amount > 0),
        default=jobs,
    )
    return max(1, min(requested, jobs, fits))


def sharing_cores(config: TraceConfig, slots: int) -> TraceConfig:
    """``config`` with the default torch threads of train and rollout workers split among ``slots`` concurrent jobs."""
    if slots == 1:
        return config
    cores = os.cpu_count() or 1
    trainer, rollout = config.trainer, config.rollout
    return dataclasses.replace(
        config,
        trainer=dataclasses.replace(
            trainer, torch_threads=trainer.torch_threads or max(1, cores // (trainer.num_workers * slots))
        ),
        rollout=dataclasses.replace(
            rollout, worker_threads=rollout.worker_threads or max(1, cores // (rollout.num_workers * slots))
        ),
    )


def run_name(config: TraceConfig, job: TrainJob) -> str:
    """``grpo-<adapter>-<fingerprint of TRAINING_KEYS, the adapter and its environment>``: the Ray Train run,
    and so the checkpoint folder, of exactly these settings (a synthetic environment by its spec's content)."""
    env = dataclasses.asdict(job.env)
    if job.env.spec:
        spec = Path(job.env.spec)
        env["spec"] = tree_hash(spec.parent, [spec.name])
    keys = [key for key in TRAINING_KEYS if not key.startswith("grpo.")]
    grpo_keys = [key for key in TRAINING_KEYS if key.startswith("grpo.")]
    values = {**config_values(config, keys), **config_values(job, grpo_keys)}  # the job's own GRPO settings
    return f"grpo-{job.name}-{digest([values, job.name, env])}"


def gpu_share(trainer) -> dict[str, float]:
    """The GPU a Ray Train worker asks for: ``trainer.gpus_per_worker`` when it uses one (below 1: it shares the GPU,
    e.g. with a vLLM rollout engine on a one-GPU machine)."""
    return {"GPU": trainer.gpus_per_worker} if trainer.use_gpu else {}


def torch_trainer(config: TraceConfig, job: TrainJob, mailbox):
    """The TorchTrainer of ``job``; ``mailbox``: the BatchMailbox actor of a multi-worker job (else None)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer_config = config.trainer
    storage = trainer_config.storage_path or str(Path(config.run_dir).resolve() / "train_state")
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": config, "job": job, "mailbox": mailbox},
        torch_config=TorchConfig(
            backend="nccl" if trainer_config.use_gpu else "gloo", timeout_s=trainer_config.collective_timeout_s
        ),
        scaling_config=ray.train.ScalingConfig(
            num_workers=trainer_config.num_workers,
            use_gpu=trainer_config.use_gpu,
            resources_per_worker={"CPU": trainer_config.cpus_per_worker, **gpu_share(trainer_config)},
        ),
        run_config=ray.train.RunConfig(
            name=run_name(config, job),
            storage_path=storage,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            failure_config=ray.train.FailureConfig(max_failures=0),
        ),
    )


def fit(config: TraceConfig, job: TrainJob, progress: Progress, interrupted: threading.Event) -> list[dict]:
    """One TorchTrainer run (resumed from its latest checkpoint if any); the metrics of every iteration.

    Raises KeyboardInterrupt once ``interrupted`` is set (Ctrl-C on the main thread), without waiting for the
    trainer: its thread ends with the process, and the run resumes from its last checkpoint."""
    import ray

    from trace_ray.environment_setup import environment_maker

    environment_maker(job.env)  # a missing environment fails here, in one line, not inside a worker
    workers = config.trainer.num_workers
    mailbox = ray.remote(BatchMailbox).options(num_cpus=0).remote(workers - 1) if workers > 1 else None
    trainer = torch_trainer(config, job, mailbox)
    done = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # surfaced on the main thread below
            failure.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    bar = progress.add_task(f"GRPO {job.name}", total=job.grpo.max_iterations or job.grpo.iterations)
    while not done.wait(POLL_S):
        if interrupted.is_set():
            raise KeyboardInterrupt
        rows = read_metrics(Path(job.output))
        if rows:
            last = rows[-1]
            progress.update(
                bar, completed=last["iteration"], description=f"GRPO {job.name} reward {last['reward_mean']:.3f}"
            )
    progress.remove_task(bar)
    thread.join()
    if mailbox is not None:
        ray.kill(mailbox)
    if failure:
        raise training_error(failure[0], job) from None
    return read_metrics(Path(job.output))


def training_error(exc: BaseException, job: TrainJob) -> TraceRayError:
    """One line for a failed job: the worker's TraceRayError as it is; any other error by its type and first line."""
    cause, innermost, seen = exc, exc, set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, TraceRayError):
            return TraceRayError(f"training {job.name} failed: {cause.args[0]}")
        innermost = cause
        nested = getattr(cause, "worker_failures", None) or getattr(cause, "cause", None)
        if isinstance(nested, dict):
            nested = next(iter(nested.values()), None)
        cause = nested or cause.__cause__
    reason = next((line.strip() for line in str(innermost).splitlines() if line.strip()), "no message")
    return TraceRayError(
        f"training {job.name} failed: {type(innermost).__name__}: {reason}; "
        "the worker's traceback is in the Ray logs (/tmp/ray/session_latest/logs on its node)"
    )


def distinct_outputs(plan: list[tuple[TraceConfig, list[TrainJob]]]) -> list[tuple[TraceConfig, list[TrainJob]]]:
    """A sweep's (combination, jobs), every job writing its own adapter folder: a job whose folder another
    combination would write too becomes ``<name>__<key-value__key-value>``, of the keys in which they differ."""
    distinct = []
    for config, jobs in plan:
        renamed = []
        for job in jobs:
            sharing = [
                other for other, others in plan if other is not config and any(o.output == job.output for o in others)
            ]
            if sharing:
                name = f"{job.name}__{job_name(config, sharing)}"
                job = dataclasses.replace(job, name=name, output=str(Path(job.output).with_name(name)))
            renamed.append(job)
        distinct.append((config, renamed))
    return distinct


def run(config: TraceConfig) -> None:
    train_all(config, train_jobs(config))


def train_capabilities(config: TraceConfig) -> None:
    """An adapter for every trainable capability of run_dir's selection."""
    train_all(config, capability_jobs(config))


def train_on_target(config: TraceConfig, name: str, grpo: GRPOConfig) -> None:
    """The adapter ``name`` trained with ``grpo`` on the target environment itself (the GRPO-on-target baseline)."""
    train_all(config, [environment_job(config, name, grpo)])


def run_sweep(configs: list[TraceConfig]) -> None:
    """``trace-ray train -m ...``: the combinations one after another, each adapter in a folder of its own."""
    plan = distinct_outputs([(config, train_jobs(config)) for config in configs])
    for number, (config, jobs) in enumerate(plan, 1):
        console.print(f"[bold]sweep job {number}/{len(plan)}:[/bold] {', '.join(job.name for job in jobs)}")
        train_all(config, jobs)


def train_all(config: TraceConfig, jobs: list[TrainJob]) -> None:
    import ray

    # on the main thread: Ray kills a local cluster's processes when the thread that started them ends (Linux's
    # parent-death signal), and a job thread ends with its job, taking the next job's Ray down without a word
    connect_ray(config)
    config = fit_cluster(config)
    slots = 1
    if config.trainer.concurrent_jobs > 1 and len(jobs) > 1:
        need = job_resources(config)
        slots = concurrent_slots(config.trainer.concurrent_jobs, len(jobs), need, ray.available_resources())
        if slots < min(config.trainer.concurrent_jobs, len(jobs)):
            console.print(
                f"the cluster holds {slots} training job(s) at once (each needs {need['CPU']:g} CPU, "
                f"{need['GPU']:g} GPU); running {slots}"
            )
    config = sharing_cores(config, slots)

    def train_one(job: TrainJob) -> tuple[str, ...]:
        env = f"{job.env.name}{'/' + job.env.capability if job.env.capability else ''}"
        console.print(f"[bold]{job.name}[/bold]: GRPO in env={env} -> {job.output}", soft_wrap=True)
        history = fit(config, job, progress, interrupted)
        if not history:
            raise TraceRayError(f"training {job.name} reported no iteration; see the Ray logs")
        first, last = history[0], history[-1]
        return (
            job.name,
            str(last["iteration"]),
            f"{first['reward_mean']:.3f}",
            f"{last['reward_mean']:.3f}",
            f"{max(h['reward_mean'] for h in history):.3f}",
            "plateau" if last.get("stopped_on_plateau") else "iterations",
        )

    interrupted = threading.Event()
    with Progress(console=console, transient=True) as progress, ThreadPoolExecutor(slots) as pool:
        try:
            rows = list(pool.map(train_one, jobs))
        except KeyboardInterrupt:  # stop now: no job starts, running ones stop polling (leaving the pool waits on them)
            interrupted.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    print_table(
        f"GRPO adapters in {Path(config.run_dir) / 'adapters'}",
        ["adapter", "iterations", "first reward", "last reward", "best reward", "stopped by"],
        rows,
    )
