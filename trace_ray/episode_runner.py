"""Run many episodes of one environment against the agent, batched, token-in/token-out.

Episodes advance in lockstep: every turn, the prompts of all live episodes
are generated in one batch; a finished episode's slot is refilled with the
next task, so the batch stays full. Each episode keeps its
:class:`TokenRecord`: the next prompt is the record itself (the sampled
tokens verbatim plus the template's rendering of the environment's reply).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from environments.protocol import Environment, Message, ToolSchema
from trace_ray.agent import Agent
from trace_ray.engines import SamplingParams
from trace_ray.trajectory import TokenRecord


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
    tools: list[ToolSchema]
    record: TokenRecord
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class _LiveEpisode:
    env: Environment
    seed: int
    messages: list[Message]
    tools: list[ToolSchema]
    reset_info: dict[str, Any]
    record: TokenRecord
    turns: int = 0

    def result(self, reward: float, info: dict[str, Any], termination: str) -> EpisodeResult:
        return EpisodeResult(
            task_id=str(self.reset_info.get("task_id", self.seed)),
            family=str(self.reset_info.get("family", "all")),
            seed=self.seed,
            reward=reward,
            success=bool(info.get("success", False)),
            turns=self.turns,
            termination=termination,
            messages=self.messages,
            tools=self.tools,
            record=self.record,
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
    prompt = agent.prompt
    queue = list(enumerate(seeds))
    live: list[tuple[int, _LiveEpisode]] = []
    results: dict[int, EpisodeResult] = {}
    generate_calls = 0

    def start(seed: int) -> _LiveEpisode:
        env = make_env()
        reset = env.reset(seed)
        record = TokenRecord()
        record.add_observation(prompt.prompt_ids(reset.messages, reset.tools, example))
        return _LiveEpisode(env, seed, list(reset.messages), reset.tools, reset.info, record)

    def finish(index: int, result: EpisodeResult) -> None:
        results[index] = result
        if on_done:
            on_done(result)

    while queue or live:
        while queue and len(live) < batch_size:
            index, seed = queue.pop(0)
            live.append((index, start(seed)))
        ready = []
        for index, episode in live:
            if agent.fits(episode.record.token_ids, params):
                ready.append((index, episode))
            else:
                finish(index, episode.result(0.0, {"success": False}, "context_limit"))
        live = []
        if not ready:
            continue
        seed = None if params.seed is None else params.seed + generate_calls
        generate_calls += 1
        step_params = SamplingParams(params.temperature, params.top_p, params.max_new_tokens, seed)
        turns = agent.act(
            [episode.record.token_ids for _, episode in ready], [episode.turns for _, episode in ready], step_params
        )
        for (index, episode), turn in zip(ready, turns):
            episode.turns += 1
            episode.record.add_action(turn.generation.token_ids, turn.generation.logprobs)
            episode.messages.append(turn.message)
            step = episode.env.step(turn.message)
            episode.messages.extend(step.messages)
            if step.done:
                finish(index, episode.result(step.reward, step.info, step.info.get("termination", "done")))
                continue
            episode.record.add_observation(
                prompt.continuation_ids(episode.messages, len(step.messages), episode.tools, example, turn.generation.token_ids)
            )
            live.append((index, episode))
    return [results[index] for index in range(len(seeds))]
