"""``trace-ray collect env=... model=... split=analysis samples_per_task=K``: episodes to Parquet on Ray."""

from __future__ import annotations

from rich.progress import Progress

from actors.rollout_service import start_rollout_service
from trace_ray.config import TraceConfig
from trace_ray.console import console, print_table
from trace_ray.engines import SamplingParams
from trace_ray.environment_setup import environment_maker
from trace_ray.metrics import summarize
from trace_ray.rollout_loop import benchmark_tasks
from trace_ray.trajectory_store import TrajectoryStore, episode_row

HELP = "sample K episodes per task of a split on Ray rollout workers and write run_dir/trajectories/ (Parquet)"


def collection_manifest(config: TraceConfig, split: str) -> dict:
    """What the trajectories of ``split`` are; a run directory holding different ones is refused."""
    return {
        "env": config.env.name,
        "split": split,
        "model": config.model.name,
        "samples_per_task": config.samples_per_task,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "max_new_tokens": config.model.sampling.max_new_tokens,
        "max_turns": config.env.max_turns,
        "max_episode_tokens": config.rollout.max_episode_tokens,
        "success_threshold": config.env.success_threshold,
        "seed": config.seed,
    }


def run(config: TraceConfig) -> None:
    collect(config, config.split, config.limit)


def collect(config: TraceConfig, split: str, limit: int | None) -> None:
    """``config.samples_per_task`` episodes of each of the first ``limit`` tasks of ``split`` (all: None) into
    run_dir/trajectories/, resuming the episodes already there."""
    manifest = collection_manifest(config, split)
    store = TrajectoryStore(config.run_dir, manifest)
    make_env = environment_maker(config.env)
    tasks = benchmark_tasks(make_env(), split, config.samples_per_task, limit)
    store.check_compatible()
    done = store.completed()
    todo = [task for task in tasks if (task.seed, task.sample_index) not in done]
    if len(todo) < len(tasks):
        console.print(f"resuming: {len(tasks) - len(todo)} of {len(tasks)} episodes already in {store.directory}")
    if todo:
        rollouts = start_rollout_service(config)
        params = SamplingParams(
            config.temperature, config.top_p, config.model.sampling.max_new_tokens, seed=config.seed
        )
        pending: list[dict] = []

        def on_done(result) -> None:
            pending.append(episode_row(result, manifest))
            progress.advance(bar)
            if len(pending) >= config.rollout.shard_size:
                store.write_shard(pending)
                pending.clear()

        try:
            with Progress(console=console, transient=True) as progress:
                bar = progress.add_task(
                    f"collecting {config.env.name}/{split} with {config.model.name}", total=len(todo)
                )
                rollouts.episodes(todo, params, on_done)
        finally:
            rollouts.close()
        if pending:
            store.write_shard(pending)
    print_summary(store, config, split)


def print_summary(store: TrajectoryStore, config: TraceConfig, split: str) -> None:
    table = store.read()
    rows = summarize(list(zip(*(table.column(name).to_pylist() for name in ("family", "reward", "success")))))
    print_table(
        f"collected {config.env.name}/{split} with {config.model.name} (T={config.temperature}, top_p={config.top_p})",
        ["family", "episodes", "perfect", "successes", "success rate", "mean reward"],
        [
            (r.group, r.episodes, r.perfect, r.successes, f"{r.success_rate:.3f}", f"{r.mean_similarity:.3f}")
            for r in rows
        ],
    )
    console.print(f"trajectories: {store.directory} ({len(table)} episodes)")
