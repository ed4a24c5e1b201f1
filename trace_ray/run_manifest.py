"""``run_dir/manifest.json``: what the pipeline ran in a run directory, and whether a stage is still up to date.

Per stage: status (``running``, ``done``, ``failed``), the config keys it
depends on, package versions, the code's git commit, its fingerprint, the hash of what it wrote,
start and end times, and the error of a failed run. A stage's fingerprint
hashes its config keys together with the fingerprint and output hash of the
stage before it, so a change anywhere upstream makes every later stage stale.
A stage left ``running`` was interrupted; running it again resumes it (each
stage resumes its own work: collection shards, training checkpoints).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, is_dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from environments.errors import TraceRayError
from trace_ray.artifacts import write_json

MANIFEST = "manifest.json"
PACKAGES = ("trace-ray", "torch", "transformers", "peft", "ray", "pyarrow")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def source_commit() -> str:
    """The git commit of the running code (``+dirty`` when its tracked files differ from it); ``unknown`` outside a
    git checkout (an installed wheel)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if commit.returncode != 0:
        return "unknown"
    return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def config_values(config: Any, keys: list[str]) -> dict[str, Any]:
    """The dotted ``keys`` of a config dataclass, as plain JSON values."""
    values = {}
    for key in keys:
        value = config
        for part in key.split("."):
            value = getattr(value, part)
        values[key] = asdict(value) if is_dataclass(value) else value
    return values


def without_nulls(value: Any) -> Any:
    """``value`` with every mapping entry whose value is None left out (list items stay where they are), so that a new
    optional setting at its null default leaves every digest, and so every finished stage and checkpoint, as it was."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, (list, tuple)):
        return [without_nulls(item) for item in value]
    return value


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(without_nulls(value), sort_keys=True, default=str).encode()).hexdigest()[:16]


def tree_hash(root: Path, paths: list[str]) -> str:
    """Hash of every file under ``paths`` (relative to ``root``): names and contents."""
    hasher = hashlib.sha256()
    for relative in paths:
        path = root / relative
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.is_file() else []
        for file in files:
            hasher.update(str(file.relative_to(root)).encode())
            hasher.update(hashlib.sha256(file.read_bytes()).digest())
    return hasher.hexdigest()[:16]


class RunManifest:
    """The manifest of one run directory, rewritten atomically on every change."""

    def __init__(self, run_dir: Path, identity: dict[str, str]):
        self.path = Path(run_dir) / MANIFEST
        self.identity = identity  # model and environment: a run directory holds one of each
        self.data: dict[str, Any] = {**identity, "stages": {}}
        if self.path.is_file():
            try:
                existing = json.loads(self.path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                raise TraceRayError(f"{self.path} is not valid JSON; delete it to rerun every stage") from None
            different = {key: existing.get(key) for key, value in identity.items() if existing.get(key) != value}
            if different:
                found = " ".join(f"{key}={value}" for key, value in different.items())
                asked = " ".join(f"{key}={identity[key]}" for key in different)
                raise TraceRayError(
                    f"{run_dir} was produced with {found}, not {asked}; choose another run_dir or pass {found}"
                )
            self.data = existing

    def entry(self, stage: str) -> dict[str, Any]:
        return self.data["stages"].get(stage, {})

    def is_current(self, stage: str, fingerprint: str) -> bool:
        entry = self.entry(stage)
        return entry.get("status") == "done" and entry.get("fingerprint") == fingerprint

    def start(self, stage: str, fingerprint: str, config: dict[str, Any], arguments: dict[str, Any]) -> None:
        """``stage`` running: the config values and the arguments (from earlier stages' results) it runs with."""
        self.data["stages"][stage] = {
            "status": "running",
            "fingerprint": fingerprint,
            "config": config,
            "arguments": arguments,
            "versions": package_versions(),
            "commit": source_commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self.save()

    def finish(self, stage: str, outputs: str, **extra: Any) -> None:
        self.data["stages"][stage].update(
            status="done", outputs=outputs, ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra
        )
        self.save()

    def fail(self, stage: str, error: str) -> None:
        self.data["stages"][stage].update(status="failed", error=error, ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self.save()

    def save(self) -> None:
        write_json(self.path, self.data)
