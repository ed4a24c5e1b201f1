"""``run_dir/trajectories/``: collected episodes as a Parquet dataset.

One row per episode; shards (``part-*.parquet``) are written atomically as
work completes (temporary file + rename), so a reader never sees half a
shard and an interrupted collection keeps every finished one. A manifest
(``_manifest.json``) records what the trajectories are (environment, split,
model, sampling); a run directory holding different trajectories is refused
rather than mixed. Resuming skips the (seed, sample_index) pairs already
on disk.

Schema (column: type — meaning):
    task_id: string — the environment's task id (e.g. ``device-64``)
    family: string — the task's family (category)
    split: string — benchmark split the task came from
    seed: int64 — the environment seed of the task
    sample_index: int32 — which of the task's samples (0..K-1)
    env: string — environment name
    model: string — model config name
    adapter_name: string (null = base model) — LoRA adapter used
    adapter_version: int64 (null = base model) — the version of its first turn, the oldest it acted with
    turn_adapter_versions: list<int64> — the adapter version of each turn, in order (null entries: the base model)
    messages: string — the whole conversation, JSON list of OpenAI messages
    tools: string — the tool schemas, JSON
    tool_calls: list<string> — every tool call the agent made, JSON objects in order
    token_ids: list<int32> — the episode's tokens exactly as seen and sampled
    action_mask: list<int8> — 1 on every token the policy sampled, 0 elsewhere
    logprobs: list<float32> — behavior log-prob of each sampled token (0 where mask is 0)
    reward: float64 — final reward in [0, 1]
    success: bool — reward reached the environment's success threshold
    reward_info: string — the final info dict (milestones reached, ...), JSON
    termination: string — agent_reply | max_turns | context_limit | ...
    turns: int32 — assistant turns
    generated_tokens: int32 — action tokens
    seconds: float64 — wall time of the episode
    finished_at: float64 — UNIX time the episode finished
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from environments.errors import TraceRayError
from trace_ray.artifacts import atomic_path, write_json
from trace_ray.rollout_loop import EpisodeResult
from trace_ray.trajectory import TokenRecord

SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("family", pa.string()),
        ("split", pa.string()),
        ("seed", pa.int64()),
        ("sample_index", pa.int32()),
        ("env", pa.string()),
        ("model", pa.string()),
        ("adapter_name", pa.string()),
        ("adapter_version", pa.int64()),
        ("turn_adapter_versions", pa.list_(pa.int64())),
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("tool_calls", pa.list_(pa.string())),
        ("token_ids", pa.list_(pa.int32())),
        ("action_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("success", pa.bool_()),
        ("reward_info", pa.string()),
        ("termination", pa.string()),
        ("turns", pa.int32()),
        ("generated_tokens", pa.int32()),
        ("seconds", pa.float64()),
        ("finished_at", pa.float64()),
    ]
)
MANIFEST = "_manifest.json"


def episode_row(result: EpisodeResult, run: dict[str, Any]) -> dict[str, Any]:
    """One Parquet row; ``run`` (the manifest) holds the collection's env, split and model."""
    tool_calls = [
        json.dumps(call["function"], ensure_ascii=False)
        for message in result.messages
        if message["role"] == "assistant"
        for call in message.get("tool_calls") or []
    ]
    return {
        "task_id": result.task_id,
        "family": result.family,
        "split": run["split"],
        "seed": result.seed,
        "sample_index": result.sample_index,
        "env": run["env"],
        "model": run["model"],
        "adapter_name": result.adapter[0] if result.adapter else None,
        "adapter_version": result.adapter[1] if result.adapter else None,
        "turn_adapter_versions": [adapter[1] if adapter else None for adapter in result.turn_adapters],
        "messages": json.dumps(result.messages, ensure_ascii=False),
        "tools": json.dumps(result.tools, ensure_ascii=False),
        "tool_calls": tool_calls,
        "token_ids": result.record.token_ids,
        "action_mask": result.record.action_mask,
        "logprobs": result.record.logprobs,
        "reward": result.reward,
        "success": result.success,
        "reward_info": json.dumps(result.info, ensure_ascii=False, default=str),
        "termination": result.termination,
        "turns": result.turns,
        "generated_tokens": result.record.action_tokens,
        "seconds": result.seconds,
        "finished_at": time.time(),
    }


def episode_from_row(row: dict[str, Any], key: str) -> EpisodeResult:
    """The episode of an :func:`episode_row` row, under ``key`` (``reward_info`` as its JSON holds it)."""
    name = row["adapter_name"]
    adapter = (name, row["adapter_version"]) if name is not None else None
    turn_versions = row.get("turn_adapter_versions") or []  # absent from shards written before it was recorded
    turn_adapters = [(name, version) if version is not None else None for version in turn_versions]
    return EpisodeResult(
        key=key,
        task_id=row["task_id"],
        family=row["family"],
        seed=row["seed"],
        sample_index=row["sample_index"],
        adapter=adapter,
        reward=row["reward"],
        success=row["success"],
        turns=row["turns"],
        termination=row["termination"],
        messages=json.loads(row["messages"]),
        tools=json.loads(row["tools"]),
        record=TokenRecord(list(row["token_ids"]), list(row["action_mask"]), list(row["logprobs"])),
        info=json.loads(row["reward_info"]),
        seconds=row["seconds"],
        turn_adapters=turn_adapters,
    )


class TrajectoryStore:
    """The trajectories of one collection (``run``: env, split, model, sampling) in ``run_dir``."""

    def __init__(self, run_dir: str | Path, run: dict[str, Any]):
        self.directory = Path(run_dir) / "trajectories"
        self.run = run

    def shards(self) -> list[Path]:
        return sorted(self.directory.glob("part-*.parquet")) if self.directory.exists() else []

    def check_compatible(self) -> None:
        """Refuse a directory that holds another collection's trajectories (nothing is written)."""
        manifest = self.directory / MANIFEST
        if not manifest.exists():
            if self.shards():
                raise TraceRayError(
                    f"{self.directory} holds Parquet shards but no {MANIFEST}; choose another run_dir "
                    "or delete that folder"
                )
            return
        try:
            existing = json.loads(manifest.read_text())
        except json.JSONDecodeError:
            raise TraceRayError(
                f"{manifest} is not valid JSON; delete {self.directory} or choose another run_dir"
            ) from None
        different = sorted(key for key in set(existing) | set(self.run) if existing.get(key) != self.run.get(key))
        if different:
            shown = ", ".join(f"{key}={existing.get(key)!r} (now {self.run.get(key)!r})" for key in different)
            raise TraceRayError(
                f"{self.directory} holds trajectories of another collection ({shown}); choose another run_dir or "
                "delete that folder"
            )

    def completed(self) -> set[tuple[int, int]]:
        """(seed, sample_index) of every episode already on disk."""
        done: set[tuple[int, int]] = set()
        for shard in self.shards():
            table = pq.read_table(shard, columns=["seed", "sample_index"])
            done.update(zip(table.column("seed").to_pylist(), table.column("sample_index").to_pylist()))
        return done

    def write_shard(self, rows: list[dict[str, Any]]) -> Path:
        """Write rows as one new shard (and the manifest, before the first shard)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if not (self.directory / MANIFEST).exists():
            write_json(self.directory / MANIFEST, self.run)
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        target = self.directory / f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        with atomic_path(target) as scratch:
            pq.write_table(table, scratch)
        return target

    def read(self) -> pa.Table:
        shards = self.shards()
        if not shards:
            return SCHEMA.empty_table()
        return pa.concat_tables([pq.read_table(shard, schema=SCHEMA) for shard in shards])
