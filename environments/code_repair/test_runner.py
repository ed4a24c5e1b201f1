"""pytest in a working copy, sandboxed when the code under test may have been written by a model.

``pytest_command(root, paths, extra_args, sandboxed)`` is the command line
and working directory of one test run. Sandboxed (every run on an agent's
edits), it runs under bubblewrap like generated environments
(``environments/synthetic/sandbox.py``): its own user, PID, IPC, UTS and
network namespaces, killed with its parent, the system and the Python
environment read-only, the working copy bound at ``/repo`` as the only
writable place besides a tmpfs ``/tmp``, and limits on CPU time, address
space, processes, open files and written file size set before pytest starts.
Unsandboxed runs are for code nobody edited: building the tasks from the
packages' own sources at install time.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Sequence

from environments.synthetic.sandbox import NAMESPACES, NOBODY, bubblewrap_problem, system_binds
from trace_ray.errors import TraceRayError

REPO = "/repo"  # the working copy inside the sandbox
LIMITS = {"cpu_s": 120, "memory_mb": 2048, "processes": 64, "open_files": 256, "file_mb": 64}
# run in the sandbox before pytest: the limits, then pytest itself in the same process
LIMITED_PYTEST = (
    "import json, resource, sys\n"
    "limits = json.loads(sys.argv[1])\n"
    "mb = 1024 * 1024\n"
    "for kind, value in ((resource.RLIMIT_CPU, limits['cpu_s']), (resource.RLIMIT_AS, limits['memory_mb'] * mb),\n"
    "                    (resource.RLIMIT_NPROC, limits['processes']), (resource.RLIMIT_NOFILE, limits['open_files']),\n"
    "                    (resource.RLIMIT_FSIZE, limits['file_mb'] * mb)):\n"
    "    resource.setrlimit(kind, (value, value))\n"
    "sys.argv = ['pytest', *sys.argv[2:]]\n"
    "import pytest\n"
    "sys.exit(pytest.main(sys.argv[1:]))\n"
)


def pytest_arguments(paths: Sequence[str], extra_args: Sequence[str]) -> list[str]:
    """pytest's arguments: quiet, no cache, short tracebacks, a summary line per test (passed, failed, errors)."""
    return ["-q", "-p", "no:cacheprovider", "--tb=short", "-rfEp", "--color=no", *extra_args, *paths]


def pytest_command(root: Path, paths: Sequence[str], extra_args: Sequence[str] = (), sandboxed: bool = True) -> tuple[list[str], Path]:
    """(argv, working directory) of a pytest run over ``paths`` in the working copy ``root``."""
    arguments = pytest_arguments(paths, extra_args)
    if not sandboxed:
        return [sys.executable, "-m", "pytest", *arguments], root
    problem = bubblewrap_problem()
    if problem:
        raise TraceRayError(f"env=code_repair runs the agent's edits only in the sandbox, and {problem}; run make install-sandbox")
    environment = os.path.realpath(sys.prefix)
    binds = [] if any(environment.startswith(path + "/") for path in ("/usr",)) else ["--ro-bind", environment, environment]
    argv = [
        "bwrap", *NAMESPACES, "--uid", NOBODY, "--gid", NOBODY, "--hostname", "sandbox",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        *system_binds(), *binds,
        "--bind", str(root), REPO, "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/", "--chdir", REPO,
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
        "--setenv", "PYTHONHASHSEED", "0", "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "PYTHONIOENCODING", "utf-8",
        sys.executable, "-c", LIMITED_PYTEST, json.dumps(LIMITS), *arguments,  # the venv's own interpreter: it has pytest
    ]
    return argv, root
