"""``env=code_repair``: fix a bug in a real Python package from an issue text, graded by the package's hidden test verdict.

Each task (``tasks.py``, SWE-bench's instance schema) is one of the pinned
packages with one injected bug. On ``reset`` the agent gets a working copy
of the package with the bug, the issue text, and tools to list files, read
a line range, search (fixed string or regex), replace a unique snippet in a
file, run the repository's visible tests (sandboxed, output truncated) and
submit. The episode ends on ``submit`` or a plain-text reply.

Grading never trusts the working copy: a fresh copy of the original package
receives the agent's version of each of its non-test source files (files
the agent added, test files, ``conftest.py`` and configuration are left
out), then every ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` test runs in the
sandbox. Reward 1.0 when all pass (Pass@1), else 0; ``info`` lists the
tests that failed.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.code_repair.packages import PACKAGES, Package, cache_dir, unpack
from environments.code_repair.tasks import run_tests
from environments.protocol import Message, StepResult
from environments.tool_environment import Tool, ToolEnvironment, ToolError
from trace_ray.errors import TraceRayError

TASKS_FILE = "tasks.jsonl"
SPLITS = ("analysis", "eval")
READ_LINES = 80  # lines read_file returns when no end is given
MAX_READ_LINES = 200
MAX_MATCHES = 40
MAX_OUTPUT_CHARS = 3000
TEST_TIMEOUT_S = 120
POLICY = (
    "You are a software engineer fixing a bug in a Python package. The package is checked out in your working "
    "directory. Read the issue, find the code that causes it, fix it with replace_in_file, run the tests that show "
    "the problem, and call submit when the fix is done. Change as little as possible and do not edit the tests."
)


@dataclass
class TaskSource:
    """The tasks, their packages, and where each package's original source is unpacked."""

    tasks: list[dict]
    packages: dict[str, Package]  # by repo ("pypi/<name>")
    roots: dict[str, Path]  # repo -> the unpacked original

    @classmethod
    def from_cache(cls) -> "TaskSource":
        path = cache_dir() / TASKS_FILE
        if not path.is_file():
            raise TraceRayError(f"env=code_repair needs its tasks in {path}; run make install-code-repair")
        tasks = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        packages = {f"pypi/{package.name}": package for package in PACKAGES}
        roots = {repo: unpack(package, cache_dir() / "unpacked") for repo, package in packages.items()}
        return cls(tasks, packages, roots)


def source_files(root: Path, package: Package) -> list[str]:
    """The package's own source files (relative paths): every ``.py`` file outside its tests, conftest and setup."""
    tests = [Path(path) for path in package.tests]
    files = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        in_tests = any(relative == test or test in relative.parents for test in tests)
        if not in_tests and relative.name not in ("conftest.py", "setup.py", "noxfile.py") and "test" not in relative.parts[0]:
            files.append(relative.as_posix())
    return files


def unique_edit(text: str, start: int, end: int, replacement: str) -> tuple[str, str]:
    """(old, new) snippets that replace ``text[start:end]`` with ``replacement``: the changed lines, widened by whole
    lines of context until ``old`` occurs once in ``text``."""
    first = text.rfind("\n", 0, start) + 1
    last = text.find("\n", end)
    last = len(text) if last < 0 else last
    while text.count(text[first:last]) > 1:
        first = text.rfind("\n", 0, max(first - 1, 0)) + 1 if first > 0 else 0
        following = text.find("\n", last + 1)
        last = len(text) if following < 0 else following
    old = text[first:last]
    return old, old[: start - first] + replacement + old[end - first:]


