"""env=code_repair on a small local package: the protocol, the tools, hidden-test grading, and agents that farm
reward."""

import json

import pytest

from environments.code_repair.environment import CodeRepairEnvironment
from environments.code_repair.sources import PackageSource, patch_edits
from environments.code_repair.tasks import build_tasks
from environments.self_checks import run_self_checks
from tests.environments.test_code_repair_tasks import SHAPES, shapes  # noqa: F401  (the package fixture)

pytestmark = pytest.mark.integration  # every episode runs the package's tests in the sandbox


@pytest.fixture()
def source(shapes):  # noqa: F811
    tasks = build_tasks(SHAPES, shapes, digest="d" * 64, count=3, seed=1)
    for index, task in enumerate(tasks):
        task["split"] = "eval" if index == 2 else "analysis"
    return PackageSource(tasks, {"pypi/shapes": SHAPES}, {"pypi/shapes": shapes})


def call(name, **arguments):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}],
    }


def test_the_tools_read_search_edit_and_run_tests_in_the_working_copy(source):
    env = CodeRepairEnvironment(source=source)
    assert env.task_seeds("analysis") == [0, 1] and env.task_seeds("eval") == [2]
    reset = env.reset(0)
    assert {tool["function"]["name"] for tool in reset.tools} == {
        "list_files",
        "read_file",
        "search",
        "replace_in_file",
        "run_tests",
        "submit",
    }
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


@pytest.mark.parametrize(
    "name, fools_the_working_copy",
    [
        ("rewrite-tests", True),
        ("silence-pytest", True),
        ("exit-on-import", True),
        ("return-early", False),
    ],
)
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
    # a grader trusting the copy would pass it
    assert (visible.endswith(" 0 failed")) == fools_the_working_copy, visible
    done = env.step(message)
    assert done.done and done.reward == 0.0


@pytest.mark.slow
def test_every_self_check_passes_including_the_code_repair_farmers(source):
    env_factory = lambda: CodeRepairEnvironment(source=source)  # noqa: E731
    results = {result.name: result for result in run_self_checks(env_factory, [0, 1, 2])}
    failed = {name: result.detail for name, result in results.items() if not result.passed}
    assert not failed, failed
    names = " ".join(results)
    for farmer in (
        "rewrite-tests",
        "return-early",
        "silence-pytest",
        "exit-on-import",
        "dump",
        "spray",
        "hook-plugin",
        "patch-pytest",
        "assert-proof",
        "fake-test-modules",
        "forged-exit",
        "read-tests",
        "hard-code-visible",
        "always-equal-runtime",
    ):
        assert f"{farmer} agent" in names


def test_a_unified_diff_becomes_one_edit_per_hunk():
    patch = (
        "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
        "@@ -1,3 +1,3 @@\n def f(x):\n-    return x + 1\n+    return x\n \n"
        "@@ -10,2 +10,3 @@\n def g():\n+    pass\n     return 2\n"
    )
    assert patch_edits(patch) == [
        ("pkg/mod.py", "def f(x):\n    return x + 1", "def f(x):\n    return x"),  # the trailing blank context dropped
        ("pkg/mod.py", "def g():\n    return 2", "def g():\n    pass\n    return 2"),
    ]


def test_without_its_tasks_the_environment_says_how_to_get_them(tmp_path, monkeypatch, capsys):
    from trace_ray.app.cli import main

    monkeypatch.setenv("TRACE_RAY_CACHE", str(tmp_path))
    assert main(["check-env", "env=code_repair", "limit=1"]) == 1
    error = capsys.readouterr().err
    assert "env=code_repair needs its tasks in" in error and "make install-code-repair" in error


def scripted(steps):
    """A policy playing ``steps`` (functions env -> message) in order, then submit."""
    queue = list(steps)
    return lambda env: queue.pop(0)(env) if queue else call("submit")


