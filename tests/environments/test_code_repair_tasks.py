"""Code-repair tasks from a small local package: validated bugs, SWE-bench fields, an issue text that hides the bug's
place."""

import subprocess
from pathlib import Path

import pytest

from environments.code_repair.packages import Package
from environments.code_repair.tasks import build_tasks, failure_report, run_tests

pytestmark = pytest.mark.integration  # task validation runs the package's own tests

MODULE = """\
def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value


def window_sums(values, size=2):
    return [sum(values[i:i + size]) for i in range(len(values) - size + 1)]


def is_even(number):
    return number % 2 == 0
"""

TESTS = """\
from shapes.core import clamp, is_even, window_sums


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(42, 0, 10) == 10


def test_window_sums():
    assert window_sums([1, 2, 3, 4]) == [3, 5, 7]


def test_window_of_three():
    assert window_sums([1, 2, 3, 4], 3) == [6, 9]


def test_even():
    assert is_even(4) and not is_even(7)
"""

SHAPES = Package("shapes", "1.0", "MIT", ("shapes/core.py",), ("tests",))


def package_tree(folder, name: str, module: str, tests: str):
    """A one-module package ``<name>-1.0`` in ``folder``: ``<name>/core.py`` holding ``module`` and
    ``tests/test_core.py`` holding ``tests``; its root."""
    root = folder / f"{name}-1.0"
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "core.py").write_text(module)
    (root / "tests").mkdir()
    (root / "tests" / "test_core.py").write_text(tests)
    return root


@pytest.fixture()
def shapes(tmp_path):
    return package_tree(tmp_path, "shapes", MODULE, TESTS)


def test_the_test_runner_reports_outcomes_by_node_id(shapes):
    run = run_tests(shapes, ["tests"])
    assert len(run.passed) == 6 and not run.failed and not run.timed_out
    assert "tests/test_core.py::test_clamp_low" in run.passed


def test_tasks_are_validated_bugs_in_swe_bench_form_and_the_gold_patch_fixes_them(shapes):
    tasks = build_tasks(SHAPES, shapes, digest="d" * 64, count=3, seed=1)
    assert len(tasks) == 3 and len({task["mutation"]["function"] for task in tasks}) == 3  # one bug per function
    original = (shapes / "shapes" / "core.py").read_text()
    assert original == MODULE  # the source is restored after every trial
    for task in tasks:
        assert set(task) >= {
            "instance_id",
            "repo",
            "base_commit",
            "problem_statement",
            "patch",
            "test_patch",
            "FAIL_TO_PASS",
            "PASS_TO_PASS",
        }
        assert task["base_commit"] == "d" * 64 and task["repo"] == "pypi/shapes"
        assert task["FAIL_TO_PASS"] and not set(task["FAIL_TO_PASS"]) & set(task["PASS_TO_PASS"])
        assert len(task["FAIL_TO_PASS"]) + len(task["PASS_TO_PASS"]) == 6
        statement = task["problem_statement"]
        assert "core.py" not in statement and "line" not in statement  # the bug's place is not named
        assert "Running" in statement and "assert" in statement
        # the bug, then the gold patch applied with git, gives back the original and the tests pass
        mutation = task["mutation"]
        (shapes / "shapes" / "core.py").write_text(
            original[: mutation["start"]] + mutation["replacement"] + original[mutation["end"] :]
        )
        broken = run_tests(shapes, ["tests"])
        assert set(task["FAIL_TO_PASS"]) <= broken.failed and set(task["PASS_TO_PASS"]) <= broken.passed
        applied = subprocess.run(["git", "apply", "-"], input=task["patch"], text=True, cwd=shapes, capture_output=True)
        assert applied.returncode == 0, applied.stderr
        assert (shapes / "shapes" / "core.py").read_text() == original


def test_the_failure_report_keeps_the_tests_statement_and_error_only():
    output = (
        "___________________ test_clamp_low ___________________\n"
        "tests/test_core.py:9: in test_clamp_low\n"
        "    assert clamp(-3, 0, 10) == 0\n"
        "shapes/core.py:3: in clamp\n"
        "    return low + 1\n"
        "E   assert 1 == 0\n"
        "=========================== short test summary info ===\n"
    )
    statement, errors = failure_report(output, "tests/test_core.py::test_clamp_low")
    assert statement == "assert clamp(-3, 0, 10) == 0" and errors == ["assert 1 == 0"]


def test_a_package_whose_tests_fail_on_the_original_is_refused(shapes):
    (shapes / "tests" / "test_core.py").write_text("def test_broken():\n    assert False\n")
    with pytest.raises(RuntimeError, match="do not pass on the original source"):
        build_tasks(SHAPES, Path(shapes), digest="d", count=1)


def test_sandboxed_runs_see_the_same_outcomes_and_cannot_write_outside_the_working_copy(shapes, tmp_path):
    outside = tmp_path / "outside.txt"
    (shapes / "tests" / "test_escape.py").write_text(
        "import pathlib\n\n"
        "def test_write_outside():\n"
        f"    pathlib.Path({str(outside)!r}).write_text('escaped')\n\n"
        "def test_write_inside():\n"
        "    pathlib.Path('inside.txt').write_text('kept')\n"
    )
    run = run_tests(shapes, ["tests"], sandboxed=True)
    assert "tests/test_core.py::test_clamp_low" in run.passed and len(run.passed) == 7, run.output[-2000:]
    assert run.failed == {"tests/test_escape.py::test_write_outside"} and not outside.exists()
    assert (shapes / "inside.txt").read_text() == "kept"  # the working copy is the writable place


def test_without_the_sandbox_edited_code_is_never_run(shapes, monkeypatch):
    from environments.code_repair import test_runner
    from environments.errors import TraceRayError

    monkeypatch.setattr(test_runner, "bubblewrap_problem", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(
        TraceRayError,
        match="only in the sandbox, and bubblewrap \\(bwrap\\) is not installed; run make install-sandbox",
    ):
        run_tests(shapes, ["tests"], sandboxed=True)
