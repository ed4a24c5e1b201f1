"""The multi-turn rollout loop: many episodes at once, batched, token-in/token-out.

Up to ``batch_size`` episodes are live at once, each on its own: when an
episode's reply is ready, the environment steps it (together with every
other reply ready at that moment) and its next prompt goes straight back to
the engine, which batches it with whatever else is generating (continuous
batching); a finished episode's slot is refilled with the next task at
once. Each episode keeps its :class:`TokenRecord`: the next prompt is the
record itself (the sampled tokens verbatim plus the template's rendering of
the environment's reply). Sampling seeds are per episode and turn, so a
seeded run makes the same random draws however episodes were scheduled.
An episode acts with its task's adapter on every turn, or, given
``adapter_at_turn``, with the adapter that function names when the turn is
submitted (training with rollouts overlapping the update takes up a newly
published version between turns); every turn's adapter is recorded.

Where environments live and where tokens are generated is the backend's
business: :class:`LocalBackend` runs both in this process (scoring, tests);
the Ray backend in ``actors/rollout_pool.py`` uses rollout workers and
environment actors. A backend that loses episodes (an environment actor
died) reports them as ``None`` and the loop reruns them from the start, so
no episode is lost or duplicated.
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from environments.protocol import Environment, Message, ResetResult, StepResult, ToolSchema
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.engines import AdapterRef, Engine, SamplingParams
from trace_ray.trajectory import TokenRecord


@dataclass(frozen=True)
class EpisodeTask:
    key: str  # unique per episode, e.g. "device-64#1"
    seed: int
    sample_index: int = 0
    adapter: AdapterRef | None = None  # (name, version) of the LoRA adapter to act with; None: base model


@dataclass
class EpisodeResult:
    key: str
    task_id: str
    family: str
    seed: int
    sample_index: int
    adapter: AdapterRef | None
    reward: float
    success: bool
    turns: int
    termination: str
    messages: list[Message]
    tools: list[ToolSchema]
    record: TokenRecord
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    turn_adapters: list[AdapterRef | None] = field(default_factory=list)  # the adapter of each turn, in order


class RolloutBackend(Protocol):
    def example_exchange(self) -> list[Message]: ...

    def reset(self, tasks: list[EpisodeTask]) -> list[ResetResult | None]: ...

    def step(self, steps: list[tuple[str, Message]]) -> list[StepResult | None]: ...

    def submit(self, prompt: list[int], params: SamplingParams, adapter: AdapterRef | None) -> Future:
        """Start one generation; the future resolves to its :class:`Generation`."""
        ...

    def release(self, keys: list[str]) -> None: ...


class EnvironmentPool:
    """Many environment instances of one environment, keyed by episode.

    A key it does not hold (its process was restarted, say) answers ``None``:
    the episode is lost and the rollout loop reruns it.
    """

    def __init__(self, make_env: Callable[[], Environment]):
        self.make_env = make_env
        self.envs: dict[str, Environment] = {}

    def example_exchange(self) -> list[Message]:
        return self.make_env().example_exchange()

    def reset(self, tasks: list[EpisodeTask]) -> list[ResetResult | None]:
        results = []
        for task in tasks:
            self.envs[task.key] = self.make_env()
            results.append(self.envs[task.key].reset(task.seed))
        return results

    def step(self, steps: list[tuple[str, Message]]) -> list[StepResult | None]:
        return [self.envs[key].step(message) if key in self.envs else None for key, message in steps]

    def release(self, keys: list[str]) -> None:
        for key in keys:
            self.envs.pop(key, None)


class LocalBackend(EnvironmentPool):
    """Environments and the engine in this process."""

    def __init__(self, make_env: Callable[[], Environment], engine: Engine):
        super().__init__(make_env)
        self.engine = engine

    def submit(self, prompt: list[int], params: SamplingParams, adapter: AdapterRef | None) -> Future:
        return self.engine.submit(prompt, params, adapter)


@dataclass
class _LiveEpisode:
    task: EpisodeTask
    messages: list[Message]
    tools: list[ToolSchema]
    reset_info: dict[str, Any]
    record: TokenRecord
    started: float
    turns: int = 0
    turn_adapters: list[AdapterRef | None] = field(default_factory=list)

    def result(self, reward: float, info: dict[str, Any], termination: str) -> EpisodeResult:
        # the episode's adapter is its first turn's: versions only rise, so the oldest it acted with
        adapter = self.turn_adapters[0] if self.turn_adapters else self.task.adapter
        return EpisodeResult(
            key=self.task.key,
            task_id=str(self.reset_info.get("task_id", self.task.seed)),
            family=str(self.reset_info.get("family", "all")),
            seed=self.task.seed,
            sample_index=self.task.sample_index,
            adapter=adapter,
            reward=reward,
            success=bool(info.get("success", False)),
            turns=self.turns,
            termination=termination,
            messages=self.messages,
            tools=self.tools,
            record=self.record,
            info=info,
            seconds=time.perf_counter() - self.started,
            turn_adapters=list(self.turn_adapters),
        )


def episode_seed(seed: int | None, key: str, turn: int) -> int | None:
    """The sampling seed of one episode's turn: fixed by the run's seed, the episode and the turn, not by scheduling."""
    return None if seed is None else (seed * 1_000_003 + zlib.crc32(f"{key}:{turn}".encode())) % 2**63


def run_rollouts(
    tasks: list[EpisodeTask],
    backend: RolloutBackend,
    prompt: AgentPrompt,
    params: SamplingParams,
    batch_size: int,
    max_context_tokens: int,
    on_done: Callable[[EpisodeResult], None] | None = None,
    max_episode_tokens: int | None = None,
    adapter_at_turn: Callable[[AdapterRef | None], AdapterRef | None] | None = None,
) -> list[EpisodeResult]:
    """Run every task to the end, ``batch_size`` episodes at a time; results in the order of ``tasks``.

    Each turn acts with the task's adapter, or with ``adapter_at_turn(task's adapter)`` called as the turn is
    submitted (the newest version published, say).

    Limits: a turn whose prompt plus ``params.max_new_tokens`` would pass
    ``max_context_tokens`` ends the episode (``context_limit``); an episode
    that has generated ``max_episode_tokens`` ends (``token_limit``), its
    last turn cut to the tokens left.
    """
    example = backend.example_exchange()
    queue = deque(tasks)
    generating: dict[Future, _LiveEpisode] = {}
    results: dict[str, EpisodeResult] = {}

    def finish(episode: _LiveEpisode, result: EpisodeResult) -> None:
        results[episode.task.key] = result
        backend.release([episode.task.key])
        if on_done:
            on_done(result)

    def next_turn(episode: _LiveEpisode) -> None:
        """Queue the episode's next generation, or end it at a limit."""
        tokens_left = params.max_new_tokens
        if max_episode_tokens is not None:
            tokens_left = min(tokens_left, max_episode_tokens - episode.record.action_tokens)
            if tokens_left <= 0:
                return finish(episode, episode.result(0.0, {"success": False}, "token_limit"))
        if len(episode.record.token_ids) + params.max_new_tokens > max_context_tokens:
            return finish(episode, episode.result(0.0, {"success": False}, "context_limit"))
        turn_params = replace(
            params, max_new_tokens=tokens_left, seed=episode_seed(params.seed, episode.task.key, episode.turns)
        )
        adapter = episode.task.adapter if adapter_at_turn is None else adapter_at_turn(episode.task.adapter)
        episode.turn_adapters.append(adapter)
        generating[backend.submit(episode.record.token_ids, turn_params, adapter)] = episode

    while queue or generating:
        starting = [queue.popleft() for _ in range(min(len(queue), batch_size - len(generating)))]
        for task, reset in zip(starting, backend.reset(starting) if starting else []):
            if reset is None:  # lost with its environment actor: run it again
                queue.append(task)
                continue
            record = TokenRecord()
            record.add_observation(prompt.prompt_ids(reset.messages, reset.tools, example))
            next_turn(_LiveEpisode(task, list(reset.messages), reset.tools, reset.info, record, time.perf_counter()))
        if not generating:
            continue
        done, _ = wait(generating, return_when=FIRST_COMPLETED)
        replied = [(generating.pop(future), future.result()) for future in done]
        replies = [prompt.parse(generation.token_ids, turn=episode.turns) for episode, generation in replied]
        steps = backend.step([(episode.task.key, reply) for (episode, _), reply in zip(replied, replies)])
        for (episode, generation), reply, step in zip(replied, replies, steps):
            if step is None:  # lost with its environment actor: run it again from the start
                queue.append(episode.task)
                continue
            episode.turns += 1
            episode.record.add_action(generation.token_ids, generation.logprobs)
            episode.messages.append(reply)
            episode.messages.extend(step.messages)
            if step.done:
                finish(episode, episode.result(step.reward, step.info, step.info.get("termination", "done")))
                continue
            episode.record.add_observation(prompt.continuation_ids(step.messages, episode.tools, generation.token_ids))
            next_turn(episode)
    return [results[task.key] for task in tasks]


def benchmark_tasks(
    env: Environment, split: str, samples_per_task: int = 1, limit: int | None = None
) -> list[EpisodeTask]:
    """``samples_per_task`` episodes of each of the split's first ``limit`` tasks."""
    seeds = env.task_seeds(split)[: limit or None]
    return [
        EpisodeTask(f"{env.name}-{seed}#{sample}", seed, sample) for seed in seeds for sample in range(samples_per_task)
    ]
