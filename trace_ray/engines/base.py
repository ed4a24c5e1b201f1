"""The engine interface shared by the transformers and vLLM engines."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from environments.errors import TraceRayError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float  # 0 = greedy
    top_p: float
    max_new_tokens: int
    seed: int | None = None


AdapterRef = tuple[str, int]  # (adapter name, version)
# Called on the engine's thread with each token as it is sampled; returning False ends the generation there
# (finish reason "stop"): how a server streams tokens and stops at a stop string or a gone client.
OnToken = Callable[[int], bool]


class AdapterNotLoadedError(TraceRayError):
    """A request named an adapter (or version) the engine does not hold."""


@dataclass
class Generation:
    token_ids: list[int]  # sampled tokens, ending with the stop token when finish_reason == "stop"
    logprobs: list[float]  # log-prob of each sampled token under the distribution drawn from (engines/sampling.py)
    finish_reason: str  # "stop" | "length"


class Engine(Protocol):
    """Holds the base model plus any number of LoRA adapters known by (name, version).

    Engines batch continuously: requests submitted while others are running
    join the running batch.
    """

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams,
        adapter: AdapterRef | None = None,
        on_token: OnToken | None = None,
    ) -> Future:
        """Start one generation with ``adapter`` (None: the base model); the future resolves to a Generation.

        ``on_token`` sees every sampled token first and may end the generation early (see :data:`OnToken`)."""
        ...

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, adapters: list[AdapterRef | None] | None = None
    ) -> list[Generation]:
        """One generation per prompt, prompt i with ``adapters[i]`` (None: the base model)."""
        ...

    def load_adapter(self, name: str, version: int, weights: dict, lora_config: dict, keep_versions: int = 1) -> None:
        """Load ``name`` at ``version``; the engine then holds the newest ``keep_versions`` versions of ``name``."""
        ...

    def unload_adapter(self, name: str) -> None: ...

    def adapters(self) -> dict[str, int]:
        """Name -> newest version held."""
        ...

    def held_versions(self) -> dict[str, list[int]]:
        """Name -> every version held, oldest first."""
        ...

    def close(self) -> None:
        """Finish the submitted generations and release the engine's thread and processes (idempotent)."""
        ...
