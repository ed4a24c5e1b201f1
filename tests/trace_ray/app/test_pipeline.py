"""``trace-ray pipeline``: every stage on the tiny model with a minimal budget, the manifest, skips, resume, bad
inputs."""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.run_dirs import episode_row, played_episode
from trace_ray.app import collect
from trace_ray.app.cli import main
from trace_ray.config_compose import compose_config
from trace_ray.run_manifest import MANIFEST
from trace_ray.run_storage import RunStorage
from trace_ray.trajectory_store import TrajectoryStore

MINIMAL = [
    "model=tiny_random",
    "lora.rank=4",
    "lora.alpha=8",
    "model.sampling.max_new_tokens=6",
    "samples_per_task=2",
    "pipeline.collect_limit=8",
    "pipeline.eval_limit=2",
    "pipeline.max_capabilities=1",
    "labeler.runs=3",
    "selection.k=3",
    "synthesis.self_check_seeds=2",
    "synthesis.accept_out_of_band=true",
    "synthesis.train_without_signal=true",
    "calibration.group_size=2",
    "calibration.num_seeds=2",
    "calibration.max_rounds=1",
    "calibration.pass_at=[1,2]",
    "grpo.iterations=1",
    "grpo.group_size=2",
    "grpo.groups_per_batch=1",
    "grpo.max_resample_batches=0",
    "grpo.mini_batch_size=2",
    "trainer.cpus_per_worker=0.5",
    "router.train_limit=2",
]


def seed_collection(run_dir, overrides=(), env=None):
    """The collect stage's episodes, already on disk: per analysis task of ``env`` (default the device) the oracle's
    (a success) and a do-nothing reply (a failure), since the tiny random model never succeeds and identification needs
    both."""
    from environments.device.environment import DeviceEnvironment

    config = compose_config("pipeline", [*MINIMAL, *overrides])
    env = env or DeviceEnvironment()
    rows = [
        episode_row(config.env.name, seed, sample, *played_episode(env, seed, follow_oracle))
        for seed in env.task_seeds("analysis")[:8]
        for sample, follow_oracle in ((0, True), (1, False))
    ]
    assert {row["success"] for row in rows} == {True, False}
    TrajectoryStore(run_dir, collect.collection_manifest(config, "analysis")).write_shard(rows)


def stages_of(run_dir):
    return json.loads((run_dir / MANIFEST).read_text())["stages"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, ray_session):
    """One pipeline run of every stage (shared: it is the slow part)."""
    run_dir = tmp_path_factory.mktemp("pipeline")
    seed_collection(run_dir)
    assert main(["pipeline", f"run_dir={run_dir}", *MINIMAL]) == 0
    return run_dir


def test_every_stage_runs_once_and_a_rerun_skips_them_all(finished_run, capsys):
    run_dir = finished_run
    stages = stages_of(run_dir)
    assert sorted(stages) == sorted(["collect", "identify", "synthesize", "train", "baseline", "route", "evaluate"])
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    for entry in stages.values():
        assert (
            entry["status"] == "done"
            and entry["versions"]["torch"]
            and entry["started"] <= entry["ended"]
            and entry["outputs"]
        )
        assert entry["commit"].removesuffix("+dirty") == head  # the code that ran
    assert (
        stages["train"]["config"]["grpo"]["iterations"] == 1
        and stages["collect"]["config"]["pipeline.collect_limit"] == 8
    )
    [trained] = [p.name for p in (run_dir / "adapters").iterdir() if p.name != "grpo_on_target"]  # max_capabilities=1
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    methods = {row["method"]: row for row in report["methods"]}
    assert {
        "base",
        f"adapter:{trained}",
        "TRACE (logit)",
        "oracle router",
        "GRPO on target",
        "prompt injection",
    } <= set(methods)
    # the same training budget
    assert methods["GRPO on target"]["rollouts"] == methods["TRACE (logit)"]["rollouts"] == 2
    # capped at it, resampling included; the run's config stays as composed
    assert stages["baseline"]["arguments"]["grpo"]["max_rollouts"] == 2
    assert stages["baseline"]["config"]["grpo"]["max_rollouts"] is None
    assert stages["collect"]["arguments"] == {"split": "analysis", "limit": 8}
    assert report["tasks"] == 2
    capsys.readouterr()
    before = (run_dir / MANIFEST).read_text()
    assert main(["pipeline", f"run_dir={run_dir}", *MINIMAL]) == 0
    rerun = capsys.readouterr().out
    assert rerun.count("up to date, skipped") == 7 and (run_dir / MANIFEST).read_text() == before
    assert "tiny_random on device/eval: 2 tasks, greedy" in rerun and "TRACE (logit)" in rerun  # the result, again
    assert str(run_dir / "eval" / "report.md") in rerun.replace("\n", "")
    # a downstream setting reruns only what depends on it
    assert main(["pipeline", f"run_dir={run_dir}", *MINIMAL, "evaluate.confidence=0.9"]) == 0
    after = stages_of(run_dir)
    assert [name for name in after if after[name]["started"] != json.loads(before)["stages"][name]["started"]] == [
        "evaluate"
    ]


