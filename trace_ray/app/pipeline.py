"""``trace-ray pipeline run_dir=DIR``: TRACE end to end, each stage recorded in ``DIR/manifest.json``.

Stages, in order: ``collect`` (the target's analysis split) -> ``identify`` ->
``synthesize`` -> ``train`` (one adapter per READY capability; OUT_OF_BAND
ones too with ``synthesis.accept_out_of_band=true``) ->
``baseline`` (GRPO on the target itself with the rollouts TRACE's training
spent) -> ``route`` -> ``evaluate`` (the held-out eval split). A stage whose
fingerprint (its config keys and everything upstream) matches a finished run
is skipped; a stage left running by an interrupted run resumes;
``pipeline.stages=[...]`` runs a subset (their upstream stages must be
done). ``budget=demo|small|paper`` scales tasks, samples, group sizes and
iterations together.

``-m`` sweeps run each combination in its own run directory under DIR
(``DIR/<key-value__key-value>``) and copy, instead of rerunning, every stage whose
fingerprint a finished combination already has; ``DIR/sweep_summary.md``
compares the combinations.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.errors import TraceRayError
from trace_ray.app import collect, evaluate, identify, route, synthesize, train
from trace_ray.app.evaluate import print_report
from trace_ray.app.sweeps import job_name
from trace_ray.artifacts import atomic_path
from trace_ray.capabilities.selection_file import read_selection, synthesized_entries
from trace_ray.config import GRPOConfig, SynthesisConfig, TraceConfig
from trace_ray.console import console, print_table
from trace_ray.routing.adapters import routable_adapters
from trace_ray.run_manifest import RunManifest, config_values, digest, tree_hash
from trace_ray.run_storage import RunStorage
from trace_ray.training.training_log import rollouts_spent

HELP = (
    "run TRACE end to end (collect, identify, synthesize, train, baseline, route, evaluate) with a manifest; reruns "
    "skip finished stages"
)


def synthesized_capabilities(run_dir: Path) -> list[str]:
    """The capabilities train may have trained (those it skipped have no adapter folder)."""
    return [entry["name"] for entry in synthesized_entries(run_dir)]


def by_coverage(run_dir: Path) -> list[str]:
    """The selected capabilities, the highest coverage first."""
    return [entry["name"] for entry in sorted(read_selection(run_dir), key=lambda e: -e.get("mean_cov", 0.0))]


def matched_grpo(config: TraceConfig, run_dir: Path) -> GRPOConfig:
    """GRPO settings on the target that spend at most the rollouts TRACE's capability adapters did.

    The cap (``grpo.max_rollouts``) holds dynamic sampling's extra batches to the
    same total; the iterations are as many as that total allows (at least one batch).
    """
    batch = config.grpo.group_size * config.grpo.groups_per_batch
    # the adapters TRACE routes: a skipped capability's training log left by an earlier attempt is not this run's budget
    spent = max(batch, sum(rollouts_spent(adapter.folder) for adapter in routable_adapters(run_dir)))
    return dataclasses.replace(config.grpo, iterations=math.ceil(spent / batch), max_rollouts=spent)


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline: ``function(config, **arguments(config, run_dir))`` does its work."""

    name: str
    function: Callable[..., None]
    arguments: Callable[[TraceConfig, Path], dict[str, Any]]  # its inputs beside the config (from earlier stages)
    keys: tuple[str, ...]  # config keys its result depends on (besides everything upstream)
    outputs: Callable[[TraceConfig, Path], list[str]]  # what it writes, relative to the run directory
    ignored: tuple[str, ...] = ()  # keys inside ``keys`` its result does not depend on

    def values(self, config: TraceConfig) -> dict:
        """The config values of ``keys``, less ``ignored``."""
        values = config_values(config, list(self.keys))
        for key in self.ignored:
            section, _, name = key.rpartition(".")
            values.get(section, {}).pop(name, None)
        return values


