"""Names of sweep jobs (``-m``): each job by the config keys in which it differs from the others."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from trace_ray.config import TraceConfig


def job_name(config: TraceConfig, others: list[TraceConfig]) -> str:
    """``key-value__key-value`` of the keys in which this sweep job differs from the others (a name that a
    ``run_dir=`` override takes as it is: no ``=`` or ``,``)."""

    def flat(c: TraceConfig) -> dict:
        return dict(_flatten(OmegaConf.to_container(OmegaConf.structured(c))))

    mine, theirs = flat(config), [flat(other) for other in others]
    keys = sorted(
        key for key in mine if key not in ("command",) and any(other.get(key) != mine[key] for other in theirs)
    )
    return "__".join(f"{key}-{mine[key]}" for key in keys) or "default"


def _flatten(tree, prefix=""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", json.dumps(value) if isinstance(value, list) else value
