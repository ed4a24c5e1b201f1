"""Differential checks of a package task: calls of the function under repair on which the bug and the fix differ.

Where the package allows (the bug is in a top-level function, and the
failing tests call it with arguments JSON can carry), :func:`differential_checks`
finds them when the task is built:

1. the failing tests run on the original under :class:`CallRecorder`,
   a pytest plugin that records the arguments of every call of the function
   (``python -m environments.code_repair.differential``, unsandboxed: code
   nobody edited);
2. each recorded call with one argument moved to a neighbour
   (``neighbours.py``) is a candidate; the recorded calls themselves are the
   visible tests' and are left out;
3. the candidates run in the sandbox on the original, twice (a function whose
   result for any of them changes between runs, drawing random numbers or
   reading the clock, gets no differential checks: even its calls that agreed
   may have agreed by chance), and on the mutant; those whose results differ
   are kept, with the original's results.

The grader replays them on the agent's code in a copy without the test
files and compares each result's text with the original's outside the
sandbox (``grading.with_differential_checks``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from environments.code_repair.mutations import Mutation
from environments.code_repair.neighbours import moved_calls
from environments.code_repair.packages import Package
from environments.code_repair.test_runner import pytest_arguments, record_calls

RECORDED_CALLS = 200  # distinct calls recorded from the tests
CANDIDATES = 400  # candidate calls tried
KEPT = 12  # differential checks kept per task


def module_of(package: Package, path: str) -> tuple[str, str]:
    """(the folder the module is imported from, relative to the root; its dotted name) of the source file ``path``."""
    folder = next((arg.split("=", 1)[1] for arg in package.pytest_args if arg.startswith("pythonpath=")), "")
    relative = path[len(folder) + 1 :] if folder and path.startswith(folder + "/") else path
    return folder, relative.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


class CallRecorder:
    """A pytest plugin that writes the arguments of every call of ``module.function`` (JSON lists, distinct) to
    ``out``."""

    def __init__(self, module: str, function: str, out: str):
        self.module, self.function, self.out = module, function, out
        self.code = None
        self.calls: dict[str, None] = {}

    def pytest_collection_finish(self, session) -> None:
        function = getattr(importlib.import_module(self.module), self.function, None)
        self.code = getattr(inspect.unwrap(function), "__code__", None) if callable(function) else None
        sys.setprofile(self.profile)

    def profile(self, frame, event, arg) -> None:
        if event != "call" or frame.f_code is not self.code or len(self.calls) >= RECORDED_CALLS:
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount]
        arguments = [frame.f_locals[name] for name in names]
        if code.co_flags & inspect.CO_VARARGS:  # the *args tuple follows the named and keyword-only parameters
            arguments += list(frame.f_locals[code.co_varnames[code.co_argcount + code.co_kwonlyargcount]])
        try:
            self.calls.setdefault(json.dumps(arguments, allow_nan=False), None)
        except (TypeError, ValueError):
            pass  # not plain data: a call the grader cannot replay

    def pytest_sessionfinish(self, session) -> None:
        sys.setprofile(None)
        Path(self.out).write_text(json.dumps([json.loads(call) for call in self.calls]), encoding="utf-8")


def recorded_calls(
    package: Package, root: Path, module: str, function: str, tests: list[str], timeout_s: float
) -> list:
    """The arguments of the calls of ``module.function`` that ``tests`` (pytest node ids) make on the original at
    ``root``."""
    with tempfile.TemporaryDirectory(prefix="code-repair-calls-") as scratch:
        out = Path(scratch) / "calls.json"
        command = [
            sys.executable,
            "-m",
            "environments.code_repair.differential",
            module,
            function,
            str(out),
            *pytest_arguments(tests, package.pytest_args),
        ]
        try:
            subprocess.run(command, cwd=root, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return []
        return json.loads(out.read_text(encoding="utf-8")) if out.is_file() else []


def candidates(recorded: list, rng: random.Random) -> list:
    """Argument lists with one argument of a recorded call moved to a neighbour, none of the recorded ones."""
    chosen = [list(arguments) for arguments in moved_calls(recorded)]
    return rng.sample(chosen, min(CANDIDATES, len(chosen)))


def differential_checks(
    package: Package, root: Path, path: str, mutation: Mutation, fail_to_pass: list[str], timeout_s: float
) -> dict | None:
    """The task's differential checks (``module``, ``folder``, ``calls``, the original's ``expected`` results), or
    None where the package does not allow them: the bug is not in a top-level function, the tests make no call of it
    that JSON carries, or no neighbour of those calls tells the mutant from the original."""
    if "." in mutation.function:
        return None
    folder, module = module_of(package, path)
    tests = sorted({test.split("[")[0] for test in fail_to_pass})  # each failing test function, all its parameters
    rng = random.Random(f"{package.name}:{path}:{mutation.function}:{mutation.start}")
    tried = candidates(recorded_calls(package, root, module, mutation.function, tests, timeout_s), rng)
    if not tried:
        return None
    calls = [[mutation.function, arguments] for arguments in tried]
    first, second = (record_calls(root, module, calls, timeout_s, folder).results for _ in range(2))
    source_file = root / path
    original = source_file.read_text(encoding="utf-8")
    source_file.write_text(mutation.apply(original), encoding="utf-8")
    try:
        mutant = record_calls(root, module, calls, timeout_s, folder).results
    finally:
        source_file.write_text(original, encoding="utf-8")
    if not (first and second and mutant) or first != second:
        return None  # a result that changes between runs (random draws, the clock): the function's results say nothing
    kept = [
        (call, right) for call, right, wrong in zip(calls, first, mutant) if right != wrong and " at 0x" not in right[1]
    ][:KEPT]
    if not kept:
        return None
    return {
        "module": module,
        "folder": folder,
        "calls": [call for call, _ in kept],
        "expected": [right for _, right in kept],
    }


if __name__ == "__main__":  # python -m environments.code_repair.differential MODULE FUNCTION OUT PYTEST_ARGS...
    import pytest

    module_name, function_name, out_file, *pytest_args = sys.argv[1:]
    sys.exit(pytest.main(pytest_args, plugins=[CallRecorder(module_name, function_name, out_file)]))
