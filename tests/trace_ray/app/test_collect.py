"""``trace-ray collect`` on real Ray actors with the tiny model: Parquet, resume, failures, bad input."""

import json
import subprocess
import sys

import pyarrow.parquet as pq

from actors.rollout_pool import RayRolloutBackend, start_pool, wait_until_alive
from environments.self_checks import play_recorded
from trace_ray.agent_prompt import AgentPrompt
from trace_ray.app.cli import main
from trace_ray.app.collect import collection_manifest
from trace_ray.config_compose import compose_config
from trace_ray.engines import SamplingParams
from trace_ray.environment_setup import environment_maker
from trace_ray.models import load_tokenizer
from trace_ray.rollout_loop import EpisodeTask, run_rollouts
from trace_ray.trajectory_store import SCHEMA, TrajectoryStore

TINY = ["model=tiny_random", "model.sampling.max_new_tokens=12", "split=analysis"]


def collect(tmp_path, *overrides):
    return main(["collect", *TINY, f"run_dir={tmp_path}", *overrides])


def test_collect_writes_a_parquet_dataset_with_the_documented_schema(ray_session, tmp_path, capsys):
    assert collect(tmp_path, "limit=3", "samples_per_task=2", "rollout.shard_size=4") == 0
    assert "overall" in capsys.readouterr().out
    store = TrajectoryStore(tmp_path, {})
    assert len(store.shards()) == 2  # 6 episodes in shards of at most 4
    assert all(shard.stat().st_mode & 0o777 == 0o644 for shard in store.shards())
    assert not list(store.directory.glob("*.tmp"))
    table = pq.read_table(store.directory)
    assert table.schema.equals(SCHEMA) and len(table) == 6
    rows = table.to_pylist()
    assert sorted((r["seed"], r["sample_index"]) for r in rows) == [(s, k) for s in range(3) for k in range(2)]
    for row in rows:
        assert len(row["token_ids"]) == len(row["action_mask"]) == len(row["logprobs"])
        assert sum(row["action_mask"]) == row["generated_tokens"] > 0
        assert all(lp <= 0 for lp, m in zip(row["logprobs"], row["action_mask"]) if m)
        messages = json.loads(row["messages"])
        assert messages[0]["role"] == "system" and sum(m["role"] == "assistant" for m in messages) == row["turns"]
        assert row["env"] == "device" and row["model"] == "tiny_random" and row["split"] == "analysis"
        assert row["task_id"] == f"device-{row['seed']}" and row["adapter_name"] is None
        assert row["turn_adapter_versions"] == [None] * row["turns"]  # every turn by the base model
        # 12 sampled tokens of the random model hold no tool call: it replies at once and the environment ends the
        # episode; the recorded reply, replayed alone in a fresh environment, scores the reward recorded
        assert row["termination"] == "agent_reply" and row["turns"] == 1
        replies = iter([message for message in messages if message["role"] == "assistant"])
        _, _, last = play_recorded(
            environment_maker(compose_config("collect", TINY).env)(),
            row["seed"],
            lambda _, replies=replies: next(replies),
        )
        assert last.done and row["reward"] == last.reward and row["success"] == last.info["success"]
    manifest = json.loads((store.directory / "_manifest.json").read_text())
    assert manifest["samples_per_task"] == 2 and manifest["temperature"] == 1.0


def test_resume_after_interruption_has_no_duplicates_and_no_gaps(ray_session, tmp_path, monkeypatch):
    writes = []
    original = TrajectoryStore.write_shard

    def interrupted_after_two_shards(self, rows):
        if len(writes) == 2:
            raise KeyboardInterrupt
        writes.append(len(rows))
        return original(self, rows)

    monkeypatch.setattr(TrajectoryStore, "write_shard", interrupted_after_two_shards)
    assert collect(tmp_path, "limit=4", "samples_per_task=2", "rollout.shard_size=2") == 130
    monkeypatch.setattr(TrajectoryStore, "write_shard", original)
    assert len(TrajectoryStore(tmp_path, {}).read()) == 4
    assert collect(tmp_path, "limit=4", "samples_per_task=2", "rollout.shard_size=2") == 0
    table = TrajectoryStore(tmp_path, {}).read()
    keys = sorted(zip(table.column("seed").to_pylist(), table.column("sample_index").to_pylist()))
    assert keys == [(s, k) for s in range(4) for k in range(2)]


def test_run_dir_of_another_collection_is_refused_and_left_untouched(ray_session, tmp_path, capsys):
    assert collect(tmp_path, "limit=1", "samples_per_task=1") == 0
    before = {p: p.read_bytes() for p in (tmp_path / "trajectories").iterdir()}
    capsys.readouterr()
    assert collect(tmp_path, "limit=1", "samples_per_task=1", "temperature=0.5") == 1
    err = capsys.readouterr().err
    assert "holds trajectories of another collection (temperature=1.0 (now 0.5))" in err and err.count("\n") == 1
    assert {p: p.read_bytes() for p in (tmp_path / "trajectories").iterdir()} == before


def test_killed_actors_lose_no_episode_and_duplicate_none(ray_session):
    import ray

    config = compose_config("collect", TINY + ["rollout.num_env_actors=2"])
    pool = start_pool(config)
    pids = ray.get([actor.ping.remote() for actor in pool.env_actors])
    tokenizer = load_tokenizer(config.model)
    tasks = [EpisodeTask(f"device-{seed}#0", seed) for seed in range(8)]
    finished = []

    def kill_once(result):
        finished.append(result.key)
        if len(finished) == 2:
            ray.kill(pool.env_actors[0], no_restart=False)  # its live episodes are lost with it
            ray.kill(pool.workers[0], no_restart=False)  # the next generate call is retried on the restarted worker

    params = SamplingParams(1.0, 1.0, 12, seed=0)
    results = run_rollouts(tasks, RayRolloutBackend(pool), AgentPrompt(tokenizer), params, 8, 8192, kill_once)
    assert sorted(finished) == sorted(task.key for task in tasks)
    assert [r.key for r in results] == [t.key for t in tasks]
    wait_until_alive(pool.env_actors[0])
    assert ray.get(pool.env_actors[0].ping.remote()) != pids[0]  # restarted
    assert ray.get(pool.workers[0].health.remote())["model"] == "tiny_random"


def test_collection_manifest_names_what_the_trajectories_are():
    config = compose_config("collect", TINY + ["temperature=0.3"])
    manifest = collection_manifest(config, "analysis")
    assert (manifest["env"], manifest["split"], manifest["model"], manifest["temperature"]) == (
        "device",
        "analysis",
        "tiny_random",
        0.3,
    )


def test_unreachable_ray_address_is_one_clear_error(tmp_path):
    command = [
        sys.executable,
        "-m",
        "trace_ray.app.cli",
        "collect",
        *TINY,
        "limit=1",
        "ray.address=127.0.0.1:9",
        f"run_dir={tmp_path}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert (
        done.stderr.strip().splitlines()[-1].startswith("trace-ray: error: cannot reach a Ray cluster at 127.0.0.1:9")
    )
    assert not (tmp_path / "trajectories").exists()
