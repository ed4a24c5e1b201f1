"""env=code_repair on a small local package: the protocol, the tools, hidden-test grading, and agents that farm reward."""

import json

import pytest

from environments.code_repair.environment import CodeRepairEnvironment, TaskSource, unique_edit
from environments.code_repair.tasks import build_tasks
from environments.self_checks import run_self_checks
from tests.test_code_repair_tasks import SHAPES, shapes  # noqa: F401  (the package fixture)


@pytest.fixture()
def source(shapes):  # noqa: F811
    tasks = build_tasks(SHAPES, shapes, digest="d" * 64, count=3, seed=1)
    for index, task in enumerate(tasks):
        task["split"] = "eval" if index == 2 else "analysis"
    return TaskSource(tasks, {"pypi/shapes": SHAPES}, {"pypi/shapes": shapes})


def call(name, **arguments):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def test_the_tools_read_search_edit_and_run_tests_in_the_working_copy(source):
    env = CodeRepairEnvironment(source=source)
    assert env.task_seeds("analysis") == [0, 1] and env.task_seeds("eval") == [2]
    reset = env.reset(0)
    assert {tool["function"]["name"] for tool in reset.tools} == {"list_files", "read_file", "search", "replace_in_file", "run_tests", "submit"}
    assert "Running" in reset.messages[1]["content"] and "core.py" not in reset.messages[1]["content"]
    listed = env.step(call("list_files")).messages[0]["content"]
    assert "shapes/core.py" in listed.splitlines() and "tests/test_core.py" in listed.splitlines()
    read = env.step(call("read_file", path="shapes/core.py", start_line=1, end_line=2)).messages[0]["content"]
    assert read.startswith("1: def clamp(value, low, high):") and read.count("\n") == 1
    assert "shapes/core.py:1:" in env.step(call("search", pattern="def clamp")).messages[0]["content"]
    assert "shapes/core.py" in env.step(call("search", pattern=r"def \w+\(", regex=True)).messages[0]["content"]
    refused = env.step(call("replace_in_file", path="shapes/core.py", old="return", new="yield")).messages[0]["content"]
    assert refused.startswith("Error: the snippet occurs") and "exactly once" in refused
    outside = env.step(call("read_file", path="../../etc/passwd")).messages[0]["content"]
    assert "outside the repository" in outside
    tests = env.step(call("run_tests", target="tests/test_core.py")).messages[0]["content"]
    assert tests.splitlines()[0].endswith("failed") and "0 failed" not in tests.splitlines()[0]  # the bug shows


def test_the_oracle_fixes_the_bug_and_scores_1_and_doing_nothing_scores_0(source):
    env = CodeRepairEnvironment(source=source)
    for seed in env.task_seeds("analysis") + env.task_seeds("eval"):
        env.reset(seed)
        first = env.step(env.oracle_message())
        assert first.messages[0]["content"].startswith("replaced 1 snippet") and not first.done
        done = env.step(env.oracle_message())
        assert done.done and done.reward == 1.0 and done.info["termination"] == "submitted" and done.info["success"]
        env.reset(seed)
        nothing = env.step({"role": "assistant", "content": "I fixed it."})
        assert nothing.done and nothing.reward == 0.0 and nothing.info["tests_failed"]


@pytest.mark.parametrize("name, fools_the_working_copy", [
    ("rewrite-tests", True), ("silence-pytest", True), ("exit-on-import", True), ("return-early", False),
])
def test_each_farmer_really_edits_and_still_scores_0(source, name, fools_the_working_copy):
    from environments.code_repair.adversaries import adversary

    env, policy = CodeRepairEnvironment(source=source), adversary(name)
    env.reset(0)
    while True:
        message = policy(env)
        if message["tool_calls"][0]["function"]["name"] == "submit":
            break
        assert env.step(message).messages[0]["content"].startswith("replaced"), name
    visible = env.step(call("run_tests")).messages[0]["content"].splitlines()[0]
    assert (visible.endswith(" 0 failed")) == fools_the_working_copy, visible  # a grader trusting the copy would pass it
    done = env.step(message)
    assert done.done and done.reward == 0.0


@pytest.mark.slow
def test_every_self_check_passes_including_the_code_repair_farmers(source):
    env_factory = lambda: CodeRepairEnvironment(source=source)  # noqa: E731
    results = {result.name: result for result in run_self_checks(env_factory, [0, 1, 2])}
    failed = {name: result.detail for name, result in results.items() if not result.passed}
    assert not failed, failed
    names = " ".join(results)
    for farmer in ("rewrite-tests", "return-early", "silence-pytest", "exit-on-import", "dump", "spray"):
        assert f"{farmer} agent" in names


def test_unique_edit_widens_the_snippet_until_it_occurs_once():
    text = "a = 1\nb = 2\na = 1\nc = 3\n"
    old, new = unique_edit(text, text.index("c"), text.index("c") + 1, "d")
    assert (old, new) == ("c = 3", "d = 3")
    start = text.rindex("a = 1")
    old, new = unique_edit(text, start + 4, start + 5, "9")
    assert text.count(old) == 1 and new == old.replace("a = 1", "a = 9")


def test_without_its_tasks_the_environment_says_how_to_get_them(tmp_path, monkeypatch, capsys):
    from trace_ray.cli import main

    monkeypatch.setenv("TRACE_RAY_CACHE", str(tmp_path))
    assert main(["check-env", "env=code_repair", "limit=1"]) == 1
    error = capsys.readouterr().err
    assert "env=code_repair needs its tasks in" in error and "make install-code-repair" in error
