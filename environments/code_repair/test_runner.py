"""pytest in a working copy, sandboxed when the code under test may have been written by a model.

``pytest_command(root, paths, extra_args, record_fd)`` is the command line
and working directory of one test run. Sandboxed (every run on an agent's
edits, ``record_fd`` given), it runs ``sandbox_runner.py``: pytest watched
by a witness that writes each test's outcome to ``record_fd``, a file this
process opened (:class:`RecordChannel`). ``sandbox_command`` runs the same
script in its other mode (a generated module's calls). The sandbox is
bubblewrap, as for generated environments
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
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from environments.synthetic.sandbox import NAMESPACES, NOBODY, bubblewrap_problem, system_binds
from trace_ray.errors import TraceRayError

REPO = "/repo"  # the working copy inside the sandbox
RUNNER = "/sandbox/runner.py"  # sandbox_runner.py inside the sandbox, read-only
LIMITS = {"cpu_s": 120, "memory_mb": 2048, "processes": 64, "open_files": 256, "file_mb": 64}


def pytest_arguments(paths: Sequence[str], extra_args: Sequence[str]) -> list[str]:
    """pytest's arguments: quiet, no cache, short tracebacks, a summary line per test (passed, failed, errors)."""
    return ["-q", "-p", "no:cacheprovider", "--tb=short", "-rfEp", "--color=no", *extra_args, *paths]


def sandbox_command(root: Path, record_fd: int, runner_args: Sequence[str]) -> list[str]:
    """The command that runs ``sandbox_runner.py`` (limits, then ``runner_args``) on the working copy ``root`` under
    bubblewrap, writing its records to the inherited file descriptor ``record_fd``."""
    problem = bubblewrap_problem()
    if problem:
        raise TraceRayError(f"env=code_repair runs the agent's edits only in the sandbox, and {problem}; run make install-sandbox")
    environment = os.path.realpath(sys.prefix)
    binds = [] if any(environment.startswith(path + "/") for path in ("/usr",)) else ["--ro-bind", environment, environment]
    return [
        "bwrap", *NAMESPACES, "--uid", NOBODY, "--gid", NOBODY, "--hostname", "sandbox",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        *system_binds(), *binds, "--ro-bind", str(Path(__file__).with_name("sandbox_runner.py")), RUNNER,
        "--bind", str(root), REPO, "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/", "--chdir", REPO,
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
        "--setenv", "PYTHONHASHSEED", "0", "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "PYTHONIOENCODING", "utf-8",
        sys.executable, RUNNER, json.dumps(LIMITS), str(record_fd), *runner_args,  # the venv's own interpreter: it has pytest
    ]


def pytest_command(root: Path, paths: Sequence[str], extra_args: Sequence[str] = (), record_fd: int | None = None) -> tuple[list[str], Path]:
    """(argv, working directory) of a pytest run over ``paths`` in the working copy ``root``: sandboxed and watched by
    the witness when ``record_fd`` is given, else a plain run (code nobody edited)."""
    arguments = pytest_arguments(paths, extra_args)
    if record_fd is None:
        return [sys.executable, "-m", "pytest", *arguments], root
    return sandbox_command(root, record_fd, ["pytest", *arguments]), root


class RecordChannel:
    """The file where the sandbox runner writes its records, opened here, outside the sandbox, and the run's nonce
    (the runner reads it from its stdin before any code under test is imported)."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()
        self.fd = self.file.fileno()
        self.nonce = secrets.token_hex(16)

    def close(self) -> tuple[list[dict], int]:
        """(the records that carry the nonce, how many lines do not); the file is gone after."""
        self.file.seek(0)
        lines = self.file.read().decode("utf-8", errors="replace").splitlines()
        self.file.close()
        records, foreign = [], 0
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict) and record.get("nonce") == self.nonce:
                records.append(record)
            else:
                foreign += 1
        return records, foreign
