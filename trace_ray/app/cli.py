"""``trace-ray <command> [-m] [--cfg] [hydra overrides]``.

Config comes from ``conf/`` (``trace_ray/config_compose.py``); ``-m``
expands sweeps (``a=1,2 b=range(0,3)``) and runs the jobs one after another. Every failure is one line on stderr and a
non-zero exit status.
"""

from __future__ import annotations

import importlib
import sys

from omegaconf import OmegaConf

from environments.errors import TraceRayError
from trace_ray.config_compose import compose_config, config_groups, sweep_jobs
from trace_ray.console import console, print_error

COMMANDS = {
    "check-env": "trace_ray.app.check_env",
    "score": "trace_ray.app.score",
    "collect": "trace_ray.app.collect",
    "identify": "trace_ray.app.identify",
    "synthesize": "trace_ray.app.synthesize",
    "train": "trace_ray.app.train",
    "route": "trace_ray.app.route",
    "evaluate": "trace_ray.app.evaluate",
    "pipeline": "trace_ray.app.pipeline",
    "serve": "trace_ray.app.serve",
}
FLAGS = {"-m", "--multirun", "--cfg", "-h", "--help"}


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
