"""``EnvironmentActor``: a Ray actor hosting many instances of one environment.

It is the isolation boundary for environment code (later: generated
synthetic environments): environments run in the actor's process, never in
the coordinator's. If the actor dies, Ray restarts it empty and the episodes
it held come back as lost (``None``) and are rerun.
"""

from __future__ import annotations

from trace_ray.config import EnvConfig
from trace_ray.environment_setup import environment_maker
from trace_ray.rollout_loop import EnvironmentPool


class EnvironmentActor(EnvironmentPool):
    def __init__(self, env: EnvConfig):
        super().__init__(environment_maker(env))

    def ping(self) -> int:
        import os

        return os.getpid()
