"""Pinning a process to CPU cores, so that rollouts overlapping the update (``grpo.max_staleness``) and the update run
on cores of their own (``rollout.cpu_cores``, ``trainer.cpu_cores``)."""

from __future__ import annotations

import os

from environments.errors import TraceRayError


def pin_process(cores: list[int], key: str) -> None:
    """Run every thread of this process, and the threads it starts later, on ``cores`` only; ``key`` names the setting
    in the error when this machine lacks one of them."""
    available = os.sched_getaffinity(0)
    missing = sorted(set(cores) - available)
    if missing:
        raise TraceRayError(
            f"{key}={list(cores)} names cores {missing} this machine does not offer (it has {sorted(available)}); "
            "pick among those or set it to null"
        )
    for thread in os.listdir("/proc/self/task"):  # the affinity is per thread; new threads inherit their creator's
        try:
            os.sched_setaffinity(int(thread), cores)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
