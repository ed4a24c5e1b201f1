"""Checks of a package task the agent never sees: failing tests held out of its working copy, and differential checks
(calls on which the bug and the fix differ, found at build time, their values compared outside the sandbox); the
special-casing agents score 0 against them."""

import ast

import pytest

from environments.code_repair.adversaries import adversary
from environments.code_repair.differential import differential_checks
from environments.code_repair.environment import CodeRepairEnvironment
from environments.code_repair.held_out import held_out_tests, remove_tests
from environments.code_repair.mutations import Mutation
from environments.code_repair.packages import Package
from environments.code_repair.sources import PackageSource
from environments.code_repair.special_cases import NAMES as SPECIAL_CASE_NAMES
from environments.code_repair.tasks import build_tasks
from environments.self_checks import oracle, play
from tests.environments.test_code_repair_tasks import (  # noqa: F401  (shapes: the package fixture)
    MODULE,
    SHAPES,
    TESTS,
    package_tree,
    shapes,
)

CLASS_TESTS = """\
import pytest


class TestSums:
    def test_one(self):
        assert sum([1]) == 1

    @pytest.mark.parametrize("n", [1, 2])
    def test_two(self, n):
        assert n > 0


def test_top():
    assert True
"""


def test_every_other_failing_test_function_is_held_out_the_first_stays_visible():
    failing = ["t.py::test_a[1]", "t.py::test_a[2]", "t.py::C::test_b", "t.py::test_c", "u.py::test_d[x-y]"]
    assert held_out_tests(failing) == ["t.py::C::test_b", "u.py::test_d"]
    assert held_out_tests(["t.py::test_a[1]", "t.py::test_a[2]"]) == []


def test_held_out_tests_leave_the_file_as_pass_and_the_rest_intact(tmp_path):
    (tmp_path / "test_x.py").write_text(CLASS_TESTS)
    remove_tests(tmp_path, ["test_x.py::TestSums::test_two", "test_x.py::test_top", "test_x.py::Other::test_none"])
    text = (tmp_path / "test_x.py").read_text()
    tree = ast.parse(text)  # still Python
    names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert names == {"test_one"} and "parametrize" not in text and "assert sum([1]) == 1" in text


@pytest.fixture()
def source(shapes):  # noqa: F811
    tasks = build_tasks(SHAPES, shapes, digest="d" * 64, count=3, seed=1)
    return PackageSource(
        [{**task, "split": "analysis"} for task in tasks], {"pypi/shapes": SHAPES}, {"pypi/shapes": shapes}
    )


def visible_calls(text):
    """(function, arguments) of every call with literal arguments in a test file's text."""
    return {
        (node.func.id, repr([ast.literal_eval(argument) for argument in node.args]))
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id != "sum"
    }


@pytest.mark.integration  # builds tasks and grades in the sandbox
def test_differential_checks_tell_the_bug_from_the_fix_on_calls_no_test_makes(source):
    for task in source.tasks:
        checks = task["differential"]
        assert checks["module"] == "shapes.core" and checks["folder"] == "" and len(checks["calls"]) >= 3
        assert not visible_calls(TESTS) & {(function, repr(arguments)) for function, arguments in checks["calls"]}
        namespace = {}
        exec(MODULE, namespace)  # the original's values, as the sandbox recorded them
        assert checks["expected"] == [["value", repr(namespace[f](*arguments))] for f, arguments in checks["calls"]]


DRAWS = """\
import random


def draw(items, count):
    return [random.choice(items) for _ in range(count)]
"""
DRAW_TESTS = """\
from draws.core import draw


def test_draw_count():
    assert len(draw(list(range(50)), 2)) == 2
"""


@pytest.mark.integration  # runs the calls in the sandbox
def test_a_function_whose_results_change_between_runs_gets_no_differential_checks(tmp_path):
    """Results drawn at random agree between two runs on some calls by chance (two draws from few items); checks kept
    from those would fail the fix itself, so the whole function gets none."""
    root = package_tree(tmp_path, "draws", DRAWS, DRAW_TESTS)
    start = DRAWS.index("range(count)")
    one_more = Mutation("off_by_one", "draw", 5, "range(count)", "range(count + 1)", start, start + len("range(count)"))
    package = Package("draws", "1.0", "MIT", ("draws/core.py",), ("tests",))
    failing = ["tests/test_core.py::test_draw_count"]
    assert differential_checks(package, root, "draws/core.py", one_more, failing, 60) is None
    deterministic = DRAWS.replace("random.choice(items)", "items[0]")  # the same function without the draw: checks
    (root / "draws" / "core.py").write_text(deterministic)
    checks = differential_checks(package, root, "draws/core.py", one_more, failing, 60)
    assert checks is not None and checks["calls"]


@pytest.mark.integration  # plays episodes in the sandbox
def test_the_working_copy_lacks_the_held_out_tests_and_grading_runs_them(source):
    env = CodeRepairEnvironment(source=source)
    seed = next(seed for seed, task in env.by_seed.items() if held_out_tests(task["FAIL_TO_PASS"]))
    env.reset(seed)
    held = held_out_tests(env.task["FAIL_TO_PASS"])
    visible = (env.workdir / "tests" / "test_core.py").read_text()
    assert all(f"def {test.split('::')[-1]}(" not in visible for test in held)
    assert all(f"def {test.split('::')[-1]}(" in TESTS for test in held)
    reward, info = play(env, seed, oracle)
    assert reward == 1.0 and info["differential_calls"] >= 3 and info["hidden_failed"] == 0


@pytest.mark.integration  # plays episodes in the sandbox
@pytest.mark.parametrize("name", SPECIAL_CASE_NAMES)
def test_each_special_casing_agent_scores_0_on_the_package_tasks(source, name):
    env = CodeRepairEnvironment(source=source)
    infos = [play(env, seed, adversary(name)) for seed in env.by_seed]
    assert all(
        reward == 0.0 and (info["hidden_failed"] or info["tests_failed"] or info["tampered"]) for reward, info in infos
    )
    if (
        name == "always-equal-runtime"
    ):  # where it passes every test, the canaries and the differential checks each catch it
        fooled = [info for _, info in infos if not info["tests_failed"]]
        assert fooled and all(
            info["hidden_failed"] > 0 and any(reason.startswith("canary ") for reason in info["tamper_reasons"])
            for info in fooled
        )
