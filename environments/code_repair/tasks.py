"""Code-repair tasks in SWE-bench's instance schema: a real package with one injected bug, validated by its own tests.

A candidate bug (``mutations.py``) becomes a task only when the package's
selected tests pass on the original source, at least one of them fails on
the mutant (``FAIL_TO_PASS``), every other one still passes
(``PASS_TO_PASS``), and the run ends within the time limit. The issue text
is written from the first failure as the tests see it (the statement run,
what came back, what was expected), never naming the buggy file or line.
The gold ``patch`` is the unified diff that undoes the bug. Where the
package allows, the task also holds ``differential`` checks: calls of the
buggy function on which the mutant and the original differ, with the
original's results (``differential.py``).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import random
import re
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from environments.code_repair.differential import differential_checks
from environments.code_repair.mutations import Mutation, mutations
from environments.code_repair.packages import PACKAGES, Package, cache_dir, sdist_digest, unpack
from environments.code_repair.test_runner import RecordChannel, pytest_command, require_started

SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR) (\S+)")
FAILURE_HEADER = re.compile(r"^_{3,} (.+?) _{3,}$")
FRAME_LINE = re.compile(r"^\S+:\d+: in ")


@dataclass(frozen=True)
class Witnessed:
    """What the witness of a sandboxed run recorded (``sandbox_runner.py``): the collected test ids, each test's
    outcome, and what on its channel was not its own (lines without the run's nonce, a test or the collection recorded
    twice)."""

    collected: frozenset[str]  # summary ids (see summary_id)
    outcomes: dict[str, str]  # summary id -> passed | failed | error | skipped
    problems: tuple[str, ...]


@dataclass(frozen=True)
class TestRun:
    passed: frozenset[str]  # pytest node ids
    failed: frozenset[str]  # failed or errored
    seconds: float
    output: str
    timed_out: bool = False
    errored: frozenset[str] = frozenset()  # errored (also in failed)
    witnessed: Witnessed | None = None  # sandboxed runs

    def reported(self) -> dict[str, str]:
        """Each test's outcome as pytest's summary reports it: passed, failed or error."""
        outcomes = {test: "passed" for test in self.passed}
        outcomes.update({test: "failed" for test in self.failed - self.errored})
        outcomes.update({test: "error" for test in self.errored})
        return outcomes


def summary_id(node_id: str) -> str:
    """A node id as pytest's summary line shows it (and :func:`run_tests` reads it): up to its first space."""
    return node_id.split(" ")[0]


def witnessed(records: list[dict], foreign: int) -> Witnessed:
    """The witness's records of one run, keyed like the summary's ids (tests whose ids agree up to a space count as
    passed only when all passed)."""
    collections = [record["collected"] for record in records if "collected" in record]
    by_node: dict[str, str] = {}
    twice = set()
    for record in records:
        if "test" in record:
            if record["test"] in by_node:
                twice.add(record["test"])
            by_node[record["test"]] = record["outcome"]
    outcomes: dict[str, str] = {}
    for node, outcome in by_node.items():
        if outcomes.get(summary_id(node), "passed") == "passed":
            outcomes[summary_id(node)] = outcome
    problems = [f"{foreign} line(s) on the witness's channel without the run's nonce"] if foreign else []
    problems += ["the collection recorded more than once"] if len(collections) > 1 else []
    problems += [f"{len(twice)} test(s) recorded twice (e.g. {min(twice)})"] if twice else []
    return Witnessed(
        frozenset(summary_id(node) for node in (collections[0] if collections else ())), outcomes, tuple(problems)
    )


