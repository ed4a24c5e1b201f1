"""Run many episodes of one environment against the agent, batched.

Episodes advance in lockstep: every turn, the prompts of all live episodes
are generated in one batch; a finished episode's slot is refilled with the
next task, so the batch stays full.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from environments.protocol import Environment, Message
from trace_ray.agent import Agent, Conversation
from trace_ray.engines import SamplingParams


@dataclass
class EpisodeResult:
    task_id: str
    family: str
    seed: int
    reward: float
    success: bool
    turns: int
    termination: str
    messages: list[Message]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class _LiveEpisode:
    env: Environment
    seed: int
    conversation: Conversation
    reset_info: dict[str, Any]
    turns: int = 0


def _start(make_env: Callable[[], Environment], seed: int, example: list[Message]) -> _LiveEpisode:
    env = make_env()
    reset = env.reset(seed)
    return _LiveEpisode(env, seed, Conversation(list(reset.messages), reset.tools, example), reset.info)


def _result(episode: _LiveEpisode, reward: float, info: dict[str, Any], termination: str) -> EpisodeResult:
    return EpisodeResult(
        task_id=str(episode.reset_info.get("task_id", episode.seed)),
        family=str(episode.reset_info.get("family", "all")),
        seed=episode.seed,
        reward=reward,
        success=bool(info.get("success", False)),
        turns=episode.turns,
        termination=termination,
        messages=episode.conversation.messages,
        info=info,
    )


def run_episodes(
    make_env: Callable[[], Environment],
    seeds: list[int],
    agent: Agent,
    params: SamplingParams,
    batch_size: int,
    on_done: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """Results in the order of ``seeds``."""
    example = make_env().example_exchange()
    queue = list(enumerate(seeds))
    live: list[tuple[int, _LiveEpisode]] = []
    results: dict[int, EpisodeResult] = {}
    generate_calls = 0

    def finish(index: int, result: EpisodeResult) -> None:
        results[index] = result
        if on_done:
            on_done(result)

    while queue or live:
        while queue and len(live) < batch_size:
            index, seed = queue.pop(0)
            live.append((index, _start(make_env, seed, example)))
        prompts, ready = [], []
        for index, episode in live:
            prompt = agent.render(episode.conversation)
            if agent.fits(prompt, params):
                prompts.append(prompt)
                ready.append((index, episode))
            else:
                finish(index, _result(episode, 0.0, {"success": False}, "context_limit"))
        live = []
        if not ready:
            continue
        seed = None if params.seed is None else params.seed + generate_calls
        generate_calls += 1
        step_params = SamplingParams(params.temperature, params.top_p, params.max_new_tokens, seed)
        turns = agent.act(prompts, [episode.turns for _, episode in ready], step_params)
        for (index, episode), turn in zip(ready, turns):
            episode.turns += 1
            episode.conversation.messages.append(turn.message)
            step = episode.env.step(turn.message)
            episode.conversation.messages.extend(step.messages)
            if step.done:
                finish(index, _result(episode, step.reward, step.info, step.info.get("termination", "done")))
            else:
                live.append((index, episode))
    return [results[index] for index in range(len(seeds))]

