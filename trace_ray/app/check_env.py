"""``trace-ray check-env env=NAME``: run the environment's self-checks (τ²-bench targets: the gold replay)."""

from __future__ import annotations

import os

from rich.progress import Progress

from environments.errors import TraceRayError
from environments.registry import make_environment
from environments.self_checks import CheckResult, run_self_checks
from environments.synthetic.factory import read_spec
from trace_ray.config import TAU2_ENVS, TraceConfig
from trace_ray.console import console, print_table
from trace_ray.environment_setup import environment_maker

HELP = (
    "run an environment's self-checks (oracle = 1.0, weak agents < 1.0, determinism, schemas; synthetic: target tools, "
    "capability needed); tau2_*: replay every task's gold actions through the package and through our adapter"
)


def target_tools(config: TraceConfig) -> list | None:
    """A synthetic environment's target's tools (its tools must be the target's); None for a target environment."""
    if config.env.name != "synthetic":
        return None
    target = make_environment(read_spec(config.env.spec)["target"])
    return target.reset(target.task_seeds("analysis")[0]).tools


def run_gold_replay(config: TraceConfig) -> None:
    """τ²-bench targets: the package's score of each task's gold actions beside ours (see
    environments/tau2/gold_replay.py).

    The weak-agent checks do not apply to a fixed benchmark: some tasks are
    solved by refusing, which a do-nothing agent does too.
    """
    environment_maker(config.env)  # a missing package fails here, naming the install command
    from environments.tau2.gold_replay import gold_replay
    from environments.tau2.tasks import domain_tasks

    domain = config.env.name.removeprefix("tau2_")
    seeds = sorted(domain_tasks(domain))
    rows = []
    with Progress(console=console, transient=True) as progress:
        job = progress.add_task(f"gold replay of {domain}", total=len(seeds))
        for row in gold_replay(domain, seeds):
            rows.append(row)
            progress.advance(job)
    print_table(
        f"gold replay of env={config.env.name} ({len(rows)} tasks, scripted user)",
        ["task", "package reward", "ours", "match", "reason"],
        [
            (
                row.task_id,
                f"{row.package_reward:.1f}",
                f"{row.our_reward:.1f}",
                "yes" if row.match else "NO",
                row.reason,
            )
            for row in rows
        ],
    )
    package_passes = sum(row.package_reward == 1.0 for row in rows)
    our_passes = sum(row.our_reward == 1.0 for row in rows)
    regressions = [row.task_id for row in rows if row.regression]
    console.print(
        f"{domain}: {len(rows)} tasks; package 1.0 on {package_passes}, ours 1.0 on {our_passes}; "
        f"{sum(row.match for row in rows)} match, {len(regressions)} where ours falls below the package's 1.0"
    )
    if regressions:
        raise TraceRayError(
            f"env={config.env.name}: our adapter scores below 1.0 where the package's gold actions score 1.0 on "
            "task(s) "
            f"{', '.join(regressions)}; see the table above"
        )


def run(config: TraceConfig) -> None:
    if config.env.name in TAU2_ENVS:
        run_gold_replay(config)
        return
    make_env = environment_maker(config.env)
    env = make_env()
    # limit=N: the first N tasks (null: all)
    seeds = (env.task_seeds("analysis") + env.task_seeds("eval"))[: config.limit]
    workers = config.check_workers or os.cpu_count() or 1
    console.print(f"self-checks of env={config.env.name}: {len(seeds)} tasks per agent, {workers} episode(s) at a time")
    with Progress(console=console, transient=True) as progress:
        episodes = progress.add_task("episodes", total=None)

        def on_check(result: CheckResult) -> None:  # each check as soon as it is decided: a full run takes hours
            console.print(f"{'PASS' if result.passed else 'FAIL'}  {result.name}: {result.detail}")

        def on_episode(agent: str) -> None:
            progress.update(episodes, advance=1, description=f"{agent} agent, episodes played")

        try:
            results = run_self_checks(
                make_env,
                seeds,
                target_tools=target_tools(config),
                workers=workers,
                on_check=on_check,
                on_episode=on_episode,
                agents=config.check_agents,
            )
        except ValueError as exc:
            raise TraceRayError(f"check_agents: {exc}; name some of them, or null for all") from None
    print_table(
        f"self-checks of env={config.env.name} ({len(seeds)} benchmark tasks)",
        ["check", "result", "detail"],
        [(result.name, "PASS" if result.passed else "FAIL", result.detail) for result in results],
    )
    failed = [result.name for result in results if not result.passed]
    if failed:
        raise TraceRayError(
            f"env={config.env.name} failed {len(failed)} self-check(s): {', '.join(failed)}; see the table above"
        )
    console.print(f"all {len(results)} self-checks passed")
