"""``env=code_repair`` and ``env=swebench``: fix a bug from an issue text, graded by the repository's hidden test
verdict.

Each task (SWE-bench's instance schema) comes from a :class:`TaskSource`
(``sources.py``): one of the pinned packages with one injected bug
(``code_repair``), or an official SWE-bench instance with a local checkout
(``swebench``). On ``reset`` the agent gets a working copy with the bug, the
issue text, and tools to list files, read a line range, search (fixed string
or regex), replace a unique snippet in a file, run the repository's visible
tests (sandboxed, output truncated) and submit. The episode ends on
``submit`` or a plain-text reply.

Grading never trusts the working copy: a fresh copy of the original tree
receives the agent's version of each of its source files (files the agent
added, test files, ``conftest.py`` and configuration are left out). An edit
that adds code reaching the grading machinery (``edit_check.py``) is refused
unrun. Otherwise the task's ``test_patch`` if any is applied and the source
grades the copy (``TaskSource.grade``, see ``grading.py``): every
``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test runs in the sandbox, with
canaries and a witness that code under test cannot decide; a package task's
working copy lacks part of its failing tests (held out, graded), and its
differential checks, where it has them, run in a copy without the test files
with their values compared outside the sandbox. Reward 1.0 when all pass and
nothing shows tampering (Pass@1), else 0; ``info`` lists the
tests that failed, whether the run was ``tampered`` and why
(``tamper_reasons``), and holds the agent's ``model_patch`` (a unified diff,
as SWE-bench predictions carry it).
"""

from __future__ import annotations

import difflib
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from environments.capabilities import CODE_REPAIR_CAPABILITIES
from environments.code_repair.adversaries import NAMES as ADVERSARY_NAMES
from environments.code_repair.adversaries import adversary
from environments.code_repair.edit_check import edit_problems
from environments.code_repair.grading import Grade
from environments.code_repair.mutations import iter_functions
from environments.code_repair.sources import PackageSource, SWEBenchSource, TaskSource, patch_edits, patch_files
from environments.code_repair.tasks import run_tests
from environments.protocol import Message, StepResult, tool_call_message
from environments.tool_environment import Tool, ToolEnvironment, ToolError

SPLITS = ("analysis", "eval")
READ_LINES = 80  # lines read_file returns when no end is given
MAX_READ_LINES = 200
MAX_MATCHES = 40
MAX_OUTPUT_CHARS = 3000
TEST_TIMEOUT_S = 120
POLICY = (
    "You are a software engineer fixing a bug in a Python {kind}. The {kind} is checked out in your working "
    "directory. Read the issue, find the code that causes it, fix it with replace_in_file, run the tests that show "
    "the problem, and call submit when the fix is done. Change as little as possible and do not edit the tests."
)
HUNK = re.compile(r"^@@ -(\d+)")


