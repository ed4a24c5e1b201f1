"""``trace-ray score env=NAME model=NAME split=eval``: the agent, greedy, on a benchmark split."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.progress import Progress

from trace_ray.agent_prompt import AgentPrompt
from trace_ray.artifacts import write_json
from trace_ray.config import TraceConfig
from trace_ray.console import console, print_table
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.environment_setup import environment_maker
from trace_ray.metrics import summarize
from trace_ray.rollout_loop import LocalBackend, benchmark_tasks, run_rollouts

HELP = "score a model greedily on a benchmark split; prints Perfect and Mean similarity per family"


def run(config: TraceConfig) -> None:
    make_env = environment_maker(config.env)
    tasks = benchmark_tasks(make_env(), config.split, limit=config.limit)
    engine = make_engine(config.model, config.engine)
    prompt = AgentPrompt.for_model(config.model, engine.tokenizer)
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=config.model.sampling.max_new_tokens)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(f"scoring {config.model.name} on {config.env.name}/{config.split}", total=len(tasks))
        results = run_rollouts(
            tasks,
            LocalBackend(make_env, engine),
            prompt,
            greedy,
            config.batch_size,
            config.model.max_context_tokens,
            on_done=lambda _: progress.advance(bar),
            max_episode_tokens=config.rollout.max_episode_tokens,
        )
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
