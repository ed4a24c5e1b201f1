"""What evaluation played, kept for reading: every method's greedy episodes, and where a method beats the base.

A gain is only worth reporting when the transcripts show the task solved, not
the reward farmed. ``evaluate`` writes ``eval/episodes.parquet`` (one row per
method and task: the messages, the reward and the grader's milestones) and
``eval/transcripts.md``: for each method, the tasks where it scored above the
base model, the two conversations side by side in brief (the agent's tool
calls and replies, the milestones each met).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from trace_ray.artifacts import atomic_path
from trace_ray.rollout_loop import EpisodeResult
from trace_ray.trajectory_store import SCHEMA, episode_row

TEXT_LIMIT = 300  # characters of each message shown in transcripts.md


def write_episodes(path: Path, episodes: dict[str, list[EpisodeResult]], run: dict[str, Any]) -> None:
    """``episodes``: method -> its episodes; one Parquet row each, with the method's name."""
    schema = SCHEMA.append(pa.field("method", pa.string()))
    rows = [dict(episode_row(result, run), method=method) for method, results in episodes.items() for result in results]
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as scratch:
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), scratch)


def write_predictions(folder: Path, episodes: dict[str, list[EpisodeResult]], model: str) -> list[Path]:
    """SWE-bench prediction files, ``folder/<method>.jsonl`` (``instance_id``, ``model_name_or_path``,
    ``model_patch``), for every method whose episodes carry a ``model_patch`` (code-repair targets); the official
    harness grades them."""
    written = []
    for method, results in episodes.items():
        rows = [
            {
                "instance_id": result.info["instance_id"],
                "model_name_or_path": f"{model}/{method}",
                "model_patch": result.info["model_patch"],
            }
            for result in results
            if "model_patch" in result.info
        ]
        if not rows:
            continue
        path = folder / f"{''.join(c if c.isalnum() else '_' for c in method).strip('_')}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as scratch:
            Path(scratch).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        written.append(path)
    return written


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 3] + "..."


def agent_turns(result: EpisodeResult) -> list[str]:
    """The agent's side of an episode, one line per action: tool calls with their arguments, then replies."""
    lines = []
    for message in result.messages:
        if message["role"] != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call["function"]
            arguments = function.get("arguments")
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            lines.append(f"call `{function['name']}` {_short(arguments)}")
        if message.get("content"):
            lines.append(f"says: {_short(message['content'])}")
    return lines or ["(nothing)"]


def request(result: EpisodeResult) -> str:
    return next((_short(m["content"]) for m in result.messages if m["role"] == "user"), "")


def milestones(result: EpisodeResult) -> str:
    """The grader's milestones as ``met k/n: names``; the grader's other figures where it keeps no milestone list."""
    listed = result.info.get("milestones") if isinstance(result.info, dict) else None
    if not isinstance(listed, list) or not all(isinstance(m, dict) and "name" in m for m in listed):
        return _short(json.dumps(result.info, ensure_ascii=False, default=str))
    met = [m["name"] for m in listed if m.get("reached")]
    return f"met {len(met)}/{len(listed)}" + (f": {', '.join(met)}" if met else "")


def wins_markdown(base: list[EpisodeResult], methods: dict[str, list[EpisodeResult]]) -> str:
    """For each method, the tasks (in order) where it scored above ``base``, both transcripts in brief."""
    lines = ["# Where each method beats the base model", ""]
    for name, results in methods.items():
        wins = [(b, r) for b, r in zip(base, results) if r.reward > b.reward]
        lines += [f"## {name}: {len(wins)} of {len(results)} tasks above base", ""]
        for b, r in wins:
            lines += [
                f"### {r.task_id} ({r.family}): base {b.reward:.3f} -> {r.reward:.3f}",
                "",
                f"Request: {request(r)}",
                "",
            ]
            for label, result in (("base", b), (name, r)):
                lines += [
                    f"**{label}** ({result.termination}, {result.turns} turns; milestones: {milestones(result)})",
                    "",
                ]
                lines += [f"- {line}" for line in agent_turns(result)] + [""]
    return "\n".join(lines)


def write_wins(path: Path, base: list[EpisodeResult], methods: dict[str, list[EpisodeResult]]) -> None:
    with atomic_path(path) as scratch:
        Path(scratch).write_text(wins_markdown(base, methods), encoding="utf-8")
