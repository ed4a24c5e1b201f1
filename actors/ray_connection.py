"""Joining Ray: a local Ray on this machine, or the cluster at ``ray.address`` / ``RAY_ADDRESS``."""

from __future__ import annotations

import os
import socket

import ray

from environments.errors import TraceRayError
from trace_ray.config import TraceConfig


def connect_ray(config: TraceConfig) -> None:
    """Start a local Ray, or join the cluster at ``ray.address`` / ``RAY_ADDRESS``."""
    if ray.is_initialized():
        return
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    if address and address not in ("auto", "local") and not address.startswith("ray://"):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except (OSError, ValueError):
            raise TraceRayError(
                f"cannot reach a Ray cluster at {address}; start one (ray start --head) or fix ray.address / "
                "RAY_ADDRESS"
            ) from None
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=config.ray.num_cpus, include_dashboard=False, log_to_driver=False)
    except ConnectionError as exc:
        raise TraceRayError(
            f"cannot connect to Ray at {address} ({str(exc).splitlines()[0]}); fix ray.address or RAY_ADDRESS"
        ) from None
