"""Synthetic code-repair environments (synthesis=templates on env=code_repair): generated modules, seeded bugs, and the
capability each template's tasks need, shown by the oracle with that turn broken."""

import ast
import json
import random

import pytest

from environments.code_repair.environment import CodeRepairEnvironment
from environments.code_repair.sources import PackageSource
from environments.code_repair.synthetic import CodeRepairTemplateEnvironment
from environments.code_repair.synthetic_templates import (
    DIFFICULTIES,
    MIN_SEPARATING,
    TEMPLATES,
    Edit,
    function_span,
    hidden_checks,
    make_task,
    outcomes,
)
from environments.code_repair.synthetic_templates import test_calls as calls_of_tests
from environments.self_checks import oracle, play, play_broken_oracle, run_self_checks
from environments.synthetic.factory import target_templates, template_environment
from tests.environments.test_code_repair_tasks import SHAPES, shapes  # noqa: F401  (the package fixture: the target's tools)

SEEDS = range(12)


def replaced(task, moves):
    source = task.buggy
    for tool, arguments in moves:
        if tool == "submit":
            break
        if tool == "replace_in_file":
            source = Edit(arguments["old"], arguments["new"]).apply(source)
    return source


def broken_moves(task):
    return [task.broken if turn == task.capability_turn else move for turn, move in enumerate(task.oracle)]


def failing_tests(task, source):
    """Run the generated test file's assertions against ``source`` in process (the tests are this project's own)."""
    namespace = {}
    exec(compile(task.module.source, "<correct>", "exec"), namespace)
    failed = []
    for node in ast.parse(task.tests).body:
        if isinstance(node, ast.FunctionDef):
            call = node.body[0].test.left
            got = outcomes(source, [(call.func.id, tuple(ast.literal_eval(arg) for arg in call.args))])[0]
            if got != ast.literal_eval(node.body[0].test.comparators[0]):
                failed.append(f"{task.module.test_file}::{node.name}")
    return failed


@pytest.mark.parametrize("capability", sorted(TEMPLATES))
@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_each_task_has_a_real_bug_that_the_oracle_fixes_and_the_broken_turn_leaves(capability, difficulty):
    for seed in SEEDS:
        task = make_task(capability, difficulty, seed)
        assert make_task(capability, difficulty, seed).buggy == task.buggy  # seeded
        assert task.fail_to_pass and task.pass_to_pass
        assert sorted(failing_tests(task, task.buggy)) == sorted(task.fail_to_pass)
        assert failing_tests(task, replaced(task, task.oracle)) == []
        assert replaced(task, task.oracle) == task.module.source
        assert failing_tests(task, replaced(task, broken_moves(task))), (capability, seed)
        assert task.module.file not in task.issue or capability == "failure_reproduction"
        assert "line" not in task.issue.lower()


@pytest.mark.parametrize("capability", sorted(TEMPLATES))
def test_the_hidden_calls_tell_every_wrong_state_from_the_fix_and_are_none_of_the_visible_ones(capability):
    for seed in SEEDS:
        task = make_task(capability, 2, seed)
        visible = {(function, repr(arguments)) for _, function, arguments in calls_of_tests(task.module)}
        assert not visible & {(function, repr(arguments)) for function, arguments in task.hidden}
        right = outcomes(task.module.source, task.hidden)
        # the buggy module, and (two bugs) the module with only the first one fixed
        fixes = [move for move in task.oracle if move[0] == "replace_in_file"]
        for wrong in [replaced(task, fixes[:count]) for count in range(len(fixes))]:
            told = sum(got != want for got, want in zip(outcomes(wrong, task.hidden), right))
            assert told >= MIN_SEPARATING, (capability, seed)
        assert {function for function, _ in task.hidden} == {function.name for function in task.module.functions}


def test_a_module_the_hidden_calls_cannot_tell_from_the_fix_is_no_task():
    task = make_task("edit_precision", 1, 0)
    assert hidden_checks(task.module, [task.buggy], random.Random(0))
    renamed = task.module.source.replace('"""', "# ", 1).replace('"""', "", 1)  # the same functions, other text
    assert hidden_checks(task.module, [renamed], random.Random(0)) is None


