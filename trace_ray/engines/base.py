"""The engine interface shared by the transformers engine and (later) vLLM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    temperature: float  # 0 = greedy
    top_p: float
    max_new_tokens: int
    seed: int | None = None


@dataclass
class Generation:
    token_ids: list[int]  # sampled tokens, ending with the stop token when finish_reason == "stop"
    logprobs: list[float]  # log-prob of each sampled token under the temperature-scaled policy
    finish_reason: str  # "stop" | "length"


class Engine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        ...