def test_an_interrupted_training_stage_resumes_from_its_checkpoint(finished_run, tmp_path):
    import pyarrow.parquet as pq

    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    # as if a run with grpo.iterations=2 had been killed after its first iteration's checkpoint
    manifest = json.loads((run_dir / MANIFEST).read_text())
    manifest["stages"]["train"]["status"] = "running"
    (run_dir / MANIFEST).write_text(json.dumps(manifest))
    assert main(["pipeline", f"run_dir={run_dir}", *MINIMAL, "grpo.iterations=2", "pipeline.stages=[train]"]) == 0
    [name] = [p.name for p in (run_dir / "adapters").iterdir() if p.name != "grpo_on_target"]
    history = pq.read_table(run_dir / "adapters" / name / "metrics.parquet").to_pylist()
    assert [row["iteration"] for row in history] == [1, 2]  # iteration 1 from the checkpoint, 2 run now
    assert (
        history[0]["started_at"]
        == pq.read_table(finished_run / "adapters" / name / "metrics.parquet").to_pylist()[0]["started_at"]
    )
    assert stages_of(run_dir)["train"]["status"] == "done"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model=smollm2_135m"], "was produced with model=tiny_random, not model=smollm2_135m"),
        (["pipeline.stages=[route]"], "stage route needs baseline done first"),
        (["pipeline.stages=[deploy]"], "pipeline.stages names ['deploy']"),
        (
            ["pipeline.storage_path=nope://bucket/run"],
            "pipeline.storage_path=nope://bucket/run cannot be opened (Unrecognized filesystem",
        ),
    ],
)
def test_bad_inputs_are_one_line_errors_and_overwrite_nothing(tmp_path, capsys, overrides, message):
    (tmp_path / MANIFEST).write_text(json.dumps({"model": "tiny_random", "env": "device", "stages": {}}))
    before = (tmp_path / MANIFEST).read_text()
    assert main(["pipeline", f"run_dir={tmp_path}", *MINIMAL, *overrides]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert (tmp_path / MANIFEST).read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST]


def test_a_stored_run_is_pulled_into_an_empty_run_dir_and_each_rerun_stage_is_pushed(finished_run, tmp_path, capsys):
    store = tmp_path / "store"
    storage = RunStorage(f"file://{store}", finished_run)
    assert storage.push() > 0 and storage.push() == 0  # a second push has nothing new to copy
    fresh, uri = tmp_path / "fresh", f"pipeline.storage_path=file://{store}"
    capsys.readouterr()
    # e.g. another machine picks the run up (evaluate left out: another test reruns it with other settings)
    upstream = "pipeline.stages=[collect,identify,synthesize,train,baseline,route]"
    assert main(["pipeline", f"run_dir={fresh}", *MINIMAL, uri, upstream]) == 0
    out = capsys.readouterr().out
    assert "pulled the stored run" in out and out.count("up to date, skipped") == 6
    assert (fresh / "router" / "summary.json").read_bytes() == (finished_run / "router" / "summary.json").read_bytes()
    before = stages_of(store)["evaluate"]
    assert main(["pipeline", f"run_dir={fresh}", *MINIMAL, uri, "evaluate.confidence=0.8"]) == 0
    assert (store / MANIFEST).read_text() == (fresh / MANIFEST).read_text()
    assert stages_of(store)["evaluate"]["started"] != before["started"]
    assert (store / "eval" / "report.json").read_bytes() == (fresh / "eval" / "report.json").read_bytes()


def test_an_unreachable_cluster_is_a_one_line_error(tmp_path):
    command = [
        sys.executable,
        "-m",
        "trace_ray.app.cli",
        "pipeline",
        f"run_dir={tmp_path}",
        *MINIMAL,
        "ray.address=127.0.0.1:1",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)  # a fresh process: no Ray running yet
    assert done.returncode == 1
    assert "cannot reach a Ray cluster at 127.0.0.1:1" in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "trajectories").exists()


