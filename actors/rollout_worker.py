"""``RolloutWorker``: a Ray actor hosting one engine (the base model, later its adapters)."""

from __future__ import annotations

import os

import torch

from trace_ray.config import ModelConfig
from trace_ray.engines import Generation, SamplingParams, make_engine


class RolloutWorker:
    def __init__(self, model: ModelConfig, engine: str = "hf", threads: int | None = None):
        if threads:
            torch.set_num_threads(threads)
        self.model_name = model.name
        self.engine_name = engine
        self.engine = make_engine(model, engine)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        return self.engine.generate(prompts, params)

    def health(self) -> dict:
        import ray

        return {
            "model": self.model_name,
            "engine": self.engine_name,
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "threads": torch.get_num_threads(),
        }
