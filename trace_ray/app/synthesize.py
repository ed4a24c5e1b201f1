"""``trace-ray synthesize run_dir=DIR``: one verifiable training environment per selected capability (TRACE step 2).

For every capability of ``DIR/capabilities/selected.json``:

1. **Source**: the target's built-in template (``synthesis=templates``) or a
   module written by a generation model and admitted only when it passes the
   self-checks inside a sandboxed process (``synthesis=llm``).
2. **Self-checks** at every difficulty tried (``environments/self_checks.py``).
3. **Calibration**: the base model's rollouts (``calibration.group_size`` K per
   seed, ``calibration.num_seeds`` S seeds, the collect sampling settings) on
   Ray rollout workers; the difficulty levels are searched for the band where
   GRPO learns (``trace_ray/synthesis/calibration.py``).

It writes ``DIR/environments/<capability>/`` (``spec.json``,
``calibration.json``, ``calibration.md``; for generated modules
``module.py`` and ``check_log.md``) and moves each selected.json entry from
PENDING to READY (a level in band), OUT_OF_BAND (no level tried was in band: the
nearest is kept and recorded with its figures and reasons; ``trace-ray train``
skips it unless ``synthesis.accept_out_of_band=true``) or FAILED with the
reason; one capability's failure does not stop the others. Train on one with
``env=synthetic/<capability>``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from actors.rollout_service import RolloutService, start_rollout_service
from environments.errors import TraceRayError
from environments.protocol import Environment, ToolSchema
from environments.self_checks import run_self_checks
from environments.synthetic.factory import target_templates
from trace_ray.artifacts import atomic_path, write_json
from trace_ray.capabilities.selection_file import OUT_OF_BAND, READY, read_selection, selection_path, trainable
from trace_ray.config import EnvConfig, TraceConfig
from trace_ray.console import console, print_table
from trace_ray.engines import SamplingParams
from trace_ray.environment_setup import environment_maker, synthetic_env_config
from trace_ray.synthesis.calibration import (
    Band,
    CalibrationRound,
    CalibrationStats,
    calibration_stats,
    calibration_table,
    search_difficulty,
)

HELP = "build, self-check and calibrate one training environment per selected capability (run_dir/environments/)"

Groups = list[list[tuple[float, bool]]]  # per task seed, the (reward, success) of its K rollouts


def capabilities_to_synthesize(run_dir: Path, only: list[str] | None) -> list[dict[str, Any]]:
    """The selected capabilities to synthesize (all, or those named in ``only``, in its order)."""
    path = selection_path(run_dir)
    entries = read_selection(run_dir)
    if not entries:
        raise TraceRayError(
            f"{path} selects no capability; lower selection.rho or selection.delta and rerun trace-ray identify"
        )
    if only:
        unknown = sorted(set(only) - {entry["name"] for entry in entries})
        if unknown:
            raise TraceRayError(
                f"synthesis.capabilities names {unknown}, which {path} does not select; choose among its names"
            )
        by_name = {entry["name"]: entry for entry in entries}
        entries = [by_name[name] for name in only]  # in the order given
    return entries


def set_status(run_dir: Path, name: str, status: str, reason: str | None, nearest: dict | None = None) -> None:
    """One selected.json entry's status (READY; OUT_OF_BAND with its reason and nearest level; FAILED with its
    reason), written atomically."""
    path = selection_path(run_dir)
    entries = json.loads(path.read_text(encoding="utf-8"))
    for entry in entries:
        if entry["name"] == name:
            entry["status"] = status
            for key in ("reason", "environment", "nearest_level"):
                entry.pop(key, None)
            if reason:
                entry["reason"] = reason
            if status in (READY, OUT_OF_BAND):
                entry["environment"] = f"synthetic/{name}"
            if nearest:
                entry["nearest_level"] = nearest
    write_json(path, entries, sort_keys=False)


def out_of_band_reason(nearest: CalibrationRound) -> str:
    """Why a capability is OUT_OF_BAND, in one line: its nearest level and the figures outside the band."""
    figures = "; ".join(nearest.reasons)
    return (
        f"no difficulty level tried was in the calibration band; the nearest, {nearest.difficulty}, is "
        f"{nearest.verdict} ({figures})"
    )


# -- calibration rollouts on Ray ---------------------------------------------------------------
class RayCalibration:
    """The base model's rollouts on synthetic environments: one rollout service, switched to each level in turn."""

    def __init__(self, config: TraceConfig):
        self.config = config
        self.rollouts: RolloutService | None = None

    def groups(self, env: EnvConfig, seeds: list[int], label: str) -> Groups:
        config = self.config
        if self.rollouts is None:
            self.rollouts = start_rollout_service(config, env)
        else:
            self.rollouts.switch_environment(env)
        size = config.calibration.group_size
        params = SamplingParams(
            config.temperature, config.top_p, config.model.sampling.max_new_tokens, seed=config.seed
        )
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task(f"calibrating {label}", total=len(seeds) * size)
            groups = self.rollouts.groups(label, seeds, size, params, on_done=lambda _: progress.advance(bar))
        return [[(result.reward, result.success) for result in group] for group in groups]

    def close(self) -> None:
        if self.rollouts is not None:
            self.rollouts.close()


