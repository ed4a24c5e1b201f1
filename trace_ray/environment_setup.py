"""Build environments from the typed config (the one place that maps EnvConfig to constructors)."""

from __future__ import annotations

from typing import Callable

from environments.protocol import Environment
from environments.registry import UnknownEnvironmentError, environment_factory
from trace_ray.config import EnvConfig
from trace_ray.errors import TraceRayError


def environment_maker(env: EnvConfig) -> Callable[[], Environment]:
    try:
        factory = environment_factory(env.name)
    except UnknownEnvironmentError as exc:
        raise TraceRayError(f"{exc} (env=NAME)") from None
    options = dict(
        max_turns=env.max_turns,
        max_tool_calls_per_turn=env.max_tool_calls_per_turn,
        success_threshold=env.success_threshold,
    )
    return lambda: factory(**options)

