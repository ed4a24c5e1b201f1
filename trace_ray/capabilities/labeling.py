"""Labeling runs: per-trajectory labels -> N run files, cached in ``run_dir/capabilities/labels/``.

The LLM labeler's N runs label every trajectory and differ by sampling seed.
The rules labeler is deterministic, so its N runs differ by the trajectories
they see: each run is a subsample, without replacement, of the successes and
of the failures (``subsample_fraction`` of each). k-of-N then measures how
stable a capability's selection is under resampling (a bootstrap would repeat
trajectory ids, which the run-file schema forbids).

The folder also holds ``candidates.json`` (the dictionary: name, description,
example trajectories) and ``_labeler.json`` (what produced the run files, and
a digest of the trajectories they label): identical settings on the same
trajectories reuse the cached runs, so sweeps relabel nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from environments.errors import TraceRayError
from trace_ray.artifacts import write_json
from trace_ray.capabilities.run_files import LABEL_LISTS, RunFile, write_run_file
from trace_ray.capabilities.trajectories import LACKING, NA, PRESENT, Trajectory

LABELER_MANIFEST = "_labeler.json"
CANDIDATES = "candidates.json"
EXAMPLES_PER_CANDIDATE = 4
_LIST_NAME = {NA: "na", PRESENT: "present", LACKING: "lacking"}


def trajectories_digest(trajectories: list[Trajectory]) -> str:
    """Identifies a labeled trajectory set: ids and outcomes."""
    text = "\n".join(
        f"{trajectory.id}:{int(trajectory.success)}" for trajectory in sorted(trajectories, key=lambda t: t.id)
    )
    return hashlib.sha256(text.encode()).hexdigest()


def run_file(attempt: int, failed: list[str], passed: list[str], labels: dict[str, dict[str, str]]) -> RunFile:
    """The run file of one labeling run over the ``failed`` and ``passed`` trajectory ids."""
    run_labels = {}
    for capability, by_trajectory in labels.items():
        lists: dict[str, list[str]] = {key: [] for key in LABEL_LISTS}
        for outcome, ids in (("failed", failed), ("passed", passed)):
            for trajectory_id in ids:
                lists[f"{_LIST_NAME[by_trajectory[trajectory_id]]}_{outcome}"].append(trajectory_id)
        run_labels[capability] = lists
    return RunFile(attempt, len(failed), len(passed), run_labels, source=f"run_{attempt:02d}.json")


def outcome_ids(trajectories: list[Trajectory]) -> tuple[list[str], list[str]]:
    """(failed ids, passed ids), sorted."""
    return sorted(t.id for t in trajectories if not t.success), sorted(t.id for t in trajectories if t.success)


def subsample_runs(
    trajectories: list[Trajectory], labels: dict[str, dict[str, str]], runs: int, fraction: float, seed: int
) -> list[RunFile]:
    """N run files, run i labeling a seeded subsample of the successes and of the failures."""
    failures, successes = outcome_ids(trajectories)
    files = []
    for attempt in range(runs):
        rng = random.Random(f"{seed}:{attempt}")
        chosen_failed = sorted(rng.sample(failures, max(1, math.ceil(fraction * len(failures)))))
        chosen_passed = sorted(rng.sample(successes, max(1, math.ceil(fraction * len(successes)))))
        files.append(run_file(attempt, chosen_failed, chosen_passed, labels))
    return files


def candidates_document(descriptions: dict[str, str], labels: dict[str, dict[str, str]]) -> dict[str, Any]:
    """``{"candidates": [{"name", "description", "example_trajectories"}]}``: examples are trajectories lacking it."""
    return {
        "candidates": [
            {
                "name": name,
                "description": description,
                "example_trajectories": sorted(i for i, label in labels.get(name, {}).items() if label == LACKING)[
                    :EXAMPLES_PER_CANDIDATE
                ],
            }
            for name, description in descriptions.items()
        ]
    }


def read_candidates(folder: Path) -> dict[str, str]:
    """name -> description from ``candidates.json`` ({} when there is none)."""
    path = folder / CANDIDATES
    if not path.exists():
        return {}
    try:
        document = json.loads(path.read_text())
        return {entry["name"]: entry.get("description", "") for entry in document["candidates"]}
    except (json.JSONDecodeError, KeyError, TypeError):
        raise TraceRayError(
            f'{path} is not a candidates file ({{"candidates": [{{"name", "description"}}]}}); fix or delete it'
        ) from None


def cached_labeler(folder: Path) -> dict[str, Any] | None:
    """The manifest of labels this project wrote in ``folder``; None when the folder holds none.

    Run files without a manifest came from elsewhere (by hand, the reference
    implementation): they are never overwritten.
    """
    manifest = folder / LABELER_MANIFEST
    if manifest.exists():
        return json.loads(manifest.read_text())
    if any(folder.glob("run_*.json")):
        raise TraceRayError(
            f"{folder} holds run files this project did not write; aggregate them with labeler=precomputed or choose "
            "another run_dir"
        )
    return None


def write_labels(folder: Path, runs: list[RunFile], candidates: dict[str, Any], manifest: dict[str, Any]) -> None:
    """Replace ``folder`` with the new runs, candidates and manifest in one rename (no mixed state on disk)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    scratch.chmod(0o755)
    try:
        for run in runs:
            write_run_file(scratch / run.source, run)
        write_json(scratch / CANDIDATES, candidates, sort_keys=False)
        write_json(scratch / LABELER_MANIFEST, manifest)
        if folder.exists():
            retired = folder.with_name(f".{folder.name}-retired")
            shutil.rmtree(retired, ignore_errors=True)
            folder.rename(retired)
            scratch.rename(folder)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            scratch.rename(folder)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
