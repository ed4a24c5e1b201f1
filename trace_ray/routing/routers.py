"""The router a run directory supports, built for serving and evaluation (``router=auto|logit|learned|moe|none``).

Every router answers ``route(first_observation) -> RouteDecision`` and
``route_many(observations)`` and names its options in ``names`` (the
capability adapters, then ``base``). ``router=none`` builds no router: the
base model answers unless a request names an adapter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from environments.errors import TraceRayError
from environments.self_checks import oracle, play_recorded
from trace_ray.config import TraceConfig
from trace_ray.environment_setup import environment_maker, synthetic_env_config
from trace_ray.routing.adapters import TrainedAdapter
from trace_ray.routing.auto_router import AutoRouter, load_selection
from trace_ray.routing.learned_gate import LearnedRouter, load_gate
from trace_ray.routing.logit_router import BASE, LogitRouter, RouteDecision, RouteOption, compact_messages
from trace_ray.routing.offsets import load_offsets
from trace_ray.routing.selection import needs


class Router(Protocol):
    names: list[str]

    def route(self, first_observation: list[dict]) -> RouteDecision: ...

    def route_many(self, observations: list[list[dict]]) -> list[RouteDecision]: ...


def oracle_example(config: TraceConfig, adapter: TrainedAdapter) -> str:
    """One successful trajectory of the adapter's synthetic environment (its oracle's), compacted."""
    env = environment_maker(synthetic_env_config(config, adapter.name))()
    messages, _, _ = play_recorded(env, env.task_seeds("analysis")[0], oracle)
    return compact_messages(messages, config.router.max_example_chars)


def logit_router(
    config: TraceConfig, model, tokenizer, adapters: list[TrainedAdapter], calibration: str | None = None
) -> LogitRouter:
    """The logit router over ``adapters`` (``calibration``: None for ``router.calibration``; ``fitted`` reads the
    offsets ``trace-ray route`` fitted, from ``run_dir/router``)."""
    calibration = calibration or config.router.calibration
    options = [RouteOption(a.name, a.description, oracle_example(config, a)) for a in adapters]
    offsets = None
    if calibration == "fitted":
        offsets = load_offsets(Path(config.run_dir) / "router", config.model.name, [a.name for a in adapters] + [BASE])
    return LogitRouter(
        model,
        tokenizer,
        options,
        max_example_chars=config.router.max_example_chars,
        calibration=calibration,
        offsets=offsets,
    )


def auto_router(config: TraceConfig, run_dir: Path, model, tokenizer, adapters: list[TrainedAdapter]) -> AutoRouter:
    """The router ``trace-ray route`` chose (``run_dir/router/selection.json``); a missing selection is a one-line
    error."""
    folder = run_dir / "router"
    selection = load_selection(folder, config.model.name, [a.name for a in adapters] + [BASE])
    logit = (
        logit_router(config, model, tokenizer, adapters, "content_free")
        if "logit" in needs(selection["rule"])
        else None
    )
    return AutoRouter(selection, model, tokenizer, logit, folder)


def build_router(config: TraceConfig, run_dir: Path, model, tokenizer, adapters: list[TrainedAdapter]) -> Router | None:
    """``config.router.name``'s router over ``adapters`` (None for ``none``); a missing artifact is a one-line error."""
    name = config.router.name
    if name == "none":
        return None
    if not adapters:
        raise TraceRayError(
            f"router={name} needs trained capability adapters in {run_dir / 'adapters'}; use "
            "router=none or run trace-ray train"
        )
    if name == "auto":
        return auto_router(config, run_dir, model, tokenizer, adapters)
    if name == "logit":
        return logit_router(config, model, tokenizer, adapters)
    if name == "learned":
        gate = load_gate(run_dir / "router", config.model.name, [a.name for a in adapters])
        return LearnedRouter(model, tokenizer, gate)
    raise TraceRayError(
        f"router={name} mixes adapters per token inside the model, so it makes no per-conversation choice; it runs as "
        "its own model (trace-ray serve router=moe, trace-ray evaluate), not as a router"
    )
