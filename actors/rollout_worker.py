"""``RolloutWorker``: a Ray actor hosting one engine: the base model and its LoRA adapters."""

from __future__ import annotations

import os

import torch

from trace_ray.config import EngineConfig, ModelConfig
from trace_ray.engines import AdapterRef, Generation, SamplingParams, make_engine


class RolloutWorker:
    def __init__(self, model: ModelConfig, engine: EngineConfig, threads: int | None = None):
        if threads:
            torch.set_num_threads(threads)
        self.model_name = model.name
        self.engine_name = engine.name
        self.engine = make_engine(model, engine)

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, adapters: list[AdapterRef | None] | None = None
    ) -> list[Generation]:
        return self.engine.generate(prompts, params, adapters)

    def load_adapter(self, name: str, version: int, weights: dict, lora_config: dict) -> dict[str, int]:
        """Load ``name`` at ``version``; returns the loaded adapters so the caller can verify the version."""
        self.engine.load_adapter(name, version, weights, lora_config)
        return self.engine.adapters()

    def unload_adapter(self, name: str) -> dict[str, int]:
        self.engine.unload_adapter(name)
        return self.engine.adapters()

    def adapters(self) -> dict[str, int]:
        return self.engine.adapters()

    def health(self) -> dict:
        import ray

        return {
            "model": self.model_name,
            "engine": self.engine_name,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "threads": torch.get_num_threads(),
            "adapters": self.engine.adapters(),
        }