class CodeRepairEnvironment(ToolEnvironment):
    name = "code_repair"
    check_edits = True  # the static check of the agent's edits (edit_check.py); off only to measure the other layers

    def __init__(
        self,
        max_turns: int = 50,
        max_tool_calls_per_turn: int = 8,
        success_threshold: float = 1.0,
        source: TaskSource | None = None,
        tasks_dir: str | None = None,
    ):
        super().__init__(max_turns=max_turns, max_tool_calls_per_turn=max_tool_calls_per_turn)
        self.success_threshold = success_threshold
        self.source = source or (PackageSource.from_folder(tasks_dir) if tasks_dir else PackageSource.from_cache())
        self.by_seed = dict(enumerate(self.source.tasks))
        self.task: dict | None = None
        self.workdir: Path | None = None
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._before_edits: dict[str, str] = {}  # file -> its text before the agent's first edit of it
        self._oracle_step = 0

    # -- tasks ------------------------------------------------------------------------------
    def task_seeds(self, split: str) -> list[int]:
        if split not in SPLITS:
            raise ValueError(
                f"split must be one of {', '.join(SPLITS)} (train seeds come from train_seed), got {split!r}"
            )
        return [seed for seed, task in self.by_seed.items() if task["split"] == split]

    def train_seed(self, index: int) -> int:
        replayed = self.task_seeds("analysis") or self.task_seeds("eval")
        return replayed[index % len(replayed)]  # the analysis tasks replayed

    def task_for(self, seed: int) -> dict:
        if seed not in self.by_seed:
            raise ValueError(f"no {self.name} task with seed {seed} ({len(self.by_seed)} tasks)")
        return self.by_seed[seed]

    def task_fingerprint(self) -> str:
        return f"{self.task['instance_id']}:{self.task['base_commit'][:16]}"

    # -- the episode --------------------------------------------------------------------------
    def start_episode(self, seed: int) -> tuple[list[Message], list[Tool], dict[str, Any]]:
        self.task = self.task_for(seed)
        self._scratch = tempfile.TemporaryDirectory(prefix="code-repair-")
        self.workdir = Path(self._scratch.name) / "repo"
        shutil.copytree(self.source.original(self.task), self.workdir, symlinks=True)
        self.source.prepare(self.task, self.workdir)
        self._before_edits, self._oracle_step = {}, 0
        request = f"Please fix this issue in {self.task['repo']}:\n\n{self.task['problem_statement']}"
        messages = [
            {"role": "system", "content": POLICY.format(kind=self.source.kind)},
            {"role": "user", "content": request},
        ]
        tools = [
            Tool(
                "list_files",
                "List the files under a directory of the repository.",
                {"type": "object", "properties": {"directory": {"type": "string"}}},
                self._list_files,
            ),
            Tool(
                "read_file",
                f"Read lines of a file (numbered; at most {MAX_READ_LINES} at once).",
                {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "start_line": {"type": "integer"},
                        "end_line": {"type": "integer"},
                    },
                    "required": ["path"],
                },
                self._read_file,
            ),
            Tool(
                "search",
                "Search the repository's Python files for a string (or a regular expression with regex=true).",
                {
                    "type": "object",
                    "properties": {"pattern": {"type": "string"}, "regex": {"type": "boolean"}},
                    "required": ["pattern"],
                },
                self._search,
            ),
            Tool(
                "replace_in_file",
                "Replace a snippet that occurs exactly once in a file with new text.",
                {
                    "type": "object",
                    "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["path", "old", "new"],
                },
                self._replace,
            ),
            Tool(
                "run_tests",
                "Run the repository's tests, or one test file or test id; shows the end of pytest's output.",
                {"type": "object", "properties": {"target": {"type": "string"}}},
                self._run_tests,
            ),
            Tool("submit", "Submit the fix; the episode ends.", {"type": "object", "properties": {}}, self._submit),
        ]
        task = self.task
        return (
            messages,
            tools,
            {
                "task_id": task["instance_id"],
                "family": task.get("family", task["repo"]),
                "seed": seed,
                "instance_id": task["instance_id"],
                "repo": task["repo"],
            },
        )

    def on_agent_reply(self, text: str) -> tuple[list[Message], bool]:
        return [], True  # the agent is done: a reply ends the episode as submit does

    def step(self, assistant_message: Message) -> StepResult:
        result = super().step(assistant_message)
        if not result.done and any(
            call.name == "submit" and call.ok for call in self.log.tool_calls if call.turn == self.log.turns
        ):
            result = self.end_early(result, "submitted")
        if result.done and self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
        return result

    # -- tools --------------------------------------------------------------------------------
    def _path(self, relative: str) -> Path:
        path = (self.workdir / relative).resolve()
        if path != self.workdir.resolve() and self.workdir.resolve() not in path.parents:
            raise ToolError(f"{relative!r} is outside the repository; use a path relative to its root")
        return path

    def _list_files(self, directory: str = ".") -> str:
        folder = self._path(directory)
        if not folder.is_dir():
            raise ToolError(f"no directory {directory!r}; list_files() shows the root")
        files = sorted(
            p.relative_to(self.workdir).as_posix()
            for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and ".git" not in p.parts
        )
        return "\n".join(files[:300]) + (f"\n... {len(files) - 300} more" if len(files) > 300 else "")

    def _read_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        file = self._path(path)
        if not file.is_file():
            raise ToolError(f"no file {path!r}; list_files() shows the files")
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
        start = max(start_line, 1)
        end = min(end_line or start + READ_LINES - 1, start + MAX_READ_LINES - 1, len(lines))
        if start > len(lines):
            raise ToolError(f"{path} has {len(lines)} lines; start_line {start_line} is past its end")
        return "\n".join(f"{number}: {lines[number - 1]}" for number in range(start, end + 1))

    def _search(self, pattern: str, regex: bool = False) -> str:
        try:
            matcher = re.compile(pattern if regex else re.escape(pattern))
        except re.error as exc:
            raise ToolError(f"bad regular expression ({exc}); send regex=false to search for the text itself") from None
        matches = []
        for file in sorted(self.workdir.rglob("*.py")):
            if ".git" in file.parts:
                continue
            for number, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if matcher.search(line):
                    matches.append(f"{file.relative_to(self.workdir).as_posix()}:{number}: {line.strip()}")
        if not matches:
            return f"no match for {pattern!r}"
        return "\n".join(matches[:MAX_MATCHES]) + (
            f"\n... {len(matches) - MAX_MATCHES} more" if len(matches) > MAX_MATCHES else ""
        )

    def _replace(self, path: str, old: str, new: str) -> str:
        file = self._path(path)
        if not file.is_file():
            raise ToolError(f"no file {path!r}; list_files() shows the files")
        text = file.read_text(encoding="utf-8")
        count = text.count(old) if old else 0
        if count != 1:
            raise ToolError(
                f"the snippet occurs {count} times in {path}; send a snippet that occurs exactly once (add "
                "lines around it)"
            )
        updated = text.replace(old, new, 1)
        self._before_edits.setdefault(file.relative_to(self.workdir.resolve()).as_posix(), text)
        file.write_text(updated, encoding="utf-8")
        try:
            compile(updated, path, "exec")
        except SyntaxError as exc:
            return f"replaced; {path} no longer parses ({exc.msg}, line {exc.lineno})"
        return f"replaced 1 snippet in {path}"

    def _run_tests(self, target: str = "") -> str:
        if target:
            self._path(target.split("::")[0])
            paths = [target]
        else:  # the visible ones (a SWE-bench test_patch adds files the agent does not see)
            paths = [path for path in self.source.test_paths(self.task) if (self.workdir / path).exists()]
        run = run_tests(self.workdir, paths, self.source.pytest_args(self.task), TEST_TIMEOUT_S, sandboxed=True)
        if run.timed_out:
            return f"the tests did not finish within {TEST_TIMEOUT_S} s"
        return f"{len(run.passed)} passed, {len(run.failed)} failed\n{run.output[-MAX_OUTPUT_CHARS:]}"

    def _submit(self) -> str:
        return "submitted"

    # -- grading ------------------------------------------------------------------------------
    def model_patch(self) -> str:
        """The agent's edits as one unified diff against the buggy tree (SWE-bench's ``model_patch``)."""
        return "".join(
            "".join(
                difflib.unified_diff(
                    before.splitlines(keepends=True),
                    (self.workdir / path).read_text(encoding="utf-8").splitlines(keepends=True),
                    f"a/{path}",
                    f"b/{path}",
                )
            )
            for path, before in sorted(self._before_edits.items())
        )

    def score(self) -> tuple[float, dict[str, Any]]:
        source, task = self.source, self.task
        original = source.original(task)
        with tempfile.TemporaryDirectory(prefix="code-repair-grade-") as scratch:
            graded = Path(scratch) / "repo"
            shutil.copytree(original, graded, symlinks=True)
            problems = []
            # the agent's version of each source file, nothing else
            for relative in source.source_files(task, original):
                edited = self.workdir / relative
                if edited.is_file():
                    shutil.copyfile(edited, graded / relative)
                    if self.check_edits:
                        before = (original / relative).read_text(encoding="utf-8", errors="replace")
                        problems += [
                            f"{relative} {problem}"
                            for problem in edit_problems(before, edited.read_text(encoding="utf-8", errors="replace"))
                        ]
                else:
                    (graded / relative).unlink()
            if problems:  # refused unrun: the edit reaches the machinery that grades it
                grade = Grade(frozenset(), tamper_reasons=tuple(problems))
            else:
                source.before_grading(task, graded)
                grade = source.grade(task, graded, TEST_TIMEOUT_S)
        required = [*task["FAIL_TO_PASS"], *task["PASS_TO_PASS"]]
        failed = sorted(test for test in required if test not in grade.passed)
        reward = 0.0 if grade.timed_out or failed or grade.hidden_failed or grade.tamper_reasons else 1.0
        return reward, {
            "success": reward >= self.success_threshold,
            "tests_failed": failed[:20],
            "tests_failed_count": len(failed),
            "fail_to_pass_fixed": sum(test in grade.passed for test in task["FAIL_TO_PASS"]),
            "fail_to_pass": len(task["FAIL_TO_PASS"]),
            "hidden_failed": grade.hidden_failed,
            "timed_out": grade.timed_out,
            "tampered": bool(grade.tamper_reasons),
            "tamper_reasons": list(grade.tamper_reasons),
            **grade.details,
            "instance_id": task["instance_id"],
            "model_patch": self.model_patch(),
        }

    # -- capabilities -------------------------------------------------------------------------
    def capability_detectors(self) -> list[str]:
        return list(CODE_REPAIR_CAPABILITIES)

    def capability_evidence(self, seed: int) -> dict[str, Any]:
        """Where the bug is (the gold patch's first changed line: its file, and the function around it in the buggy
        file, with its lines and text) and the tests that reveal it."""
        task = self.by_seed[seed]
        bug_file = patch_files(task["patch"])[0]
        buggy = self.source.buggy_text(task, bug_file)
        line = _first_changed_line(task["patch"])
        around = [
            (last - first, name, first, last) for name, first, last in iter_functions(buggy) if first <= line <= last
        ]
        _, function, first, last = min(around) if around else (0, "", line, line)
        return {
            "needs": list(CODE_REPAIR_CAPABILITIES),
            "bug_file": bug_file,
            "bug_function": function,
            "function_lines": [first, last],
            "function_source": "\n".join(buggy.splitlines()[first - 1 : last]),
            "fail_to_pass": list(task["FAIL_TO_PASS"]),
        }

    def adversaries(self) -> list[tuple[str, Any]]:
        return [(name, adversary(name)) for name in ADVERSARY_NAMES]

    # -- the oracle ---------------------------------------------------------------------------
    def oracle_message(self) -> Message:
        """The gold patch, one replace_in_file per hunk, then submit."""
        edits = patch_edits(self.task["patch"])
        step, self._oracle_step = self._oracle_step, self._oracle_step + 1
        if step < len(edits):
            path, old, new = edits[step]
            return tool_call_message("replace_in_file", {"path": path, "old": old, "new": new}, f"call_{step}_0")
        return tool_call_message("submit", {}, f"call_{step}_0")


def _first_changed_line(patch: str) -> int:
    """The line, in the file before the patch, of the first line the patch removes (or where it first adds)."""
    line = 1
    for text in patch.splitlines():
        header = HUNK.match(text)
        if header:
            line = int(header.group(1))
        elif text.startswith(("-", "+")) and not text.startswith(("---", "+++")):
            return line
        elif text.startswith(" "):
            line += 1
    return line


def swebench_environment(
    max_turns: int = 50,
    max_tool_calls_per_turn: int = 8,
    success_threshold: float = 1.0,
    instances: str | None = None,
    repos_dir: str | None = None,
) -> CodeRepairEnvironment:
    """``env=swebench``: SWE-bench instances (``env.instances``) on local checkouts (``env.repos_dir``)."""
    environment = CodeRepairEnvironment(
        max_turns, max_tool_calls_per_turn, success_threshold, SWEBenchSource.from_files(instances, repos_dir)
    )
    environment.name = "swebench"
    return environment
