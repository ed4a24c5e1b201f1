"""``trace-ray identify run_dir=...``: the capabilities whose absence explains the failures (TRACE step 1).

Labels every collected trajectory per candidate capability (NA / PRESENT /
LACKING) in N runs, aggregates them (``trace_ray/capabilities/aggregation.py``)
and writes ``run_dir/capabilities/``: ``labels/run_XX.json`` and
``labels/candidates.json`` (the reference's formats), ``all_capabilities.json``
(every candidate) and ``selected.json`` (those kept). With ``-m`` over
``selection.*`` the labels are made once and each setting is aggregated from
them into ``sweep.parquet`` and ``sweep.md``. With ``labeler=precomputed`` the
run files alone define Cov and Delta (and the example failed cases): a run
directory holding only ``capabilities/labels/`` is enough.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from environments.capabilities import CAPABILITIES
from environments.errors import TraceRayError
from environments.synthetic.factory import target_templates
from trace_ray.artifacts import atomic_path, write_json
from trace_ray.capabilities import plots
from trace_ray.capabilities.aggregation import Aggregation, SelectionSettings, aggregate
from trace_ray.capabilities.agreement import agreement
from trace_ray.capabilities.labeling import (
    cached_labeler,
    candidates_document,
    outcome_ids,
    read_candidates,
    run_file,
    subsample_runs,
    trajectories_digest,
    write_labels,
)
from trace_ray.capabilities.run_files import RunFile, read_run_files
from trace_ray.capabilities.trajectories import Trajectory, read_trajectories
from trace_ray.config import TraceConfig
from trace_ray.console import console, print_table
from trace_ray.environment_setup import environment_maker

HELP = (
    "contrast the successes and failures in run_dir/trajectories (or precomputed run files) and select what the "
    "failures lack"
)
SHOWN_WARNINGS = 5


def run(config: TraceConfig) -> None:
    run_sweep([config])


def run_sweep(configs: list[TraceConfig]) -> None:
    """Label once, aggregate once per selection setting (one config: the full outputs; several: a sweep table)."""
    first = configs[0]
    if any(
        (c.run_dir, c.labeler, c.env.name, c.seed) != (first.run_dir, first.labeler, first.env.name, first.seed)
        for c in configs
    ):
        raise TraceRayError("a sweep may vary only selection.* (labels are made once); run other changes separately")
    trajectories = collected_trajectories(first)
    runs, descriptions = labeled_runs(first, trajectories)
    folder = Path(first.run_dir) / "capabilities"
    if len(configs) == 1:
        result = aggregate(runs, descriptions, selection_settings(first))
        write_outputs(folder, result)
        plots.cov_vs_delta(result, first.selection.rho, first.selection.delta, folder / "cov_vs_delta.png")
        plots.label_counts(runs, [capability.name for capability in result.all], folder / "label_counts.png")
        report(result, first, folder)
        report_agreement(folder)
        return
    write_sweep(
        folder, [(config.selection, aggregate(runs, descriptions, selection_settings(config))) for config in configs]
    )


def selection_settings(config: TraceConfig) -> SelectionSettings:
    return SelectionSettings(**asdict(config.selection))


def collected_trajectories(config: TraceConfig) -> list[Trajectory]:
    """The collected trajectories, checked for contrast; none for precomputed run files without ``trajectories/``."""
    if config.labeler.name == "precomputed" and not (Path(config.run_dir) / "trajectories").exists():
        console.print(f"no {Path(config.run_dir) / 'trajectories'}: aggregating the precomputed run files alone")
        return []
    trajectories = read_trajectories(config.run_dir)
    check_contrast(trajectories, config)
    return trajectories


def check_contrast(trajectories: list[Trajectory], config: TraceConfig) -> None:
    envs = sorted({trajectory.env for trajectory in trajectories})
    if envs != [config.env.name]:
        raise TraceRayError(
            f"{config.run_dir}/trajectories holds env={','.join(envs)} trajectories; pass env={envs[0]}"
        )
    successes = sum(trajectory.success for trajectory in trajectories)
    failures = len(trajectories) - successes
    if not successes or not failures:
        raise TraceRayError(
            f"contrastive analysis needs successes and failures, and {config.run_dir}/trajectories has {successes} "
            "successes "
            f"and {failures} failures; collect more samples per task (samples_per_task=K, a higher temperature) or "
            "another split"
        )


def labeled_runs(config: TraceConfig, trajectories: list[Trajectory]) -> tuple[list[RunFile], dict[str, str]]:
    """The labeler's run files and the candidates' descriptions (cached labels reused)."""
    folder = Path(config.run_dir) / "capabilities" / "labels"
    if config.labeler.name == "precomputed":
        runs = read_run_files(folder)
        check_run_contrast(runs, folder)
        return runs, read_candidates(folder)
    if config.labeler.name == "llm":
        return llm_runs(config, trajectories, folder)
    from trace_ray.capabilities.rules import label_trajectories

    env = environment_maker(config.env)()
    names = env.capability_detectors()
    if not names:
        raise TraceRayError(
            f"env={config.env.name} declares no rule detectors; use labeler=precomputed with your own run files"
        )
    manifest = {
        "labeler": "rules",
        "capabilities": names,
        "runs": config.labeler.runs,
        "subsample_fraction": config.labeler.subsample_fraction,
        "seed": config.seed,
        "trajectories": trajectories_digest(trajectories),
    }
    if cached_labeler(folder) == manifest:
        return read_run_files(folder), read_candidates(folder)
    seeds = {t.task_id: t.seed for t in trajectories}  # K samples of a task share its evidence
    evidence = {task_id: env.capability_evidence(seed) for task_id, seed in seeds.items()}
    labels = label_trajectories(trajectories, evidence, names)
    runs = subsample_runs(trajectories, labels, config.labeler.runs, config.labeler.subsample_fraction, config.seed)
    descriptions = rule_descriptions(config.env.name, names)
    write_labels(folder, runs, candidates_document(descriptions, labels), manifest)
    save_trajectory_labels(folder.parent, "rules", labels)
    console.print(f"labeled {len(trajectories)} trajectories x {len(names)} capabilities in {len(runs)} runs: {folder}")
    return runs, descriptions


def check_run_contrast(runs: list[RunFile], folder: Path) -> None:
    """Precomputed run files must name failed and passed tasks (trajectories, if any, are checked apart)."""
    failed, passed = sum(run.total_failed for run in runs), sum(run.total_passed for run in runs)
    if not failed or not passed:
        raise TraceRayError(
            f"contrastive analysis needs successes and failures, and the run files in {folder} name {passed} passed "
            f"and {failed} failed tasks in all; label a set of trajectories that holds both"
        )


def rule_descriptions(target: str, names: list[str]) -> dict[str, str]:
    """Each capability's description in the target's own words where its synthetic templates have them, else the
    catalogue's.

    The descriptions reach the agent (the logit router's options, the prompt-injection baseline).
    """
    templates = target_templates(target)
    return {name: templates[name].description if name in templates else CAPABILITIES[name] for name in names}


def llm_runs(config: TraceConfig, trajectories: list[Trajectory], folder: Path) -> tuple[list[RunFile], dict[str, str]]:
    """Candidates proposed once; N labeling runs (seeds seed, seed+1, ...) as parallel Ray tasks."""
    import ray

    from actors.ray_connection import connect_ray
    from actors.remote_errors import task_error
    from trace_ray.capabilities.llm_labeler import label_trajectories_llm, propose_candidates
    from trace_ray.llm_client import LLMClient

    labeler = config.labeler
    settings = {
        key: getattr(labeler, key)
        for key in ("base_url", "model", "max_candidates", "temperature", "max_chars", "runs", "response_format")
    }
    manifest = {"labeler": "llm", **settings, "seed": config.seed, "trajectories": trajectories_digest(trajectories)}
    if cached_labeler(folder) == manifest:
        return read_run_files(folder), read_candidates(folder)
    client = LLMClient(
        labeler.base_url,
        labeler.model,
        os.environ.get(labeler.api_key_env or ""),
        config_key="labeler",
        timeout_s=labeler.timeout_s,
        max_retries=labeler.max_retries,
        response_format=labeler.response_format,
        max_tokens=labeler.max_tokens,
    )
    proposed = propose_candidates(
        client,
        trajectories,
        labeler.max_candidates,
        config.seed,
        labeler.temperature,
        labeler.max_chars,
        labeler.max_repairs,
    )
    descriptions = {name: entry["description"] for name, entry in proposed.items()}
    connect_ray(config)
    label_run = ray.remote(num_cpus=0.1)(label_trajectories_llm)
    references = [
        label_run.remote(
            client,
            trajectories,
            descriptions,
            config.seed + attempt,
            labeler.temperature,
            labeler.max_chars,
            labeler.max_repairs,
        )
        for attempt in range(labeler.runs)
    ]
    try:
        labels = ray.get(references)
    except ray.exceptions.RayTaskError as exc:
        raise task_error(exc) from None
    failed, passed = outcome_ids(trajectories)
    runs = [run_file(attempt, failed, passed, run_labels) for attempt, run_labels in enumerate(labels)]
    candidates = {"candidates": [{"name": name, **entry} for name, entry in proposed.items()]}
    write_labels(folder, runs, candidates, manifest)
    save_trajectory_labels(folder.parent, "llm", majority_labels(labels))
    console.print(
        f"labeled {len(trajectories)} trajectories x {len(descriptions)} capabilities in {len(runs)} runs: {folder}"
    )
    return runs, descriptions


def save_trajectory_labels(folder: Path, labeler: str, labels: dict[str, dict[str, str]]) -> None:
    """Each labeler's per-trajectory labels, kept beside the active run files for agreement."""
    write_json(folder / "trajectory_labels" / f"{labeler}.json", labels)


def majority_labels(runs_labels: list[dict[str, dict[str, str]]]) -> dict[str, dict[str, str]]:
    """Per capability and trajectory, the label most runs gave (ties: the earliest run's)."""
    from collections import Counter

    first = runs_labels[0]
    return {
        capability: {
            trajectory: Counter(run[capability][trajectory] for run in runs_labels).most_common(1)[0][0]
            for trajectory in first[capability]
        }
        for capability in first
    }


def report_agreement(folder: Path) -> None:
    """Cohen's kappa per shared capability when both the rules and the LLM labeler labelled these trajectories."""
    import json

    files = {name: folder / "trajectory_labels" / f"{name}.json" for name in ("rules", "llm")}
    if not all(path.exists() for path in files.values()):
        return
    kappas = agreement(*(json.loads(path.read_text()) for path in files.values()))
    write_json(folder / "agreement.json", kappas)
    if kappas:
        print_table(
            "rules vs LLM labels (Cohen's kappa)",
            ["capability", "kappa"],
            [(name, "-" if kappa is None else f"{kappa:.2f}") for name, kappa in kappas.items()],
        )


def write_outputs(folder: Path, result: Aggregation) -> None:
    write_json(folder / "all_capabilities.json", [capability.to_json() for capability in result.all], sort_keys=False)
    write_json(folder / "selected.json", [capability.to_json() for capability in result.selected], sort_keys=False)


def _mean_std(mean: float | None, std: float | None) -> str:
    return "-" if mean is None else f"{mean:.3f} ± {std:.3f}"


def report(result: Aggregation, config: TraceConfig, folder: Path) -> None:
    selection = config.selection
    print_table(
        f"capabilities (rho={selection.rho}, delta={selection.delta}, k={selection.k}, undefined rates: "
        f"{selection.undefined_rate})",
        ["capability", "Cov", "Delta", "runs passed", "kept"],
        [
            (
                c.name,
                _mean_std(c.mean_cov, c.std_cov),
                _mean_std(c.mean_delta, c.std_delta),
                f"{c.n_runs_passed}/{c.n_runs_total}",
                "yes" if c.passes_consistency else "no",
            )
            for c in result.all
        ],
    )
    for warning in result.warnings[:SHOWN_WARNINGS]:
        console.print(f"[yellow]warning:[/yellow] {warning}", markup=True, highlight=False)
    if len(result.warnings) > SHOWN_WARNINGS:
        console.print(f"... and {len(result.warnings) - SHOWN_WARNINGS} more warnings")
    console.print(f"{len(result.selected)} of {len(result.all)} capabilities selected: {folder / 'selected.json'}")
    console.print(
        "every candidate, with 95% intervals of ER- and ER+ and the p-value of Delta: "
        f"{folder / 'all_capabilities.json'}"
    )


def write_sweep(folder: Path, results: list) -> None:
    """``sweep.parquet`` and ``sweep.md``: the selected set per (rho, delta, k, undefined_rate)."""
    rows = [
        {
            "rho": selection.rho,
            "delta": selection.delta,
            "k": selection.k,
            "undefined_rate": selection.undefined_rate,
            "n_selected": len(result.selected),
            "selected": [capability.name for capability in result.selected],
        }
        for selection, result in results
    ]
    with atomic_path(folder / "sweep.parquet") as scratch:
        pq.write_table(pa.Table.from_pylist(rows), scratch)
    lines = ["| rho | delta | k | undefined_rate | selected |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['rho']} | {r['delta']} | {r['k']} | {r['undefined_rate']} | {', '.join(r['selected']) or '(none)'} |"
        for r in rows
    ]
    with atomic_path(folder / "sweep.md") as scratch:
        Path(scratch).write_text("\n".join(lines) + "\n")
    print_table(
        f"sweep over {len(rows)} selection settings",
        ["rho", "delta", "k", "undefined_rate", "selected"],
        [(r["rho"], r["delta"], r["k"], r["undefined_rate"], ", ".join(r["selected"]) or "(none)") for r in rows],
    )
    console.print(f"sweep table: {folder / 'sweep.parquet'}, {folder / 'sweep.md'}")
