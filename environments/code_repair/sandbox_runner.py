"""What runs inside the code-repair sandbox, as a script: the limits, then pytest watched by a witness, or a module's
calls.

``python sandbox_runner.py LIMITS RECORD_FD pytest ARGS...`` and
``python sandbox_runner.py LIMITS RECORD_FD calls MODULE [FOLDER]`` (``test_runner.py``
builds the command). The script first sets the resource limits (``LIMITS``,
JSON) and reads one line from stdin, the run's nonce (in ``calls`` mode a
second line: the calls, JSON). Then, before any code under test is
imported, it records that it started (a run without that record never
ran: the grader raises instead of grading it) and holds the record
channel: ``RECORD_FD``, the write end of a pipe the grader reads outside
the sandbox, where it writes JSON lines that each carry the nonce. What
the code under test prints never goes there, and nothing in the sandbox
can read back or rewrite what was written.

- ``pytest``: pytest runs with :class:`Witness` registered first. The
  witness records the collected test ids, then each test as its setup and
  call really ended (``passed``, ``failed``, ``error``, ``skipped``), taken
  from the exception the test raised (or, for ``unittest`` cases, the one
  pytest's unittest support stored), never from a report: plugins, hooks and
  patched report classes that rewrite reports do not change it.
- ``calls``: imports ``MODULE`` from the working directory (or its
  ``FOLDER``) and records what each call ``[function, arguments]`` returns
  (its ``repr``; an iterator read into a list) or which exception it
  raises; the grader compares the values with the expected ones in its own
  process.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import resource
import sys
from collections.abc import Iterator

import pytest

MB = 1024 * 1024
MAX_ITEMS = 10_000  # items of a returned iterator recorded in calls mode


def set_limits(limits: dict) -> None:
    for kind, value in (
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_AS, limits["memory_mb"] * MB),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_NOFILE, limits["open_files"]),
        (resource.RLIMIT_FSIZE, limits["file_mb"] * MB),
    ):
        resource.setrlimit(kind, (value, value))


class Recorder:
    """JSON lines with the run's nonce on the record channel."""

    def __init__(self, fd: int, nonce: str):
        self.fd, self.nonce = fd, nonce

    def __call__(self, **fields) -> None:
        os.write(self.fd, (json.dumps({"nonce": self.nonce, **fields}) + "\n").encode())


def _outcome(error: BaseException, failed: str) -> str:
    return "skipped" if isinstance(error, (pytest.skip.Exception, pytest.xfail.Exception)) else failed


class Witness:
    """A pytest plugin that records how each test's setup and call ended, from the exceptions themselves."""

    def __init__(self, record: Recorder):
        self.record = record

    def pytest_collection_finish(self, session) -> None:
        self.record(collected=[item.nodeid for item in session.items])

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item):
        try:
            return (yield)
        except BaseException as error:
            self.record(test=item.nodeid, outcome=_outcome(error, "error"))
            raise

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item):
        try:
            result = yield
        except BaseException as error:
            self.record(test=item.nodeid, outcome=_outcome(error, "failed"))
            raise
        stored = [info.value for info in item.__dict__.get("_excinfo") or []]  # unittest cases: failures pytest stored
        outcomes = {_outcome(error, "failed") for error in stored}
        self.record(test=item.nodeid, outcome="failed" if "failed" in outcomes else "skipped" if outcomes else "passed")
        return result


def run_calls(record: Recorder, module_name: str, calls: list) -> int:
    """Record ``["value", repr]`` or ``["raises", exception type]`` for every call (a module that does not load:
    every call raises); an iterator returned is read into a list first (at most :data:`MAX_ITEMS` items)."""
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001
        record(results=[["raises", type(error).__name__]] * len(calls))
        return 0
    results = []
    for name, arguments in calls:
        try:
            value = getattr(module, name)(*arguments)
            if isinstance(value, Iterator):
                value = list(itertools.islice(value, MAX_ITEMS))
            results.append(["value", repr(value)])
        except Exception as error:  # noqa: BLE001
            results.append(["raises", type(error).__name__])
    record(results=results)
    return 0


def main(argv: list[str]) -> int:
    limits, fd, mode, rest = json.loads(argv[1]), int(argv[2]), argv[3], argv[4:]
    set_limits(limits)
    record = Recorder(fd, sys.stdin.readline().strip())
    record(started=True)  # before any code under test: the grader knows the sandbox ran
    sys.path[0] = ""  # the working directory, as for python -c
    if mode == "calls":
        sys.path[1:1] = rest[1:]  # the folder the module is imported from (a src layout's src), if not the root
        return run_calls(record, rest[0], json.loads(sys.stdin.readline()))
    sys.argv = ["pytest", *rest]
    return pytest.main(rest, plugins=[Witness(record)])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
