"""A job's demand is checked against the cluster before anything waits; what cannot be placed is one line."""

import json
import subprocess
import sys

import pytest

from environments.errors import TraceRayError
from trace_ray import resources
from trace_ray.config_compose import compose_config
from trace_ray.resources import Role, check_rollout_pool, fit_training, unplaced, wait_ready

TWO_CORES = [{"CPU": 2.0}]


def config(*overrides):
    return compose_config("train", ["model=tiny_random", *overrides])


def test_two_train_workers_on_two_cores_get_a_smaller_cpu_share_instead_of_waiting_forever():
    two_workers = config("trainer.num_workers=2")  # 2 x 0.5 + rollout worker 1 + environment actor 0.1 = 2.1 CPUs
    assert unplaced(resources.training_roles(two_workers), TWO_CORES).name == "environment actor"
    fitted = fit_training(two_workers, TWO_CORES)
    assert fitted.trainer.cpus_per_worker == 0.25 and unplaced(resources.training_roles(fitted), TWO_CORES) is None
    assert fitted.rollout == two_workers.rollout and fitted.trainer.num_workers == 2
    one_worker = config()
    assert fit_training(one_worker, TWO_CORES) == one_worker  # 1.6 CPUs fit as they are


def test_a_gpu_demand_the_cluster_lacks_fails_at_once_naming_the_demand_and_the_cluster():
    gpu_job = config("trainer.num_workers=2", "trainer.use_gpu=true", "rollout.worker_gpus=1")
    with pytest.raises(TraceRayError) as caught:
        fit_training(gpu_job, [{"CPU": 16.0, "GPU": 2.0}])
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "the training job cannot be placed: it needs 2 Ray Train worker x 0.5 CPU + 1 GPU "
        "(trainer.num_workers), "
        "1 rollout worker x 1 CPU + 1 GPU (rollout.num_workers), 1 environment actor x 0.1 CPU"
    )
    assert "the cluster has 16 CPUs and 2 GPUs on 1 node" in message and "lower" in message
    assert fit_training(gpu_job, [{"CPU": 16.0, "GPU": 3.0}]).trainer.cpus_per_worker == 0.5


def test_placement_is_per_node_not_the_cluster_total():
    tensor_parallel = [Role("rollout worker", 1, 1.0, 2.0, "rollout.num_workers")]
    assert unplaced(tensor_parallel, [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}]) == tensor_parallel[0]
    assert unplaced(tensor_parallel, [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 2.0}]) is None
    # largest first: the 2-GPU worker takes the 2-GPU node before a 1-GPU worker could split it
    mixed = [Role("small", 1, 1.0, 1.0, "a"), Role("large", 1, 1.0, 2.0, "b")]
    assert unplaced(mixed, [{"CPU": 8.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 1.0}]) is None


def test_a_rollout_pool_that_cannot_be_placed_is_one_line():
    with pytest.raises(
        TraceRayError,
        match=r"^the rollout pool cannot be placed: it needs 3 rollout worker x 1 CPU "
        r"\(rollout.num_workers\)",
    ):
        check_rollout_pool(config("rollout.num_workers=3"), TWO_CORES)
    check_rollout_pool(config("rollout.num_workers=1"), TWO_CORES)


class Idle:
    def ping(self):
        return "up"


def test_actors_that_never_come_up_are_reported_then_given_up_on(ray_session, monkeypatch, capsys):
    monkeypatch.setattr(resources, "REPORT_EVERY_S", 0.5)
    up = ray_session.remote(num_cpus=0)(Idle).remote()
    stuck = ray_session.remote(num_cpus=64)(Idle).remote()  # the session's Ray has 4 CPUs: it stays pending
    role = Role("rollout worker", 1, 64.0, 0.0, "rollout.num_workers")
    # a worker process can take several seconds to start on a loaded 2-core machine
    assert wait_ready([up.ping.remote()], "rollout workers", [role], timeout_s=60) == ["up"]
    with pytest.raises(TraceRayError) as caught:
        wait_ready([up.ping.remote(), stuck.ping.remote()], "rollout workers", [role], timeout_s=2)
    message = str(caught.value)
    assert message.startswith(
        "1 of 2 rollout workers not up after 2 s (loading, or waiting for 1 rollout worker x 64 CPU"
    )
    assert "free now:" in message and message.endswith(
        "gave up after ray.placement_timeout_s=2 (ray status shows pending demands)"
    )
    assert capsys.readouterr().out.count("1 of 2 rollout workers not up after") >= 2  # reported while it waited
    ray_session.kill(stuck)


@pytest.mark.slow
def test_two_train_workers_train_on_a_two_core_ray(tmp_path):
    """The command that used to hang on this machine (the environment actor pending forever) trains to the end."""
    command = [
        sys.executable,
        "-m",
        "trace_ray.app.cli",
        "train",
        f"run_dir={tmp_path}",
        "train_on=env",
        "env=device",
        "model=tiny_random",
        "ray.num_cpus=2",
        "trainer.num_workers=2",
        "grpo.group_size=2",
        "grpo.groups_per_batch=2",
        "grpo.iterations=2",
        "grpo.max_resample_batches=0",
        "model.sampling.max_new_tokens=6",
        "ray.placement_timeout_s=300",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trainer.cpus_per_worker=0.5 lowered to 0.25" in done.stdout
    assert json.loads((tmp_path / "adapters" / "device" / "adapter_config.json").read_text())["r"] > 0


def test_a_trainer_and_a_rollout_engine_share_one_gpu_when_each_asks_for_half(tmp_path):
    from trace_ray.app import train

    shared = config(
        f"run_dir={tmp_path}",
        "train_on=env",
        "trainer.use_gpu=true",
        "trainer.gpus_per_worker=0.5",
        "engine=hf",
        "rollout.worker_gpus=0.5",
    )
    one_gpu = [{"CPU": 16.0, "GPU": 1.0}]
    assert fit_training(shared, one_gpu) == shared
    [job] = train.train_jobs(shared)
    assert train.torch_trainer(shared, job, mailbox=None).scaling_config.resources_per_worker == {
        "CPU": 0.5,
        "GPU": 0.5,
    }
    with pytest.raises(TraceRayError, match="1 Ray Train worker x 0.5 CPU \\+ 1 GPU"):
        fit_training(config("trainer.use_gpu=true", "rollout.worker_gpus=0.5"), one_gpu)
