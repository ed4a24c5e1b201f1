"""``trace-ray check-env env=NAME``: run the environment's self-checks."""

from __future__ import annotations

from environments.registry import make_environment
from environments.self_checks import run_self_checks
from environments.synthetic.factory import read_spec
from trace_ray.config import TraceConfig
from trace_ray.console import console, print_table
from trace_ray.environment_setup import environment_maker
from trace_ray.errors import TraceRayError

HELP = "run an environment's self-checks (oracle = 1.0, weak agents < 1.0, determinism, schemas; synthetic: target tools, capability needed)"


def target_tools(config: TraceConfig) -> list | None:
    """A synthetic environment's target's tools (its tools must be the target's); None for a target environment."""
    if config.env.name != "synthetic":
        return None
    target = make_environment(read_spec(config.env.spec)["target"])
    return target.reset(target.task_seeds("analysis")[0]).tools


def run(config: TraceConfig) -> None:
    make_env = environment_maker(config.env)
    env = make_env()
    seeds = env.task_seeds("analysis") + env.task_seeds("eval")
    results = run_self_checks(make_env, seeds, target_tools=target_tools(config))
    print_table(
        f"self-checks of env={config.env.name} ({len(seeds)} benchmark tasks)",
        ["check", "result", "detail"],
        [(result.name, "PASS" if result.passed else "FAIL", result.detail) for result in results],
    )
    failed = [result.name for result in results if not result.passed]
    if failed:
        raise TraceRayError(f"env={config.env.name} failed {len(failed)} self-check(s): {', '.join(failed)}; see the table above")
    console.print(f"all {len(results)} self-checks passed")
