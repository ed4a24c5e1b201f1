"""Errors of remote calls as the caller should see them."""

from __future__ import annotations

from ray.exceptions import RayTaskError

from environments.errors import TraceRayError


def task_error(exc: BaseException) -> BaseException:
    """A remote call's error as the caller should see it: a TraceRayError raised remotely becomes that one line
    again."""
    if isinstance(exc, RayTaskError) and isinstance(exc.cause, TraceRayError):
        return TraceRayError(str(exc.cause.args[0]))
    return exc