# -- one capability -----------------------------------------------------------------------------
@dataclass
class Target:
    name: str
    tools: list[ToolSchema]
    policy: str


def describe_target(config: TraceConfig) -> Target:
    env = environment_maker(config.env)()
    reset = env.reset(env.task_seeds("analysis")[0])
    policy = next((m["content"] for m in reset.messages if m.get("role") == "system"), "")
    return Target(config.env.name, reset.tools, policy)


def check_level(config: TraceConfig, env: EnvConfig, target: Target, seeds: list[int]) -> list[dict]:
    """The self-checks at one difficulty; raises when any fails."""
    make_env: Callable[[], Environment] = environment_maker(env)
    results = run_self_checks(make_env, seeds, target_tools=target.tools)
    failed = [f"{result.name} ({result.detail})" for result in results if not result.passed]
    if failed:
        raise TraceRayError(f"self-checks failed at difficulty {env.difficulty}: {'; '.join(failed)}")
    return [{"check": result.name, "passed": result.passed, "detail": result.detail} for result in results]


def synthesize_capability(
    config: TraceConfig,
    entry: dict,
    target: Target,
    rollouts: Callable[[EnvConfig, list[int], str], Groups],
) -> dict[str, Any]:
    """Build, check and calibrate one capability's environment; returns its final spec."""
    name = entry["name"]
    folder = Path(config.run_dir) / "environments" / name
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec.json"
    spec: dict[str, Any] = {
        "capability": name,
        "description": entry.get("description", ""),
        "target": target.name,
        "source": config.synthesis.name,
        "model": config.model.name,
        "sampling": {
            "temperature": config.temperature,
            "top_p": config.top_p,
            "max_new_tokens": config.model.sampling.max_new_tokens,
        },
    }
    if config.synthesis.name == "templates":
        template = target_templates(target.name)[name]
        levels, start = list(template.difficulties), template.default_difficulty
    else:
        from trace_ray.synthesis.llm_environments import generate_module

        spec.update(generate_module(config, entry, target, folder))
        levels = spec.pop("difficulties")
        start = levels[(len(levels) - 1) // 2]
    if config.calibration.start == "easiest":
        start = levels[0]
    write_json(spec_path, {**spec, "difficulty": start})  # the environment actors read it
    probe = environment_maker(synthetic_env_config(config, name, start))()
    check_seeds = probe.task_seeds("analysis")[: config.synthesis.self_check_seeds]
    calibration_seeds = probe.task_seeds("eval")[: config.calibration.num_seeds]
    spec.update(difficulties=levels, self_check_seeds=check_seeds, calibration_seeds=calibration_seeds)
    checks: dict[int, list[dict]] = {}

    def evaluate(difficulty: int) -> CalibrationStats:
        env = synthetic_env_config(config, name, difficulty)
        checks[difficulty] = check_level(config, env, target, check_seeds)
        groups = rollouts(env, calibration_seeds, f"{name}@{difficulty}")
        return calibration_stats(groups, tuple(config.calibration.pass_at))

    calibration = config.calibration
    band = Band(
        tuple(calibration.band.mean_reward),
        tuple(calibration.band.success_rate),
        calibration.band.max_all_success,
        calibration.band.max_all_zero,
    )
    result = search_difficulty(evaluate, levels, start, band, calibration.max_rounds)
    spec.update(difficulty=result.difficulty, in_band=result.in_band, self_checks=checks[result.difficulty])
    write_json(folder / "calibration.json", {"capability": name, "band": vars(calibration.band), **result.to_json()})
    table = calibration_table(result.rounds)
    verdict = (
        "in band"
        if result.in_band
        else f"no level tried was in band; the nearest is kept and the status is {OUT_OF_BAND}"
    )
    with atomic_path(folder / "calibration.md") as scratch:
        Path(scratch).write_text(
            f"# Calibration of {name}\n\nChosen difficulty {result.difficulty} ({verdict}).\n\n{table}\n"
        )
    write_json(spec_path, spec)
    spec["chosen"] = result.chosen
    return spec


# -- the command ----------------------------------------------------------------------------------
def check_sources(config: TraceConfig, entries: list[dict]) -> None:
    """Every capability needs a template unless a generation model writes the environments."""
    if config.synthesis.name != "templates":
        return
    templates = target_templates(config.env.name)
    missing = [entry["name"] for entry in entries if entry["name"] not in templates]
    if missing:
        raise TraceRayError(
            f"env={config.env.name} has no template for {', '.join(missing)}; generate them with synthesis=llm "
            "synthesis.base_url=http://HOST:PORT/v1 synthesis.model=NAME, or leave them out with "
            "synthesis.capabilities=[...]"
        )


def run(config: TraceConfig, rollouts: Callable[[EnvConfig, list[int], str], Groups] | None = None) -> None:
    synthesize(config, config.synthesis.capabilities, config.synthesis.stop_after, rollouts)


def synthesize(
    config: TraceConfig,
    capabilities: list[str] | None,
    stop_after: int | None,
    rollouts: Callable[[EnvConfig, list[int], str], Groups] | None = None,
) -> None:
    """An environment for each of ``capabilities`` (None: every selected one), in that order, until ``stop_after``
    are trainable (None: no limit); ``rollouts`` plays calibration groups (None: the base model on Ray)."""
    run_dir = Path(config.run_dir)
    if config.env.name == "synthetic":
        raise TraceRayError(
            "env= names the target environment the capabilities come from (e.g. env=device), not a synthetic one"
        )
    entries = capabilities_to_synthesize(run_dir, capabilities)
    check_sources(config, entries)
    target = describe_target(config)
    calibration = None if rollouts else RayCalibration(config)
    try:
        rows = synthesize_all(config, entries, target, rollouts or calibration.groups, stop_after)
    finally:
        if calibration is not None:
            calibration.close()
    print_table(
        f"synthetic environments in {run_dir / 'environments'} (base model {config.model.name})",
        ["capability", "source", "difficulty", "in band", "mean reward", "success", "status"],
        rows,
    )
    failed = [row[0] for row in rows if row[-1] == "FAILED"]
    if len(failed) == len(rows):
        raise TraceRayError(
            f"no capability got an environment ({', '.join(failed)}); see the reasons in {selection_path(run_dir)}"
        )
    outside = [row[0] for row in rows if row[-1] == OUT_OF_BAND]
    if outside:
        console.print(
            f"trace-ray train skips {', '.join(outside)} ({OUT_OF_BAND}) unless synthesis.accept_out_of_band=true"
        )
    console.print(f"train one with env=synthetic/<capability> run_dir={run_dir}")


def synthesize_all(
    config: TraceConfig,
    entries: list[dict],
    target: Target,
    rollouts: Callable[[EnvConfig, list[int], str], Groups],
    stop_after: int | None,
) -> list[tuple]:
    """Each capability's environment, until ``stop_after`` are trainable; one summary row each."""
    run_dir = Path(config.run_dir)
    rows = []
    ready = 0
    for position, entry in enumerate(entries):
        name = entry["name"]
        if stop_after is not None and ready >= stop_after:
            rest = ", ".join(e["name"] for e in entries[position:])
            console.print(f"{stop_after} capabilities trainable: {rest} left PENDING", soft_wrap=True)
            break
        console.print(f"[bold]{name}[/bold]: synthesis={config.synthesis.name}")
        try:
            spec = synthesize_capability(config, entry, target, rollouts)
        except TraceRayError as exc:
            set_status(run_dir, name, "FAILED", str(exc))
            console.print(f"[red]{name} FAILED[/red]: {exc}")
            rows.append((name, config.synthesis.name, "-", "-", "-", "-", "FAILED"))
            continue
        chosen = spec["chosen"]
        if spec["in_band"]:
            status = READY
            set_status(run_dir, name, status, None)
        else:
            status, reason = OUT_OF_BAND, out_of_band_reason(chosen)
            set_status(run_dir, name, status, reason, chosen.figures())
            console.print(f"[yellow]{name} {status}[/yellow]: {reason}", soft_wrap=True)
        ready += trainable({"status": status, "nearest_level": chosen.figures()}, config.synthesis)
        rows.append(
            (
                name,
                spec["source"],
                str(spec["difficulty"]),
                "yes" if spec["in_band"] else "no",
                f"{chosen.stats.mean_reward:.3f}",
                f"{chosen.stats.success_rate:.3f}",
                status,
            )
        )
    return rows