class CodeRepairEnvironment(ToolEnvironment):
    name = "code_repair"

    def __init__(self, max_turns: int = 50, max_tool_calls_per_turn: int = 8, success_threshold: float = 1.0,
                 source: TaskSource | None = None):
        super().__init__(max_turns=max_turns, max_tool_calls_per_turn=max_tool_calls_per_turn)
        self.success_threshold = success_threshold
        self.source = source or TaskSource.from_cache()
        self.by_seed = {index: task for index, task in enumerate(self.source.tasks)}
        self.task: dict | None = None
        self.workdir: Path | None = None
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._oracle_turn = 0

    # -- tasks ------------------------------------------------------------------------------
    def task_seeds(self, split: str) -> list[int]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)} (train seeds come from train_seed), got {split!r}")
        return [seed for seed, task in self.by_seed.items() if task["split"] == split]

    def train_seed(self, index: int) -> int:
        analysis = self.task_seeds("analysis")
        return analysis[index % len(analysis)]  # the analysis tasks replayed

    def task_fingerprint(self) -> str:
        return f"{self.task['instance_id']}:{self.task['base_commit'][:16]}"

    @property
    def package(self) -> Package:
        return self.source.packages[self.task["repo"]]

    # -- the episode --------------------------------------------------------------------------
    def start_episode(self, seed: int) -> tuple[list[Message], list[Tool], dict[str, Any]]:
        if seed not in self.by_seed:
            raise ValueError(f"no code_repair task with seed {seed} ({len(self.by_seed)} tasks)")
        self.task = self.by_seed[seed]
        self._scratch = tempfile.TemporaryDirectory(prefix="code-repair-")
        self.workdir = Path(self._scratch.name) / "repo"
        shutil.copytree(self.source.roots[self.task["repo"]], self.workdir)
        mutation = self.task["mutation"]
        buggy = self.workdir / mutation["file"]
        text = buggy.read_text(encoding="utf-8")
        buggy.write_text(text[: mutation["start"]] + mutation["replacement"] + text[mutation["end"]:], encoding="utf-8")
        self._oracle_turn = 0
        request = f"Please fix this issue in {self.package.name}:\n\n{self.task['problem_statement']}"
        messages = [{"role": "system", "content": POLICY}, {"role": "user", "content": request}]
        tools = [
            Tool("list_files", "List the files under a directory of the repository.",
                 {"type": "object", "properties": {"directory": {"type": "string"}}}, self._list_files),
            Tool("read_file", f"Read lines of a file (numbered; at most {MAX_READ_LINES} at once).",
                 {"type": "object", "properties": {"path": {"type": "string"}, "start_line": {"type": "integer"},
                                                   "end_line": {"type": "integer"}}, "required": ["path"]}, self._read_file),
            Tool("search", "Search the repository's Python files for a string (or a regular expression with regex=true).",
                 {"type": "object", "properties": {"pattern": {"type": "string"}, "regex": {"type": "boolean"}},
                  "required": ["pattern"]}, self._search),
            Tool("replace_in_file", "Replace a snippet that occurs exactly once in a file with new text.",
                 {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
                  "required": ["path", "old", "new"]}, self._replace),
            Tool("run_tests", "Run the repository's tests, or one test file or test id; shows the end of pytest's output.",
                 {"type": "object", "properties": {"target": {"type": "string"}}}, self._run_tests),
            Tool("submit", "Submit the fix; the episode ends.", {"type": "object", "properties": {}}, self._submit),
        ]
        return messages, tools, {"instance_id": self.task["instance_id"], "repo": self.task["repo"]}

    def on_agent_reply(self, text: str) -> tuple[list[Message], bool]:
        return [], True  # the agent is done: a reply ends the episode as submit does

    def step(self, assistant_message: Message) -> StepResult:
        result = super().step(assistant_message)
        if not result.done and any(call.name == "submit" and call.ok for call in self.log.tool_calls if call.turn == self.log.turns):
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
        files = sorted(p.relative_to(self.workdir).as_posix() for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
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
            for number, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if matcher.search(line):
                    matches.append(f"{file.relative_to(self.workdir).as_posix()}:{number}: {line.strip()}")
        if not matches:
            return f"no match for {pattern!r}"
        return "\n".join(matches[:MAX_MATCHES]) + (f"\n... {len(matches) - MAX_MATCHES} more" if len(matches) > MAX_MATCHES else "")

    def _replace(self, path: str, old: str, new: str) -> str:
        file = self._path(path)
        if not file.is_file():
            raise ToolError(f"no file {path!r}; list_files() shows the files")
        text = file.read_text(encoding="utf-8")
        count = text.count(old) if old else 0
        if count != 1:
            raise ToolError(f"the snippet occurs {count} times in {path}; send a snippet that occurs exactly once (add lines around it)")
        updated = text.replace(old, new, 1)
        file.write_text(updated, encoding="utf-8")
        try:
            compile(updated, path, "exec")
        except SyntaxError as exc:
            return f"replaced; {path} no longer parses ({exc.msg}, line {exc.lineno})"
        return f"replaced 1 snippet in {path}"

    def _run_tests(self, target: str = "") -> str:
        paths = [target] if target else list(self.package.tests)
        if target:
            self._path(target.split("::")[0])
        run = run_tests(self.workdir, paths, self.package.pytest_args, TEST_TIMEOUT_S, sandboxed=True)
        if run.timed_out:
            return f"the tests did not finish within {TEST_TIMEOUT_S} s"
        summary = f"{len(run.passed)} passed, {len(run.failed)} failed"
        tail = run.output[-MAX_OUTPUT_CHARS:]
        return f"{summary}\n{tail}"

    def _submit(self) -> str:
        return "submitted"

    # -- grading ------------------------------------------------------------------------------
    def score(self) -> tuple[float, dict[str, Any]]:
        package, task = self.package, self.task
        original = self.source.roots[task["repo"]]
        with tempfile.TemporaryDirectory(prefix="code-repair-grade-") as scratch:
            graded = Path(scratch) / "repo"
            shutil.copytree(original, graded)
            for relative in source_files(original, package):  # the agent's version of each source file, nothing else
                edited = self.workdir / relative
                if edited.is_file():
                    shutil.copyfile(edited, graded / relative)
                else:
                    (graded / relative).unlink()
            run = run_tests(graded, list(package.tests), package.pytest_args, TEST_TIMEOUT_S, sandboxed=True)
        required = [*task["FAIL_TO_PASS"], *task["PASS_TO_PASS"]]
        failed = sorted(test for test in required if test not in run.passed)
        reward = 0.0 if run.timed_out or failed else 1.0
        return reward, {
            "success": reward >= self.success_threshold, "tests_failed": failed[:20], "tests_failed_count": len(failed),
            "fail_to_pass_fixed": sum(test in run.passed for test in task["FAIL_TO_PASS"]), "fail_to_pass": len(task["FAIL_TO_PASS"]),
            "timed_out": run.timed_out,
        }

    def capability_detectors(self) -> list[str]:
        from trace_ray.capabilities.rules import CODE_REPAIR_DETECTORS

        return list(CODE_REPAIR_DETECTORS)

    def capability_evidence(self, seed: int) -> dict[str, Any]:
        """Where the bug is (file, function, its lines and text in the buggy file) and the tests that reveal it."""
        from environments.code_repair.mutations import iter_functions
        from trace_ray.capabilities.rules import CODE_REPAIR_DETECTORS

        task = self.by_seed[seed]
        mutation = task["mutation"]
        original = (self.source.roots[task["repo"]] / mutation["file"]).read_text(encoding="utf-8")
        buggy = original[: mutation["start"]] + mutation["replacement"] + original[mutation["end"]:]
        first, last = next((a, b) for name, a, b in iter_functions(buggy) if name == mutation["function"])
        return {
            "needs": list(CODE_REPAIR_DETECTORS), "bug_file": mutation["file"], "bug_function": mutation["function"],
            "function_lines": [first, last], "function_source": "\n".join(buggy.splitlines()[first - 1:last]),
            "fail_to_pass": list(task["FAIL_TO_PASS"]),
        }

    def adversaries(self) -> list[tuple[str, Any]]:
        from environments.code_repair.adversaries import NAMES, adversary

        return [(name, adversary(name)) for name in NAMES]

    # -- the oracle ---------------------------------------------------------------------------
    def oracle_message(self) -> Message:
        """Turn 0: undo the bug with replace_in_file; turn 1: submit."""
        if self._oracle_turn == 0:
            mutation = self.task["mutation"]
            mutant = (self.workdir / mutation["file"]).read_text(encoding="utf-8")
            end = mutation["start"] + len(mutation["replacement"])
            old, new = unique_edit(mutant, mutation["start"], end, mutation["original"])
            arguments = {"path": mutation["file"], "old": old, "new": new}
            self._oracle_turn = 1
            return {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_0_0", "type": "function", "function": {"name": "replace_in_file", "arguments": json.dumps(arguments)}}]}
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1_0", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}
