"""The verdict on a graded copy, taken so that code running inside the test process cannot decide it.

- :func:`grade_with_pytest` (package tasks, SWE-bench): canaries planted in
  the test files (``canaries.py``), pytest run in the sandbox with the
  witness (``sandbox_runner.py``); a required test passes only when pytest's
  summary *and* the witness say so. A test pytest reports passed that the
  witness did not see pass, a canary with the wrong outcome, or anything on
  the witness's channel that is not the witness's own marks the run
  tampered.
- :func:`grade_calls` (the synthetic template tasks): no pytest at all. The
  sandbox runner imports the module and records what each test's call
  returns, plus hidden calls drawn per grading run that the agent never
  sees; the grader compares every value with the correct module's in its own
  process.
"""

from __future__ import annotations

import json
import random
import secrets
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from environments.code_repair.canaries import canary_problems, plant
from environments.code_repair.mutations import literal
from environments.code_repair.tasks import run_tests
from environments.code_repair.test_runner import RecordChannel, require_started, sandbox_command


@dataclass(frozen=True)
class Grade:
    passed: frozenset[str]  # the tests that passed, by every account
    timed_out: bool = False
    tamper_reasons: tuple[str, ...] = ()  # why the run cannot be trusted (empty: nothing seen)
    hidden_failed: int = 0  # checks the agent never saw (hidden calls) that came out wrong
    details: dict[str, Any] = field(default_factory=dict)  # more for the episode's info


def grade_with_pytest(
    root: Path,
    test_paths: Sequence[str],
    pytest_args: Sequence[str],
    required: Sequence[str],
    fail_to_pass: Sequence[str],
    timeout_s: float,
) -> Grade:
    """Plant canaries beside the ``fail_to_pass`` tests, run ``test_paths`` in the sandbox, and cross-check."""
    canaries = plant(root, [test.split("::")[0] for test in fail_to_pass], random.Random(secrets.randbits(64)))
    run = run_tests(root, test_paths, pytest_args, timeout_s, sandboxed=True)
    if run.timed_out:
        return Grade(frozenset(), timed_out=True)
    witnessed = run.witnessed
    watched = [*required, *(canary.test_id for canary in canaries)]
    unseen = sorted(test for test in watched if test in run.passed and witnessed.outcomes.get(test) != "passed")
    reasons = list(witnessed.problems)
    if unseen:
        reasons.append(
            f"pytest reported {len(unseen)} test(s) passed that the witness did not see pass (e.g. {unseen[0]})"
        )
    reasons += canary_problems(canaries, run.reported(), witnessed.outcomes)
    passed = frozenset(test for test in required if test in run.passed and witnessed.outcomes.get(test) == "passed")
    return Grade(passed, tamper_reasons=tuple(reasons), details={"canaries": len(canaries)})


def grade_calls(
    root: Path,
    module: str,
    tests: Sequence[tuple[str, str, tuple]],
    hidden: Sequence[tuple[str, tuple]],
    expected: Sequence[Any],
    timeout_s: float,
) -> Grade:
    """Run every test's call (``tests``: test id, function, arguments) and the ``hidden`` calls on ``module`` in the
    sandbox; a test passes when its value equals its ``expected`` one (``expected`` holds the tests' values, then the
    hidden calls'); ``hidden_failed`` counts the hidden calls whose value does not."""
    calls = [[function, list(arguments)] for _, function, arguments in tests] + [
        [function, list(arguments)] for function, arguments in hidden
    ]
    channel = RecordChannel()
    command = sandbox_command(root, channel.fd, ["calls", module])
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
        return Grade(frozenset(), timed_out=True)
    records, foreign = channel.close()
    require_started(records, finished.stderr)
    results = [record["results"] for record in records if "results" in record]
    reasons = [f"{foreign} line(s) on the record channel without the run's nonce"] if foreign else []
    reasons += ["the results recorded more than once"] if len(results) > 1 else []
    if not results or len(results[0]) != len(calls):
        return Grade(frozenset(), tamper_reasons=tuple(reasons), details={"calls_recorded": False})
    right = [_value(result) == want for result, want in zip(results[0], expected)]
    passed = frozenset(test for (test, _, _), ok in zip(tests, right) if ok)
    return Grade(
        passed,
        tamper_reasons=tuple(reasons),
        hidden_failed=len(hidden) - sum(right[len(tests) :]),
        details={"hidden_calls": len(hidden)},
    )


def _value(result: list) -> Any:
    """A recorded result as a plain value (``("raises", type)`` for an exception); a ``repr`` that is no literal
    matches nothing."""
    if not (isinstance(result, list) and len(result) == 2 and all(isinstance(part, str) for part in result)):
        return _Unmatched()
    kind, text = result
    if kind == "raises":
        return ("raises", text)
    try:
        return literal(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _Unmatched()


class _Unmatched:
    """A value equal to nothing."""

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__
