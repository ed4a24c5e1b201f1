"""The one rollout service: what collection, synthesis calibration and training ask of the rollout stack.

A :class:`RolloutService` owns a pool of rollout workers (an engine each, holding the base model and the
published adapters) and environment actors of one environment, plus the agent prompt. It starts with
:func:`start_rollout_service`, the only place that wires the stack; it can switch to another environment
(a synthetic environment's next level, the next calibration level) keeping its workers; it plays episodes
or groups of episodes with the base model or an adapter version; it publishes a new adapter version to
every worker, verified; and it closes. Every :class:`~trace_ray.rollout_loop.EpisodeResult` carries the
adapter ``(name, version)`` it was generated with. Nobody outside this module touches the pool.
"""

from __future__ import annotations

from collections.abc import Callable

import ray
import torch

from actors.ray_connection import connect_ray
from actors.rollout_pool import RayRolloutBackend, start_env_actors, start_pool, stop_env_actors
from actors.weight_sync import sync_adapter
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.config import EnvConfig, TraceConfig
from trace_ray.engines import AdapterRef, SamplingParams
from trace_ray.models import load_tokenizer
from trace_ray.rollout_loop import EpisodeResult, EpisodeTask, run_rollouts


class RolloutService:
    def __init__(self, config: TraceConfig, env: EnvConfig):
        self.config = config
        self.env = env
        self.pool = start_pool(config, env)
        self.backend = RayRolloutBackend(self.pool)
        self.prompt = AgentPrompt.for_model(config.model, load_tokenizer(config.model))
        self.published: dict[str, int] = {}  # adapter name -> the version every worker serves

    def switch_environment(self, env: EnvConfig) -> None:
        """Play ``env`` from now on: new environment actors, the same rollout workers."""
        stop_env_actors(self.pool.env_actors)
        self.pool.env_actors = start_env_actors(self.config, env)
        self.backend = RayRolloutBackend(self.pool)
        self.env = env

    def episodes(
        self,
        tasks: list[EpisodeTask],
        params: SamplingParams,
        on_done: Callable[[EpisodeResult], None] | None = None,
    ) -> list[EpisodeResult]:
        """Every task played to the end (``config.batch_size`` at a time); results in the order of ``tasks``."""
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
        )

    def groups(
        self,
        label: str,
        seeds: list[int],
        group_size: int,
        params: SamplingParams,
        adapter: AdapterRef | None = None,
        on_done: Callable[[EpisodeResult], None] | None = None,
    ) -> list[list[EpisodeResult]]:
        """One group of ``group_size`` episodes per seed (keys ``<label>-<seed>#<k>``), with ``adapter`` or the base."""
        tasks = [
            EpisodeTask(f"{label}-{seed}#{k}", seed, k, adapter=adapter) for seed in seeds for k in range(group_size)
        ]
        results = self.episodes(tasks, params, on_done)
        return [results[i : i + group_size] for i in range(0, len(results), group_size)]

    def publish_adapter(self, name: str, version: int, weights: dict[str, torch.Tensor], lora_config: dict) -> float:
        """Every worker serves ``name`` at ``version`` from now on (verified); seconds taken."""
        seconds = sync_adapter(self.pool.workers, name, version, weights, lora_config)
        self.published[name] = version
        return seconds

    def close(self) -> None:
        """Stop the environment actors and the rollout workers."""
        stop_env_actors(self.pool.env_actors)
        for actor in [*self.pool.workers, self.pool.registry]:
            if actor is not None:
                ray.kill(actor)
        self.pool.env_actors, self.pool.workers = [], []


def start_rollout_service(config: TraceConfig, env: EnvConfig | None = None) -> RolloutService:
    """Join Ray and start the rollout stack for ``env`` (default ``config.env``), sized by ``config.rollout``."""
    connect_ray(config)
    return RolloutService(config, env or config.env)
