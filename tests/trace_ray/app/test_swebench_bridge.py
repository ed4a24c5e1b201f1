"""env=swebench: an instance in SWE-bench's schema, built here from a local repository, loads and grades."""

import difflib
import json
import subprocess

import pytest

from environments.code_repair.adversaries import adversary
from environments.self_checks import do_nothing, oracle, play
from tests.environments.test_code_repair_tasks import MODULE, TESTS
from trace_ray.app.cli import main
from trace_ray.config_compose import compose_config
from trace_ray.environment_setup import environment_maker

pytestmark = pytest.mark.integration  # every episode runs the repository's tests in the sandbox

BUGGY = MODULE.replace("return number % 2 == 0", "return number % 2 == 1")
VISIBLE_TESTS = TESTS.split("\n\ndef test_even")[0] + "\n"
HIDDEN_TEST = "from shapes.core import is_even\n\n\ndef test_even():\n    assert is_even(4) and not is_even(7)\n"


def diff(path, before, after):
    old = f"a/{path}" if before else "/dev/null"
    return "".join(
        difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), old, f"b/{path}")
    )


@pytest.fixture()
def instance(tmp_path):
    """(instances file, repos dir) of one instance: is_even broken, its test in the hidden test_patch."""
    repo = tmp_path / "repos" / "local__shapes"
    (repo / "shapes").mkdir(parents=True)
    (repo / "shapes" / "__init__.py").write_text("")
    (repo / "shapes" / "core.py").write_text(BUGGY)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_core.py").write_text(VISIBLE_TESTS)

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "buggy")
    visible = ["test_clamp_inside", "test_clamp_low", "test_clamp_high", "test_window_sums", "test_window_of_three"]
    record = {
        "instance_id": "local__shapes-1",
        "repo": "local/shapes",
        "base_commit": git("rev-parse", "HEAD"),
        "problem_statement": "is_even(4) returns False.",
        "patch": diff("shapes/core.py", BUGGY, MODULE),
        "test_patch": diff("tests/test_even.py", "", HIDDEN_TEST),
        "version": "1.0",
        "FAIL_TO_PASS": json.dumps(["tests/test_even.py::test_even"]),  # the official files hold JSON strings
        "PASS_TO_PASS": json.dumps([f"tests/test_core.py::{name}" for name in visible]),
    }
    instances = tmp_path / "instances.jsonl"
    instances.write_text(json.dumps(record) + "\n")
    return instances, tmp_path / "repos"


def make(instances, repos):
    config = compose_config("check-env", ["env=swebench", f"env.instances={instances}", f"env.repos_dir={repos}"])
    return environment_maker(config.env)()


def test_an_instance_loads_hides_its_test_patch_and_grades_the_gold_patch_1_and_nothing_0(instance):
    env = make(*instance)
    assert env.name == "swebench" and env.task_seeds("eval") == [0]
    reset = env.reset(0)
    assert "is_even(4) returns False." in reset.messages[1]["content"] and "repository" in reset.messages[0]["content"]
    assert not (env.workdir / "tests" / "test_even.py").exists()  # the test_patch is the grader's alone
    reward, info = play(env, 0, oracle)
    assert reward == 1.0 and info["instance_id"] == "local__shapes-1"
    assert "-    return number % 2 == 1\n+    return number % 2 == 0" in info["model_patch"]  # a SWE-bench prediction
    assert play(env, 0, do_nothing)[0] == 0.0
    assert play(env, 0, adversary("rewrite-tests"))[0] == 0.0
    evidence = env.capability_evidence(0)
    assert (evidence["bug_file"], evidence["bug_function"]) == ("shapes/core.py", "is_even")


def test_a_checkout_at_another_commit_or_a_missing_one_is_a_one_line_error(instance, capsys, tmp_path):
    instances, repos = instance
    record = json.loads(instances.read_text())
    instances.write_text(json.dumps({**record, "base_commit": "0" * 40}) + "\n")
    assert main(["check-env", "env=swebench", f"env.instances={instances}", f"env.repos_dir={repos}"]) == 1
    assert "is at commit" in capsys.readouterr().err
    assert main(["check-env", "env=swebench", f"env.instances={instances}", f"env.repos_dir={tmp_path / 'none'}"]) == 1
    assert "no checkout for local__shapes-1" in capsys.readouterr().err
    assert main(["check-env", "env=swebench"]) == 1
    assert "env.instances=FILE.jsonl" in capsys.readouterr().err
