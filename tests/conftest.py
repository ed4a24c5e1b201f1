import pytest

from trace_ray.cli import compose_config
from trace_ray.models import load_model


def model_config(name, *overrides):
    return compose_config("score", [f"model={name}", *overrides]).model


@pytest.fixture(scope="session")
def tiny_model():
    """(network, tokenizer) of the seeded tiny random-init model."""
    return load_model(model_config("tiny_random"))


@pytest.fixture(scope="session")
def smollm2():
    """(network, tokenizer) of the embedded SmolLM2-135M-Instruct."""
    return load_model(model_config("smollm2_135m"))
