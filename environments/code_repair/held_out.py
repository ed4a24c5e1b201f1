"""Failing tests held out from the agent: the working copy lacks them, grading runs them.

A package task's ``FAIL_TO_PASS`` tests come from one or more test functions
(or methods). :func:`held_out_tests` picks every other one of them, in
order, so the first, which the issue text quotes, stays visible; a task
whose failing tests are one function holds none out. :func:`remove_tests`
takes them out of a working copy's test files. An edit that answers only the
tests the agent can read still fails the ones it cannot.
"""

from __future__ import annotations

import ast
from pathlib import Path

from environments.code_repair.mutations import syntax_tree

DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def held_out_tests(fail_to_pass: list[str]) -> list[str]:
    """The test functions (``file::name`` or ``file::Class::name``, without parameters) held out from the agent."""
    functions = list(dict.fromkeys(test.split("[")[0] for test in fail_to_pass))
    return functions[1::2]


def _definition(body: list[ast.stmt], names: list[str]) -> ast.AST | None:
    found = next((node for node in body if isinstance(node, DEFINITIONS) and node.name == names[0]), None)
    if found is None or len(names) == 1:
        return found
    return _definition(found.body, names[1:]) if isinstance(found, ast.ClassDef) else None


def remove_tests(root: Path, tests: list[str]) -> None:
    """Replace each of ``tests`` (see :func:`held_out_tests`) in its file under ``root`` by ``pass``; a test not defined
    in its file's own text (inherited from another class) stays."""
    by_file: dict[str, list[list[str]]] = {}
    for test in tests:
        file, *names = test.split("::")
        by_file.setdefault(file, []).append(names)
    for file, tests_of_file in by_file.items():
        path = root / file
        text = path.read_text(encoding="utf-8")
        tree = syntax_tree(text)
        found = [node for names in tests_of_file if (node := _definition(tree.body, names)) is not None]
        lines = text.splitlines(keepends=True)
        for node in sorted(found, key=lambda node: node.lineno, reverse=True):
            first = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)])
            lines[first - 1 : node.end_lineno] = [" " * node.col_offset + "pass\n"]
        path.write_text("".join(lines), encoding="utf-8")
