"""The multi-turn rollout loop: many episodes at once, batched, token-in/token-out.

Every turn, the prompts of all live episodes are generated in one batch; a
finished episode's slot is refilled with the next task, so the batch stays
full. Each episode keeps its :class:`TokenRecord`: the next prompt is the
record itself (the sampled tokens verbatim plus the template's rendering of
the environment's reply).

Where environments live and where tokens are generated is the backend's
business: :class:`LocalBackend` runs both in this process (scoring, tests);
the Ray backend in ``actors/rollout_coordinator.py`` uses rollout workers and
environment actors. A backend that loses episodes (an environment actor
died) reports them as ``None`` and the loop reruns them from the start, so
no episode is lost or duplicated.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from environments.protocol import Environment, Message, ResetResult, StepResult, ToolSchema
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.engines import AdapterRef, Engine, Generation, SamplingParams
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


class RolloutBackend(Protocol):
    def example_exchange(self) -> list[Message]: ...

    def reset(self, tasks: list[EpisodeTask]) -> list[ResetResult | None]: ...

    def step(self, steps: list[tuple[str, Message]]) -> list[StepResult | None]: ...

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, adapters: list[AdapterRef | None]
    ) -> list[Generation]: ...

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

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, adapters: list[AdapterRef | None]
    ) -> list[Generation]:
        return self.engine.generate(prompts, params, adapters)


@dataclass
class _LiveEpisode:
    task: EpisodeTask
    messages: list[Message]
    tools: list[ToolSchema]
    reset_info: dict[str, Any]
    record: TokenRecord
    started: float
    turns: int = 0

    def result(self, reward: float, info: dict[str, Any], termination: str) -> EpisodeResult:
        return EpisodeResult(
            key=self.task.key,
            task_id=str(self.reset_info.get("task_id", self.task.seed)),
            family=str(self.reset_info.get("family", "all")),
            seed=self.task.seed,
            sample_index=self.task.sample_index,
            adapter=self.task.adapter,
            reward=reward,
            success=bool(info.get("success", False)),
            turns=self.turns,
            termination=termination,
            messages=self.messages,
            tools=self.tools,
            record=self.record,
            info=info,
            seconds=time.perf_counter() - self.started,
        )


def run_rollouts(
    tasks: list[EpisodeTask],
    backend: RolloutBackend,
    prompt: AgentPrompt,
    params: SamplingParams,
    batch_size: int,
    max_context_tokens: int,
    on_done: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """Results in the order of ``tasks``."""
    example = backend.example_exchange()
    queue = list(tasks)
    live: list[_LiveEpisode] = []
    results: dict[str, EpisodeResult] = {}
    generate_calls = 0

    def finish(episode: _LiveEpisode, result: EpisodeResult) -> None:
        results[episode.task.key] = result
        backend.release([episode.task.key])
        if on_done:
            on_done(result)

    while queue or live:
        starting, queue = queue[: batch_size - len(live)], queue[batch_size - len(live):]
        for task, reset in zip(starting, backend.reset(starting) if starting else []):
            if reset is None:  # lost with its environment actor: run it again
                queue.append(task)
                continue
            record = TokenRecord()
            record.add_observation(prompt.prompt_ids(reset.messages, reset.tools, example))
            live.append(_LiveEpisode(task, list(reset.messages), reset.tools, reset.info, record, time.perf_counter()))
        ready = []
        for episode in live:
            if len(episode.record.token_ids) + params.max_new_tokens <= max_context_tokens:
                ready.append(episode)
            else:
                finish(episode, episode.result(0.0, {"success": False}, "context_limit"))
        live = []
        if not ready:
            continue
        seed = None if params.seed is None else params.seed + generate_calls
        generate_calls += 1
        batch_params = SamplingParams(params.temperature, params.top_p, params.max_new_tokens, seed)
        generations = backend.generate(
            [episode.record.token_ids for episode in ready], batch_params, [episode.task.adapter for episode in ready]
        )
        replies = [prompt.parse(generation.token_ids, turn=episode.turns) for episode, generation in zip(ready, generations)]
        steps = backend.step([(episode.task.key, reply) for episode, reply in zip(ready, replies)])
        for episode, generation, reply, step in zip(ready, generations, replies, steps):
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
            episode.record.add_observation(
                prompt.continuation_ids(episode.messages, len(step.messages), episode.tools, example, generation.token_ids)
            )
            live.append(episode)
    return [results[task.key] for task in tasks]


def benchmark_tasks(env: Environment, split: str, samples_per_task: int = 1, limit: int | None = None) -> list[EpisodeTask]:
    """``samples_per_task`` episodes of each of the split's first ``limit`` tasks."""
    seeds = env.task_seeds(split)[: limit or None]
    return [
        EpisodeTask(f"{env.name}-{seed}#{sample}", seed, sample) for seed in seeds for sample in range(samples_per_task)
    ]
