"""Reference run files: one JSON per labeling run of contrastive capability identification.

A labeling run labels every (trajectory, capability) pair NA, PRESENT or LACKING.
Schema (extra top-level keys are ignored on read; nothing else is allowed)::

    {"attempt": i,
     "totals": {"total_failed": F, "total_passed": P},
     "labels": {capability: {"lacking_failed": [ids], "present_failed": [ids], "na_failed": [ids],
                             "lacking_passed": [ids], "present_passed": [ids], "na_passed": [ids]}}}

For every capability the three ``*_failed`` lists partition the run's failed task ids and the
three ``*_passed`` lists its passed ids; the failed (passed) ids of a run are the union of the
capabilities' ``*_failed`` (``*_passed``) lists, and the totals count them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.errors import TraceRayError
from trace_ray.artifacts import write_json

LABEL_LISTS = ("lacking_failed", "present_failed", "na_failed", "lacking_passed", "present_passed", "na_passed")
FAILED_LISTS = LABEL_LISTS[:3]
PASSED_LISTS = LABEL_LISTS[3:]


class RunFileError(TraceRayError):
    """A run file that cannot be read or breaks the schema; the message names the file."""


@dataclass
class RunFile:
    attempt: int
    total_failed: int
    total_passed: int
    labels: dict[str, dict[str, list[str]]]  # capability -> the six LABEL_LISTS -> task ids
    source: str  # the file it was read from (its name prefixes every error and warning)


def read_run_file(path: str | Path) -> RunFile:
    """Parse and validate one run file; any problem raises a one-line RunFileError."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise RunFileError(f"{path.name}: cannot be read ({error.strerror})") from None
    except UnicodeDecodeError:
        raise RunFileError(f"{path.name}: is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise RunFileError(
            f"{path.name}: invalid JSON ({error.msg} at line {error.lineno} column {error.colno})"
        ) from None
    run = _parse(data, path)
    validate_run(run)
    return run


def read_run_files(folder: str | Path) -> list[RunFile]:
    """Every ``run_*.json`` of ``folder``, sorted by file name."""
    paths = sorted(Path(folder).glob("run_*.json"), key=lambda path: path.name)
    if not paths:
        raise RunFileError(
            f"{folder}: no run_*.json files; put precomputed run files there, or label collected trajectories "
            "(labeler=rules or labeler=llm)"
        )
    return [read_run_file(path) for path in paths]


def write_run_file(path: str | Path, run: RunFile) -> None:
    """Validate ``run`` and write it atomically with the exact schema."""
    validate_run(run)
    path = Path(path)
    data = {
        "attempt": run.attempt,
        "totals": {"total_failed": run.total_failed, "total_passed": run.total_passed},
        "labels": {cap: {key: list(lists[key]) for key in LABEL_LISTS} for cap, lists in run.labels.items()},
    }
    write_json(path, data, sort_keys=False)


def validate_run(run: RunFile) -> None:
    """Check that every capability's lists partition the run's failed and passed task ids.

    An id may appear once among a capability's six lists and must be failed (or passed) for
    every capability; every capability must cover the same failed and passed ids; the totals
    must count them (not checked for a run without capabilities, whose ids are unknown).
    """
    name = Path(run.source).name
    for cap, lists in run.labels.items():
        seen: dict[str, str] = {}
        for key in LABEL_LISTS:
            for task in lists[key]:
                if task in seen:
                    where = f"twice in {key}" if seen[task] == key else f"in both {seen[task]} and {key}"
                    raise RunFileError(f"{name}: capability '{cap}': task '{task}' appears {where}")
                seen[task] = key
    if not run.labels:
        return
    failed = {task for lists in run.labels.values() for key in FAILED_LISTS for task in lists[key]}
    passed = {task for lists in run.labels.values() for key in PASSED_LISTS for task in lists[key]}
    both = sorted(failed & passed)
    if both:
        task = both[0]
        as_failed = next(cap for cap, lists in run.labels.items() if any(task in lists[key] for key in FAILED_LISTS))
        as_passed = next(cap for cap, lists in run.labels.items() if any(task in lists[key] for key in PASSED_LISTS))
        raise RunFileError(
            f"{name}: capability '{as_passed}': task '{task}' is labelled as passed "
            f"but capability '{as_failed}' labels it as failed"
        )
    for cap, lists in run.labels.items():
        for outcome, ids, keys in (("failed", failed, FAILED_LISTS), ("passed", passed, PASSED_LISTS)):
            missing = sorted(ids - {task for key in keys for task in lists[key]})
            if missing:
                raise RunFileError(
                    f"{name}: capability '{cap}': {outcome} task '{missing[0]}' is missing from its *_{outcome} lists "
                    f"(another capability labels it {outcome})"
                )
    for key, total, ids in (("total_failed", run.total_failed, failed), ("total_passed", run.total_passed, passed)):
        if total != len(ids):
            outcome = key.removeprefix("total_")
            raise RunFileError(f"{name}: totals.{key} is {total} but the labels name {len(ids)} {outcome} tasks")


def _parse(data: Any, path: Path) -> RunFile:
    """The RunFile of parsed JSON, checking keys and types (not the partition)."""

    def fail(problem: str) -> RunFileError:
        return RunFileError(f"{path.name}: {problem}")

    if not isinstance(data, dict):
        raise fail("the top level must be a JSON object")
    for key in ("attempt", "totals", "labels"):
        if key not in data:
            raise fail(f"missing key '{key}'")
    if not _is_int(data["attempt"]):
        raise fail("'attempt' must be an integer")
    totals = data["totals"]
    if not isinstance(totals, dict) or set(totals) != {"total_failed", "total_passed"}:
        raise fail("'totals' must be an object with exactly 'total_failed' and 'total_passed'")
    for key, value in totals.items():
        if not _is_int(value) or value < 0:
            raise fail(f"totals.{key} must be a non-negative integer")
    if not isinstance(data["labels"], dict):
        raise fail("'labels' must be an object mapping capability names to label lists")
    labels: dict[str, dict[str, list[str]]] = {}
    for cap, lists in data["labels"].items():
        if not isinstance(lists, dict) or set(lists) != set(LABEL_LISTS):
            raise fail(f"capability '{cap}': must be an object with exactly the keys {', '.join(LABEL_LISTS)}")
        for key in LABEL_LISTS:
            if not isinstance(lists[key], list) or not all(isinstance(task, str) for task in lists[key]):
                raise fail(f"capability '{cap}': '{key}' must be a list of task id strings")
        labels[cap] = {key: lists[key] for key in LABEL_LISTS}
    return RunFile(data["attempt"], totals["total_failed"], totals["total_passed"], labels, str(path))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
