"""Where the HF engine's model runs: on the GPU only when this process was given one, in bf16 there for dtype auto."""

import pytest
import ray
import torch

from trace_ray.models import assigned_device, model_device, model_dtype


@pytest.mark.parametrize(
    "cuda_available, gpu_assigned, device",
    [(True, True, "cuda"), (True, False, "cpu"), (False, True, "cpu"), (False, False, "cpu")],
)
def test_the_model_goes_to_the_gpu_only_when_this_process_was_given_one(cuda_available, gpu_assigned, device):
    # (True, False): a GPU machine's actor that asked for no GPU still sees them all (Ray 2.60); it must stay off them
    assert model_device(cuda_available, gpu_assigned) == device


@pytest.mark.parametrize(
    "setting, device, dtype",
    [
        ("auto", "cuda", torch.bfloat16),
        ("auto", "cuda:1", torch.bfloat16),
        ("auto", "cpu", torch.float32),
        ("float32", "cuda", torch.float32),
        ("bfloat16", "cpu", torch.bfloat16),
    ],
)
def test_auto_is_bf16_on_the_gpu_and_float32_on_the_cpu_and_a_named_dtype_is_kept(setting, device, dtype):
    assert model_dtype(setting, device) is dtype


@pytest.mark.parametrize(
    "gpu_ids, ray_running, device", [(["0"], True, "cuda"), ([], True, "cpu"), (["0"], False, "cpu")]
)
def test_the_device_follows_the_gpus_ray_assigned_not_the_gpus_visible(monkeypatch, gpu_ids, ray_running, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU machine
    monkeypatch.setattr(ray, "is_initialized", lambda: ray_running)
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: gpu_ids)
    assert assigned_device() == device


def test_the_trainer_loads_dtype_auto_as_float32_on_the_cpu():
    from trace_ray.config_compose import compose_config
    from trace_ray.training.lora_model import trainable_model

    config = compose_config("train", ["model=tiny_random", "model.dtype=auto"])
    policy, _ = trainable_model(config.model, config.lora, config.seed, device="cpu")
    assert {parameter.dtype for parameter in policy.parameters()} == {torch.float32}
    assert {parameter.device.type for parameter in policy.parameters()} == {"cpu"}
