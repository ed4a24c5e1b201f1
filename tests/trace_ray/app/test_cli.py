import json
import re
import subprocess
import sys

import pytest

from environments.errors import TraceRayError
from trace_ray.app.cli import main
from trace_ray.config import TraceConfig
from trace_ray.config_compose import compose_config, sweep_jobs


def test_default_config_is_typed_and_points_at_the_embedded_model():
    config = compose_config("score", [])
    assert isinstance(config, TraceConfig)
    assert (config.model.name, config.env.name, config.split, config.env.max_turns) == (
        "smollm2_135m",
        "device",
        "eval",
        50,
    )
    assert config.model.sampling.temperature == 0.7 and config.env.success_threshold == 1.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["env=nope"], "unknown env 'nope'; choose one of: code_repair, device"),
        (["model=gpt5"], "unknown model 'gpt5'; choose one of:"),
        (["nokey=1"], "unknown config key 'nokey'"),
        (["split=="], "malformed override 'split=='"),
        (["split=test"], "split='test' is not one of analysis, eval"),
        (["batch_size=lots"], "invalid configuration (key batch_size)"),
        (["batch_size=0"], "batch_size must be > 0"),
        (["limit=-3"], "limit must be a positive number"),
        (["check_workers=0"], "check_workers must be >= 1 or null"),
        (["model.sampling.top_p=1.5"], "model.sampling.top_p must be in (0, 1]"),
        (["model.sampling.temperature=-1"], "model.sampling.temperature must be >= 0"),
        (["model.dtype=int8"], "model.dtype='int8' is not one of"),
        (["env.max_turns=0"], "env.max_turns must be >= 1"),
        (["rollout.max_episode_tokens=0"], "rollout.max_episode_tokens must be >= 1 or null"),
        (
            ["engine=vllm", "model=tiny_random"],
            "engine=vllm loads weights from a folder and model=tiny_random has none; use engine=hf",
        ),
        (["engine=vllm_cpu", "engine.memory_fraction=0"], "engine.memory_fraction must be in (0, 1]"),
        (["engine.max_batch_rows=0"], "engine.max_batch_rows must be >= 1"),
        (["labeler=llm"], "labeler=llm needs labeler.base_url=http://HOST:PORT/v1 and labeler.model=NAME"),
        (["labeler.runs=0"], "labeler.runs must be >= 1"),
        (["selection.undefined_rate=maybe"], "undefined_rate must be 'zero' or 'fail'"),
        (["env.success_threshold=0"], "env.success_threshold must be in (0, 1]"),
        (["env.eval_size=0"], "env.eval_size must be 1 to 100000 tasks, got 0"),
        (
            ["env=code_repair", "+env.eval_size=256"],
            "env.eval_size sizes the device target's splits only, not env=code_repair; drop it",
        ),
        (["router=auto", "router.auto.folds=1"], "router.auto.folds must be >= 2, got 1"),
        (["router.auto.ridge=0"], "router.auto.ridge must be > 0, got 0"),
        (["model=local"], "model.source=path needs model.path="),
        (["split=eval,analysis"], "add -m to sweep"),
        (["grpo.max_rollouts=3"], "grpo.max_rollouts=3 is below one batch (group_size x groups_per_batch = 64)"),
        (
            ["grpo.iterations=8", "grpo.max_iterations=4"],
            "grpo.max_iterations=4 is below grpo.iterations=8; raise it or set null",
        ),
        (["trainer.collective_timeout_s=0"], "trainer.collective_timeout_s must be > 0 seconds, got 0"),
        (["trainer.strategy=zero3"], "trainer.strategy='zero3' is not one of ddp, fsdp"),
        (["ray.placement_timeout_s=0"], "ray.placement_timeout_s must be > 0 seconds or null, got 0"),
        (["grpo.old_logprobs=vllm"], "grpo.old_logprobs='vllm' is not one of engine, trainer"),
        (["synthesis.stop_after=0"], "synthesis.stop_after must be >= 1 or null, got 0"),
        (["calibration.start=hardest"], "calibration.start must be default or easiest, got 'hardest'"),
        (
            ["trainer.gpus_per_worker=1.5"],
            "trainer.gpus_per_worker must be a share of one GPU (0 < x <= 1) or a whole number, got 1.5",
        ),
        (
            ["engine=vllm", "engine.tensor_parallel_size=2", "rollout.worker_gpus=1"],
            "rollout.worker_gpus=1 does not match engine.tensor_parallel_size=2: each rollout worker runs one vLLM "
            "engine "
            "on tensor_parallel_size GPUs; set rollout.worker_gpus=2",
        ),
        (["engine=vllm", "engine.tensor_parallel_size=2", "rollout.worker_gpus=4"], "set rollout.worker_gpus=2"),
        (["engine=vllm", "engine.tensor_parallel_size=2", "rollout.worker_gpus=0.5"], "set rollout.worker_gpus=2"),
    ],
)
def test_bad_config_is_one_clear_error(overrides, message):
    with pytest.raises(TraceRayError) as caught:
        compose_config("score", overrides)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["engine=vllm_cpu", "lora.rank=65"],
            "lora.rank=65 exceeds engine.max_lora_rank=64, the largest adapter vLLM loads; set engine.max_lora_rank=65 "
            "or "
            "lower lora.rank",
        ),
        (["cluster=a100_multinode", "engine.max_lora_rank=8"], "lora.rank=16 exceeds engine.max_lora_rank=8"),
    ],
)
def test_training_a_rank_the_vllm_engine_cannot_load_is_refused_before_it_starts(overrides, message):
    for command in ("train", "pipeline"):
        with pytest.raises(TraceRayError, match=re.escape(message)):
            compose_config(command, overrides)
    compose_config("collect", overrides)  # it trains nothing: the engine's limit does not matter there


