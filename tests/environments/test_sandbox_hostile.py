"""Hostile generated modules in the strict sandbox (bubblewrap): each attack is contained, the module is rejected with
the reason, nothing it started survives, and what it could reach was only its own scratch."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from environments.synthetic import sandbox
from environments.synthetic.sandbox import SandboxedEnvironment, SandboxError, SandboxLimits, bubblewrap_problem
from tests.trace_ray.synthesis.test_llm_synthesis import OPTIONS, SEEDS, TOOLS, VALID, variant
from trace_ray.synthesis.llm_synthesis import sandbox_admission

pytestmark = pytest.mark.integration  # hostile modules in the bubblewrap sandbox

STRICT = SandboxLimits(call_timeout_s=3.0, memory_mb=400, start_timeout_s=20.0, cpu_s=20, processes=16, open_files=64)
PROJECT = Path(__file__).resolve().parents[2]


def on_reset(body: str) -> str:
    """VALID whose ``reset`` first runs ``body`` (indented by the caller's 8 spaces), then resets as usual."""
    return variant("reset", body + "        return SetValues.reset(self, *args)")


def rejection(tmp_path: Path, name: str, code: str) -> list[str]:
    path = tmp_path / name
    path.write_text(code)
    return sandbox_admission(TOOLS, SEEDS, STRICT, env_options=OPTIONS)(path)


def survivors(marker: str) -> list[str]:
    """Processes whose command line holds ``marker`` (what a module started and left behind)."""
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return [pid for pid in found if int(pid) != os.getpid()]


def survivors_after(marker: str, seconds: float = 10.0) -> list[str]:
    """:func:`survivors` once they are gone, or after ``seconds`` (the kernel takes a moment to end a PID namespace)."""
    deadline = time.monotonic() + seconds
    while survivors(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return survivors(marker)


@pytest.fixture(autouse=True)
def strict_sandbox_available():
    problem = bubblewrap_problem()
    assert problem is None, f"the strict sandbox must run here (.ci/run installs bubblewrap): {problem}"


def test_writes_outside_scratch_fail_and_writes_inside_vanish(tmp_path):
    target = tmp_path / "escaped.txt"
    home_target = Path.home() / "trace-ray-sandbox-escape.txt"
    code = on_reset(f"""\
        outcomes = []
        for path in ({str(target)!r}, {str(home_target)!r}, {str(PROJECT / "escaped.txt")!r}, "/tmp/escaped.txt"):
            try:
                open(path, "w").write("out")
                outcomes.append("wrote " + path)
            except OSError as exc:
                outcomes.append(type(exc).__name__)
        open("inside.txt", "w").write("in")
        if any(o.startswith("wrote ") for o in outcomes):
            raise RuntimeError("escaped: " + repr(outcomes))
""")
    path = tmp_path / "writer.py"
    path.write_text(code)
    with SandboxedEnvironment(path, 1, limits=STRICT) as env:
        env.reset(1)  # no write outside scratch succeeded (the module raises if one did)
    assert not target.exists() and not home_target.exists() and not (PROJECT / "escaped.txt").exists()
    assert not Path("/tmp/escaped.txt").exists()


def test_the_project_and_the_home_directory_cannot_be_read(tmp_path):
    secret = Path.home() / ".trace-ray-test-secret"
    secret.write_text("secret")
    try:
        code = on_reset(f"""\
        seen = []
        for path in ({str(PROJECT / "README.md")!r}, {str(PROJECT / "pyproject.toml")!r}, {str(secret)!r},
                     {str(PROJECT / "trace_ray" / "config.py")!r}, "/root/.bashrc", "/etc/passwd"):
            try:
                seen.append(path + ": " + open(path).read()[:20])
            except OSError:
                pass
        if seen:
            raise RuntimeError("read " + repr(seen))
""")
        path = tmp_path / "reader.py"
        path.write_text(code)
        with SandboxedEnvironment(path, 1, limits=STRICT) as env:
            env.reset(1)
    finally:
        secret.unlink()


def test_a_subprocess_and_a_double_forked_daemon_die_with_the_sandbox(tmp_path):
    marker = f"trace-ray-daemon-{os.getpid()}-{time.monotonic_ns()}"
    code = on_reset(f"""\
        import os, subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", {marker!r}])
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {marker!r}])
            os._exit(0)
        time.sleep(0.5)
""")
    path = tmp_path / "daemon.py"
    path.write_text(code)
    env = SandboxedEnvironment(path, 1, limits=STRICT)
    env.reset(1)
    assert len(survivors(marker)) == 2  # both are running, in the sandbox's PID namespace
    env.close()
    assert survivors_after(marker) == []


@pytest.mark.parametrize(
    "attack, code, reason",
    [
        # its processes fight over the channel, so the answer may not come: then the call's time limit stops it
        (
            "fork bomb",
            "        import os\n        while True:\n            os.fork()\n",
            ("BlockingIOError", "did not return within 3 s"),
        ),
        (
            "memory bomb",
            "        hoard = []\n        while True:\n            hoard.append(bytearray(50 * 1024 * 1024))\n",
            ("memory limit",),
        ),
        ("busy loop", "        while True:\n            pass\n", ("did not return within 3 s",)),
        (
            "huge output",
            "        import sys\n        while True:\n            sys.stderr.write('x' * 65536)\n",
            ("killed by SIGXFSZ", "File too large"),
        ),
    ],
)
def test_resource_attacks_are_stopped_and_reject_the_module(tmp_path, attack, code, reason):
    name = f"hostile_{attack.replace(' ', '_')}_{os.getpid()}.py"
    problems = rejection(tmp_path, name, on_reset(code))
    assert problems and any(words in problems[0] for words in reason), problems
    assert survivors(name) == []  # stopping the sandbox returned once nothing of it ran on


def test_a_raw_socket_cannot_reach_a_loopback_port_the_test_opens(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = on_reset(f"""\
        import _socket
        raw = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        raw.settimeout(2)
        raw.connect(("127.0.0.1", {port}))
""")
    try:
        problems = rejection(tmp_path, "raw_socket.py", code)
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing arrived
    finally:
        listener.close()
    assert problems and (
        "ConnectionRefusedError" in problems[0] or "OSError" in problems[0] or "network" in problems[0]
    ), problems


def test_synthesis_refuses_generated_code_without_the_sandbox_unless_told_weak(tmp_path, monkeypatch):
    path = tmp_path / "valid.py"
    path.write_text(VALID)
    monkeypatch.setattr(sandbox, "bubblewrap_problem", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(SandboxError) as caught:
        SandboxedEnvironment(path, 1, limits=STRICT)
    assert str(caught.value) == (
        "refusing to run generated module valid.py: bubblewrap (bwrap) is not installed; install bubblewrap "
        "(apt-get install bubblewrap) or accept a weaker isolation with synthesis.sandbox=weak"
    )
    weak = SandboxLimits(call_timeout_s=3.0, memory_mb=400, start_timeout_s=20.0, mode="weak")
    with SandboxedEnvironment(path, 1, limits=weak) as env:
        assert env.isolation.startswith("weak: ") and env.reset(1).tools
