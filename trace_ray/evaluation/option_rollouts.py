"""Greedy episodes of a task set under each option: the base model, or the base model with one LoRA adapter.

One engine holds the base model and every adapter; each task is played once
per option, all in one batched run. With greedy decoding and an adapter
chosen at the start of the conversation, a router's score on a task is the
score of the option it picks, so routers are scored from these episodes
without playing the tasks again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.progress import Progress

from environments.protocol import Environment
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.config import TraceConfig
from trace_ray.console import console
from trace_ray.engines import SamplingParams, make_engine
from trace_ray.evaluation.played_episodes import Played
from trace_ray.rollout_loop import EpisodeTask, LocalBackend, run_rollouts
from trace_ray.routing.adapters import read_peft_folder
from trace_ray.routing.logit_router import BASE

ADAPTER_VERSION = 1


def best_choice(rewards: dict[str, float], order: list[str]) -> str:
    """The oracle label: the option with the highest reward; ties go to the base, else to the first in ``order``."""
    best = max(rewards.values())
    tied = [name for name in order if rewards[name] == best]
    return BASE if BASE in tied else tied[0]


def play_options_here(
    config: TraceConfig,
    make_env: Callable[[], Environment],
    adapters: dict[str, Path],
    pairs: list[tuple[int, str]],
    make_engine_here: Callable[[], Any] | None,
) -> Played:
    """Each (seed, option) of ``pairs``: its greedy episode, in this process (``actors.model_tasks.play_options`` runs
    it on a Ray model worker)."""
    engine = make_engine_here() if make_engine_here else make_engine(config.model, config.engine)
    try:
        for name, folder in adapters.items():
            engine.load_adapter(name, ADAPTER_VERSION, *read_peft_folder(folder))
        tasks = [
            EpisodeTask(f"{name}-{seed}", seed, 0, adapter=None if name == BASE else (name, ADAPTER_VERSION))
            for seed, name in pairs
        ]
        greedy = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=config.model.sampling.max_new_tokens)
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task(f"greedy episodes: {len(tasks)}", total=len(tasks))
            results = run_rollouts(
                tasks,
                LocalBackend(make_env, engine),
                AgentPrompt.for_model(config.model, engine.tokenizer),
                greedy,
                config.batch_size,
                config.model.max_context_tokens,
                lambda _: progress.advance(bar),
                config.rollout.max_episode_tokens,
            )
    finally:
        engine.close()  # a Ray worker runs many tasks: an engine left open keeps its weights and KV caches
    played: Played = {}
    for task, result in zip(tasks, results):
        played.setdefault(task.seed, {})[task.key.rsplit("-", 1)[0]] = result
    return played
