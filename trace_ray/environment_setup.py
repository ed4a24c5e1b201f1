"""Build environments from the typed config (the one place that maps EnvConfig to constructors)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from environments.errors import TraceRayError
from environments.protocol import Environment
from environments.registry import UnknownEnvironmentError, environment_factory
from environments.tau2.package import Tau2NotInstalledError, tau2_module
from trace_ray.config import TAU2_ENVS, EnvConfig, TraceConfig
from trace_ray.responders import judge_responder, user_responder


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
    if env.name == "synthetic":
        if not Path(env.spec).is_file():
            raise TraceRayError(
                f"no synthetic environment for capability {env.capability!r}: {env.spec} does not exist; "
                "run trace-ray synthesize run_dir=... first (or fix run_dir)"
            )
        options.update(spec=env.spec, difficulty=env.difficulty)
    if env.name == "swebench":
        options.update(instances=env.instances, repos_dir=env.repos_dir)
    if env.name == "code_repair":
        options.update(tasks_dir=env.tasks_dir)
    if env.name == "device":
        options.update(
            (key, size) for key, size in (("analysis_size", env.analysis_size), ("eval_size", env.eval_size)) if size
        )
    if env.name in TAU2_ENVS:
        try:
            tau2_module("domains")
        except Tau2NotInstalledError as exc:
            raise TraceRayError(f"env={env.name}: {exc}") from None
        user = env.user
        options.update(
            user=user_responder(user),
            user_temperature=(user.temperature or 0.0) if user else 0.0,
            judge=judge_responder(env.judge),
        )
    return lambda: factory(**options)


def synthetic_env_config(config: TraceConfig, capability: str, difficulty: int | None = None) -> EnvConfig:
    """``env=synthetic/<capability>`` of ``config.run_dir`` under the target's turn limits and success threshold.

    ``difficulty`` None: the spec's calibrated one.
    """
    spec = Path(config.run_dir).resolve() / "environments" / capability / "spec.json"
    return EnvConfig(
        name="synthetic",
        capability=capability,
        spec=str(spec),
        difficulty=difficulty,
        max_turns=config.env.max_turns,
        max_tool_calls_per_turn=config.env.max_tool_calls_per_turn,
        success_threshold=config.env.success_threshold,
    )