@pytest.mark.parametrize(
    "overrides",
    [
        ["engine=vllm", "engine.tensor_parallel_size=2", "rollout.worker_gpus=2"],  # one engine on the worker's 2 GPUs
        ["engine=vllm", "rollout.worker_gpus=0.5"],  # two single-GPU engines share a GPU
        ["engine=vllm_cpu", "lora.rank=64"],  # vllm-cpu: no GPU; the largest rank the engine takes
        ["engine=hf", "lora.rank=128", "rollout.worker_gpus=1"],  # the HF engine has neither limit
    ],
)
def test_vllm_settings_that_fit_are_accepted(overrides):
    compose_config("train", overrides)


def test_the_qwen3_30b_preset_shards_training_and_spans_two_gpus_per_engine_on_the_a100_cluster():
    config = compose_config("train", ["model=qwen3_30b_a3b", "cluster=a100_qwen3_30b_a3b"])
    assert (config.trainer.strategy, config.trainer.concurrent_jobs, config.trainer.use_gpu) == ("fsdp", 1, True)
    assert (config.engine.name, config.engine.tensor_parallel_size, config.rollout.worker_gpus) == ("vllm", 2, 2)
    assert config.ray.address == "auto" and config.trainer.gradient_checkpointing  # the rest from a100_multinode
    assert compose_config("train", ["cluster=a100_multinode"]).trainer.strategy == "ddp"


def test_multirun_expands_sweeps_like_hydra():
    jobs = sweep_jobs(["split=analysis,eval", "model=tiny_random", "limit=range(1,3)"])
    assert sorted(jobs) == sorted(
        [
            [f"split={split}", "model=tiny_random", f"limit={limit}"]
            for split in ("analysis", "eval")
            for limit in (1, 2)
        ]
    )


def test_help_lists_commands_and_groups(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert (
        "check-env" in out
        and "score" in out
        and "model: local, qwen3_30b_a3b, qwen3_8b, smollm2_135m, tiny_random" in out
    )


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (["deploy"], 2, "unknown command 'deploy'; choose one of: check-env, score"),
        (["score", "--fast"], 1, "unknown flag --fast"),
        (["score", "env=nope"], 1, "unknown env 'nope'"),
    ],
)
def test_bad_command_lines_exit_non_zero_with_one_line(capsys, argv, status, message):
    assert main(argv) == status
    err = capsys.readouterr().err
    assert err.startswith("trace-ray: error: ") and message in err and err.count("\n") == 1


def test_cfg_prints_the_composed_config(capsys):
    assert main(["score", "--cfg", "model=tiny_random", "env.max_turns=7"]) == 0
    out = capsys.readouterr().out
    assert "name: tiny_random" in out and "max_turns: 7" in out


def test_check_env_command_passes_on_device(capsys):
    assert main(["check-env", "env=device", "check_workers=2"]) == 0
    out = capsys.readouterr().out
    assert "128 tasks per agent, 2 episode(s) at a time" in out
    # each check printed as it is decided, then all of them in the table
    assert out.count("PASS") == 20 and "all 10 self-checks passed" in out
    assert out.index("PASS  oracle scores 1.0: 128/128 tasks") < out.index("self-checks of env=device (128")
    assert "dump agent scores < 1.0, mean <= 0.05" in out and "spray agent scores < 1.0, mean <= 0.05" in out
    assert "(128 benchmark tasks)" in out.replace("\n", " ")
    assert main(
        ["check-env", "env=device", "limit=5"]
    ) == 0 and "(5 benchmark tasks)" in capsys.readouterr().out.replace("\n", " ")


def test_score_with_tiny_model_writes_report_and_table(tmp_path, capsys):
    argv = [
        "score",
        "model=tiny_random",
        "split=analysis",
        "limit=7",
        "batch_size=4",
        "model.sampling.max_new_tokens=8",
        f"run_dir={tmp_path}",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "overall" in out and "mean similarity" in out
    report = json.loads((tmp_path / "score" / "device-tiny_random-analysis.json").read_text())
    assert [episode["seed"] for episode in report["episodes"]] == list(range(7))
    overall = report["metrics"][-1]
    assert overall["group"] == "overall" and overall["episodes"] == 7
    assert overall["mean_similarity"] == pytest.approx(sum(e["reward"] for e in report["episodes"]) / 7)


def test_multirun_runs_every_job(tmp_path, capsys):
    argv = [
        "score",
        "-m",
        "model=tiny_random",
        "split=analysis,eval",
        "limit=1",
        "model.sampling.max_new_tokens=4",
        f"run_dir={tmp_path}",
    ]
    assert main(argv) == 0
    assert "job 2/2" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "score").iterdir()) == [
        "device-tiny_random-analysis.json",
        "device-tiny_random-eval.json",
    ]


def test_installed_entry_point_runs():
    done = subprocess.run(
        [sys.executable, "-m", "trace_ray.app.cli", "score", "env=missing"], capture_output=True, text=True
    )
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        == "trace-ray: error: unknown env 'missing'; choose one of: code_repair, device, swebench, synthetic, "
        "tau2_airline, tau2_retail (env=NAME)"
    )


def test_vllm_engine_without_vllm_installed_is_one_clear_error(monkeypatch):
    import importlib.util

    from trace_ray.engines import make_engine

    config = compose_config("score", ["engine=vllm_cpu"])
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    with pytest.raises(TraceRayError) as caught:
        make_engine(config.model, config.engine)
    assert "engine=vllm needs vLLM, which is not installed; run: pip install 'trace-ray[vllm]'" in str(caught.value)
    assert "\n" not in str(caught.value)