def recorded(arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` as the manifest records them (a settings dataclass as its fields)."""
    return {
        name: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        for name, value in arguments.items()
    }


# accept_out_of_band decides what train trains, not what synthesis builds: a key of the train stage only
# all: they decide which are trainable
SYNTHESIS_KEYS = tuple(f"synthesis.{f.name}" for f in dataclasses.fields(SynthesisConfig))
HELD_OUT = "eval"  # the split route and evaluate score on; collect plays the other one

STAGES = [
    Stage(
        "collect",
        collect.collect,
        lambda c, d: {"split": "analysis", "limit": c.pipeline.collect_limit},
        (
            "model.name",
            "model.sampling",
            "env",
            "samples_per_task",
            "temperature",
            "top_p",
            "seed",
            "rollout.max_episode_tokens",
            "pipeline.collect_limit",
        ),
        lambda c, d: ["trajectories"],
        ignored=("env.eval_size",),  # collection plays the analysis split: a larger eval split leaves it up to date
    ),
    Stage(
        "identify",
        identify.run,
        lambda c, d: {},
        ("labeler", "selection"),
        lambda c, d: ["capabilities/all_capabilities.json"],
    ),
    Stage(
        "synthesize",
        synthesize.synthesize,
        # the most covered first, until pipeline.max_capabilities are trainable (an environment too hard or too easy
        # for any GRPO signal makes way for the next)
        lambda c, d: {"capabilities": by_coverage(d), "stop_after": c.pipeline.max_capabilities},
        (*SYNTHESIS_KEYS, "calibration", "pipeline.max_capabilities"),
        lambda c, d: ["environments", "capabilities/selected.json"],
    ),
    Stage(
        "train",
        train.train_capabilities,
        lambda c, d: {},
        (
            "grpo",
            "lora",
            "synthesis.accept_out_of_band",
            "synthesis.train_without_signal",
            "synthesis.min_informative_fraction",
        ),
        lambda c, d: [f"adapters/{name}" for name in synthesized_capabilities(d)],
    ),
    Stage(
        "baseline",
        train.train_on_target,
        lambda c, d: {"name": c.evaluate.grpo_baseline, "grpo": matched_grpo(c, d)},
        ("grpo", "lora", "evaluate.grpo_baseline"),
        lambda c, d: [f"adapters/{c.evaluate.grpo_baseline}"],
    ),
    Stage(
        "route",
        route.route,
        lambda c, d: {"split": HELD_OUT, "limit": c.pipeline.eval_limit},
        ("router", "env.eval_size", "pipeline.eval_limit"),
        lambda c, d: ["router"],
    ),
    Stage(
        "evaluate",
        evaluate.evaluate,
        lambda c, d: {"split": HELD_OUT, "limit": c.pipeline.eval_limit},
        ("evaluate", "env.eval_size", "pipeline.eval_limit"),
        lambda c, d: ["eval"],
    ),
]
STAGE_NAMES = [stage.name for stage in STAGES]


def selected_stages(config: TraceConfig) -> list[Stage]:
    wanted = config.pipeline.stages or STAGE_NAMES
    unknown = sorted(set(wanted) - set(STAGE_NAMES))
    if unknown:
        raise TraceRayError(f"pipeline.stages names {unknown}; choose among {STAGE_NAMES}")
    return [stage for stage in STAGES if stage.name in wanted]


def fingerprint(config: TraceConfig, stage: Stage, manifest: RunManifest) -> str:
    index = STAGE_NAMES.index(stage.name)
    upstream = manifest.entry(STAGE_NAMES[index - 1]) if index else {}
    return digest([stage.values(config), upstream.get("fingerprint"), upstream.get("outputs")])


def reuse(stage: Stage, stage_fingerprint: str, sources: list[Path], run_dir: Path, config: TraceConfig) -> dict | None:
    """Copy a finished stage with the same fingerprint from another run directory of the sweep; its manifest entry."""
    for source in sources:
        path = source / "manifest.json"
        if not path.is_file():
            continue
        entry = json.loads(path.read_text(encoding="utf-8"))["stages"].get(stage.name, {})
        if entry.get("status") == "done" and entry.get("fingerprint") == stage_fingerprint:
            for relative in stage.outputs(config, source):
                origin, target = source / relative, run_dir / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                if origin.is_dir():
                    shutil.copytree(origin, target, dirs_exist_ok=True)
                elif origin.is_file():
                    shutil.copy2(origin, target)
            return {**entry, "reused_from": str(source)}
    return None


def run_pipeline(config: TraceConfig, reuse_from: list[Path] = ()) -> None:
    run_dir = Path(config.run_dir)
    stages = selected_stages(config)
    storage = RunStorage(config.pipeline.storage_path, run_dir) if config.pipeline.storage_path else None
    if storage and storage.pull():
        console.print(f"pulled the stored run from {storage.uri} into {run_dir}")
    manifest = RunManifest(run_dir, {"model": config.model.name, "env": config.env.name})
    for stage in stages:
        index = STAGE_NAMES.index(stage.name)
        if index and manifest.entry(STAGE_NAMES[index - 1]).get("status") != "done" and STAGES[index - 1] not in stages:
            raise TraceRayError(
                f"stage {stage.name} needs {STAGE_NAMES[index - 1]} done first; add it to pipeline.stages"
            )
        stage_fingerprint = fingerprint(config, stage, manifest)
        if manifest.is_current(stage.name, stage_fingerprint):
            console.print(f"[dim]{stage.name}: up to date, skipped[/dim]")
            if stage.name == "evaluate":  # a rerun still answers with the result
                print_report(run_dir / "eval")
            continue
        copied = reuse(stage, stage_fingerprint, list(reuse_from), run_dir, config)
        if copied:
            manifest.data["stages"][stage.name] = copied
            manifest.save()
            if storage:
                storage.push()
            console.print(f"{stage.name}: reused from {copied['reused_from']}")
            continue
        resumed = manifest.entry(stage.name).get("status") == "running"
        console.rule(f"{stage.name}{' (resuming an interrupted run)' if resumed else ''}")
        arguments = stage.arguments(config, run_dir)
        manifest.start(stage.name, stage_fingerprint, stage.values(config), recorded(arguments))
        try:
            stage.function(config, **arguments)
        except TraceRayError as exc:
            manifest.fail(stage.name, str(exc))
            raise TraceRayError(f"pipeline stage {stage.name} failed: {exc}") from None
        except BaseException as exc:  # interrupted or crashed: the stage stays "running" and resumes next time
            if not isinstance(exc, KeyboardInterrupt):
                manifest.fail(stage.name, f"{type(exc).__name__}: {exc}")
            raise
        manifest.finish(stage.name, tree_hash(run_dir, stage.outputs(config, run_dir)))
        if storage:
            storage.push()
    console.print(f"manifest: {manifest.path}" + (f" (stored at {storage.uri})" if storage else ""))


def run(config: TraceConfig) -> None:
    run_pipeline(config)


def run_sweep(configs: list[TraceConfig]) -> None:
    """Each combination in ``run_dir/<key-value__...>``; stages an earlier combination finished are copied."""
    root = Path(configs[0].run_dir)
    finished: list[Path] = []
    rows = []
    for config in configs:
        name = job_name(config, configs)
        run_dir = root / name
        console.rule(f"[bold]sweep job {name}[/bold]")
        storage = config.pipeline.storage_path and f"{config.pipeline.storage_path.rstrip('/')}/{name}"
        job = dataclasses.replace(
            config, run_dir=str(run_dir), pipeline=dataclasses.replace(config.pipeline, storage_path=storage)
        )
        run_pipeline(job, reuse_from=finished)
        finished.append(run_dir)
        rows.append((name, *sweep_figures(run_dir)))
    header = ["job", "base", "TRACE (logit)", "oracle router", "GRPO on target"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    with atomic_path(root / "sweep_summary.md") as scratch:
        Path(scratch).write_text(
            "# Sweep: mean reward on the held-out split\n\n" + "\n".join(lines) + "\n", encoding="utf-8"
        )
    print_table(f"sweep: mean reward on the held-out split ({root / 'sweep_summary.md'})", header, rows)


def sweep_figures(run_dir: Path) -> tuple[str, ...]:
    path = run_dir / "eval" / "report.json"
    methods = (
        {row["method"]: row for row in json.loads(path.read_text(encoding="utf-8"))["methods"]}
        if path.is_file()
        else {}
    )
    return tuple(
        f"{methods[name]['mean_reward']:.3f}" if name in methods else "-"
        for name in ("base", "TRACE (logit)", "oracle router", "GRPO on target")
    )
