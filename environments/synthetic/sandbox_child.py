"""The child side of the sandbox: ``python -m environments.synthetic.sandbox_child MODULE_PATH OPTIONS_JSON``.

Started by :class:`environments.synthetic.sandbox.SandboxedEnvironment` in a
scratch directory. Before any line of the generated module runs, it

1. takes the channel to the parent: private copies of stdin and stdout; fd 0
   becomes /dev/null and fd 1 a copy of stderr, so the module's prints and
   reads never touch the channel;
2. leaves the network: a new network namespace (no interface but a downed
   loopback) when the kernel allows it (as root, or inside a new user
   namespace), and in any case ``socket.socket``, ``socket.create_connection``,
   ``socket.getaddrinfo`` and ``socket.socketpair`` refuse with
   PermissionError and record the attempt, so a module that catches the error
   is still caught;
3. caps its address space (RLIMIT_AS) and the size of the files it writes at
   the memory limit, its CPU seconds, the processes it may start and its open
   files.

Then it imports the module, checks ``DIFFICULTIES``, calls
``make_environment(...)`` and answers one JSON line per request::

    request  {"method": "step", "args": [message]}
    answer   {"ok": true, "value": ...}
           | {"ok": false, "kind": "exception" | "memory" | "network" | "invalid", "message": "...", "call": "..."}

The first answer comes unasked once the environment is made: its value is
``{"name", "difficulty", "difficulties", "network"}``. The child exits after a
failed start and after a memory or network failure. Results are plain JSON:
``reset`` and ``step`` results are sent as dicts of their fields.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any, TextIO

METHODS = (
    "task_seeds",
    "train_seed",
    "reset",
    "step",
    "oracle_message",
    "capability_turns",
    "task_fingerprint",
    "example_exchange",
    "capability_detectors",
    "capability_evidence",
)
MEMORY_EXIT_STATUS = 86  # out of memory where not even the answer could be written
NETWORK_DISABLED = "network access is disabled in the sandbox"
MODULE_NAME = "synthetic_environment_module"
CLONE_NEWNET = getattr(os, "CLONE_NEWNET", 0x40000000)
CLONE_NEWUSER = getattr(os, "CLONE_NEWUSER", 0x10000000)

network_attempts: list[str] = []  # what the module tried, in order


class Invalid(Exception):
    """The module breaks the contract (DIFFICULTIES, make_environment, the protocol's methods)."""


# -- isolation ------------------------------------------------------------------------------
def take_channel() -> tuple[TextIO, TextIO]:
    """Private (requests, answers) streams; fd 0 becomes /dev/null and fd 1 goes to stderr."""
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return requests, answers


def _unshare(flags: int) -> None:
    if hasattr(os, "unshare"):  # Python >= 3.12
        os.unshare(flags)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def leave_network() -> str:
    """Move into a new network namespace if the kernel allows it; how the network is cut, in words."""
    try:
        _unshare(CLONE_NEWNET)
        return "network namespace"
    except (OSError, AttributeError):
        pass
    uid, gid = os.getuid(), os.getgid()
    try:
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)
    except (OSError, AttributeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return f"socket functions disabled (no network namespace: {reason})"
    # keep our own ids inside the new user namespace, so the files we write keep their owner
    for path, text in (
        ("/proc/self/setgroups", "deny"),
        ("/proc/self/uid_map", f"{uid} {uid} 1"),
        ("/proc/self/gid_map", f"{gid} {gid} 1"),
    ):
        try:
            with open(path, "w") as file:
                file.write(text)
        except OSError:
            pass
    return "user and network namespaces"


def _refuse(what: str) -> None:
    network_attempts.append(what)
    raise PermissionError(NETWORK_DISABLED)


class _RefusedSocket(socket.socket):
    """Stays a class so that modules subclassing ``socket.socket`` (ssl, ...) still import."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _refuse("socket.socket")


def _refuser(name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        _refuse(f"socket.{name}")

    return refuse


def disable_sockets() -> None:
    socket.socket = _RefusedSocket  # type: ignore[misc]
    for name in ("create_connection", "getaddrinfo", "socketpair"):
        setattr(socket, name, _refuser(name))


def cap_resources(options: dict[str, Any]) -> None:
    """Address space and written file size at the memory limit; CPU seconds, processes and open files as given."""
    memory = options["memory_mb"] * 1024 * 1024
    limits = {
        resource.RLIMIT_AS: memory,
        resource.RLIMIT_FSIZE: memory,
        resource.RLIMIT_CPU: options.get("cpu_s"),
        resource.RLIMIT_NPROC: options.get("processes"),
        resource.RLIMIT_NOFILE: options.get("open_files"),
    }
    for kind, limit in limits.items():
        if limit is None:
            continue
        hard = resource.getrlimit(kind)[1]
        value = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
        resource.setrlimit(kind, (value, value))


# -- the module -----------------------------------------------------------------------------
def describe(exc: BaseException, module_path: str) -> str:
    """``Type: message`` and the module's line where it was raised."""
    where = ""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename == module_path:
            where = f" at {os.path.basename(module_path)} line {frame.lineno}"
            break
    text = " ".join(str(exc).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


def make_environment(module_path: str, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Import the module and make its environment; (environment, hello value)."""
    spec = importlib.util.spec_from_file_location(MODULE_NAME, module_path)
    if spec is None or spec.loader is None:
        raise Invalid(f"cannot import {module_path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    levels = getattr(module, "DIFFICULTIES", None)
    if not (isinstance(levels, tuple) and levels and all(type(level) is int for level in levels)):
        raise Invalid(f"DIFFICULTIES must be a non-empty tuple of ints (easy -> hard), got {levels!r:.80}")
    make = getattr(module, "make_environment", None)
    if not callable(make):
        raise Invalid(
            "the module defines no function make_environment(difficulty, max_turns, max_tool_calls_per_turn, "
            "success_threshold)"
        )
    difficulty = options["difficulty"]
    if difficulty is None:
        difficulty = levels[len(levels) // 2]
    elif difficulty not in levels:
        raise Invalid(f"difficulty {difficulty} is not one of DIFFICULTIES {list(levels)}")
    env = make(
        difficulty=difficulty,
        max_turns=options["max_turns"],
        max_tool_calls_per_turn=options["max_tool_calls_per_turn"],
        success_threshold=options["success_threshold"],
    )
    missing = [method for method in METHODS if not callable(getattr(env, method, None))]
    if missing:
        raise Invalid(
            f"make_environment returned a {type(env).__name__} without the protocol's method(s) {', '.join(missing)}"
        )
    hello = {"name": str(getattr(env, "name", "") or ""), "difficulty": difficulty, "difficulties": list(levels)}
    return env, hello


def encode(method: str, value: Any) -> Any:
    """A protocol result as plain data."""
    if method == "reset":
        return {"messages": value.messages, "tools": value.tools, "info": value.info}
    if method == "step":
        return {"messages": value.messages, "reward": float(value.reward), "done": bool(value.done), "info": value.info}
    return value


def call(env: Any, method: str, args: list[Any], module_path: str) -> dict[str, Any]:
    """The answer to one request."""
    failure = None
    try:
        if method not in METHODS:
            raise Invalid(f"unknown method {method!r}")
        value = encode(method, getattr(env, method)(*args))
    except MemoryError:
        failure = {"kind": "memory", "message": "MemoryError"}  # set outside the handler's frames, which are freed
    except Exception as exc:
        failure = {"kind": "exception", "message": describe(exc, module_path)}
    if network_attempts:
        return {"ok": False, "kind": "network", "message": network_attempts[0]}
    if failure is not None:
        return {"ok": False, **failure}
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return {
            "ok": False,
            "kind": "exception",
            "message": f"its result is not plain JSON ({describe(exc, module_path)})",
        }
    return {"ok": True, "value": value}


def serve(module_path: str, options: dict[str, Any], requests: TextIO, answers: TextIO, network: str) -> int:
    def send(answer: dict[str, Any]) -> None:
        answers.write(json.dumps(answer, allow_nan=False) + "\n")
        answers.flush()

    failure = None
    try:
        env, hello = make_environment(module_path, options)
    except MemoryError:
        failure = {"kind": "memory", "message": "MemoryError"}
    except Invalid as exc:
        failure = {"kind": "invalid", "message": str(exc)}
    except Exception as exc:
        failure = {"kind": "exception", "message": describe(exc, module_path)}
    if network_attempts:
        failure = {"kind": "network", "message": network_attempts[0]}
    if failure is not None:
        send({"ok": False, "call": "start (import and make_environment)", **failure})
        return 1
    send({"ok": True, "value": {**hello, "network": network}})
    for line in requests:
        request = json.loads(line)
        answer = call(env, request["method"], request.get("args", []), module_path)
        send(answer)
        if not answer["ok"] and answer["kind"] in ("memory", "network"):
            return 1
    return 0


def main(argv: list[str]) -> int:
    module_path, options = os.path.abspath(argv[1]), json.loads(argv[2])
    requests, answers = take_channel()
    network = leave_network()
    disable_sockets()
    cap_resources(options)
    try:
        return serve(module_path, options, requests, answers, network)
    except MemoryError:
        os._exit(MEMORY_EXIT_STATUS)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