def test_a_sweep_runs_each_combination_in_its_own_directory_and_reuses_shared_stages(tmp_path, capsys):
    stages = "pipeline.stages=[collect,identify]"
    # the first combination's collection (the tiny model never succeeds)
    seed_collection(tmp_path / "selection.rho-0.05")
    assert main(["pipeline", "-m", f"run_dir={tmp_path}", *MINIMAL, stages, "selection.rho=0.05,0.5"]) == 0
    first, second = stages_of(tmp_path / "selection.rho-0.05"), stages_of(tmp_path / "selection.rho-0.5")
    assert "reused_from" not in first["collect"] and second["collect"]["reused_from"] == str(
        tmp_path / "selection.rho-0.05"
    )
    assert second["collect"]["outputs"] == first["collect"]["outputs"]  # the same trajectories, copied
    assert "reused_from" not in second["identify"] and second["identify"]["config"]["selection"]["rho"] == 0.5
    selected = [
        json.loads((tmp_path / name / "capabilities" / "selected.json").read_text())
        for name in ("selection.rho-0.05", "selection.rho-0.5")
    ]
    assert len(selected[1]) < len(selected[0])  # a higher coverage threshold keeps fewer capabilities
    summary = (tmp_path / "sweep_summary.md").read_text()
    assert "| selection.rho-0.05 |" in summary and "| selection.rho-0.5 |" in summary


@pytest.mark.slow
def test_a_lora_rank_sweep_sharing_one_checkpoint_store_trains_each_rank_and_a_rerun_skips(
    finished_run, tmp_path, capsys
):
    """One trainer.storage_path for every combination (as the cluster preset sets it): each rank's training is a Ray
    Train run of its own (the second used to resume the first one's checkpoint and fail on its shapes)."""
    unranked = [override for override in MINIMAL if not override.startswith("lora.rank=")]
    for rank in (8, 16):
        shutil.copytree(finished_run, tmp_path / f"lora.rank-{rank}")  # every stage before train done
    sweep = [
        "pipeline",
        "-m",
        f"run_dir={tmp_path}",
        *unranked,
        "lora.rank=8,16",
        f"trainer.storage_path={tmp_path / 'checkpoints'}",
        "pipeline.stages=[train]",
    ]
    assert main(sweep) == 0
    for rank in (8, 16):
        adapters = tmp_path / f"lora.rank-{rank}" / "adapters"
        [name] = [p.name for p in adapters.iterdir() if p.name != "grpo_on_target"]
        assert json.loads((adapters / name / "adapter_config.json").read_text())["r"] == rank
    assert len(list((tmp_path / "checkpoints").iterdir())) == 2
    capsys.readouterr()
    assert main(sweep) == 0
    assert capsys.readouterr().out.count("train: up to date, skipped") == 2


def test_grpo_on_the_target_is_matched_to_the_rollouts_of_the_adapters_trace_routes(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trace_ray.app.pipeline import matched_grpo

    entries = [
        {"name": name, "status": "OUT_OF_BAND", "environment": f"synthetic/{name}"}
        for name in ("kept", "stale", "untrained")
    ]
    (tmp_path / "capabilities").mkdir()
    (tmp_path / "capabilities" / "selected.json").write_text(json.dumps(entries))
    # stale: an earlier attempt's log only
    for name, rollouts, exported in (("kept", [32, 16], True), ("stale", [48], False)):
        folder = tmp_path / "adapters" / name
        folder.mkdir(parents=True)
        pq.write_table(
            pa.table({"iteration": list(range(1, len(rollouts) + 1)), "rollouts": rollouts}), folder / "metrics.parquet"
        )
        if exported:
            (folder / "adapter_model.safetensors").write_bytes(b"weights")
    config = compose_config("pipeline", MINIMAL)  # a batch of 2 x 1 rollouts
    matched = matched_grpo(config, tmp_path)
    assert (matched.iterations, matched.max_rollouts) == (24, 48)
    assert dataclasses.replace(matched, iterations=None, max_rollouts=None) == dataclasses.replace(
        config.grpo, iterations=None, max_rollouts=None
    )  # the rest of GRPO as configured


def test_a_larger_eval_split_leaves_collection_up_to_date_and_makes_route_and_evaluate_stale(tmp_path):
    from trace_ray.app.pipeline import STAGES, fingerprint
    from trace_ray.run_manifest import RunManifest

    manifest = RunManifest(tmp_path, {"model": "tiny_random", "env": "device"})
    base = compose_config("pipeline", [f"run_dir={tmp_path}", "model=tiny_random"])
    larger = compose_config("pipeline", [f"run_dir={tmp_path}", "model=tiny_random", "env.eval_size=256"])
    analysis = compose_config("pipeline", [f"run_dir={tmp_path}", "model=tiny_random", "env.analysis_size=128"])
    changed = {
        stage.name for stage in STAGES if fingerprint(larger, stage, manifest) != fingerprint(base, stage, manifest)
    }
    assert changed == {"route", "evaluate"}
    collect = STAGES[0]
    # a larger analysis split: collect again
    assert fingerprint(analysis, collect, manifest) != fingerprint(base, collect, manifest)
    assert "eval_size" not in collect.values(larger)["env"] and collect.values(larger)["env"]["analysis_size"] is None
