"""Grades that the code under test cannot forge: the static check of edits, canaries, the witness, out-of-process
values,
and the tamper agents that try each (they pass a grader that trusts pytest's report, and score 0 here)."""

import json
import random
import shutil
import subprocess
import sys

import pytest

from environments.code_repair import synthetic_templates as templates
from environments.code_repair.adversaries import TAMPER_NAMES, adversary
from environments.code_repair.canaries import Canary, canary_problems, plant
from environments.code_repair.edit_check import edit_problems
from environments.code_repair.environment import CodeRepairEnvironment
from environments.code_repair.forgeries import payload
from environments.code_repair.grading import grade_calls
from environments.code_repair.sources import PackageSource
from environments.code_repair.special_cases import NAMES as SPECIAL_CASE_NAMES
from environments.code_repair.special_cases import helpers, special_cased
from environments.code_repair.synthetic import CodeRepairTemplateEnvironment
from environments.code_repair.synthetic_templates import make_task, outcomes
from environments.code_repair.tasks import build_tasks, run_tests
from environments.code_repair.test_runner import RecordChannel, sandbox_command
from environments.errors import TraceRayError
from environments.self_checks import oracle, play
from tests.environments.test_code_repair_tasks import SHAPES, TESTS, shapes  # noqa: F401  (the package fixture)

ORIGINAL = (
    "import re\n\n\ndef first_word(text, limit=3):\n    words = re.findall(r'\\w+', text)\n    return "
    "words[0][:limit] if words else ''\n"
)


# -- the static check ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "added, names",
    [
        ("import gc\n", ["gc"]),
        ("import _pytest.reports as r\nr.TestReport.from_item_and_call = None\n", ["_pytest"]),
        ("def pytest_runtest_makereport(item, call):\n    pass\n", ["pytest_runtest_makereport"]),
        ("m = __import__('g' + 'c')\n", ["__import__"]),
        ("import importlib\nx = importlib.import_module(''.join(['s', 'ys']))\n", ["importlib"]),
        ("x = getattr(re, 'modules')\n", ["modules"]),
        ("x = getattr(re, ''.join(['mod', 'ules']))\n", ["getattr with a computed name"]),
        ("exec(bytes.fromhex('7072696e742829').decode())\n", ["exec"]),
        ("import os\nos._exit(0)\n", ["_exit"]),
        ("import atexit, faulthandler, signal\n", ["atexit", "faulthandler", "signal"]),
        ("import sys\nsys.stdout.write('PASSED x')\n", ["stdout"]),
        ("x = re.__builtins__\n", ["__builtins__"]),
        ("class Same:\n    def __eq__(self, other):\n        return True\n", ["__eq__"]),
        (
            "def f():\n    try:\n        1 / 0\n    except Exception as e:\n        return "
            "e.__traceback__.tb_frame.f_back.f_globals\n",
            ["__traceback__", "f_back", "f_globals", "tb_frame"],
        ),
        ("import threading\nthreading.Thread(target=print).start()\n", ["threading", "Thread"]),
        ("class Later:\n    def __del__(self):\n        pass\n", ["__del__"]),
        ("import os as o\nfrom os import pread\no.ftruncate(3, 0)\n", ["os.pread", "os.ftruncate"]),
        ("x = open('/pr' 'oc/self/mem', 'rb')\n", ["/proc"]),
        ("g = getattr\nx = g(re, 'compile')\n", ["getattr with a computed name"]),
        ("import operator\nx = operator.attrgetter('_get' + 'frame')\n", ["attrgetter"]),
        ("x = object.__getattribute__(re, 'sub')\n", ["__getattribute__"]),
        (
            "import traceback\nx = '{0.f_locals}'.format(next(traceback.walk_stack(None))[0])\n",
            ["walk_stack", "f_locals"],
        ),
        ("import _frozen_importlib as b\nx = b._gcd_import('g' + 'c')\n", ["_frozen_importlib", "_gcd_import"]),
    ],
)
def test_an_edit_that_reaches_the_grading_machinery_is_named(added, names):
    problems = edit_problems(ORIGINAL, ORIGINAL + added)
    assert problems and all(any(name in problem for problem in problems) for name in names), problems
    assert all(problem.startswith("adds ") and problem.endswith(")") for problem in problems)


@pytest.mark.parametrize(
    "edited",
    [
        ORIGINAL.replace("[:limit]", "[:limit + 1]"),  # a fix: what the code computes
        ORIGINAL.replace("if words else ''", "if len(words) > 0 else ''"),
        ORIGINAL
        + "\n\ndef second_word(text):\n    words = re.findall(r'\\w+', text)\n    return words[1] if len(words) > "
        "1 else ''\n",
        ORIGINAL.replace("def first_word(", "def first_word(  # unparsable now\n"),  # its tests fail on their own
        ORIGINAL.replace(
            "return words", "import os\n    name = os.path.join('{0}', 'x').format(text)\n    return words"
        ),
    ],
)
def test_an_ordinary_edit_is_not_refused(edited):
    assert edit_problems(ORIGINAL, edited) == []