def test_the_broken_moves_are_the_capabilitys_absence():
    for seed in SEEDS:
        task = make_task("code_localisation", 2, seed)  # a look-alike edited; the buggy function untouched
        first, last = function_span(task.buggy, next(f.name for f in task.module.functions if f.name in task.issue))
        old = task.broken[1]["old"]
        assert old in task.buggy and old not in "\n".join(task.buggy.splitlines()[first - 1 : last])
        family = [f.family for f in task.module.functions if f.name in task.issue][0]
        assert sum(f.family is family for f in task.module.functions) >= 3

        # the issue gives no expected value; the oracle runs the tests first
        task = make_task("failure_reproduction", 2, seed)
        assert "should return" not in task.issue and task.oracle[0][0] == "run_tests"
        assert task.broken[0] == "replace_in_file"

        task = make_task("fix_verification", 2, seed)  # the first fix alone still fails; the broken move submits there
        edits = [move for move in task.oracle if move[0] == "replace_in_file"]
        assert len(edits) == 2 and failing_tests(task, replaced(task, edits[:1]))
        assert task.oracle[task.capability_turn][0] == "run_tests" and task.broken == ("submit", {})

        # the fix restores a dropped branch; mistyped, the file stops parsing
        task = make_task("edit_precision", 2, seed)
        assert task.oracle[task.capability_turn][1]["new"].count("\n") >= 1
        with pytest.raises(SyntaxError):
            compile(replaced(task, broken_moves(task)), "<mistyped>", "exec")

        task = make_task("minimal_change", 2, seed)  # the rewrite spans the buggy function and its neighbour
        assert task.broken[1]["old"].count("\ndef ") == 1


def test_templates_are_registered_for_the_code_repair_target():
    assert (
        set(target_templates("code_repair"))
        == set(TEMPLATES)
        == {"code_localisation", "failure_reproduction", "fix_verification", "edit_precision", "minimal_change"}
    )
    env = template_environment("code_repair", "fix_verification", 1)
    assert env.name == "synthetic/fix_verification" and env.task_seeds("eval")[0] not in env.task_seeds("analysis")
    assert env.train_seed(3) not in env.task_seeds("analysis") + env.task_seeds("eval")
    with pytest.raises(ValueError, match="templates: code_localisation"):
        CodeRepairTemplateEnvironment("datetime_reasoning", 1)
    with pytest.raises(ValueError, match="difficulty 9"):
        CodeRepairTemplateEnvironment("edit_precision", 9)


@pytest.mark.integration  # test runs in the sandbox
def test_an_episode_in_the_sandbox_oracle_1_broken_turn_0_and_the_tools_see_the_generated_module():
    env = CodeRepairTemplateEnvironment("failure_reproduction", 1)
    seed = env.task_seeds("analysis")[0]
    reset = env.reset(seed)
    task = env.task["synthetic"]
    assert task.issue in reset.messages[1]["content"] and "Python module" in reset.messages[0]["content"]
    listed = env.step(oracle_call("list_files", {})).messages[0]["content"].splitlines()
    assert listed == sorted([task.module.file, task.module.test_file])
    run = env.step(oracle_call("run_tests", {"target": task.module.test_file})).messages[0]["content"]
    assert run.startswith(f"{len(task.pass_to_pass)} passed, {len(task.fail_to_pass)} failed")
    reward, info = play(env, seed, oracle)
    assert reward == 1.0 and info["tests_failed"] == [] and info["model_patch"].startswith(f"--- a/{task.module.file}")
    reward, info = play_broken_oracle(env, seed)
    assert reward == 0.0 and info["tests_failed"]


def oracle_call(name, arguments):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}],
    }


@pytest.mark.slow
@pytest.mark.parametrize("capability", sorted(TEMPLATES))
def test_every_self_check_passes_for_every_template(capability, shapes):  # noqa: F811
    from environments.code_repair.tasks import build_tasks

    target = CodeRepairEnvironment(
        source=PackageSource(
            build_tasks(SHAPES, shapes, digest="d" * 64, count=1, seed=1),
            {"pypi/shapes": SHAPES},
            {"pypi/shapes": shapes},
        )
    )
    make = lambda: CodeRepairTemplateEnvironment(capability, 2)  # noqa: E731
    seeds = make().task_seeds("analysis")[:2]
    results = run_self_checks(make, seeds, target_tools=target.reset(0).tools)
    assert [result for result in results if not result.passed] == []
    assert "capability necessary (broken step scores < 1.0)" in [result.name for result in results]
