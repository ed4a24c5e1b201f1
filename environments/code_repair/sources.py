"""Where code-repair tasks come from: the pinned packages with injected bugs, or SWE-bench instances with local
checkouts.

A :class:`TaskSource` gives the environment everything that differs between
the two: the tasks, each task's original tree, how a working copy gets its
bug, which tests run, and which files are tests (never taken from the
agent's working copy when grading).

- :class:`PackageSource` (``env=code_repair``): ``tasks.jsonl`` built by
  ``make install-code-repair``; the original is the unpacked package, the
  working copy gets the task's mutation and lacks the failing tests held out
  from the agent (``held_out.py``); grading adds the task's differential
  checks where it has them (``differential.py``). With ``env.tasks_dir=DIR``, tasks on
  local packages instead: ``DIR/tasks.jsonl`` and ``DIR/packages.json``
  (written by :func:`write_task_folder`).
- :class:`SWEBenchSource` (``env=swebench``): official SWE-bench instances
  (a JSONL file) and a folder of repository checkouts at their
  ``base_commit``, one per instance (``<repos_dir>/<instance_id>``, or one per
  repository, ``<repos_dir>/<owner>__<name>``). The original is the checkout
  (the bug is in it); grading applies the instance's ``test_patch``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from environments.code_repair.grading import Grade, grade_with_pytest, with_differential_checks
from environments.code_repair.held_out import held_out_tests, remove_tests
from environments.code_repair.packages import PACKAGES, Package, cache_dir, unpack
from environments.errors import TraceRayError

TASKS_FILE = "tasks.jsonl"
PACKAGES_FILE = "packages.json"  # a task folder's packages: each one's fields and its unpacked tree ("root")
NOT_SOURCE = ("conftest.py", "setup.py", "noxfile.py")
SWE_FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)


def patch_files(patch: str) -> list[str]:
    """The files a unified diff changes (its ``+++ b/...`` paths)."""
    return [line[len("+++ b/") :].strip() for line in patch.splitlines() if line.startswith("+++ b/")]


def patch_edits(patch: str) -> list[tuple[str, str, str]]:
    """(file, old text, new text) of every hunk of a unified diff: the context and removed lines, the context and added
    ones."""
    edits, path, old, new = [], None, None, None

    def close():
        if path is not None and old is not None:
            edits.append((path, "".join(old).rstrip("\n"), "".join(new).rstrip("\n")))

    for line in patch.splitlines(keepends=True):
        if line.startswith("+++ b/"):
            close()
            path, old, new = line[len("+++ b/") :].strip(), None, None
        elif line.startswith("@@"):
            close()
            old, new = [], []
        elif old is not None and line[:1] in (" ", "-", "+"):
            if line[:1] != "+":
                old.append(line[1:])
            if line[:1] != "-":
                new.append(line[1:])
    close()
    return edits


class TaskSource:
    """What the code-repair environment needs of its tasks (see the module docstring)."""

    tasks: list[dict]
    kind = "package"  # how the policy names the code: package or repository

    def original(self, task: dict) -> Path:
        raise NotImplementedError

    def prepare(self, task: dict, workdir: Path) -> None:
        """Put the task's bug into ``workdir``, a copy of the original (default: the original has it already)."""

    def test_paths(self, task: dict) -> list[str]:
        raise NotImplementedError

    def pytest_args(self, task: dict) -> list[str]:
        return []

    def is_test(self, task: dict, relative: str) -> bool:
        raise NotImplementedError

    def before_grading(self, task: dict, graded: Path) -> None:
        """Add what the grader needs to the graded tree (default: nothing)."""

    def buggy_text(self, task: dict, relative: str) -> str:
        """A file of the tree the agent starts from (default: the original's, which has the bug)."""
        return (self.original(task) / relative).read_text(encoding="utf-8")

    def grade(self, task: dict, graded: Path, timeout_s: float) -> Grade:
        """Run the task's hidden tests on the graded copy (default: its tests with canaries and the witness, see
        ``grading.py``)."""
        return grade_with_pytest(
            graded,
            self.test_paths(task),
            self.pytest_args(task),
            [*task["FAIL_TO_PASS"], *task["PASS_TO_PASS"]],
            task["FAIL_TO_PASS"],
            timeout_s,
        )

    def source_files(self, task: dict, root: Path) -> list[str]:
        """The ``.py`` files of ``root`` that are the code under repair: not tests, conftest, setup or hidden
        folders."""
        files = []
        for path in sorted(root.rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if path.name in NOT_SOURCE or any(part.startswith(".") for part in path.relative_to(root).parts):
                continue
            if not self.is_test(task, relative):
                files.append(relative)
        return files


@dataclass
class PackageSource(TaskSource):
    tasks: list[dict]
    packages: dict[str, Package]  # by repo ("pypi/<name>")
    roots: dict[str, Path]  # repo -> the unpacked original

    @classmethod
    def from_cache(cls) -> PackageSource:
        path = cache_dir() / TASKS_FILE
        if not path.is_file():
            raise TraceRayError(f"env=code_repair needs its tasks in {path}; run make install-code-repair")
        tasks = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        packages = {f"pypi/{package.name}": package for package in PACKAGES}
        roots = {repo: unpack(package, cache_dir() / "unpacked") for repo, package in packages.items()}
        return cls(tasks, packages, roots)

    @classmethod
    def from_folder(cls, folder: str | Path) -> PackageSource:
        """Tasks on local packages: ``folder/tasks.jsonl`` and ``folder/packages.json`` (see
        :func:`write_task_folder`)."""
        folder = Path(folder)
        missing = [name for name in (TASKS_FILE, PACKAGES_FILE) if not (folder / name).is_file()]
        if missing:
            raise TraceRayError(
                f"env.tasks_dir={folder} lacks {' and '.join(missing)}; write the folder with "
                "environments.code_repair.sources.write_task_folder, or leave env.tasks_dir out"
            )
        tasks = [
            json.loads(line) for line in (folder / TASKS_FILE).read_text(encoding="utf-8").splitlines() if line.strip()
        ]
        packages, roots = {}, {}
        for entry in json.loads((folder / PACKAGES_FILE).read_text(encoding="utf-8")):
            fields = {
                key: tuple(value) if isinstance(value, list) else value for key, value in entry.items() if key != "root"
            }
            package = Package(**fields)
            packages[f"pypi/{package.name}"], roots[f"pypi/{package.name}"] = package, folder / entry["root"]
        unknown = sorted({task["repo"] for task in tasks} - set(packages))
        if unknown:
            raise TraceRayError(
                f"{folder / TASKS_FILE} has tasks of {', '.join(unknown)}, which "
                f"{folder / PACKAGES_FILE} does not describe"
            )
        return cls(tasks, packages, roots)

    def original(self, task: dict) -> Path:
        return self.roots[task["repo"]]

    def prepare(self, task: dict, workdir: Path) -> None:
        """The bug put in; the failing tests held out from the agent taken out (``held_out.py``)."""
        mutation = task["mutation"]
        buggy = workdir / mutation["file"]
        text = buggy.read_text(encoding="utf-8")
        buggy.write_text(
            text[: mutation["start"]] + mutation["replacement"] + text[mutation["end"] :], encoding="utf-8"
        )
        remove_tests(workdir, held_out_tests(task["FAIL_TO_PASS"]))

    def grade(self, task: dict, graded: Path, timeout_s: float) -> Grade:
        """The tests (the held-out ones among them) with canaries and the witness, then, where the task has them, its
        differential checks in the graded copy without its test files."""
        grade = super().grade(task, graded, timeout_s)
        if "differential" not in task or grade.timed_out:
            return grade
        for test in self.test_paths(task):
            path = graded / test
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        return with_differential_checks(grade, graded, task["differential"], timeout_s)

    def buggy_text(self, task: dict, relative: str) -> str:
        text = (self.original(task) / relative).read_text(encoding="utf-8")
        mutation = task["mutation"]
        return (
            text[: mutation["start"]] + mutation["replacement"] + text[mutation["end"] :]
            if relative == mutation["file"]
            else text
        )

    def test_paths(self, task: dict) -> list[str]:
        return list(self.packages[task["repo"]].tests)

    def pytest_args(self, task: dict) -> list[str]:
        return list(self.packages[task["repo"]].pytest_args)

    def is_test(self, task: dict, relative: str) -> bool:
        path = Path(relative)
        tests = [Path(test) for test in self.packages[task["repo"]].tests]
        return any(path == test or test in path.parents for test in tests) or "test" in path.parts[0]


def write_task_folder(folder: str | Path, packages: list[tuple[Package, Path]], tasks: list[dict]) -> Path:
    """A task folder for ``env.tasks_dir``: ``tasks`` (from ``tasks.build_tasks``, each with its ``split``) on local
    ``packages``, each (package, its tree), the tree copied in as the task's original."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    described = []
    for package, root in packages:
        shutil.copytree(root, folder / "packages" / package.name, dirs_exist_ok=True)
        described.append({**asdict(package), "root": f"packages/{package.name}"})
    (folder / PACKAGES_FILE).write_text(json.dumps(described, indent=1), encoding="utf-8")
    (folder / TASKS_FILE).write_text("".join(json.dumps(task) + "\n" for task in tasks), encoding="utf-8")
    return folder


@dataclass
class SWEBenchSource(TaskSource):
    tasks: list[dict]
    repos_dir: Path
    kind = "repository"

    @classmethod
    def from_files(cls, instances: str | None, repos_dir: str | None) -> SWEBenchSource:
        if not instances or not repos_dir:
            raise TraceRayError(
                "env=swebench needs env.instances=FILE.jsonl (SWE-bench instances) and "
                "env.repos_dir=DIR "
                "(their repositories checked out at base_commit)"
            )
        path, folder = Path(instances), Path(repos_dir)
        if not path.is_file():
            raise TraceRayError(f"env.instances={path} does not exist; point it at a SWE-bench instances JSONL file")
        tasks = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceRayError(
                    f"{path}:{number} is not JSON ({exc.msg}); one SWE-bench instance per line"
                ) from None
            missing = [field for field in SWE_FIELDS if field not in task]
            if missing:
                raise TraceRayError(
                    f"{path}:{number} lacks {', '.join(missing)}; SWE-bench instances need {', '.join(SWE_FIELDS)}"
                )
            for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):  # the official files hold these as JSON strings
                task[key] = json.loads(task[key]) if isinstance(task[key], str) else task[key]
            task.setdefault("split", "eval")
            tasks.append(task)
        source = cls(tasks, folder)
        for task in tasks:
            source.original(task)  # every checkout exists and is at its base_commit
        return source

    def original(self, task: dict) -> Path:
        candidates = [self.repos_dir / task["instance_id"], self.repos_dir / task["repo"].replace("/", "__")]
        root = next((path for path in candidates if path.is_dir()), None)
        if root is None:
            raise TraceRayError(
                f"no checkout for {task['instance_id']}: expected {candidates[0]} or {candidates[1]} "
                f"at commit {task['base_commit']}"
            )
        if (root / ".git").exists():
            head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
            if head != task["base_commit"]:
                raise TraceRayError(
                    f"{root} is at commit {head[:12] or '?'}, not {task['instance_id']}'s base_commit "
                    f"{task['base_commit'][:12]}; check it out with git -C {root} checkout "
                    f"{task['base_commit']}"
                )
        return root

    def test_paths(self, task: dict) -> list[str]:
        return sorted({test.split("::")[0] for test in [*task["FAIL_TO_PASS"], *task["PASS_TO_PASS"]]})

    def is_test(self, task: dict, relative: str) -> bool:
        path = Path(relative)
        return (
            relative in patch_files(task["test_patch"])
            or relative in self.test_paths(task)
            or any(part in ("test", "tests", "testing") for part in path.parts[:-1])
            or path.name.startswith("test_")
            or path.stem.endswith("_test")
        )

    def before_grading(self, task: dict, graded: Path) -> None:
        if not task["test_patch"].strip():
            return
        applied = subprocess.run(
            ["git", "apply", "-"], input=task["test_patch"], text=True, cwd=graded, capture_output=True
        )
        if applied.returncode != 0:
            raise TraceRayError(
                f"{task['instance_id']}: its test_patch does not apply to the checkout ({applied.stderr.strip()[:200]})"
            )
