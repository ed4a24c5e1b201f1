"""The pipeline as a Ray job on a two-node cluster: ``ray start --head`` and ``ray start --address`` on loopback, each
node with its own resources, the job sent with ``ray job submit``.

The cluster's processes are found again by a marker in their environment and
stopped one by one; ``ray stop`` would stop every Ray on the machine.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.trace_ray.app.test_pipeline import MINIMAL, seed_collection

BIN = Path(sys.executable).parent
MARKER = "TRACE_RAY_TEST_CLUSTER"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def node_ports() -> list[str]:
    """Ports of one node's agents: two nodes on one machine must not share the defaults."""
    return [
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
    ]


def stop_marked(marker: str) -> None:
    """Kill every process started with ``MARKER=marker`` in its environment (the cluster and its workers)."""
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARKER) == marker:
                process.send_signal(signal.SIGKILL)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue


@dataclass
class Cluster:
    dashboard: str  # the job server's URL
    env: dict[str, str]  # the environment the ray CLI runs with
    head_node: str
    worker_node: str


@pytest.fixture
def two_node_cluster():
    marker = uuid.uuid4().hex
    # a short temp dir: Ray's Unix socket paths live under it
    temp_dir = tempfile.mkdtemp(prefix="trc-", dir="/tmp")
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env.update({MARKER: marker, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
    gcs, dashboard = free_port(), free_port()
    common = ["--node-ip-address=127.0.0.1", "--disable-usage-stats", *node_ports()]
    start = dict(env=env, cwd=temp_dir, check=True, capture_output=True, text=True, timeout=120)
    try:
        subprocess.run(
            [
                BIN / "ray",
                "start",
                "--head",
                f"--port={gcs}",
                f"--temp-dir={temp_dir}",
                "--num-cpus=1",
                '--resources={"head_node": 1}',
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
                f"--ray-client-server-port={free_port()}",
                *common,
            ],
            **start,
        )
        common = ["--node-ip-address=127.0.0.1", "--disable-usage-stats", *node_ports()]
        subprocess.run(
            [
                BIN / "ray",
                "start",
                f"--address=127.0.0.1:{gcs}",
                "--num-cpus=3",
                '--resources={"worker_node": 1}',
                *common,
            ],
            **start,
        )
        nodes = wait_for_nodes(f"http://127.0.0.1:{dashboard}", 2)
        yield Cluster(f"http://127.0.0.1:{dashboard}", env, nodes["head_node"], nodes["worker_node"])
    finally:
        stop_marked(marker)
        shutil.rmtree(temp_dir, ignore_errors=True)


def wait_for_nodes(dashboard: str, count: int, timeout_s: float = 60) -> dict[str, str]:
    """Custom resource name -> node id, once ``count`` nodes are alive."""
    from ray.util.state import list_nodes

    deadline = time.monotonic() + timeout_s
    while True:
        alive = [node for node in list_nodes(address=dashboard, detail=True) if node.state == "ALIVE"]
        if len(alive) == count:
            return {name: node.node_id for node in alive for name in node.resources_total if name.endswith("_node")}
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(alive)} of {count} Ray nodes alive after {timeout_s} s")
        time.sleep(1)


@pytest.mark.slow
def test_the_pipeline_runs_as_a_job_on_a_two_node_cluster(two_node_cluster, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient
    from ray.util.state import list_actors

    run_dir = tmp_path / "run"
    seed_collection(run_dir)
    submission = f"trace-ray-{uuid.uuid4().hex[:8]}"
    runtime_env = {"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}}
    submitted = subprocess.run(
        [
            BIN / "ray",
            "job",
            "submit",
            f"--address={two_node_cluster.dashboard}",
            f"--submission-id={submission}",
            f"--runtime-env-json={json.dumps(runtime_env)}",
            "--no-wait",
            "--",
            str(BIN / "trace-ray"),
            "pipeline",
            f"run_dir={run_dir}",
            *MINIMAL,
        ],
        env=two_node_cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stderr

    client = JobSubmissionClient(two_node_cluster.dashboard)
    deadline = time.monotonic() + 900
    while client.get_job_status(submission) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.monotonic() < deadline, "the pipeline job did not finish in 15 minutes"
        time.sleep(5)
    logs = client.get_job_logs(submission)
    assert client.get_job_status(submission) == JobStatus.SUCCEEDED, logs[-3000:]

    # the job ends with the report table, and every stage is recorded as done
    assert "GRPO on target" in logs and "prompt injection" in logs
    stages = json.loads((run_dir / "manifest.json").read_text())["stages"]
    assert {entry["status"] for entry in stages.values()} == {"done"} and len(stages) == 7
    assert json.loads((run_dir / "eval" / "report.json").read_text())["tasks"] == 2

    # the driver ran on the head; the job's actors ran on both nodes
    driver_node = client.get_job_info(submission).driver_node_id
    job_id = client.get_job_info(submission).job_id
    actors = list_actors(
        address=two_node_cluster.dashboard, filters=[("job_id", "=", job_id)], detail=True, limit=10_000
    )
    assert driver_node == two_node_cluster.head_node
    assert {actor.node_id for actor in actors} == {two_node_cluster.head_node, two_node_cluster.worker_node}