def test_names_the_original_already_uses_are_not_counted_until_the_edit_adds_more():
    original = "import sys\n\n\ndef loaded(name):\n    return name in sys.modules\n"
    restored = original.replace("in sys.modules", "not in sys.modules")  # the mutant's fix restores the same names
    assert edit_problems(original, restored) == []
    assert edit_problems(original, original + "\nsys.modules['x'] = None\n") == ["adds modules (the import system)"]


# -- canaries -------------------------------------------------------------------------------------
def test_canaries_hide_among_the_tests_and_come_out_as_planted_in_an_honest_run(shapes):  # noqa: F811
    canaries = plant(shapes, ["tests/test_core.py"], random.Random(3))
    assert sorted(canary.expected for canary in canaries) == ["error", "failed", "failed", "passed", "passed"]
    text = (shapes / "tests" / "test_core.py").read_text()
    assert all(line in text for line in TESTS.splitlines())  # the real tests are all still there
    # the must-fail canaries are real tests asserting against a fresh object
    assert text.count("== object() or ") == 2
    words = {
        word
        for line in TESTS.splitlines()
        if line.startswith("def test_")
        for word in line[9:].split("(")[0].split("_")
    }
    for canary in canaries:
        name = canary.test_id.split("::")[1]
        assert name.startswith("test_") and set(name[5:].split("_")) <= words  # the file's own vocabulary
    run = run_tests(shapes, ["tests"])
    assert canary_problems(canaries, run.reported(), {}) == []
    # the six tests, the planted passes; the planted failures, error
    assert len(run.passed) == 8 and len(run.failed) == 3


def test_canaries_give_away_a_run_where_everything_passed():
    canaries = [
        Canary("t.py::test_a_b", "passed"),
        Canary("t.py::test_b_c", "failed"),
        Canary("t.py::test_c_d", "error"),
    ]
    everything_passed = {canary.test_id: "passed" for canary in canaries}
    problems = canary_problems(canaries, everything_passed, {})
    assert len(problems) == 2 and "t.py::test_b_c must come out failed, but pytest says passed" in problems[0]
    assert canary_problems(canaries, {}, {}) == []  # canaries that never ran (an import error) say nothing
    assert canary_problems(canaries, {"t.py::test_c_d": "error"}, {"t.py::test_c_d": "passed"}) == [
        "canary t.py::test_c_d must come out error, but the witness says passed"
    ]
    # a file-wide skip marker skips the canaries too: a skip passes nothing, so it says nothing
    skipped = {canary.test_id: "skipped" for canary in canaries}
    assert canary_problems(canaries, skipped, skipped) == []


def test_a_test_that_may_skip_itself_is_not_copied_into_the_canary_that_must_fail(tmp_path):
    # semver's optional-backend tests skip when a package is missing: a copy would skip, not fail (the oracle was
    # flagged)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_optional.py").write_text(
        "import pytest\n\n\ndef test_backend_parts():\n    pytest.skip('no backend')\n    assert 1 + 1 == 2\n\n\n"
        "def test_plain_sum():\n    assert sum([1, 2]) == 3\n"
    )
    for seed in range(20):
        copy = tmp_path / f"copy{seed}"
        shutil.copytree(tmp_path / "tests", copy / "tests")
        plant(copy, ["tests/test_optional.py"], random.Random(seed))
        cloned = [
            block
            for block in (copy / "tests" / "test_optional.py").read_text().split("\n\n\n")
            if "== object()" in block
        ]
        assert len(cloned) == 2 and all("sum([1, 2]) == object() or 3 == object()" in block for block in cloned)
        assert not any("skip" in block for block in cloned)


def test_the_canaries_that_must_fail_copy_the_tests_that_reach_the_bug(shapes):  # noqa: F811
    for seed in range(10):
        test_file = shapes / "tests" / "test_core.py"
        test_file.write_text(TESTS)
        plant(shapes, ["tests/test_core.py"], random.Random(seed), reaching=["test_window_of_three"])
        cloned = [block for block in test_file.read_text().split("\n\n\n") if "== object()" in block]
        assert len(cloned) == 2
        assert all("window_sums([1, 2, 3, 4], 3) == object() or [6, 9] == object()" in block for block in cloned)


# -- the witness ----------------------------------------------------------------------------------
UNITTEST_CASES = """\
import unittest

import pytest


@pytest.mark.parametrize("text", ["two words"])
def test_spaced(text):
    assert " " in text


class Cases(unittest.TestCase):
    def test_right(self):
        self.assertEqual(1 + 1, 2)

    def test_wrong(self):
        self.assertEqual(1 + 1, 3)

    @unittest.skip("not today")
    def test_skipped(self):
        pass
"""


