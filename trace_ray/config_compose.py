"""The typed config of a command, composed from ``conf/`` through Hydra's compose API.

Overrides use Hydra's grammar (``key=value``, ``group=option``, ``+key=value``); ``sweep_jobs`` expands
``-m`` sweeps (``a=1,2 b=range(0,3)``) with Hydra's basic sweeper. Every bad override is a one-line error.
"""

from __future__ import annotations

import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from environments.errors import TraceRayError
from trace_ray.config import TraceConfig, to_typed

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def config_groups() -> dict[str, list[str]]:
    """Each config group in conf/ and its options."""
    return {
        group.name: sorted(path.stem for path in group.glob("*.yaml"))
        for group in sorted(CONF_DIR.iterdir())
        if group.is_dir()
    }


def _parse(overrides: list[str]):
    parsed = []
    for text in overrides:
        try:
            parsed.extend(OverridesParser.create().parse_overrides([text]))
        except OverrideParseException:
            raise TraceRayError(
                f"malformed override {text!r}; write key=value (e.g. split=eval or model=tiny_random)"
            ) from None
    return parsed


def _check_group_choices(parsed) -> None:
    groups = config_groups()
    for override in parsed:
        key = override.get_key_element()
        if key not in groups or override.is_sweep_override():
            continue
        value = override.value()
        if value not in groups[key]:
            raise TraceRayError(f"unknown {key} {value!r}; choose one of: {', '.join(groups[key])} ({key}=NAME)")


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """Hydra's basic-sweeper expansion of ``a=1,2 b=x,y`` into one override list per job."""
    batches = BasicSweeper.split_arguments(_parse(overrides), None)
    return [list(job) for batch in batches for job in batch]


def _expand_synthetic(overrides: list[str]) -> list[str]:
    """``env=synthetic/<capability>`` -> ``env=synthetic env.capability=<capability>``."""
    expanded = []
    for text in overrides:
        match = re.fullmatch(r"env=synthetic/(.+)", text)
        expanded += ["env=synthetic", f"env.capability={match.group(1)}"] if match else [text]
    return expanded


def compose_config(command: str, overrides: list[str]) -> TraceConfig:
    overrides = _expand_synthetic(overrides)
    _check_group_choices(_parse(overrides))
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            composed = compose("config", overrides=[*overrides, f"command={command}"])
    except (HydraException, OmegaConfBaseException) as exc:
        unknown_key = re.search(r"Could not override '([^']+)'", str(exc))
        if unknown_key:
            fix = (
                f"unknown config key {unknown_key.group(1)!r}; check the key name (trace-ray {command} --cfg lists "
                "every key)"
            )
        elif "Ambiguous value" in str(exc):
            fix = f"{str(exc).splitlines()[0]}; write key=[v1,v2] for a list, or add -m to sweep"
        else:
            fix = f"{str(exc).splitlines()[0]}; fix the override or the file in conf/"
        raise TraceRayError(fix) from None
    return to_typed(composed)
