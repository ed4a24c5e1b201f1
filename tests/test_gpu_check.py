"""benchmarks/gpu_check.sh runs only where a GPU is lent: what can be checked without one is checked here."""

import shlex
import subprocess
import sys
from pathlib import Path

from trace_ray.config_compose import compose_config

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


def train_overrides() -> list[str]:
    """The overrides of the script's ``trace-ray train`` command (its continued lines joined)."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    [line] = [line for line in text.splitlines() if line.startswith("trace-ray train ")]
    return [word for word in shlex.split(line)[2:] if not word.startswith("run_dir=")]


def test_the_gpu_checks_training_command_composes_to_a_shared_gpu_job():
    config = compose_config("train", train_overrides())
    assert config.engine.name == "vllm" and config.trainer.use_gpu and config.grpo.old_logprobs == "trainer"
    assert config.rollout.worker_gpus + config.trainer.gpus_per_worker * config.trainer.num_workers <= 1  # one GPU


def test_the_scripts_parse_and_the_engine_check_refuses_a_machine_without_a_gpu():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("gpu_engine_check.py"))],
        capture_output=True,
        text=True,
        env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
        cwd=SCRIPT.parents[1],
    )
    assert done.returncode == 2 and "no CUDA GPU here" in done.stdout
