"""Synthetic code-repair tasks, one template per capability: a generated single-file module, a seeded bug, pytest tests.

A task is a module of small functions drawn from :data:`FAMILIES` (names and
constants seeded), its test file (one test per call, the expected value
computed from the correct module), a bug put into one function by
:func:`~environments.code_repair.mutations.mutations`, and hidden calls only
the grader makes (:func:`hidden_checks`: calls on which the bug, and every
state the oracle's fix passes through, differ from the correct module; a
draw without enough of them is no task). Each capability's
template chooses the bug, writes the issue text and the oracle's moves, and
names the oracle turn that needs the capability together with the move an
agent lacking it makes instead (its ``broken`` move); every move is replayed
here on the module's source before the task is accepted, and the sandboxed
self-checks replay them again through the environment:

- ``code_localisation``: look-alike functions of the buggy one's family; the
  broken move edits a look-alike.
- ``failure_reproduction``: the issue says only that a function is wrong for
  some inputs; the oracle runs the tests first; the broken move is a fix
  guessed elsewhere in the function, which breaks a passing test.
- ``fix_verification``: two bugs on one function; the issue shows the first;
  the oracle runs the tests after fixing it and finds the second; the broken
  move submits instead.
- ``edit_precision``: a fix that restores lines (at level 2 and above a
  dropped branch); the broken move is the fix mistyped, so the file no longer
  parses.
- ``minimal_change``: the broken move rewrites the buggy function together
  with its neighbour, which it changes.

Difficulty 1 to 3: more functions and look-alikes in the module. Task
generation runs only this project's own templates (never model-written
code), in process, to compute expected values; the agent's edits run in the
sandbox.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from environments.code_repair.mutations import Mutation, iter_functions, mutations
from environments.code_repair.neighbours import moved_calls
from environments.synthetic.template import CapabilityTemplate

DIFFICULTIES = (1, 2, 3)
MODULE_NAMES = ("helpers", "measures", "listing", "tally", "ranges", "shaping", "figures", "batches")
NOUNS = (
    "speed",
    "volume",
    "width",
    "price",
    "score",
    "level",
    "weight",
    "stock",
    "delay",
    "height",
    "budget",
    "margin",
)
CASES_PER_FUNCTION = 6
RANDOM_CANDIDATES = 40  # random argument tuples per function searched for hidden checks, beside the tests' neighbours
MIN_SEPARATING = 3  # hidden calls that must tell each wrong state of the module from the correct one
HIDDEN_SEPARATING = 12  # hidden calls kept per wrong state among those that tell it from the correct module
HIDDEN_AGREEING = 2  # hidden calls kept per function besides


# -- function families ------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    base: str
    source: str  # a function's text; {name} and the constants' names are filled in
    constants: Callable[[random.Random], dict[str, Any]]
    cases: Callable[[random.Random, dict[str, Any]], list[tuple]]  # argument tuples


def _ints(rng: random.Random, size: int, low: int = 0, high: int = 20) -> list[int]:
    return [rng.randint(low, high) for _ in range(size)]


FAMILIES = (
    Family(
        "clamp",
        (
            "def {name}(value, low={low}, high={high}):\n"
            "    if value < low:\n"
            "        return low\n"
            "    if value > high:\n"
            "        return high\n"
            "    return value\n"
        ),
        lambda rng: {"low": (low := rng.randint(0, 5)), "high": low + rng.randint(5, 15)},
        lambda rng, c: [(v,) for v in (c["low"] - 2, c["low"], c["low"] + 1, c["high"] - 1, c["high"], c["high"] + 3)],
    ),
    Family(
        "count_between",
        (
            "def {name}(values, low, high):\n"
            "    count = 0\n"
            "    for value in values:\n"
            "        if value >= low and value < high:\n"
            "            count += 1\n"
            "    return count\n"
        ),
        lambda rng: {},
        lambda rng, c: (
            [
                (values, low, low + rng.randint(1, 6))
                for values, low in ((sorted(_ints(rng, 6)), rng.randint(0, 10)) for _ in range(CASES_PER_FUNCTION - 1))
            ]
            + [([1, 2, 3, 4], 2, 4)]
        ),
    ),
    Family(
        "window_sums",
        (
            "def {name}(values, size={size}):\n"
            "    sums = []\n"
            "    for start in range(len(values) - size + 1):\n"
            "        sums.append(sum(values[start:start + size]))\n"
            "    return sums\n"
        ),
        lambda rng: {"size": rng.randint(2, 3)},
        lambda rng, c: [(_ints(rng, length),) for length in (2, 3, 4, 5, 6, 7)],
    ),
    Family(
        "last_items",
        ("def {name}(values, count):\n    if count <= 0:\n        return []\n    return values[-count:]\n"),
        lambda rng: {},
        lambda rng, c: [(_ints(rng, 5), count) for count in (0, 1, 2, 3, 5, -1)],
    ),
    Family(
        "first_above",
        (
            "def {name}(values, threshold={threshold}):\n"
            "    for index in range(len(values)):\n"
            "        if values[index] > threshold:\n"
            "            return index\n"
            "    return -1\n"
        ),
        lambda rng: {"threshold": rng.randint(5, 15)},
        lambda rng, c: [
            (values,)
            for values in (
                [c["threshold"]] * 3,
                [c["threshold"] + 1],
                [0, c["threshold"], c["threshold"] + 2],
                [],
                _ints(rng, 5),
                [c["threshold"] + 4, 0],
            )
        ],
    ),
    Family(
        "grade",
        (
            "def {name}(score, top={top}, pass_mark={pass_mark}):\n"
            "    if score >= top:\n"
            '        return "{word}"\n'
            "    if score >= pass_mark:\n"
            '        return "pass"\n'
            '    return "fail"\n'
        ),
        lambda rng: {
            "pass_mark": (mark := rng.randint(40, 60)),
            "top": mark + rng.randint(20, 35),
            "word": rng.choice(("excellent", "distinction", "top")),
        },
        lambda rng, c: [(s,) for s in (c["top"], c["top"] - 1, c["pass_mark"], c["pass_mark"] - 1, 0, c["top"] + 5)],
    ),
    Family(
        "pad_left",
        (
            'def {name}(text, width={width}, fill="{fill}"):\n'
            "    if len(text) >= width:\n"
            "        return text\n"
            "    return fill * (width - len(text)) + text\n"
        ),
        lambda rng: {"width": rng.randint(4, 8), "fill": rng.choice("0.*-")},
        lambda rng, c: [
            (text,) for text in ("", "7", "ab", "x" * (c["width"] - 1), "y" * c["width"], "z" * (c["width"] + 2))
        ],
    ),
    Family(
        "is_sorted",
        (
            "def {name}(values):\n"
            "    for index in range(1, len(values)):\n"
            "        if values[index - 1] > values[index]:\n"
            "            return False\n"
            "    return True\n"
        ),
        lambda rng: {},
        lambda rng, c: [(values,) for values in ([], [3], [1, 1, 2], [2, 1], [1, 3, 2], sorted(_ints(rng, 5)))],
    ),
    Family(
        "chunk",
        (
            "def {name}(values, size={size}):\n"
            "    chunks = []\n"
            "    for start in range(0, len(values), size):\n"
            "        chunks.append(values[start:start + size])\n"
            "    return chunks\n"
        ),
        lambda rng: {"size": rng.randint(2, 3)},
        lambda rng, c: [(_ints(rng, length),) for length in (0, 1, 2, 3, 5, 7)],
    ),
    Family(
        "percent",
        (
            "def {name}(part, whole, digits={digits}):\n"
            "    if whole == 0:\n"
            "        return 0.0\n"
            "    return round(100 * part / whole, digits)\n"
        ),
        lambda rng: {"digits": rng.randint(0, 2)},
        lambda rng, c: [
            (part, whole)
            for part, whole in ((1, 3), (2, 7), (5, 0), (0, 4), (9, 8), (rng.randint(1, 50), rng.randint(51, 99)))
        ],
    ),
)


# -- the module and its tests --------------------------------------------------------------------
@dataclass
class Function:
    name: str
    family: Family
    text: str
    cases: list[tuple]


@dataclass
class Module:
    name: str
    functions: list[Function]

    @property
    def file(self) -> str:
        return f"{self.name}.py"

    @property
    def test_file(self) -> str:
        return f"tests/test_{self.name}.py"

    @property
    def source(self) -> str:
        return f'"""{self.name}: small helpers."""\n\n\n' + "\n\n".join(function.text for function in self.functions)

    def function(self, name: str) -> Function:
        return next(function for function in self.functions if function.name == name)


def _draw_function(rng: random.Random, family: Family, taken: set[str]) -> Function:
    name = next(
        candidate for candidate in (f"{family.base}_{rng.choice(NOUNS)}" for _ in range(100)) if candidate not in taken
    )
    taken.add(name)
    constants = family.constants(rng)
    return Function(name, family, family.source.format(name=name, **constants), family.cases(rng, constants))


def draw_module(rng: random.Random, size: int, look_alikes: int) -> tuple[Module, str]:
    """A module of ``size`` functions whose first-drawn one (the bug's, returned by name) has ``look_alikes`` of its
    family."""
    target_family = rng.choice(FAMILIES)
    taken: set[str] = set()
    functions = [_draw_function(rng, target_family, taken) for _ in range(1 + look_alikes)]
    others = [family for family in FAMILIES if family is not target_family]
    functions += [_draw_function(rng, family, taken) for family in rng.sample(others, max(size - len(functions), 0))]
    target = functions[0].name
    rng.shuffle(functions)
    return Module(rng.choice(MODULE_NAMES), functions), target


def call_text(name: str, arguments: tuple) -> str:
    return f"{name}({', '.join(repr(argument) for argument in arguments)})"


def outcomes(source: str, calls: list[tuple[str, tuple]]) -> list[Any]:
    """What each call returns under ``source`` (an exception as ``("raises", type name)``; a source that does not load:
    every call raises). Runs only this module's own templates and their mutants."""
    namespace: dict[str, Any] = {}
    try:
        exec(compile(source, "<generated>", "exec"), namespace)
    except Exception as exc:  # noqa: BLE001  (a mutant that does not load fails every test)
        return [("raises", type(exc).__name__)] * len(calls)
    results = []
    for name, arguments in calls:
        try:
            results.append(namespace[name](*[list(a) if isinstance(a, list) else a for a in arguments]))
        except Exception as exc:  # noqa: BLE001
            results.append(("raises", type(exc).__name__))
    return results


def test_calls(module: Module) -> list[tuple[str, str, tuple]]:
    """(test name, function, arguments) of every test, in the test file's order."""
    return [
        (f"test_{function.name}_{index}", function.name, arguments)
        for function in module.functions
        for index, arguments in enumerate(function.cases, 1)
    ]


def _varied(argument: Any, rng: random.Random) -> Any:
    """Another argument of the same kind as ``argument``, at random."""
    if isinstance(argument, bool):
        return rng.random() < 0.5
    if isinstance(argument, int):
        return rng.randint(-5, 60)
    if isinstance(argument, str):
        return "".join(rng.choice("abxyz0.*-") for _ in range(rng.randint(0, 9)))
    if isinstance(argument, list):
        return [_varied(argument[0] if argument else 0, rng) for _ in range(rng.randint(0, 8))]
    return argument


def candidate_calls(function: Function, rng: random.Random) -> list[tuple]:
    """Argument tuples for ``function`` its tests do not use: each test's arguments with one of them moved to a
    neighbour (:func:`~environments.code_repair.neighbours.neighbours`), and random ones of the same kinds."""
    visible = {repr(arguments) for arguments in function.cases}
    drawn = [tuple(_varied(argument, rng) for argument in rng.choice(function.cases)) for _ in range(RANDOM_CANDIDATES)]
    unique = {repr(arguments): arguments for arguments in moved_calls(function.cases) + drawn}
    return [arguments for key, arguments in unique.items() if key not in visible]


def hidden_checks(module: Module, wrong_sources: list[str], rng: random.Random) -> list[tuple[str, tuple]] | None:
    """The hidden calls of a task: for each of ``wrong_sources`` (the buggy module and every state the fix passes
    through) up to :data:`HIDDEN_SEPARATING` calls the tests do not make on which it differs from the correct module,
    and :data:`HIDDEN_AGREEING` more per function; None when some wrong source is told from the correct one by fewer
    than :data:`MIN_SEPARATING`."""
    calls = [
        (function.name, arguments) for function in module.functions for arguments in candidate_calls(function, rng)
    ]
    right = outcomes(module.source, calls)
    chosen: dict[str, tuple[str, tuple]] = {}
    for wrong in wrong_sources:
        separating = [call for call, got, want in zip(calls, outcomes(wrong, calls), right) if got != want]
        if len(separating) < MIN_SEPARATING:
            return None
        for call in rng.sample(separating, min(HIDDEN_SEPARATING, len(separating))):
            chosen[repr(call)] = call
    for function in module.functions:
        own = [call for call in calls if call[0] == function.name and repr(call) not in chosen]
        for call in rng.sample(own, min(HIDDEN_AGREEING, len(own))):
            chosen[repr(call)] = call
    return list(chosen.values())


def test_file_text(module: Module, expected: list[Any]) -> str:
    names = ", ".join(sorted(function.name for function in module.functions))
    lines = [f"from {module.name} import {names}\n"]
    for (test, function, arguments), value in zip(test_calls(module), expected):
        lines.append(f"\ndef {test}():\n    assert {call_text(function, arguments)} == {value!r}\n")
    return "\n".join(lines)


# -- edits -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Edit:
    old: str
    new: str

    def apply(self, source: str) -> str:
        return source.replace(self.old, self.new, 1) if source.count(self.old) == 1 else source


def apply_all(source: str, bugs: list[Mutation]) -> str:
    """``source`` with every mutation of ``bugs`` (non-overlapping spans of ``source``) applied."""
    for bug in sorted(bugs, key=lambda m: m.start, reverse=True):  # the later spans first: earlier offsets stay valid
        source = bug.apply(source)
    return source


def line_edit(before: str, after: str) -> Edit:
    """The one edit that turns ``before`` into ``after``: the changed lines, widened by whole lines until the old text
    occurs exactly once in ``before``."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    changed = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    i1, i2, j1, j2 = changed[0][1], changed[-1][2], changed[0][3], changed[-1][4]
    while True:
        old, new = "".join(a[i1:i2]).rstrip("\n"), "".join(b[j1:j2]).rstrip("\n")
        if (old and before.count(old) == 1) or (i1 == 0 and i2 == len(a)):
            return Edit(old, new)
        if i1 > 0:
            i1, j1 = i1 - 1, j1 - 1
        else:
            i2, j2 = i2 + 1, j2 + 1


def function_span(source: str, name: str) -> tuple[int, int]:
    return next((first, last) for qualified, first, last in iter_functions(source) if qualified == name)


# -- tasks -------------------------------------------------------------------------------------------
@dataclass
class SyntheticTask:
    capability: str
    module: Module
    buggy: str  # the module's source with the bug
    tests: str  # the test file's text
    issue: str
    oracle: list[tuple[str, dict]]  # (tool, arguments) per turn
    capability_turn: int
    broken: tuple[str, dict]  # the move an agent without the capability makes at that turn
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    hidden: list[tuple[str, tuple]] = field(default_factory=list)  # calls only the grader makes (hidden_checks)


@dataclass
class Draft:
    """One task in the making: the module, its calls and expected values, and checks of candidate edits."""

    rng: random.Random
    module: Module
    target: str

    def __post_init__(self) -> None:
        self.source = self.module.source
        self.tests = test_calls(self.module)
        self.calls = [(function, arguments) for _, function, arguments in self.tests]
        self.expected = outcomes(self.source, self.calls)

    def failing(self, source: str) -> list[str]:
        """The tests that fail on ``source``."""
        return [
            test
            for (test, _, _), got, want in zip(self.tests, outcomes(source, self.calls), self.expected)
            if got != want
        ]

    def bugs(self, function: str, kinds: tuple[str, ...] = ()) -> list[Mutation]:
        """The mutations of ``function`` (of these kinds, if given) that fail a test of that function and no other."""
        own = {test for test, name, _ in self.tests if name == function}
        found = [m for m in mutations(self.source) if m.function == function and (not kinds or m.kind in kinds)]
        return [m for m in found if (failing := set(self.failing(m.apply(self.source)))) and failing <= own]

    def issue_for(self, buggy: str, intro: str = "") -> str:
        """The issue text of the first failing call: what was called, what came back, what was expected."""
        got_all = outcomes(buggy, self.calls)
        for (_test, function, arguments), got, want in zip(self.tests, got_all, self.expected):
            if got != want and function == self.target:
                came = f"raises {got[1]}" if isinstance(got, tuple) and got[:1] == ("raises",) else f"returns {got!r}"
                return f"{intro}`{call_text(function, arguments)}` {came}, but it should return {want!r}."
        raise ValueError("the bug fails no test of its function")

    def task(
        self,
        capability: str,
        buggy: str,
        issue: str,
        oracle: list[tuple[str, dict]],
        turn: int,
        broken: tuple[str, dict],
    ) -> SyntheticTask:
        failing = self.failing(buggy)
        tests = [test for test, _, _ in self.tests]
        test_file = test_file_text(self.module, self.expected)
        node = f"{self.module.test_file}::"
        return SyntheticTask(
            capability,
            self.module,
            buggy,
            test_file,
            issue,
            oracle,
            turn,
            broken,
            [node + test for test in failing],
            [node + test for test in tests if test not in failing],
        )


def read_move(draft: Draft, buggy: str) -> tuple[str, dict]:
    first, last = function_span(buggy, draft.target)
    return "read_file", {"path": draft.module.file, "start_line": first, "end_line": last}


def replace_move(draft: Draft, edit: Edit) -> tuple[str, dict]:
    return "replace_in_file", {"path": draft.module.file, "old": edit.old, "new": edit.new}


def _localisation(draft: Draft, difficulty: int) -> SyntheticTask | None:
    family = draft.module.function(draft.target).family
    look_alikes = [f.name for f in draft.module.functions if f.family is family and f.name != draft.target]
    bugs, decoys = draft.bugs(draft.target), [m for name in look_alikes for m in draft.bugs(name)]
    if not bugs or not decoys:
        return None
    bug, decoy = draft.rng.choice(bugs), draft.rng.choice(decoys)
    buggy = bug.apply(draft.source)
    oracle = [
        ("search", {"pattern": f"def {draft.target}("}),
        read_move(draft, buggy),
        replace_move(draft, line_edit(buggy, draft.source)),
        ("submit", {}),
    ]
    wrong = line_edit(buggy, apply_all(draft.source, [bug, decoy]))  # a look-alike changed instead
    return draft.task("code_localisation", buggy, draft.issue_for(buggy), oracle, 2, replace_move(draft, wrong))


def _reproduction(draft: Draft, difficulty: int) -> SyntheticTask | None:
    candidates = draft.bugs(draft.target)
    if len(candidates) < 2:
        return None
    bug = draft.rng.choice(candidates)
    buggy = bug.apply(draft.source)
    guesses = [m for m in candidates if m.end <= bug.start or m.start >= bug.end]
    if not guesses:
        return None
    guess = draft.rng.choice(guesses)  # a plausible fix elsewhere in the function: it changes correct code
    issue = (
        f"`{draft.target}` in {draft.module.file} gives wrong results for some inputs. We have not narrowed it "
        f"down; the tests in {draft.module.test_file} show it."
    )
    oracle = [
        ("run_tests", {"target": draft.module.test_file}),
        read_move(draft, buggy),
        replace_move(draft, line_edit(buggy, draft.source)),
        ("run_tests", {"target": draft.module.test_file}),
        ("submit", {}),
    ]
    wrong = line_edit(buggy, apply_all(draft.source, [bug, guess]))
    return draft.task("failure_reproduction", buggy, issue, oracle, 0, replace_move(draft, wrong))


def _verification(draft: Draft, difficulty: int) -> SyntheticTask | None:
    candidates = draft.bugs(draft.target)
    draft.rng.shuffle(candidates)
    pairs = [
        (first, second)
        for first in candidates
        for second in candidates
        if (second.end <= first.start or second.start >= first.end) and first.line != second.line
    ]
    if not pairs:
        return None
    first, second = pairs[0]
    buggy, only_second = apply_all(draft.source, [first, second]), second.apply(draft.source)
    if not draft.failing(buggy):  # the two bugs cancel out on every test
        return None
    test_move = ("run_tests", {"target": draft.module.test_file})
    oracle = [
        read_move(draft, buggy),
        replace_move(draft, line_edit(buggy, only_second)),
        test_move,
        replace_move(draft, line_edit(only_second, draft.source)),
        test_move,
        ("submit", {}),
    ]
    return draft.task("fix_verification", buggy, draft.issue_for(buggy), oracle, 2, ("submit", {}))


def _precision(draft: Draft, difficulty: int) -> SyntheticTask | None:
    kinds = ("dropped_branch",) if difficulty >= 2 else ("comparison", "off_by_one")
    bugs = draft.bugs(draft.target, kinds)
    if not bugs:
        return None
    buggy = draft.rng.choice(bugs).apply(draft.source)
    fix = line_edit(buggy, draft.source)
    lines = fix.new.splitlines()
    mistyped = Edit(fix.old, "\n".join([*lines[:-1], " " + lines[-1].rstrip() + ")"]))  # an indent and a bracket astray
    oracle = [read_move(draft, buggy), replace_move(draft, fix), ("submit", {})]
    return draft.task("edit_precision", buggy, draft.issue_for(buggy), oracle, 1, replace_move(draft, mistyped))


def _minimal(draft: Draft, difficulty: int) -> SyntheticTask | None:
    names = [function.name for function in draft.module.functions]
    position = names.index(draft.target)
    neighbour = names[position + 1] if position + 1 < len(names) else names[position - 1]
    bugs, changes = draft.bugs(draft.target), draft.bugs(neighbour)
    if not bugs or not changes:
        return None
    bug = draft.rng.choice(bugs)
    buggy = bug.apply(draft.source)
    # the over-broad rewrite: both functions replaced at once, the bug fixed and the neighbour "tidied" (changed)
    spans = [function_span(buggy, name) for name in (draft.target, neighbour)]
    first, last = min(span[0] for span in spans), max(span[1] for span in spans)
    tidied = draft.rng.choice(changes).apply(draft.source)
    rewrite = Edit(
        "".join(buggy.splitlines(keepends=True)[first - 1 : last]).rstrip("\n"),
        "".join(tidied.splitlines(keepends=True)[first - 1 : last]).rstrip("\n"),
    )
    oracle = [
        read_move(draft, buggy),
        replace_move(draft, line_edit(buggy, draft.source)),
        ("run_tests", {"target": draft.module.test_file}),
        ("submit", {}),
    ]
    return draft.task("minimal_change", buggy, draft.issue_for(buggy), oracle, 1, replace_move(draft, rewrite))


TEMPLATES = {
    template.capability: template
    for template in (
        CapabilityTemplate(
            "code_localisation",
            "Find the function that causes the reported behaviour and read it before "
            "editing, rather than changing a look-alike.",
            _localisation,
            DIFFICULTIES,
        ),
        CapabilityTemplate(
            "failure_reproduction",
            "Run the failing tests to see the bug before changing any code, instead of guessing a fix from the issue.",
            _reproduction,
            DIFFICULTIES,
        ),
        CapabilityTemplate(
            "fix_verification",
            "Run the tests after the last edit and before submitting, and keep fixing until they pass.",
            _verification,
            DIFFICULTIES,
        ),
        CapabilityTemplate(
            "edit_precision",
            "Make edits that apply and leave the file valid Python: the exact snippet, indentation and brackets.",
            _precision,
            DIFFICULTIES,
        ),
        CapabilityTemplate(
            "minimal_change",
            "Change only the code that causes the bug; leave the surrounding functions as they are.",
            _minimal,
            DIFFICULTIES,
        ),
    )
}


def _replay(buggy: str, moves: list[tuple[str, dict]]) -> str:
    """The module's source after ``moves`` (edits applied as replace_in_file would; the rest read or end the
    episode)."""
    for tool, arguments in moves:
        if tool == "submit":
            break
        if tool == "replace_in_file":
            buggy = Edit(arguments["old"], arguments["new"]).apply(buggy)
    return buggy


def holds(draft: Draft, task: SyntheticTask) -> bool:
    """The oracle's moves restore the module, and with its capability turn broken they leave a test failing."""
    broken = [task.broken if turn == task.capability_turn else move for turn, move in enumerate(task.oracle)]
    replaced = [move for move in task.oracle if move[0] == "replace_in_file"]
    unique = all(
        source.count(arguments["old"]) == 1
        for source, (_, arguments) in zip(_sources_before(task.buggy, replaced), replaced)
    )
    return (
        unique and _replay(task.buggy, task.oracle) == draft.source and bool(draft.failing(_replay(task.buggy, broken)))
    )


def _sources_before(buggy: str, moves: list[tuple[str, dict]]) -> list[str]:
    sources = []
    for move in moves:
        sources.append(buggy)
        buggy = _replay(buggy, [move])
    return sources


def make_task(capability: str, difficulty: int, seed: int) -> SyntheticTask:
    """The task of ``seed``: the same arguments give the same task."""
    template = TEMPLATES[capability]
    rng = random.Random(f"code_repair/{capability}/{difficulty}/{seed}")
    for _ in range(200):
        module, target = draw_module(rng, size=1 + 2 * difficulty, look_alikes=difficulty)
        draft = Draft(rng, module, target)
        task = template.build(draft, difficulty)
        if task is None or not holds(draft, task):
            continue
        replaced = [move for move in task.oracle if move[0] == "replace_in_file"]
        hidden = hidden_checks(module, _sources_before(task.buggy, replaced), rng)
        if hidden is not None:  # a task whose hidden calls cannot tell its bug from the fix is no task
            task.hidden = hidden
            return task
    raise RuntimeError(f"no {capability} task at difficulty {difficulty} for seed {seed} after 200 draws")
