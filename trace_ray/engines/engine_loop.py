"""Continuous batching: an engine core stepped on one background thread.

Callers ``submit`` requests from any thread and get a future back. The loop
thread hands newly submitted requests to the core, which admits them into
its running batch, and advances the batch one decode step at a time; a
request leaves the batch the moment it finishes. So a multi-turn episode
whose reply ended can step its environment and come back with its next
prompt while the other episodes are still generating: no one waits for the
slowest sequence of a batch.

A core implements ``admit(requests) -> ended``, ``step() -> finished``,
``busy`` and ``room`` (requests beyond it wait their turn). Everything
that touches the core's state (adapter loading included) runs under the
loop's lock, between steps. ``close`` ends the thread once the requests
already submitted are done, so that a closed engine (its weights and KV
caches) can be freed: a live loop thread keeps its core alive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

import torch

from trace_ray.engines.base import AdapterNotLoadedError, AdapterRef, Generation, OnToken, SamplingParams

T = TypeVar("T")


class EngineClosedError(RuntimeError):
    """A generation was submitted to an engine after its ``close``."""


@dataclass(eq=False)
class Request:
    prompt: list[int]
    params: SamplingParams
    adapter: AdapterRef | None
    generator: torch.Generator
    on_token: OnToken | None = None
    future: Future = field(default_factory=Future)

    def wants_more(self, token: int) -> bool:
        """Tell ``on_token`` about a sampled token; False when the caller ends the generation (a failing callback ends
        it)."""
        if self.on_token is None:
            return True
        try:
            return bool(self.on_token(token))
        except Exception:
            return False


class EngineCore(Protocol):
    busy: bool  # requests are in the running batch
    room: int  # how many more requests the running batch takes

    def admit(self, requests: list[Request]) -> list[tuple[Request, Generation | BaseException]]:
        """Add requests to the running batch; those already ended come back (finished at their first token, or
        failed)."""
        ...

    def step(self) -> list[tuple[Request, Generation]]:
        """Advance the running batch one token; returns the requests that finished."""
        ...

    def abort(self) -> list[Request]:
        """Drop every request in the running batch (after an unexpected error); returns them."""
        ...


def request_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


class EngineLoop:
    def __init__(self, core: EngineCore):
        self.core = core
        self._lock = threading.Lock()  # held while the core runs
        self._wakeup = threading.Condition()
        self._waiting: list[Request] = []
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(
        self, requests: list[tuple[list[int], SamplingParams, AdapterRef | None]], on_token: OnToken | None = None
    ) -> list[Future]:
        """Queue generations ``(prompt, params, adapter)``, together; each future resolves to a :class:`Generation`."""
        queued = [
            Request(list(prompt), params, adapter, request_generator(params.seed), on_token)
            for prompt, params, adapter in requests
        ]
        with self._wakeup:
            if self._closed:
                raise EngineClosedError("the engine is closed; make a new engine to generate again")
            self._waiting += queued
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
                self._thread.start()
            self._wakeup.notify()
        return [request.future for request in queued]

    def close(self) -> None:
        """Finish the requests already submitted, then stop the loop thread; later submits raise EngineClosedError."""
        with self._wakeup:
            self._closed = True
            thread = self._thread
            self._wakeup.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def locked(self, function: Callable[..., T], *args) -> T:
        """Run ``function`` between decode steps (adapter loading, inspection)."""
        with self._lock:
            return function(*args)

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while not self._waiting and not self.core.busy:
                    if self._closed:
                        return
                    self._wakeup.wait()
                room = max(self.core.room, 0)
                arrived, self._waiting = self._waiting[:room], self._waiting[room:]
            with self._lock:
                try:
                    ended = self.core.admit(arrived) if arrived else []
                    ended += self.core.step() if self.core.busy else []
                except BaseException as error:  # a broken step fails its requests, never the loop
                    for request in [*arrived, *self.core.abort()]:
                        if not request.future.done():
                            request.future.set_exception(error)
                    continue
            for request, outcome in ended:
                if isinstance(outcome, BaseException):
                    request.future.set_exception(outcome)
                else:
                    request.future.set_result(outcome)


class LoopedEngine:
    """The public engine interface (``engines/base.py``) over an engine core stepped by an :class:`EngineLoop`.

    A subclass is the core (``admit``, ``step``, ``abort``, ``busy``, ``room``)
    and holds the adapters: ``_held()``, ``_load_adapter`` and ``_retire``
    (both run between decode steps).
    """

    def __init__(self):
        self._loop = EngineLoop(self)

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams,
        adapter: AdapterRef | None = None,
        on_token: OnToken | None = None,
    ) -> Future:
        """Queue one generation; the future resolves to its :class:`Generation` (``on_token``: see
        ``engines/base.py``)."""
        return self._loop.submit([(prompt, params, adapter)], on_token)[0]

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, adapters: list[AdapterRef | None] | None = None
    ) -> list[Generation]:
        """One generation per prompt, prompt i with ``adapters[i]`` (None: the base model) and seed ``seed + i``."""
        adapters = adapters or [None] * len(prompts)
        requests = [
            (prompt, replace(params, seed=None if params.seed is None else params.seed + index), adapter)
            for index, (prompt, adapter) in enumerate(zip(prompts, adapters))
        ]
        return [future.result() for future in self._loop.submit(requests)]

    def close(self) -> None:
        """Finish the submitted generations and stop the loop thread; the engine can then be freed."""
        self._loop.close()

    def adapters(self) -> dict[str, int]:
        """Loaded adapters: name -> newest version."""
        return {name: versions[-1] for name, versions in self.held_versions().items()}

    def held_versions(self) -> dict[str, list[int]]:
        """Loaded adapters: name -> every version held, oldest first."""
        held: dict[str, list[int]] = {}
        for name, version in sorted(self._held()):
            held.setdefault(name, []).append(version)
        return held

    def load_adapter(self, name: str, version: int, weights: dict, lora_config: dict, keep_versions: int = 1) -> None:
        """Load (or replace) adapter ``name`` at ``version`` from a PEFT state dict and LoRA settings; the engine then
        holds the newest ``keep_versions`` versions of ``name`` (an older one is retired, its weights kept until the
        generations running with it finish). Several versions serve a rollout that overlaps training: episodes started
        with version v finish with it while v + 1 is published."""
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        self._loop.locked(self._load_adapter, name, version, weights, lora_config)
        older = sorted(v for n, v in self._held() if n == name)[:-keep_versions]
        if older:
            self._loop.locked(self._retire, [(name, v) for v in older])

    def unload_adapter(self, name: str) -> None:
        if name not in self.adapters():
            raise KeyError(f"adapter {name!r} is not loaded (loaded: {', '.join(sorted(self.adapters())) or 'none'})")
        self._loop.locked(self._retire, [ref for ref in self._held() if ref[0] == name])

    def check_loaded(self, adapter: AdapterRef | None) -> None:
        """Refuse a request for an adapter, or a version of it, the engine does not hold."""
        if adapter is not None and tuple(adapter) not in self._held():
            have = ", ".join(f"{n} v{v}" for n, v in sorted(self._held())) or "none"
            raise AdapterNotLoadedError(
                f"adapter {adapter[0]!r} version {adapter[1]} is not loaded (loaded: {have}); load it first"
            )

    def _held(self) -> set[AdapterRef]:
        """Every (name, version) the engine holds."""
        raise NotImplementedError

    def _load_adapter(self, name: str, version: int, weights: dict, lora_config: dict) -> None:
        """Hold ``(name, version)`` (replacing the same version's weights if held)."""
        raise NotImplementedError

    def _retire(self, refs: list[AdapterRef]) -> None:
        """Stop holding ``refs``; their weights go once no running generation uses them."""
        raise NotImplementedError