def run_tests(
    root: Path, paths: Sequence[str], extra_args: Sequence[str] = (), timeout_s: float = 60, sandboxed: bool = False
) -> TestRun:
    """Run pytest on ``paths`` in the working copy ``root`` (sandboxed: see ``test_runner.py``, with the witness's
    records); outcomes by node id."""
    channel = RecordChannel() if sandboxed else None
    command, cwd = pytest_command(root, paths, extra_args, channel.fd if channel else None)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    start = time.monotonic()
    try:
        result = subprocess.run(
            command,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            input=channel.nonce + "\n" if channel else None,
            pass_fds=(channel.fd,) if channel else (),
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return TestRun(frozenset(), frozenset(), time.monotonic() - start, output, timed_out=True)
    finally:
        records = channel.close() if channel else None
    if channel:
        require_started(records[0], result.stderr)
    outcomes: dict[str, set] = {"PASSED": set(), "FAILED": set(), "ERROR": set()}
    for line in result.stdout.splitlines():
        match = SUMMARY_LINE.match(line)
        if match:
            outcomes[match.group(1)].add(match.group(2))
    return TestRun(
        frozenset(outcomes["PASSED"]),
        frozenset(outcomes["FAILED"] | outcomes["ERROR"]),
        time.monotonic() - start,
        result.stdout + result.stderr,
        errored=frozenset(outcomes["ERROR"]),
        witnessed=witnessed(*records) if records else None,
    )


def failure_report(output: str, test_id: str) -> tuple[str | None, list[str]]:
    """(the test's failing statement, the error lines) of ``test_id``'s failure in pytest's short traceback output.

    Frames inside the package, which would name the buggy file and line, are
    never read: the statement is the last line of the test file's frame.
    """
    name = test_id.split("::")[-1]
    blocks: dict[str, list[str]] = {}
    current = None
    for line in output.splitlines():
        header = FAILURE_HEADER.match(line)
        if header:
            current = header.group(1).split(".")[-1]
            blocks[current] = []
        elif line.startswith("=") or line.startswith("-" * 10):
            current = None
        elif current is not None:
            blocks[current].append(line)
    test_file = test_id.split("::")[0]
    statement, errors, in_test = None, [], False
    for line in blocks.get(name, []):
        if FRAME_LINE.match(line):
            in_test = line.startswith(test_file)
        elif line.startswith("E "):
            errors.append(line[1:].strip())
        elif in_test and line.strip():
            statement = line.strip()
    return statement, errors


def issue_text(package: Package, statement: str | None, errors: list[str], fail_count: int) -> str:
    """An issue as a user would file it: what was run, what came back, what was expected."""
    lines = [f"Something is broken in {package.name} {package.version}."]
    if statement:
        lines.append(f"\nRunning\n\n    {statement}\n")
    if errors:
        lines.append(
            ("fails with" if statement else "A check fails with")
            + "\n\n"
            + "\n".join(f"    {line}" for line in errors[:6])
            + "\n"
        )
    if statement and statement.startswith("assert"):
        lines.append("The assertion states the behaviour that is expected.")
    if fail_count > 1:
        lines.append(f"Other checks of the same behaviour fail too ({fail_count} in all).")
    return "\n".join(lines).strip() + "\n"


def gold_patch(path: str, mutant: str, original: str) -> str:
    """The unified diff (``a/`` and ``b/`` prefixes, as ``git diff``) that turns the mutant back into the original."""
    diff = difflib.unified_diff(
        mutant.splitlines(keepends=True), original.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return "".join(diff)


def candidate_bugs(package: Package, root: Path, seed: int) -> list[tuple[str, Mutation]]:
    """Every (source file, mutation) of the package, in a seeded order."""
    found = [
        (path, mutation)
        for path in package.sources
        for mutation in mutations((root / path).read_text(encoding="utf-8"))
    ]
    random.Random(f"{package.name}:{seed}").shuffle(found)
    return found


def validate(
    package: Package, root: Path, path: str, mutation: Mutation, baseline: TestRun, timeout_s: float
) -> dict | None:
    """The SWE-bench-style instance of one candidate bug, or None when the tests do not make it a task."""
    source_file = root / path
    original = source_file.read_text(encoding="utf-8")
    mutant = mutation.apply(original)
    source_file.write_text(mutant, encoding="utf-8")
    try:
        run = run_tests(root, package.tests, package.pytest_args, timeout_s)
    finally:
        source_file.write_text(original, encoding="utf-8")
    fail_to_pass = sorted(baseline.passed & run.failed)
    pass_to_pass = sorted(baseline.passed - set(fail_to_pass))
    if run.timed_out or not fail_to_pass or not set(pass_to_pass) <= run.passed:
        return None
    differential = differential_checks(package, root, path, mutation, fail_to_pass, timeout_s)
    return {
        "repo": f"pypi/{package.name}",
        "version": package.version,
        "problem_statement": issue_text(package, *failure_report(run.output, fail_to_pass[0]), len(fail_to_pass)),
        "patch": gold_patch(path, mutant, original),
        "test_patch": "",
        "FAIL_TO_PASS": fail_to_pass,
        "PASS_TO_PASS": pass_to_pass,
        "mutation": {
            "file": path,
            "kind": mutation.kind,
            "function": mutation.function,
            "line": mutation.line,
            "start": mutation.start,
            "end": mutation.end,
            "original": mutation.original,
            "replacement": mutation.replacement,
        },
        "test_seconds": round(run.seconds, 2),
        **({"differential": differential} if differential else {}),
    }


def build_tasks(
    package: Package,
    root: Path,
    digest: str,
    count: int,
    seed: int = 0,
    max_tries: int | None = None,
    timeout_s: float = 60,
) -> list[dict]:
    """Up to ``count`` validated tasks of ``package`` unpacked at ``root``, trying its candidate bugs in a seeded order.

    At most one task per function, so that tasks differ in where the bug is.
    """
    baseline = run_tests(root, package.tests, package.pytest_args, timeout_s)
    if baseline.timed_out or not baseline.passed:
        raise RuntimeError(
            f"{package.name} {package.version}: its tests {list(package.tests)} do not pass on the original source"
        )
    tasks, used = [], set()
    candidates = candidate_bugs(package, root, seed)
    for tries, (path, mutation) in enumerate(candidates):
        if len(tasks) >= count or (max_tries is not None and tries >= max_tries):
            break
        if (path, mutation.function) in used:
            continue
        task = validate(package, root, path, mutation, baseline, timeout_s)
        if task is not None:
            used.add((path, mutation.function))
            tasks.append({"instance_id": f"{package.name}__{len(tasks):03d}", "base_commit": digest, **task})
    return tasks


def split_of(instance_id: str) -> str:
    """``analysis`` or ``eval``, fixed by the instance id's hash (half each, whatever else is built)."""
    return "analysis" if int(hashlib.sha256(instance_id.encode()).hexdigest(), 16) % 2 == 0 else "eval"


def build_all(per_package: int = 17, seed: int = 0) -> Path:
    """Build the tasks of every pinned package into ``cache_dir()/tasks.jsonl`` (written whole, atomically)."""
    tasks = []
    with tempfile.TemporaryDirectory(prefix="code-repair-build-") as scratch:
        for package in PACKAGES:
            start = time.monotonic()
            root = unpack(package, Path(scratch))
            built = build_tasks(package, root, sdist_digest(package), per_package, seed, max_tries=per_package * 4)
            tasks += [{**task, "split": split_of(task["instance_id"])} for task in built]
            print(
                f"{package.name} {package.version}: {len(built)} tasks in {time.monotonic() - start:.0f} s", flush=True
            )
    path = cache_dir() / "tasks.jsonl"
    scratch_path = path.with_suffix(".tmp")
    scratch_path.write_text("".join(json.dumps(task) + "\n" for task in tasks), encoding="utf-8")
    scratch_path.replace(path)
    return path


if __name__ == "__main__":
    print(f"wrote {build_all()}")
