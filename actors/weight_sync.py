"""Publishing a new adapter version to every rollout worker, and verifying it arrived.

The trainer puts the adapter tensors into the Ray object store once; every
worker records the reference in its pool's adapter registry (so a worker
Ray restarts later loads this version before it serves again), loads the
tensors (HF engine: in place under a fresh PEFT name; vLLM: written to the
worker's scratch folder, loaded under a new LoRA id) and answers with the
adapters it now serves. No shared filesystem is involved. The next
iteration starts only when every worker reports the new version.
"""

from __future__ import annotations

import time

import torch

from actors.adapter_registry import StoredWeights
from environments.errors import TraceRayError


class WeightSyncError(TraceRayError):
    """A rollout worker did not take the new adapter version; training stops."""


def sync_adapter(
    workers: list,
    name: str,
    version: int,
    weights: dict[str, torch.Tensor],
    lora_config: dict,
    keep_versions: int = 1,
) -> float:
    """Load ``name`` at ``version`` on every worker, each holding its newest ``keep_versions`` versions; seconds
    taken. Raises WeightSyncError on any failure."""
    import ray

    started = time.perf_counter()
    stored = StoredWeights(ray.put(weights))
    calls = [worker.load_adapter.remote(name, version, stored, lora_config, keep_versions) for worker in workers]
    for index, call in enumerate(calls):
        try:
            loaded = ray.get(call)
        except ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None) or exc
            message = " ".join(str(cause).split())[:200]
            raise WeightSyncError(
                f"rollout worker {index} failed to load adapter {name!r} version {version} ({type(cause).__name__}: "
                f"{message}); "
                "training stopped: check the worker's log and engine.max_loras / engine.max_lora_rank"
            ) from None
        if loaded.get(name) != version:
            raise WeightSyncError(
                f"rollout worker {index} serves adapter {name!r} version {loaded.get(name)} after loading version "
                f"{version}; "
                "training stopped: the worker's engine did not take the new weights"
            )
    return time.perf_counter() - started
