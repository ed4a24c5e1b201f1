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
  returns, plus the task's hidden calls that the agent never sees; the
  grader compares every value with the correct module's in its own process.
- :func:`with_differential_checks` (package tasks where the package allows):
  calls of the function under repair on which the bug and the fix differ,
  found when the task was built (``differential.py``), replayed in the
  sandbox on a copy without the test files; each result's text is compared
  with the original's outside it.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from environments.code_repair.canaries import canary_problems, plant
from environments.code_repair.mutations import literal
from environments.code_repair.tasks import run_tests
from environments.code_repair.test_runner import record_calls


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
    reaching = [test.split("::")[-1].split("[")[0] for test in fail_to_pass]  # the tests that call the bug's code
    canaries = plant(
        root, [test.split("::")[0] for test in fail_to_pass], random.Random(secrets.randbits(64)), reaching
    )
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
    recorded = record_calls(root, module, calls, timeout_s)
    if recorded.timed_out:
        return Grade(frozenset(), timed_out=True)
    if recorded.results is None:
        return Grade(frozenset(), tamper_reasons=recorded.reasons, details={"calls_recorded": False})
    right = [_value(result) == want for result, want in zip(recorded.results, expected)]
    passed = frozenset(test for (test, _, _), ok in zip(tests, right) if ok)
    return Grade(
        passed,
        tamper_reasons=recorded.reasons,
        hidden_failed=len(hidden) - sum(right[len(tests) :]),
        details={"hidden_calls": len(hidden)},
    )


def with_differential_checks(grade: Grade, root: Path, checks: dict, timeout_s: float) -> Grade:
    """``grade`` with a package task's differential checks (``checks``: ``module``, its ``folder``, the ``calls`` and
    the original's recorded results, ``expected``) replayed on the tree ``root`` in the sandbox; each result compared
    here with the original's as text, so no value of the code under test takes part in the comparison."""
    recorded = record_calls(root, checks["module"], checks["calls"], timeout_s, checks["folder"])
    results = recorded.results or [None] * len(checks["calls"])
    failed = sum(got != want for got, want in zip(results, checks["expected"]))
    return replace(
        grade,
        timed_out=grade.timed_out or recorded.timed_out,
        hidden_failed=grade.hidden_failed + failed,
        tamper_reasons=grade.tamper_reasons + recorded.reasons,
        details={**grade.details, "differential_calls": len(checks["calls"])},
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
