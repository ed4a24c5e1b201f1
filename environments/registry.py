"""Find environments by name (``env=device``; later ``tau2_retail``, ``synthetic/<capability>``)."""

from __future__ import annotations

import importlib
from typing import Callable

from environments.protocol import Environment

# name -> "module:factory"; imported on use so optional packages stay optional.
_FACTORIES: dict[str, str] = {
    "device": "environments.device.environment:DeviceEnvironment",
    "synthetic": "environments.synthetic.factory:synthetic_environment",  # env=synthetic/<capability>
}


class UnknownEnvironmentError(LookupError):
    pass


def environment_names() -> list[str]:
    return sorted(_FACTORIES)


def environment_factory(name: str) -> Callable[..., Environment]:
    if name not in _FACTORIES:
        raise UnknownEnvironmentError(
            f"unknown environment {name!r}; choose one of: {', '.join(environment_names())}"
        )
    module_name, attribute = _FACTORIES[name].split(":")
    return getattr(importlib.import_module(module_name), attribute)


def make_environment(name: str, **options) -> Environment:
    return environment_factory(name)(**options)
