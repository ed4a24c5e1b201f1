"""Greedy option episodes already played, kept so that a later stage does not play them again.

``trace-ray route`` plays every task of its splits greedily with the base
model and with each adapter to label it; ``trace-ray evaluate`` needs the
same episodes of the eval split. Route keeps them in
``run_dir/router/episodes.parquet`` (the rows of ``trajectories/``, plus the
option and its context) and evaluate plays only what that file lacks.

Greedy decoding makes an episode a function of its context: the model, the
engine, the environment's config, the option and its adapter's weights (a
digest of the file). A row is reused only under the same context, so an
adapter trained again, another environment setting or another model plays
afresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from trace_ray.artifacts import atomic_path
from trace_ray.config import EnvConfig, TraceConfig
from trace_ray.rollout_loop import EpisodeResult
from trace_ray.routing.logit_router import BASE
from trace_ray.run_manifest import digest
from trace_ray.trajectory_store import SCHEMA, episode_from_row, episode_row

Played = dict[int, dict[str, EpisodeResult]]  # seed -> option -> its greedy episode
EPISODES = Path("router") / "episodes.parquet"  # in the run directory, written by route
ROW_SCHEMA = SCHEMA.append(pa.field("option", pa.string())).append(pa.field("context", pa.string()))


def option_context(config: TraceConfig, env: EnvConfig, option: str, folder: Path | None) -> str:
    """What a greedy episode of ``option`` (adapter folder ``folder``; None: the base model) on ``env`` depends on."""
    weights = hashlib.sha256((folder / "adapter_model.safetensors").read_bytes()).hexdigest() if folder else None
    return digest(
        [
            dataclasses.asdict(config.model),
            config.engine.name,
            dataclasses.asdict(env),
            option,
            weights,
            config.rollout.max_episode_tokens,
        ]
    )


def option_contexts(config: TraceConfig, env: EnvConfig, adapters: dict[str, Path]) -> dict[str, str]:
    """Option (``base`` and each adapter of ``adapters``: name -> folder) -> :func:`option_context`."""
    return {BASE: option_context(config, env, BASE, None)} | {
        name: option_context(config, env, name, folder) for name, folder in adapters.items()
    }


def load_played(path: Path, contexts: dict[str, str], seeds: list[int]) -> Played:
    """The episodes of ``path`` for ``seeds`` whose option's context is in ``contexts`` (option -> context)."""
    if not path.is_file():
        return {}
    wanted, played = set(seeds), {}
    for row in pq.read_table(path).to_pylist():
        if row["seed"] in wanted and contexts.get(row["option"]) == row["context"]:
            played.setdefault(row["seed"], {})[row["option"]] = episode_from_row(row, f"{row['option']}-{row['seed']}")
    return played


def save_played(path: Path, contexts: dict[str, str], played: Played, run: dict) -> None:
    """Add ``played`` (under each option's context) to ``path``, replacing rows of the same context and seed."""
    rows = [
        dict(episode_row(result, run), option=option, context=contexts[option])
        for results in played.values()
        for option, result in results.items()
    ]
    fresh = {(row["context"], row["seed"]) for row in rows}
    kept = (
        [row for row in pq.read_table(path).to_pylist() if (row["context"], row["seed"]) not in fresh]
        if path.is_file()
        else []
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as scratch:
        pq.write_table(pa.Table.from_pylist(kept + rows, schema=ROW_SCHEMA), scratch)