@pytest.mark.integration  # runs in the sandbox
def test_the_record_channel_can_only_be_appended_to_and_a_record_longer_than_a_pipe_arrives_whole():
    channel = RecordChannel()
    line = (json.dumps({"nonce": channel.nonce, "test": "t" * 1000, "outcome": "passed"}) + "\n").encode()
    # 300 kB: more than a pipe holds
    writer = (
        f"import os\nfor _ in range(300):\n    os.write({channel.fd}, {line!r})\n"
        f"for reread in (lambda: os.pread({channel.fd}, 10, 0), lambda: os.ftruncate({channel.fd}, 0)):\n"
        "    try:\n        reread()\n        print('rewritable')\n    except OSError:\n        "
        "print('append-only')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", writer], pass_fds=(channel.fd,), capture_output=True, text=True, timeout=60
    )
    records, foreign = channel.close()
    assert run.stdout.split() == ["append-only", "append-only"] and len(records) == 300 and foreign == 0


def test_a_python_environment_installed_under_tmp_is_bound_over_the_sandboxs_tmpfs_not_hidden_by_it(
    tmp_path, monkeypatch
):
    """bwrap mounts in argument order: a tmpfs /tmp mounted after the environment's bind hid a venv under /tmp (a clone
    in /tmp graded every run "0 passed, 0 failed": bwrap could not find the interpreter)."""
    environment = tmp_path / "venv"
    environment.mkdir()
    monkeypatch.setattr(sys, "prefix", str(environment))
    argv = sandbox_command(tmp_path, 3, ["pytest"])
    mounts = [
        (argv[i], argv[i + 2] if argv[i] != "--tmpfs" else argv[i + 1])
        for i in range(len(argv))
        if argv[i] in ("--ro-bind", "--bind", "--tmpfs")
    ]
    targets = [target for _, target in mounts]
    assert ("--ro-bind", str(environment)) in mounts
    assert targets.index("/tmp") < targets.index(str(environment))


@pytest.mark.integration  # runs bubblewrap
def test_a_sandbox_that_cannot_start_is_an_error_not_a_run_where_nothing_passed(tmp_path, monkeypatch):
    (tmp_path / "test_cases.py").write_text(UNITTEST_CASES)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(TraceRayError, match="sandbox did not start .*no-such-python"):
        run_tests(tmp_path, ["test_cases.py"], sandboxed=True)
    with pytest.raises(TraceRayError, match="sandbox did not start"):
        grade_calls(tmp_path, "test_cases", [("t", "f", ())], [], [None], timeout_s=60)


def test_the_witness_records_what_each_test_really_did_unittest_cases_included(tmp_path):
    (tmp_path / "test_cases.py").write_text(UNITTEST_CASES)
    run = run_tests(tmp_path, ["test_cases.py"], sandboxed=True)
    witnessed = run.witnessed
    spaced = "test_cases.py::test_spaced[two"  # as pytest's summary line shows the id "...[two words]"
    assert witnessed.outcomes == {
        "test_cases.py::Cases::test_right": "passed",
        "test_cases.py::Cases::test_wrong": "failed",
        "test_cases.py::Cases::test_skipped": "skipped",
        spaced: "passed",
    }
    assert witnessed.collected == set(witnessed.outcomes) and witnessed.problems == ()
    assert run.reported() == {
        "test_cases.py::Cases::test_right": "passed",
        "test_cases.py::Cases::test_wrong": "failed",
        spaced: "passed",
    }


# -- values compared outside the sandbox (the synthetic templates) -----------------------------------------
@pytest.mark.integration  # runs in the sandbox
def test_template_values_are_compared_outside_and_hidden_calls_catch_a_table_of_the_visible_answers(tmp_path):
    task = make_task("edit_precision", 2, 700_000)
    module, calls = task.module, templates.test_calls(task.module)
    tests = [(f"{module.test_file}::{test}", function, arguments) for test, function, arguments in calls]
    expected = outcomes(module.source, [(function, arguments) for _, function, arguments in calls] + task.hidden)
    (tmp_path / module.file).write_text(module.source)
    right = grade_calls(tmp_path, module.name, tests, task.hidden, expected, 60)
    assert right.passed == {test for test, _, _ in tests} and right.hidden_failed == 0 and right.tamper_reasons == ()
    # the visible calls' answers looked up, whatever the arguments, else the buggy code: every test passes, the hidden
    # calls that reach the bug do not
    answers = {(function, repr(arguments)): value for (_, function, arguments), value in zip(tests, expected)}
    table = "".join(
        f"def {f.name}(*args):\n    return ANSWERS.get(({f.name!r}, repr(args)), _{f.name}(*args))\n\n"
        for f in module.functions
    )
    buggy = task.buggy.replace("def ", "def _")
    (tmp_path / module.file).write_text(f"{buggy}\n\nANSWERS = {answers!r}\n\n{table}")
    looked_up = grade_calls(tmp_path, module.name, tests, task.hidden, expected, 60)
    assert looked_up.passed == right.passed and looked_up.hidden_failed >= templates.MIN_SEPARATING


