"""Synthetic capability environments on the code-repair target (``synthesis=templates`` for env=code_repair).

A :class:`CodeRepairTemplateEnvironment` is the code-repair environment (the
same tools, policy, sandboxed test runs and hidden-test grading, Pass@1)
whose tasks come from one capability's template
(``environments/code_repair/synthetic_templates.py``) at one difficulty: a
generated module with a seeded bug and its pytest file. Grading runs no
pytest: in a copy without the test files, the sandbox records what each
test's call and each of the task's hidden calls (inputs found when the task
was built on which the bug and the fix differ, never shown to the agent)
returns, and the values are compared here, outside it
(``grading.grade_calls``). The oracle plays the
template's moves; ``capability_turns``/``broken_step`` give the self-checks
the turn that needs the capability and the move made without it.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

from environments.code_repair.environment import CodeRepairEnvironment
from environments.code_repair.grading import Grade, grade_calls
from environments.code_repair.sources import TaskSource
from environments.code_repair.synthetic_templates import (
    TEMPLATES,
    SyntheticTask,
    make_task,
    outcomes,
    test_calls,
)
from environments.protocol import Message, tool_call_message
from environments.synthetic.seeds import TemplateSeeds

SPLIT_SEEDS = {"analysis": tuple(range(700_000, 700_032)), "eval": tuple(range(700_032, 700_064))}
TRAIN_SEED_OFFSET = 4_000_000
PYTEST_ARGS = ("-o", "pythonpath=.")  # the module sits at the root; the tests import it from there


@lru_cache(maxsize=512)
def cached_task(capability: str, difficulty: int, seed: int) -> SyntheticTask:
    return make_task(capability, difficulty, seed)


def instance(task: SyntheticTask, seed: int) -> dict:
    """The task in SWE-bench's instance fields (what the code-repair environment reads), plus the template's script."""
    digest = hashlib.sha256((task.buggy + task.tests).encode()).hexdigest()
    return {
        "instance_id": f"synthetic__{task.capability}-{seed}",
        "repo": f"synthetic/{task.module.name}",
        "base_commit": digest,
        "problem_statement": task.issue,
        "patch": "",
        "test_patch": "",
        "split": "train",
        "family": f"synthetic/{task.capability}",
        "FAIL_TO_PASS": task.fail_to_pass,
        "PASS_TO_PASS": task.pass_to_pass,
        "synthetic": task,
    }


class GeneratedSource(TaskSource):
    """Generated modules: the original tree (the correct module and its tests) written once per task to a scratch
    folder."""

    kind = "module"

    def __init__(self) -> None:
        self.tasks = []
        self._scratch = tempfile.TemporaryDirectory(prefix="code-repair-synthetic-")

    def original(self, task: dict) -> Path:
        root = Path(self._scratch.name) / task["instance_id"]
        if not root.is_dir():
            synthetic: SyntheticTask = task["synthetic"]
            staging = root.with_name(root.name + ".partial")
            (staging / "tests").mkdir(parents=True, exist_ok=True)
            (staging / synthetic.module.file).write_text(synthetic.module.source, encoding="utf-8")
            (staging / synthetic.module.test_file).write_text(synthetic.tests, encoding="utf-8")
            staging.rename(root)
        return root

    def prepare(self, task: dict, workdir: Path) -> None:
        synthetic: SyntheticTask = task["synthetic"]
        (workdir / synthetic.module.file).write_text(synthetic.buggy, encoding="utf-8")

    def buggy_text(self, task: dict, relative: str) -> str:
        synthetic: SyntheticTask = task["synthetic"]
        return synthetic.buggy if relative == synthetic.module.file else super().buggy_text(task, relative)

    def test_paths(self, task: dict) -> list[str]:
        return [task["synthetic"].module.test_file]

    def pytest_args(self, task: dict) -> list[str]:
        return list(PYTEST_ARGS)

    def is_test(self, task: dict, relative: str) -> bool:
        return relative.startswith("tests/")

    def before_grading(self, task: dict, graded: Path) -> None:
        """The test files leave the graded tree: the code under test cannot read the visible answers there."""
        shutil.rmtree(graded / "tests")

    def grade(self, task: dict, graded: Path, timeout_s: float) -> Grade:
        """Every test's call and the task's hidden calls, run in the sandbox; the values compared here with the correct
        module's (see ``grading.py``)."""
        synthetic: SyntheticTask = task["synthetic"]
        module, hidden = synthetic.module, synthetic.hidden
        tests = [
            (f"{module.test_file}::{test}", function, arguments) for test, function, arguments in test_calls(module)
        ]
        expected = outcomes(module.source, [(function, arguments) for _, function, arguments in tests] + hidden)
        return grade_calls(graded, module.name, tests, hidden, expected, timeout_s)


class CodeRepairTemplateEnvironment(TemplateSeeds, CodeRepairEnvironment):
    split_seeds, train_seed_offset = SPLIT_SEEDS, TRAIN_SEED_OFFSET

    def __init__(
        self,
        capability: str,
        difficulty: int,
        max_turns: int = 50,
        max_tool_calls_per_turn: int = 8,
        success_threshold: float = 1.0,
    ):
        if capability not in TEMPLATES:
            raise ValueError(
                f"no code_repair template for capability {capability!r}; templates: {', '.join(sorted(TEMPLATES))}"
            )
        template = TEMPLATES[capability]
        if difficulty not in template.difficulties:
            raise ValueError(f"difficulty {difficulty} of {capability!r} is not one of {list(template.difficulties)}")
        super().__init__(max_turns, max_tool_calls_per_turn, success_threshold, source=GeneratedSource())
        self.capability, self.difficulty = capability, difficulty
        self.name = f"synthetic/{capability}"

    def task_for(self, seed: int) -> dict:
        return instance(cached_task(self.capability, self.difficulty, seed), seed)

    def task_fingerprint(self) -> str:
        return self.task["base_commit"][:32]

    def oracle_message(self) -> Message:
        script = self.task["synthetic"].oracle
        step, self._oracle_step = self._oracle_step, self._oracle_step + 1
        tool, arguments = script[min(step, len(script) - 1)]
        return tool_call_message(tool, arguments, f"call_{step}_0")

    def capability_turns(self) -> list[int]:
        return [self.task["synthetic"].capability_turn]

    def broken_step(self, turn: int) -> Message | None:
        synthetic: SyntheticTask = self.task["synthetic"]
        if turn != synthetic.capability_turn:
            return None
        tool, arguments = synthetic.broken
        return tool_call_message(tool, arguments, f"call_{turn}_0")

    def capability_detectors(self) -> list[str]:
        return []

    def capability_evidence(self, seed: int) -> dict:
        return {}
