"""``trace-ray route run_dir=DIR``: route held-out target tasks to capability adapters, scored against oracle labels.

Oracle labels: every task of ``split`` (default ``eval``) is played greedily
with the base model and with each trained adapter; the label is whichever
scored best (ties go to the base). The router (``router=logit``, the paper's
training-free router: ``trace_ray/routing/logit_router.py``) reads each
task's first observation with each capability's description and one
successful trajectory of its synthetic environment (the oracle's). Writes
``DIR/router/logit.json`` (per task: choice, scores, oracle label, rewards)
and ``DIR/router/report.md`` (accuracy and the confusion matrix).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.progress import Progress

from environments.self_checks import oracle
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.artifacts import atomic_path, write_json
from trace_ray.config import TraceConfig
from trace_ray.console import console, print_table
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.environment_setup import environment_maker, synthetic_env_config
from trace_ray.rollout_loop import EpisodeTask, LocalBackend, run_rollouts
from trace_ray.routing.adapters import TrainedAdapter, read_peft_folder, trained_adapters
from trace_ray.routing.logit_router import BASE, LogitRouter, RouteOption, compact_messages

HELP = "route held-out tasks to capability adapters with the logit router; accuracy and confusion matrix against oracle labels"
ADAPTER_VERSION = 1


def oracle_example(config: TraceConfig, run_dir: Path, adapter: TrainedAdapter) -> str:
    """One successful trajectory of the adapter's synthetic environment (its oracle's), compacted."""
    env = environment_maker(synthetic_env_config(config, adapter.name))()
    seed = env.task_seeds("analysis")[0]
    messages = list(env.reset(seed).messages)
    while True:
        message = oracle(env)
        step = env.step(message)
        messages += [message, *step.messages]
        if step.done:
            return compact_messages(messages, config.router.max_example_chars)


def best_choice(rewards: dict[str, float], order: list[str]) -> str:
    """The option with the highest reward; ties go to the base, else to the first in ``order``."""
    best = max(rewards.values())
    tied = [name for name in order if rewards[name] == best]
    return BASE if BASE in tied else tied[0]


def oracle_rewards(config: TraceConfig, adapters: list[TrainedAdapter], seeds: list[int]) -> dict[int, dict[str, float]]:
    """Seed -> option -> greedy reward of the base model and of each adapter."""
    make_env = environment_maker(config.env)
    engine = make_engine(config.model, config.engine)
    for adapter in adapters:
        weights, lora_config = read_peft_folder(adapter.folder)
        engine.load_adapter(adapter.name, ADAPTER_VERSION, weights, lora_config)
    options: list[tuple[str, tuple[str, int] | None]] = [(BASE, None)] + [(a.name, (a.name, ADAPTER_VERSION)) for a in adapters]
    tasks = [EpisodeTask(f"{name}-{seed}", seed, 0, adapter=ref) for seed in seeds for name, ref in options]
    greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=config.model.sampling.max_new_tokens)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(f"oracle labels: {len(seeds)} tasks x {len(options)} options", total=len(tasks))
        results = run_rollouts(
            tasks, LocalBackend(make_env, engine), AgentPrompt.for_model(config.model, engine.tokenizer), greedy,
            config.batch_size, config.model.max_context_tokens, lambda _: progress.advance(bar), config.rollout.max_episode_tokens,
        )
    if hasattr(engine, "close"):
        engine.close()
    rewards: dict[int, dict[str, float]] = {seed: {} for seed in seeds}
    for task, result in zip(tasks, results):
        rewards[task.seed][task.key.rsplit("-", 1)[0]] = result.reward
    return rewards


def confusion(labels: list[str], choices: list[str], names: list[str]) -> list[list[int]]:
    """Rows: oracle label; columns: the router's choice; both in ``names`` order."""
    counts = Counter(zip(labels, choices))
    return [[counts[(label, choice)] for choice in names] for label in names]


def report_markdown(names: list[str], matrix: list[list[int]], accuracy: float, tasks: int, split: str) -> str:
    header = "| oracle \\ router | " + " | ".join(names) + " |"
    rule = "|---" * (len(names) + 1) + "|"
    rows = [f"| {name} | " + " | ".join(str(n) for n in row) + " |" for name, row in zip(names, matrix)]
    return "\n".join([
        f"# Routing on {tasks} held-out tasks ({split})", "", f"logit router accuracy against the oracle labels: {accuracy:.3f}", "",
        header, rule, *rows, "",
    ])


def run(config: TraceConfig) -> None:
    from trace_ray.models import load_model

    run_dir = Path(config.run_dir)
    adapters = trained_adapters(run_dir)
    target = environment_maker(config.env)()
    seeds = target.task_seeds(config.split)[: config.limit or None]
    rewards = oracle_rewards(config, adapters, seeds)
    names = [a.name for a in adapters] + [BASE]
    labels = [best_choice(rewards[seed], [BASE] + names[:-1]) for seed in seeds]
    model, tokenizer = load_model(config.model)
    options = [RouteOption(a.name, a.description, oracle_example(config, run_dir, a)) for a in adapters]
    router = LogitRouter(model, tokenizer, options, max_example_chars=config.router.max_example_chars)
    decisions = router.route_many([list(target.reset(seed).messages) for seed in seeds])
    choices = [decision.choice for decision in decisions]
    accuracy = sum(label == choice for label, choice in zip(labels, choices)) / len(seeds)
    matrix = confusion(labels, choices, names)
    folder = run_dir / "router"
    write_json(folder / "logit.json", {
        "router": "logit", "split": config.split, "options": names, "accuracy": accuracy, "confusion": matrix,
        "tasks": [
            {"seed": seed, "choice": d.choice, "scores": d.scores, "probabilities": d.probabilities, "oracle": label, "rewards": rewards[seed]}
            for seed, d, label in zip(seeds, decisions, labels)
        ],
    })
    with atomic_path(folder / "report.md") as scratch:
        Path(scratch).write_text(report_markdown(names, matrix, accuracy, len(seeds), config.split))
    print_table(
        f"logit router on {len(seeds)} {config.env.name}/{config.split} tasks: accuracy {accuracy:.3f} (rows: oracle label, columns: choice)",
        ["oracle \\ router", *names],
        [(name, *(str(n) for n in row)) for name, row in zip(names, matrix)],
    )
    console.print(f"per-task decisions: {folder / 'logit.json'}")