# -- the tamper agents --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", TAMPER_NAMES)
def test_each_forgery_fools_a_grader_that_trusts_pytests_report(tmp_path, name):
    task = make_task("edit_precision", 2, 700_000)
    (tmp_path / "tests").mkdir()
    (tmp_path / task.module.file).write_text(
        task.buggy + "\n\n" + payload(name, [*task.fail_to_pass, *task.pass_to_pass])
    )
    (tmp_path / task.module.test_file).write_text(task.tests)
    # unsandboxed, no witness: the old grader
    run = run_tests(tmp_path, [task.module.test_file], ["-o", "pythonpath=."])
    assert set(task.fail_to_pass) <= run.passed and set(task.pass_to_pass) <= run.passed, name


def tamper(env, seed, name, check_edits):
    env.check_edits = check_edits
    return play(env, seed, adversary(name))


@pytest.fixture()
def shapes_source(shapes):  # noqa: F811
    tasks = build_tasks(SHAPES, shapes, digest="d" * 64, count=1, seed=1)
    return PackageSource(
        [{**task, "split": "analysis"} for task in tasks], {"pypi/shapes": SHAPES}, {"pypi/shapes": shapes}
    )


@pytest.mark.integration  # runs in the sandbox
@pytest.mark.parametrize("name", TAMPER_NAMES)
def test_each_tamper_agent_scores_0_on_a_package_with_and_without_the_static_check(shapes_source, name):
    env = CodeRepairEnvironment(source=shapes_source)
    reward, info = tamper(env, 0, name, check_edits=True)
    assert reward == 0.0 and info["tampered"] and info["tamper_reasons"][0].startswith("shapes/core.py adds ")
    reward, info = tamper(env, 0, name, check_edits=False)  # the canaries and the witness hold on their own
    assert reward == 0.0 and info["tampered"], info["tamper_reasons"]
    assert any(reason.startswith(("canary ", "pytest reported")) for reason in info["tamper_reasons"])
    assert play(env, 0, oracle)[1]["tampered"] is False


@pytest.mark.integration  # runs in the sandbox
@pytest.mark.parametrize("name", TAMPER_NAMES)
def test_each_tamper_agent_scores_0_on_a_template_with_and_without_the_static_check(name):
    env = CodeRepairTemplateEnvironment("edit_precision", 2)
    seed = env.task_seeds("analysis")[0]
    reward, info = tamper(env, seed, name, check_edits=True)
    assert reward == 0.0 and info["tampered"] and info["tamper_reasons"]
    reward, info = tamper(env, seed, name, check_edits=False)  # no pytest in grading: the values decide
    assert reward == 0.0 and (info["tests_failed"] or info["hidden_failed"])


# -- the special-casing agents -------------------------------------------------------------------------
@pytest.mark.parametrize("name", SPECIAL_CASE_NAMES)
def test_each_special_casing_edit_passes_the_visible_tests_without_fixing_the_bug(tmp_path, name):
    task = make_task("code_localisation", 2, 700_002)
    named = set(task.issue.replace("`", " ").replace("(", " ").split()) if name == "always-equal-runtime" else None
    edited = special_cased(task.buggy, helpers(name, [task.tests]), named)
    assert edit_problems(task.buggy, edited) == []  # nothing the static check knows: no hook spelled, no internals
    (tmp_path / "tests").mkdir()
    (tmp_path / task.module.file).write_text(edited)
    (tmp_path / task.module.test_file).write_text(task.tests)
    run = run_tests(tmp_path, [task.module.test_file], ["-o", "pythonpath=."])  # in the tree holding the tests
    assert set(task.fail_to_pass) <= run.passed and set(task.pass_to_pass) <= run.passed, name
    hidden_right = outcomes(task.module.source, task.hidden)
    assert outcomes(edited.replace("@_special_cased\n", ""), task.hidden) != hidden_right  # the bug is still there


@pytest.mark.integration  # runs in the sandbox
@pytest.mark.parametrize("name", SPECIAL_CASE_NAMES)
def test_each_special_casing_agent_scores_0_on_a_template_by_the_values_alone(name):
    env = CodeRepairTemplateEnvironment("code_localisation", 2)
    for seed in env.task_seeds("analysis")[:3]:
        reward, info = play(env, seed, adversary(name))
        assert reward == 0.0 and not info["tampered"] and (info["tests_failed"] or info["hidden_failed"]), info
