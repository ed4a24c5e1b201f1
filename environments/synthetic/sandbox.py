"""Run a generated environment module in a sandboxed child process (``synthesis=llm``).

The generated module's contract
-------------------------------
(The generation prompt quotes this section.) A generated module is one
Python file that implements a synthetic training environment for one
capability. It defines

- ``DIFFICULTIES``: a non-empty tuple of ints, the difficulty levels from easy
  to hard (harder levels give harder tasks of the same capability);
- ``make_environment(difficulty: int, max_turns: int, max_tool_calls_per_turn: int,
  success_threshold: float)``, called with these keyword arguments, returning
  an object that implements the environment protocol of
  ``environments.protocol.Environment``: ``task_seeds(split)``,
  ``train_seed(index)``, ``reset(seed) -> ResetResult``,
  ``step(assistant_message) -> StepResult``, ``oracle_message()``,
  ``capability_turns()`` (the indices of the current task's oracle turns
  that exercise the capability: the checks break those turns themselves),
  ``task_fingerprint()``, and optionally
  ``example_exchange()``, ``capability_detectors()``,
  ``capability_evidence(seed)``.

It may import ``environments.protocol`` and ``environments.tool_environment``
(subclassing ``ToolEnvironment`` is the easy way) and the standard library.
Everything it returns must be plain JSON (dicts, lists, strings, numbers,
booleans, None). It runs without network access, with a time limit on every
call, a memory limit, and a fresh scratch directory as its working directory;
what it prints is kept apart (its last line shows in a crash report) and never
reaches the agent.

The sandbox
-----------
:class:`SandboxedEnvironment` starts ``python -m
environments.synthetic.sandbox_child`` (see that module for what the child
does before importing the module: private channel, no network, resource
limits) in a new session.

``strict`` (the default) runs it under bubblewrap (Debian's ``bubblewrap``):
new user, PID, IPC, UTS, network and cgroup namespaces, every capability
dropped, no new privileges, killed with its parent; the root holds only the
system's read-only ``/usr`` and libraries, the Python installation
(read-only), the ``environments`` package (read-only: nothing else of the
project) and the module file (read-only), and a fresh tmpfs ``/scratch``,
its working directory and HOME, is the only writable place. Whatever the
module starts stays in its PID namespace and dies with it. Where bubblewrap
is missing or cannot create the namespaces, generated code is refused with
one line naming the missing piece, unless ``synthesis.sandbox=weak``: a
plain child process in its own session and scratch directory, the network
cut as far as the kernel allows (recorded as ``isolation``). Either way the
child caps its address space, CPU time, processes, open files and written
file sizes (``SandboxLimits``; the kernel does not count processes against
the limit when the sandbox is started by root, so there a fork bomb runs
until the call's time limit, and stopping the sandbox waits until the
kernel has ended every process of its namespace). It proxies every protocol method over JSON lines on the
child's stdin/stdout and waits for each answer with a deadline (select on the
pipe). A timeout, a memory error, a network attempt or a crash kills the
child's process group and raises :class:`SandboxError`; every later call
raises it too. An exception raised by the module's own method is a
SandboxError as well, but leaves the sandbox usable.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.errors import TraceRayError
from environments.protocol import Environment, Message, ResetResult, StepResult
from environments.synthetic.sandbox_child import MEMORY_EXIT_STATUS

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # holds the environments package


SANDBOX_MODES = ("strict", "weak")
LIBRARY = "/sandbox/lib"  # inside the sandbox: the environments package, read-only
MODULES = "/sandbox/module"  # inside the sandbox: the generated module, under its own name, read-only
SCRATCH = "/scratch"  # inside the sandbox: the tmpfs working directory, the only writable place
NAMESPACES = (
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-net",
    "--unshare-cgroup-try",
)
NOBODY = "65534"


@dataclass
class SandboxLimits:
    call_timeout_s: float = 10.0  # per protocol call
    memory_mb: int = 1024  # address space of the child process, and the largest file it may write
    start_timeout_s: float = 30.0  # importing the module and make_environment
    cpu_s: int = 300  # CPU seconds over the child's life
    processes: int = 16  # processes and threads the child may start (RLIMIT_NPROC)
    open_files: int = 64
    mode: str = "strict"  # strict: bubblewrap; weak: a plain child process (see the module docstring)


def system_binds() -> list[str]:
    """``--ro-bind`` arguments for what the Python interpreter needs: the system's programs and libraries and the
    Python installation (the venv's base; the child needs the standard library only)."""
    paths = [path for path in ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin") if os.path.exists(path)]
    base = os.path.realpath(sys.base_prefix)
    if not any(base == path or base.startswith(path + "/") for path in paths):
        paths.append(base)
    return [argument for path in paths for argument in ("--ro-bind", path, path)]


def bubblewrap_command(module_path: Path, options: dict[str, Any], info_fd: int | None = None) -> list[str]:
    """The command that runs the sandbox child for ``module_path`` under bubblewrap (see the module docstring);
    ``info_fd``: where bubblewrap writes the PID of the namespace's first process, as JSON."""
    return [
        "bwrap",
        *(["--info-fd", str(info_fd)] if info_fd is not None else []),
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
        *system_binds(),
        "--ro-bind",
        str(PROJECT_ROOT / "environments"),
        f"{LIBRARY}/environments",
        "--ro-bind",
        str(module_path),
        f"{MODULES}/{module_path.name}",
        "--tmpfs",
        SCRATCH,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        SCRATCH,
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "PYTHONPATH",
        LIBRARY,
        "--setenv",
        "HOME",
        SCRATCH,
        "--setenv",
        "TMPDIR",
        SCRATCH,
        "--setenv",
        "PYTHONHASHSEED",
        "0",
        "--setenv",
        "PYTHONDONTWRITEBYTECODE",
        "1",
        "--setenv",
        "PYTHONIOENCODING",
        "utf-8",
        os.path.realpath(sys.executable),
        "-m",
        "environments.synthetic.sandbox_child",
        f"{MODULES}/{module_path.name}",
        json.dumps(options),
    ]


@functools.cache
def bubblewrap_problem() -> str | None:
    """Why this machine cannot run the strict sandbox (None: it can), in a few words."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    probe = [
        "bwrap",
        *NAMESPACES,
        "--uid",
        NOBODY,
        "--gid",
        NOBODY,
        "--die-with-parent",
        *system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "true",
    ]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap did not run ({type(exc).__name__})"
    if done.returncode != 0:
        return (
            f"bubblewrap cannot create the namespaces here ({_one_line(done.stderr, 120) or f'exit {done.returncode}'})"
        )
    return None


class SandboxError(TraceRayError):
    """A generated module failed in its sandbox; the one-line message names the module, the call and the cause."""


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SandboxedEnvironment(Environment):
    """The environment of a generated module, running in a sandboxed child process.

    ``difficulty=None`` picks the middle level of the module's ``DIFFICULTIES``.
    """

    def __init__(
        self,
        module_path: str | Path,
        difficulty: int | None,
        max_turns: int = 50,
        max_tool_calls_per_turn: int = 8,
        success_threshold: float = 1.0,
        limits: SandboxLimits | None = None,
    ) -> None:
        self.module_path = Path(module_path).resolve()
        self.limits = limits or SandboxLimits()
        self._process: subprocess.Popen | None = None
        self._stopped: str | None = None  # why the sandbox no longer answers
        self._group_killed = False
        self._namespace_info: int | None = None  # read end of bubblewrap's --info-fd (strict mode)
        self._buffer = bytearray()
        if not self.module_path.is_file():
            self._stopped = "no module"
            raise SandboxError(f"synthetic module {self.module_path}: no such file")
        limits = self.limits
        if limits.mode not in SANDBOX_MODES:
            self._stopped = "no sandbox"
            raise SandboxError(f"synthesis.sandbox={limits.mode!r} is not one of {', '.join(SANDBOX_MODES)}")
        problem = bubblewrap_problem() if limits.mode == "strict" else None
        if problem:
            self._stopped = "no sandbox"
            raise SandboxError(
                f"refusing to run generated module {self.module_path.name}: {problem}; install bubblewrap "
                "(apt-get install bubblewrap) or accept a weaker isolation with synthesis.sandbox=weak"
            )
        self._scratch = tempfile.mkdtemp(prefix="trace-ray-sandbox-")
        self._stderr = tempfile.TemporaryFile(mode="a+b")  # append-only: the child's writes never overwrite
        options = {
            "difficulty": difficulty,
            "max_turns": max_turns,
            "max_tool_calls_per_turn": max_tool_calls_per_turn,
            "success_threshold": success_threshold,
            "memory_mb": limits.memory_mb,
            "cpu_s": limits.cpu_s,
            "processes": limits.processes,
            "open_files": limits.open_files,
        }
        passed: tuple[int, ...] = ()
        if limits.mode == "strict":
            self._namespace_info, info_write = os.pipe()
            passed = (info_write,)
            command, child_env = (
                bubblewrap_command(self.module_path, options, info_write),
                {"PATH": os.environ.get("PATH", os.defpath)},
            )
        else:
            command = [
                sys.executable,
                "-m",
                "environments.synthetic.sandbox_child",
                str(self.module_path),
                json.dumps(options),
            ]
            child_env = {
                "PATH": os.environ.get("PATH", os.defpath),
                "PYTHONPATH": str(PROJECT_ROOT),
                "HOME": self._scratch,
                "TMPDIR": self._scratch,
                "PYTHONHASHSEED": "0",
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONIOENCODING": "utf-8",
            }
        self._process = subprocess.Popen(
            command,
            cwd=self._scratch,
            env=child_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
            close_fds=True,
            pass_fds=passed,
        )
        for descriptor in passed:
            os.close(descriptor)
        try:
            hello = self._receive("start (import and make_environment)", self.limits.start_timeout_s)
        except BaseException:
            self.close()
            raise
        self.name = hello["name"] or f"synthetic/{self.module_path.stem}"
        self.difficulty: int = hello["difficulty"]
        self._difficulties = tuple(hello["difficulties"])
        self.network_isolation: str = hello["network"]  # how the child is cut off the network, in words
        self.isolation = (
            "bubblewrap: user, PID, IPC, UTS, network namespaces; read-only system; tmpfs scratch"
            if limits.mode == "strict"
            else (f"weak: a child process in its own session and scratch directory; {self.network_isolation}")
        )

    # -- the protocol, proxied ------------------------------------------------------------------
    def difficulties(self) -> tuple[int, ...]:
        """The module's ``DIFFICULTIES``, easy -> hard."""
        return self._difficulties

    def task_seeds(self, split: str) -> list[int]:
        return self._call("task_seeds", split)

    def train_seed(self, index: int) -> int:
        return self._call("train_seed", index)

    def reset(self, seed: int) -> ResetResult:
        value = self._call("reset", seed)
        return ResetResult(messages=value["messages"], tools=value["tools"], info=value["info"])

    def step(self, assistant_message: Message) -> StepResult:
        value = self._call("step", assistant_message)
        return StepResult(messages=value["messages"], reward=value["reward"], done=value["done"], info=value["info"])

    def oracle_message(self) -> Message:
        return self._call("oracle_message")

    def capability_turns(self) -> list[int]:
        return self._call("capability_turns")

    def broken_step(self, turn: int) -> Message | None:
        return None  # a generated module does not choose how its capability's steps are broken: the checks do

    def task_fingerprint(self) -> str:
        return self._call("task_fingerprint")

    def example_exchange(self) -> list[Message]:
        return self._call("example_exchange")

    def capability_detectors(self) -> list[str]:
        return self._call("capability_detectors")

    def capability_evidence(self, seed: int) -> dict[str, Any]:
        return self._call("capability_evidence", seed)

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the child and remove its scratch directory; idempotent."""
        if self._process is None:
            return
        self._stop("closed")
        for stream in (self._process.stdin, self._process.stdout, self._stderr):
            try:
                stream.close()
            except OSError:
                pass
        if self._namespace_info is not None:
            os.close(self._namespace_info)
            self._namespace_info = None
        shutil.rmtree(self._scratch, ignore_errors=True)
        self._process = None

    def __enter__(self) -> SandboxedEnvironment:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- the channel ----------------------------------------------------------------------------
    def _call(self, method: str, *args: Any) -> Any:
        shown = "step(message)" if method == "step" else f"{method}({', '.join(repr(arg) for arg in args)})"
        if self._stopped:
            raise SandboxError(
                f"synthetic module {self.module_path.name}: {shown} called on a stopped sandbox ({self._stopped})"
            )
        request = json.dumps({"method": method, "args": list(args)}) + "\n"
        try:
            self._process.stdin.write(request.encode("utf-8"))
            self._process.stdin.flush()
        except OSError:  # the child is gone
            raise self._failure(shown, self._exit_cause()) from None
        return self._receive(shown, self.limits.call_timeout_s)

    def _receive(self, call: str, timeout_s: float) -> Any:
        """The value of the child's next answer, within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        fd = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                limit = "start_timeout_s" if call.startswith("start") else "synthesis.call_timeout_s"
                raise self._failure(
                    call,
                    f"did not return within {timeout_s:g} s (the sandbox's time limit, {limit}); "
                    "the sandbox was stopped",
                )
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._failure(call, self._exit_cause())
            self._buffer += chunk
        end = self._buffer.index(b"\n")
        line, self._buffer = bytes(self._buffer[:end]), self._buffer[end + 1 :]
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            raise self._failure(
                call,
                f"the sandbox answered something that is not JSON ({_one_line(line.decode(errors='replace'), 80)})",
            ) from None
        if answer["ok"]:
            return answer["value"]
        call = answer.get("call", call)
        kind, message = answer["kind"], answer["message"]
        if kind == "memory":
            raise self._failure(
                call,
                f"exceeded the memory limit of {self.limits.memory_mb} MB (MemoryError; "
                "synthesis.memory_mb); the sandbox was stopped",
            )
        if kind == "network":
            raise self._failure(
                call, f"attempted network access ({message}), which is disabled in the sandbox; the sandbox was stopped"
            )
        if kind == "invalid":
            raise self._failure(call, f"failed: {message}")
        if call.startswith("start"):
            raise self._failure(call, f"raised {message}")
        raise SandboxError(f"synthetic module {self.module_path.name}: {call} raised {message}")  # the child lives on

    def _failure(self, call: str, cause: str) -> SandboxError:
        """Stop the child; the error to raise."""
        self._stop(f"{call} failed")
        return SandboxError(f"synthetic module {self.module_path.name}: {call} {cause}")

    def _stop(self, reason: str) -> None:
        """Kill the child's process group (once: the group id is not ours after that) and reap the child."""
        self._stopped = self._stopped or reason
        if self._process is None or self._group_killed:
            return
        self._group_killed = True
        try:
            # the child leads its own session: whatever it started goes too
            os.killpg(self._process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._process.wait()
        self._await_namespace_end()

    def _await_namespace_end(self, wait_s: float = 60.0) -> None:
        """Return once the PID namespace's first process has ended (strict mode).

        Killing it makes the kernel kill everything else in the namespace, but
        that takes a while when the module forked many processes (as root the
        process limit does not hold); the first process ends only after all of
        them, so once it has, nothing the module started runs on."""
        if self._namespace_info is None:
            return
        os.set_blocking(self._namespace_info, False)
        try:
            info = json.loads(os.read(self._namespace_info, 4096).decode() or "{}")
        except (BlockingIOError, ValueError):
            return  # bubblewrap never started the namespace
        first = info.get("child-pid")
        deadline = time.monotonic() + wait_s
        while first and time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{first}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return  # gone
            if state in ("Z", "X"):  # ended; a zombie until its new parent reaps it
                return
            time.sleep(0.05)

    def _exit_cause(self) -> str:
        """Why the child ended, in words."""
        try:
            status = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # it closed its channel but lives on
            self._stop("hung after closing its channel")
            status = self._process.returncode
        if status == MEMORY_EXIT_STATUS:
            return (
                f"exceeded the memory limit of {self.limits.memory_mb} MB (MemoryError; synthesis.memory_mb); the "
                "sandbox was stopped"
            )
        if status < 0:
            name = signal.Signals(-status).name if -status in signal.valid_signals() else str(-status)
            return f"crashed: the sandbox process was killed by {name}"
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - 4000))
        lines = [line for line in self._stderr.read().decode("utf-8", errors="replace").splitlines() if line.strip()]
        last = f" (last output: {_one_line(lines[-1], 160)})" if lines else ""
        return f"crashed: the sandbox process exited with status {status}{last}"
