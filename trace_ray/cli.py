"""``trace-ray <command> [-m] [--cfg] [hydra overrides]``.

Config comes from ``conf/`` through Hydra's compose API with Hydra's
override grammar (``key=value``, ``group=option``, ``+key=value``); ``-m``
expands sweeps (``a=1,2 b=range(0,3)``) with Hydra's basic sweeper and runs
the jobs one after another. Every failure is one line on stderr and a
non-zero exit status.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

from omegaconf import OmegaConf

from trace_ray.config import TraceConfig, to_typed
from trace_ray.console import console, print_error
from trace_ray.errors import TraceRayError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
COMMANDS = {
    "check-env": "trace_ray.commands.check_env",
    "score": "trace_ray.commands.score",
    "collect": "trace_ray.commands.collect",
    "identify": "trace_ray.commands.identify",
    "synthesize": "trace_ray.commands.synthesize",
    "train": "trace_ray.commands.train",
    "route": "trace_ray.commands.route",
    "evaluate": "trace_ray.commands.evaluate",
    "pipeline": "trace_ray.commands.pipeline",
    "serve": "trace_ray.commands.serve",
}
FLAGS = {"-m", "--multirun", "--cfg", "-h", "--help"}


def config_groups() -> dict[str, list[str]]:
    """Each config group in conf/ and its options."""
    return {
        group.name: sorted(path.stem for path in group.glob("*.yaml"))
        for group in sorted(CONF_DIR.iterdir())
        if group.is_dir()
    }


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        "usage: trace-ray <command> [-m] [--cfg] [key=value ...]",
        "",
        "commands:",
        *(f"  {name:<{width}}  {importlib.import_module(module).HELP}" for name, module in COMMANDS.items()),
        "",
        "config groups (group=option):",
        *(f"  {group}: {', '.join(options)}" for group, options in config_groups().items()),
        "",
        "flags: -m/--multirun sweeps comma-separated values; --cfg prints the composed config and exits.",
        "example: trace-ray score env=device model=smollm2_135m split=eval limit=8",
    ]
    return "\n".join(lines)


def _parse(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parsed = []
    for text in overrides:
        try:
            parsed.extend(OverridesParser.create().parse_overrides([text]))
        except OverrideParseException:
            raise TraceRayError(f"malformed override {text!r}; write key=value (e.g. split=eval or model=tiny_random)") from None
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
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

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
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = _expand_synthetic(overrides)
    _check_group_choices(_parse(overrides))
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            composed = compose("config", overrides=[*overrides, f"command={command}"])
    except (HydraException, OmegaConfBaseException) as exc:
        unknown_key = re.search(r"Could not override '([^']+)'", str(exc))
        if unknown_key:
            fix = f"unknown config key {unknown_key.group(1)!r}; check the key name (trace-ray {command} --cfg lists every key)"
        elif "Ambiguous value" in str(exc):
            fix = f"{str(exc).splitlines()[0]}; write key=[v1,v2] for a list, or add -m to sweep"
        else:
            fix = f"{str(exc).splitlines()[0]}; fix the override or the file in conf/"
        raise TraceRayError(fix) from None
    return to_typed(composed)


def run_command(command: str, arguments: list[str]) -> None:
    flags = {argument for argument in arguments if argument.startswith("-")}
    unknown = flags - FLAGS
    if unknown:
        raise TraceRayError(f"unknown flag {sorted(unknown)[0]}; flags are -m/--multirun, --cfg, --help")
    overrides = [argument for argument in arguments if argument not in FLAGS]
    jobs = sweep_jobs(overrides) if flags & {"-m", "--multirun"} else [overrides]
    module = importlib.import_module(COMMANDS[command])
    configs = [compose_config(command, job) for job in jobs]
    if "--cfg" in flags:
        for config in configs:
            console.print(OmegaConf.to_yaml(OmegaConf.structured(config)), markup=False)
        return
    if len(configs) > 1 and hasattr(module, "run_sweep"):  # the command shares work across the jobs
        module.run_sweep(configs)
        return
    for number, (job, config) in enumerate(zip(jobs, configs)):
        if len(jobs) > 1:
            console.print(f"[bold]job {number + 1}/{len(jobs)}:[/bold] {' '.join(job)}")
        module.run(config)


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if not arguments or arguments[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    command, rest = arguments[0], arguments[1:]
    if command not in COMMANDS:
        print_error(f"unknown command {command!r}; choose one of: {', '.join(COMMANDS)} (trace-ray --help)")
        return 2
    if {"-h", "--help"} & set(rest):
        print(usage())
        return 0
    try:
        run_command(command, rest)
    except TraceRayError as exc:
        print_error(str(exc))
        return 1
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
