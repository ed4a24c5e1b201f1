"""``trace-ray score env=NAME model=NAME split=eval``: the agent, greedy, on a benchmark split."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.progress import Progress

from trace_ray.agent import build_agent
from trace_ray.artifacts import write_json
from trace_ray.config import TraceConfig
from trace_ray.console import console, print_table
from trace_ray.engines import SamplingParams
from trace_ray.environment_setup import environment_maker
from trace_ray.episode_runner import run_episodes
from trace_ray.metrics import summarize

HELP = "score a model greedily on a benchmark split; prints Perfect and Mean similarity per family"


def run(config: TraceConfig) -> None:
    make_env = environment_maker(config.env)
    seeds = make_env().task_seeds(config.split)[: config.limit or None]
    agent = build_agent(config.model)
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=config.model.sampling.max_new_tokens)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"scoring {config.model.name} on {config.env.name}/{config.split}", total=len(seeds))
        results = run_episodes(
            make_env, seeds, agent, greedy, config.batch_size, on_done=lambda _: progress.advance(task)
        )
    rows = summarize(results)
    print_table(
        f"{config.model.name} on env={config.env.name} split={config.split} (greedy)",
        ["family", "tasks", "perfect", "success", "mean similarity"],
        [(row.group, row.tasks, row.perfect, row.successes, f"{row.mean_similarity:.3f}") for row in rows],
    )
    report = Path(config.run_dir) / "score" / f"{config.env.name}-{config.model.name}-{config.split}.json"
    write_json(
        report,
        {
            "env": config.env.name,
            "model": config.model.name,
            "split": config.split,
            "metrics": [dataclasses.asdict(row) for row in rows],
            "episodes": [
                {key: value for key, value in dataclasses.asdict(result).items() if key not in ("messages", "tools", "record")}
                for result in results
            ],
        },
    )
    console.print(f"per-task results: {report}")
