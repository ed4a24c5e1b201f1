"""``RolloutWorker``: a Ray actor hosting one engine: the base model and its LoRA adapters.

Workers are restarted by Ray when their process dies. A worker given its
pool's :class:`AdapterRegistry` records there every adapter the weight sync
loads, and its constructor (which Ray re-runs on a restart) loads every
recorded adapter, so a restarted worker serves the current versions before
it serves a call.
"""

from __future__ import annotations

import os

import ray
import torch

from actors.adapter_registry import StoredWeights
from trace_ray.config import EngineConfig, ModelConfig
from trace_ray.cpu_affinity import pin_process
from trace_ray.engines import AdapterRef, Generation, SamplingParams, make_engine


class RolloutWorker:
    def __init__(
        self,
        model: ModelConfig,
        engine: EngineConfig,
        threads: int | None = None,
        registry=None,
        cpu_cores: list[int] | None = None,
    ):
        """``registry``: the pool's AdapterRegistry actor (None: a worker on its own, restored by no one);
        ``cpu_cores``: the cores the worker's process runs on (None: any)."""
        if cpu_cores:
            pin_process(cpu_cores, "rollout.cpu_cores")  # before the engine starts its threads
        if threads:
            torch.set_num_threads(threads)
        self.model_name = model.name
        self.engine_name = engine.name
        self.engine = make_engine(model, engine)
        self.registry = registry
        if registry is not None:
            for name, version, weights, lora_config, keep_versions in ray.get(registry.current.remote()):
                self.engine.load_adapter(name, version, weights.fetch(), lora_config, keep_versions)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, adapters: list[AdapterRef | None] | None = None
    ) -> list[Generation]:
        return self.engine.generate(prompts, params, adapters)

    def load_adapter(
        self, name: str, version: int, weights: dict | StoredWeights, lora_config: dict, keep_versions: int = 1
    ) -> dict[str, int]:
        """Load ``name`` at ``version``, holding its newest ``keep_versions`` versions; returns the loaded adapters
        (name -> newest version) so the caller can verify the version.

        ``weights``: the tensors, or (from the weight sync) StoredWeights, which
        are recorded in the pool's registry first: a restart loads them again.
        """
        if isinstance(weights, StoredWeights):
            if self.registry is not None:
                ray.get(self.registry.record.remote(name, version, weights, lora_config, keep_versions))
            weights = weights.fetch()
        self.engine.load_adapter(name, version, weights, lora_config, keep_versions)
        return self.engine.adapters()

    def unload_adapter(self, name: str) -> dict[str, int]:
        self.engine.unload_adapter(name)
        if self.registry is not None:
            ray.get(self.registry.forget.remote(name))
        return self.engine.adapters()

    def adapters(self) -> dict[str, int]:
        return self.engine.adapters()

    def health(self) -> dict:
        return {
            "model": self.model_name,
            "engine": self.engine_name,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "threads": torch.get_num_threads(),
            "adapters": self.engine.adapters(),
        }
