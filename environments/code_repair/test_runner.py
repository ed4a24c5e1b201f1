"""pytest in a working copy, sandboxed when the code under test may have been written by a model.

``pytest_command(root, paths, extra_args, record_fd)`` is the command line
and working directory of one test run. Sandboxed (every run on an agent's
edits, ``record_fd`` given), it runs ``sandbox_runner.py``: pytest watched
by a witness that writes each test's outcome to ``record_fd``, the write
end of a pipe this process reads (:class:`RecordChannel`). ``sandbox_command`` runs the same
script in its other mode, and :func:`record_calls` runs a module's calls that way and returns
what each returned (the template tasks' values, package tasks' differential checks). The sandbox is
bubblewrap, as for generated environments
(``environments/synthetic/sandbox.py``): its own user, PID, IPC, UTS and
network namespaces, killed with its parent, the system and the Python
environment read-only, the working copy bound at ``/repo`` as the only
writable place besides a tmpfs ``/tmp``, no ``/proc`` (the process cannot
read its own memory, where the witness keeps the run's nonce), and limits on
CPU time, address space, processes, open files and written file size set
before pytest starts.
Unsandboxed runs are for code nobody edited: building the tasks from the
packages' own sources at install time.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from environments.errors import TraceRayError
from environments.synthetic.sandbox import NAMESPACES, NOBODY, bubblewrap_problem, system_binds

REPO = "/repo"  # the working copy inside the sandbox
RUNNER = "/sandbox/runner.py"  # sandbox_runner.py inside the sandbox, read-only
DRAIN_S = 10  # how long the records may still arrive after the run (a process of the sandbox still holding the pipe)
LIMITS = {"cpu_s": 120, "memory_mb": 2048, "processes": 64, "open_files": 256, "file_mb": 64}


def pytest_arguments(paths: Sequence[str], extra_args: Sequence[str]) -> list[str]:
    """pytest's arguments: quiet, no cache, short tracebacks, a summary line per test (passed, failed, errors)."""
    return ["-q", "-p", "no:cacheprovider", "--tb=short", "-rfEp", "--color=no", *extra_args, *paths]


def sandbox_command(root: Path, record_fd: int, runner_args: Sequence[str]) -> list[str]:
    """The command that runs ``sandbox_runner.py`` (limits, then ``runner_args``) on the working copy ``root`` under
    bubblewrap, writing its records to the inherited file descriptor ``record_fd``."""
    problem = bubblewrap_problem()
    if problem:
        raise TraceRayError(
            f"env=code_repair runs the agent's edits only in the sandbox, and {problem}; run make install-sandbox"
        )
    environment = os.path.realpath(sys.prefix)
    binds = (
        [] if any(environment.startswith(path + "/") for path in ("/usr",)) else ["--ro-bind", environment, environment]
    )
    return [
        "bwrap",
        *NAMESPACES,
        "--uid",
        NOBODY,
        "--gid",
        NOBODY,
        "--hostname",
        "sandbox",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--tmpfs",
        "/tmp",  # first: an environment installed under /tmp is bound over it, not hidden by it
        *system_binds(),
        *binds,
        "--ro-bind",
        str(Path(__file__).with_name("sandbox_runner.py")),
        RUNNER,
        "--bind",
        str(root),
        REPO,
        "--dev",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        REPO,
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "TMPDIR",
        "/tmp",
        "--setenv",
        "PYTHONHASHSEED",
        "0",
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
        "--setenv",
        "PYTHONIOENCODING",
        "utf-8",
        # the venv's own interpreter: it has pytest
        sys.executable,
        RUNNER,
        json.dumps(LIMITS),
        str(record_fd),
        *runner_args,
    ]


def require_started(records: list[dict], stderr: str) -> None:
    """Raise when the sandbox never ran the runner (its first record, written before any code under test, is
    missing): bubblewrap failed, and grading the run would score every test as not passed."""
    if not any(record.get("started") for record in records):
        cause = stderr.strip().splitlines()[0] if stderr.strip() else "no output"
        raise TraceRayError(
            f"the code_repair test sandbox did not start ({cause}); bubblewrap must be able to run "
            f"{sys.executable} and read its environment: run make install-sandbox"
        )


def pytest_command(
    root: Path, paths: Sequence[str], extra_args: Sequence[str] = (), record_fd: int | None = None
) -> tuple[list[str], Path]:
    """(argv, working directory) of a pytest run over ``paths`` in the working copy ``root``: sandboxed and watched by
    the witness when ``record_fd`` is given, else a plain run (code nobody edited)."""
    arguments = pytest_arguments(paths, extra_args)
    if record_fd is None:
        return [sys.executable, "-m", "pytest", *arguments], root
    return sandbox_command(root, record_fd, ["pytest", *arguments]), root


class RecordChannel:
    """A pipe for the sandbox runner's records, and the run's nonce (the runner reads it from its stdin before any code
    under test is imported).

    The runner inherits only the write end (``fd``): code under test can add lines, never read back, rewrite or
    remove the witness's (a file it could reread would hand it the nonce and let it forge the record in place).
    This process drains the read end in a thread, so a long record never blocks the runner.
    """

    def __init__(self) -> None:
        self._read_end, self.fd = os.pipe()
        self.nonce = secrets.token_hex(16)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._drain, name="record-channel", daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while chunk := os.read(self._read_end, 1 << 16):
            self._chunks.append(chunk)

    def close(self) -> tuple[list[dict], int]:
        """(the records that carry the nonce, how many lines do not), once the run is over: what arrived within
        :data:`DRAIN_S` of closing this process's write end."""
        os.close(self.fd)
        self._reader.join(DRAIN_S)  # every write end is closed once the sandbox is gone: EOF
        if not self._reader.is_alive():
            os.close(self._read_end)
        lines = b"".join(self._chunks).decode("utf-8", errors="replace").splitlines()
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


@dataclass(frozen=True)
class Recorded:
    """What the calls of one sandboxed run returned (``[kind, text]`` each, see ``sandbox_runner.py``; None when the run
    recorded no whole list), and why the record cannot be trusted."""

    results: list | None
    reasons: tuple[str, ...] = ()
    timed_out: bool = False


def record_calls(root: Path, module: str, calls: list, timeout_s: float, folder: str = "") -> Recorded:
    """Run ``calls`` (``[function, arguments]`` each) on ``module`` of the tree ``root`` (imported from its ``folder``,
    if given) in the sandbox; what each returned, as recorded outside it."""
    channel = RecordChannel()
    command = sandbox_command(root, channel.fd, ["calls", module, *([folder] if folder else [])])
    try:
        finished = subprocess.run(
            command,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            input=f"{channel.nonce}\n{json.dumps(calls)}\n",
            pass_fds=(channel.fd,),
        )
    except subprocess.TimeoutExpired:
        channel.close()
        return Recorded(None, timed_out=True)
    records, foreign = channel.close()
    require_started(records, finished.stderr)
    results = [record["results"] for record in records if "results" in record]
    reasons = [f"{foreign} line(s) on the record channel without the run's nonce"] if foreign else []
    reasons += ["the results recorded more than once"] if len(results) > 1 else []
    whole = results[0] if results and len(results[0]) == len(calls) else None
    return Recorded(whole, tuple(reasons))