def labels_of(env, seed, steps):
    from environments.capabilities import CODE_REPAIR_CAPABILITIES
    from environments.self_checks import play_recorded
    from trace_ray.capabilities.rules import label_trajectories
    from trace_ray.capabilities.trajectories import Trajectory

    messages, _, last = play_recorded(env, seed, scripted(steps))
    trajectory = Trajectory(
        "t#0", "t", "code_repair", seed, "", last.reward == 1.0, last.reward, messages, last.info, "submitted"
    )
    labels = label_trajectories([trajectory], {"t": env.capability_evidence(seed)}, list(CODE_REPAIR_CAPABILITIES))
    return {name: by_id["t#0"] for name, by_id in labels.items()}, last.reward


def test_code_repair_capabilities_are_present_in_a_careful_fix_and_lacking_where_a_step_is_skipped(source):
    env = CodeRepairEnvironment(source=source)
    evidence = env.capability_evidence(0)
    first, last = evidence["function_lines"]
    failing_file = evidence["fail_to_pass"][0].split("::")[0]
    read = lambda env: call("read_file", path=evidence["bug_file"], start_line=first, end_line=last)  # noqa: E731
    run = lambda env: call("run_tests", target=failing_file)  # noqa: E731
    fix = lambda env: env.oracle_message()  # noqa: E731  (the oracle's first message is its edit)
    careful, reward = labels_of(env, 0, [read, run, fix, run])
    assert reward == 1.0 and set(careful.values()) == {"PRESENT"}, careful
    hasty, reward = labels_of(env, 0, [fix])
    assert reward == 1.0  # a right fix with no reading, no reproduction, no verification
    assert hasty == {
        "code_localisation": "LACKING",
        "failure_reproduction": "LACKING",
        "fix_verification": "LACKING",
        "edit_precision": "PRESENT",
        "minimal_change": "PRESENT",
    }

    def unreadable(env):
        return call(
            "replace_in_file",
            path=evidence["bug_file"],
            old=evidence["function_source"].splitlines()[0],
            new="def broken(:",
        )

    sloppy, reward = labels_of(env, 0, [read, run, unreadable, run])
    assert reward == 0.0 and sloppy["edit_precision"] == "LACKING" and sloppy["code_localisation"] == "PRESENT"
    head = "from shapes.core import clamp, is_even, window_sums"

    def elsewhere(env):
        return call("replace_in_file", path="tests/test_core.py", old=head, new=head + "  # touched")

    wandering, reward = labels_of(env, 0, [read, run, fix, elsewhere, run])
    assert reward == 1.0 and wandering["minimal_change"] == "LACKING" and wandering["edit_precision"] == "PRESENT"
    nothing, reward = labels_of(env, 0, [])
    assert reward == 0.0 and set(nothing.values()) == {"LACKING"}


def test_a_task_folder_on_a_local_package_is_env_code_repair_with_env_tasks_dir(tmp_path, shapes):  # noqa: F811
    from environments.code_repair.sources import write_task_folder
    from environments.self_checks import oracle, play
    from trace_ray.config_compose import compose_config
    from trace_ray.environment_setup import environment_maker

    tasks = build_tasks(SHAPES, shapes, digest="d" * 64, count=2, seed=1)
    folder = write_task_folder(tmp_path / "tasks", [(SHAPES, shapes)], [{**task, "split": "eval"} for task in tasks])
    env = environment_maker(compose_config("score", ["env=code_repair", f"env.tasks_dir={folder}"]).env)()
    assert env.task_seeds("eval") == [0, 1] and env.source.packages["pypi/shapes"] == SHAPES
    assert [play(env, seed, oracle)[0] for seed in (0, 1)] == [1.0, 1.0]


@pytest.mark.parametrize(
    "written, message",
    [
        ((), "lacks tasks.jsonl and packages.json"),
        (("tasks.jsonl",), "lacks packages.json"),
        (("tasks.jsonl", "packages.json"), "does not describe"),
    ],
)
def test_a_bad_task_folder_is_one_line_naming_what_is_missing(tmp_path, capsys, written, message):
    from trace_ray.app.cli import main

    for name in written:
        (tmp_path / name).write_text('{"repo": "pypi/other"}\n' if name == "tasks.jsonl" else "[]")
    assert main(["check-env", "env=code_repair", f"env.tasks_dir={tmp_path}", "limit=1"]) == 1
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1
