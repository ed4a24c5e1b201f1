"""The one rollout service: what collection, synthesis calibration, training, routing, evaluation and scoring ask
of the rollout stack.

A :class:`RolloutService` plays episodes, or groups of episodes, of one environment with the base model or an
adapter version (every :class:`~trace_ray.rollout_loop.EpisodeResult` carries the adapter ``(name, version)`` it was
generated with); it can switch to another environment (a synthetic environment's next level, the next calibration
level) keeping its engines; it publishes an adapter version to every engine; and it closes.
:func:`start_rollout_service`, the only place that wires the stack, builds one of two:

- :class:`RayRolloutService`: a pool of Ray rollout workers (an engine each) and environment actors, for
  collection, calibration and training; an adapter version is published to every worker, verified.
- :class:`LocalRolloutService`: one engine and the environments in this process, for the greedy episodes of
  ``route`` and ``evaluate`` (inside a Ray model task, ``actors/model_tasks.py``) and for ``trace-ray score``.

Nobody outside this module touches the pool or the backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from actors.ray_connection import connect_ray
from actors.rollout_pool import RayRolloutBackend, start_env_actors, start_pool, stop_actors
from actors.weight_sync import sync_adapter
from environments.protocol import Environment
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.config import EnvConfig, TraceConfig
from trace_ray.engines import AdapterRef, Engine, SamplingParams
from trace_ray.environment_setup import environment_maker
from trace_ray.models import load_tokenizer
from trace_ray.rollout_loop import EnvironmentPool, EpisodeResult, EpisodeTask, LocalBackend, run_rollouts


class RolloutService:
    """Episodes and groups over a backend (the environments and the engines) with the agent prompt."""

    def __init__(self, config: TraceConfig, backend: EnvironmentPool, prompt: AgentPrompt):
        self.config = config
        self.backend = backend
        self.prompt = prompt

    def episodes(
        self,
        tasks: list[EpisodeTask],
        params: SamplingParams,
        on_done: Callable[[EpisodeResult], None] | None = None,
        adapter_at_turn: Callable[[AdapterRef | None], AdapterRef | None] | None = None,
    ) -> list[EpisodeResult]:
        """Every task played to the end (``config.batch_size`` at a time); results in the order of ``tasks``. Each
        turn acts with its task's adapter, or with the one ``adapter_at_turn`` names when the turn starts."""
        config = self.config
        return run_rollouts(
            tasks,
            self.backend,
            self.prompt,
            params,
            config.batch_size,
            config.model.max_context_tokens,
            on_done,
            config.rollout.max_episode_tokens,
            adapter_at_turn,
        )

    def groups(
        self,
        label: str,
        seeds: list[int],
        group_size: int,
        params: SamplingParams,
        adapter: AdapterRef | None = None,
        on_done: Callable[[EpisodeResult], None] | None = None,
        adapter_at_turn: Callable[[AdapterRef | None], AdapterRef | None] | None = None,
    ) -> list[list[EpisodeResult]]:
        """One group of ``group_size`` episodes per seed (keys ``<label>-<seed>#<k>``), with ``adapter`` or the base
        (or, turn by turn, the one ``adapter_at_turn`` names)."""
        tasks = [
            EpisodeTask(f"{label}-{seed}#{k}", seed, k, adapter=adapter) for seed in seeds for k in range(group_size)
        ]
        results = self.episodes(tasks, params, on_done, adapter_at_turn)
        return [results[i : i + group_size] for i in range(0, len(results), group_size)]

    def switch_environment(self, env: EnvConfig) -> None:
        """Play ``env`` from now on, keeping the engines."""
        raise NotImplementedError

    def publish_adapter(
        self, name: str, version: int, weights: dict[str, torch.Tensor], lora_config: dict, keep_versions: int = 1
    ) -> float:
        """Every engine serves ``name`` at ``version`` from now on, and still its ``keep_versions - 1`` versions before
        (for episodes started with them); seconds taken."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the environments and the engines."""
        raise NotImplementedError


class RayRolloutService(RolloutService):
    """Ray rollout workers and environment actors, sized by ``config.rollout``."""

    def __init__(self, config: TraceConfig, env: EnvConfig):
        self.pool = start_pool(config, env)
        super().__init__(
            config, RayRolloutBackend(self.pool), AgentPrompt.for_model(config.model, load_tokenizer(config.model))
        )

    def switch_environment(self, env: EnvConfig) -> None:
        stop_actors(self.pool.env_actors)
        self.pool.env_actors = start_env_actors(self.config, env)
        self.backend = RayRolloutBackend(self.pool)

    def publish_adapter(
        self, name: str, version: int, weights: dict[str, torch.Tensor], lora_config: dict, keep_versions: int = 1
    ) -> float:
        return sync_adapter(self.pool.workers, name, version, weights, lora_config, keep_versions)  # verified

    def close(self) -> None:
        registry = [self.pool.registry] if self.pool.registry is not None else []
        stop_actors([*self.pool.env_actors, *self.pool.workers, *registry])
        self.pool.env_actors, self.pool.workers = [], []


class LocalRolloutService(RolloutService):
    """One engine and the environments (``make_env``) in this process."""

    def __init__(self, config: TraceConfig, make_env: Callable[[], Environment], engine: Engine):
        self.engine = engine
        super().__init__(config, LocalBackend(make_env, engine), AgentPrompt.for_model(config.model, engine.tokenizer))

    def switch_environment(self, env: EnvConfig) -> None:
        self.backend = LocalBackend(environment_maker(env), self.engine)

    def publish_adapter(
        self, name: str, version: int, weights: dict[str, torch.Tensor], lora_config: dict, keep_versions: int = 1
    ) -> float:
        started = time.perf_counter()
        self.engine.load_adapter(name, version, weights, lora_config, keep_versions)
        return time.perf_counter() - started

    def close(self) -> None:
        self.engine.close()  # a Ray worker runs many tasks: an engine left open keeps its weights and KV caches


def start_rollout_service(
    config: TraceConfig,
    env: EnvConfig | None = None,
    engine: Engine | None = None,
    make_env: Callable[[], Environment] | None = None,
) -> RolloutService:
    """The rollout stack for ``env`` (default ``config.env``): on Ray (joining it) unless ``engine`` is given, then
    that engine in this process, playing the environments ``make_env`` builds (default ``env``'s)."""
    if engine is not None:
        return LocalRolloutService(config, make_env or environment_maker(env or config.env), engine)
    connect_ray(config)
    return RayRolloutService(config, env or config.env)
