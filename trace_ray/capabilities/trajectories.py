"""The trajectories that capability labelers see, read from ``run_dir/trajectories/``.

A labeler judges each (trajectory, capability) pair NA (the task does not
need the capability), PRESENT (needed and exercised) or LACKING (needed, not
exercised). Trajectory ids are ``<task_id>#<sample_index>``, unique within a
collection; they are the ids written in the run files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from environments.errors import TraceRayError

NA, PRESENT, LACKING = "NA", "PRESENT", "LACKING"
LABELS = (NA, PRESENT, LACKING)


@dataclass(frozen=True)
class Trajectory:
    id: str  # "<task_id>#<sample_index>"
    task_id: str
    env: str
    seed: int
    family: str
    success: bool
    reward: float
    messages: list[dict[str, Any]]  # the whole conversation, OpenAI format
    reward_info: dict[str, Any]  # the environment's final info: milestones reached, score breakdown
    termination: str


def read_trajectories(run_dir: str | Path) -> list[Trajectory]:
    """Every collected episode of ``run_dir``, ordered by id."""
    folder = Path(run_dir) / "trajectories"
    shards = sorted(folder.glob("part-*.parquet")) if folder.exists() else []
    if not shards:
        raise TraceRayError(f"no trajectories in {folder}; run trace-ray collect run_dir={run_dir} first")
    columns = [
        "task_id",
        "env",
        "seed",
        "sample_index",
        "family",
        "success",
        "reward",
        "messages",
        "reward_info",
        "termination",
    ]
    trajectories = []
    for shard in shards:
        for row in pq.read_table(shard, columns=columns).to_pylist():
            trajectories.append(
                Trajectory(
                    id=f"{row['task_id']}#{row['sample_index']}",
                    task_id=row["task_id"],
                    env=row["env"],
                    seed=row["seed"],
                    family=row["family"],
                    success=row["success"],
                    reward=row["reward"],
                    messages=json.loads(row["messages"]),
                    reward_info=json.loads(row["reward_info"]),
                    termination=row["termination"],
                )
            )
    return sorted(trajectories, key=lambda trajectory: trajectory.id)
