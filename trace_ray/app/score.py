"""``trace-ray score env=NAME model=NAME split=eval``: the agent, greedy, on a benchmark split."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.progress import Progress

from actors.rollout_service import start_rollout_service
from trace_ray.artifacts import write_json
from trace_ray.config import TraceConfig
from trace_ray.console import console, print_table
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.environment_setup import environment_maker
from trace_ray.metrics import summarize
from trace_ray.rollout_loop import benchmark_tasks

HELP = "score a model greedily on a benchmark split; prints Perfect and Mean similarity per family"


def run(config: TraceConfig) -> None:
    make_env = environment_maker(config.env)
    tasks = benchmark_tasks(make_env(), config.split, limit=config.limit)
    rollouts = start_rollout_service(config, engine=make_engine(config.model, config.engine), make_env=make_env)
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=config.model.sampling.max_new_tokens)
    try:
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task(
                f"scoring {config.model.name} on {config.env.name}/{config.split}", total=len(tasks)
            )
            results = rollouts.episodes(tasks, greedy, lambda _: progress.advance(bar))
    finally:
        rollouts.close()
    rows = summarize([(result.family, result.reward, result.success) for result in results])
    print_table(
        f"{config.model.name} on env={config.env.name} split={config.split} (greedy)",
        ["family", "tasks", "perfect", "success", "mean similarity"],
        [(row.group, row.episodes, row.perfect, row.successes, f"{row.mean_similarity:.3f}") for row in rows],
    )
    report = Path(config.run_dir) / "score" / f"{config.env.name}-{config.model.name}-{config.split}.json"
    episodes = [
        {
            "task_id": r.task_id,
            "family": r.family,
            "seed": r.seed,
            "reward": r.reward,
            "success": r.success,
            "turns": r.turns,
            "termination": r.termination,
            "milestones": r.info.get("milestones", []),
        }
        for r in results
    ]
    metrics = [dataclasses.asdict(row) for row in rows]
    write_json(
        report,
        {
            "env": config.env.name,
            "model": config.model.name,
            "split": config.split,
            "metrics": metrics,
            "episodes": episodes,
        },
    )
    console.print(f"per-task results: {report}")
