import pytest

from trace_ray.config_compose import compose_config
from trace_ray.models import load_model

# A test that uses one of these runs on a real Ray cluster, Serve app, finished pipeline run or the embedded model's
# weights: marked `integration` (`make test-fast` leaves them out)
INTEGRATION_FIXTURES = {"ray_session", "finished_run", "servers", "two_node_cluster", "served_model", "smollm2"}


def pytest_collection_modifyitems(items):
    for item in items:
        if INTEGRATION_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.integration)


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


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray per test process, i.e. per pytest-xdist worker (4 logical CPUs so light actors always fit)."""
    import ray

    if ray.is_initialized():  # a command an earlier test ran on this worker joined a Ray of its own size
        ray.shutdown()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
