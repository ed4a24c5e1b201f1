"""Bugs injected into Python source by AST mutation, each a small text edit inside one function.

``mutations(source)`` lists every candidate bug of a module: a comparison
flipped or its boundary moved, an off-by-one in a ``range`` bound or a slice,
the first two arguments of a call swapped, a branch dropped, a returned
boolean negated or a value returned as ``None``, a parameter's default
changed. Each :class:`Mutation` replaces one node's source text (so the
diff against the original is a line or two, as a real bug's fix would be)
and names the function it lives in. Pure functions, no I/O.

:func:`syntax_tree` is ``ast.parse`` for every module of this package:
CPython 3.11 builds syntax trees with interpreter-wide state, and the
self-checks grade episodes in threads (two parses at once fail with
``SystemError: AST constructor recursion depth mismatch``), so one parse
runs at a time.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

COMPARISON_FLIPS = {  # the negation, then the boundary moved
    ast.Lt: ("<", [">=", "<="]),
    ast.LtE: ("<=", [">", "<"]),
    ast.Gt: (">", ["<=", ">="]),
    ast.GtE: (">=", ["<", ">"]),
    ast.Eq: ("==", ["!="]),
    ast.NotEq: ("!=", ["=="]),
    ast.In: ("in", ["not in"]),
    ast.NotIn: ("not in", ["in"]),
    ast.Is: ("is", ["is not"]),
    ast.IsNot: ("is not", ["is"]),
}


AST_LOCK = threading.Lock()  # held while a syntax tree is built or read back (see the module docstring)


def syntax_tree(source: str) -> ast.Module:
    with AST_LOCK:
        return ast.parse(source)


def literal(text: str) -> Any:
    """``ast.literal_eval`` under the same lock."""
    with AST_LOCK:
        return ast.literal_eval(text)


@dataclass(frozen=True)
class Mutation:
    kind: str  # comparison | off_by_one | swapped_arguments | dropped_branch | wrong_return | wrong_default
    function: str  # qualified name of the function holding the bug
    line: int  # 1-based line of the changed text in the original
    original: str  # the replaced source text
    replacement: str
    start: int  # character offsets of ``original`` in the source
    end: int

    def apply(self, source: str) -> str:
        return source[: self.start] + self.replacement + source[self.end :]

    @property
    def description(self) -> str:
        return (
            f"{self.kind} in {self.function} (line {self.line}): {self.original.strip()!r} -> "
            f"{self.replacement.strip()!r}"
        )


def _offsets(source: str) -> list[int]:
    """Character offset of each line's start (index 0 is line 1)."""
    starts, position = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(position)
        position += len(line)
    return starts + [position]


class _Collector(ast.NodeVisitor):
    def __init__(self, source: str):
        self.source = source
        self.lines = _offsets(source)
        self.scope: list[str] = []
        self.found: list[Mutation] = []

    # -- positions ------------------------------------------------------------------------
    def _span(self, node: ast.AST) -> tuple[int, int]:
        return self.lines[node.lineno - 1] + node.col_offset, self.lines[node.end_lineno - 1] + node.end_col_offset

    def _text(self, node: ast.AST) -> str:
        start, end = self._span(node)
        return self.source[start:end]

    def _add(self, kind: str, node: ast.AST, replacement: str, span: tuple[int, int] | None = None) -> None:
        if not self.scope:
            return  # module level: no function to localise
        start, end = span or self._span(node)
        original = self.source[start:end]
        if replacement != original:
            line = self.source.count("\n", 0, start) + 1
            self.found.append(Mutation(kind, ".".join(self.scope), line, original, replacement, start, end))

    # -- scopes ---------------------------------------------------------------------------
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self._defaults(node)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    # -- operators ------------------------------------------------------------------------
    def visit_Compare(self, node: ast.Compare) -> None:
        if len(node.ops) == 1 and type(node.ops[0]) in COMPARISON_FLIPS:
            _, flips = COMPARISON_FLIPS[type(node.ops[0])]
            left, right = self._text(node.left), self._text(node.comparators[0])
            for flipped in flips:
                self._add("comparison", node, f"{left} {flipped} {right}")
        self.generic_visit(node)

    def _shift(self, bound: ast.AST) -> None:
        """An off-by-one: the bound plus one and minus one (an integer literal is rewritten, anything else gets ``+
        1``)."""
        for delta in (1, -1):
            if isinstance(bound, ast.Constant) and isinstance(bound.value, int) and not isinstance(bound.value, bool):
                self._add("off_by_one", bound, str(bound.value + delta))
            else:
                self._add("off_by_one", bound, f"{self._text(bound)} {'+' if delta > 0 else '-'} 1")

    def visit_Call(self, node: ast.Call) -> None:
        is_range = isinstance(node.func, ast.Name) and node.func.id == "range"
        if is_range and node.args and not node.keywords:
            self._shift(node.args[1] if len(node.args) >= 2 else node.args[0])
        elif len(node.args) >= 2 and not any(isinstance(arg, ast.Starred) for arg in node.args[:2]):
            first, second = node.args[0], node.args[1]
            if self._text(first) != self._text(second):
                (start, first_end), (second_start, end) = self._span(first), self._span(second)
                between = self.source[first_end:second_start]
                self._add("swapped_arguments", node, f"{self._text(second)}{between}{self._text(first)}", (start, end))
        self.generic_visit(node)

    def visit_Slice(self, node: ast.Slice) -> None:
        for bound in (node.lower, node.upper):
            if isinstance(bound, (ast.Constant, ast.Name, ast.BinOp)) and not (
                isinstance(bound, ast.Constant) and not isinstance(bound.value, int)
            ):
                self._shift(bound)
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        if self.scope and not node.orelse:
            start = self.lines[node.lineno - 1]
            end = self.lines[node.end_lineno]  # the whole lines of the statement
            indent = " " * node.col_offset
            line_start = start + node.col_offset
            if self.source[start:line_start].strip() == "":  # the if begins its line
                self._add("dropped_branch", node, f"{indent}pass\n", (start, end))
        self.generic_visit(node)

    def visit_Return(self, node: ast.Return) -> None:
        value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, bool):
            self._add("wrong_return", value, str(not value.value))
        elif value is not None and not (isinstance(value, ast.Constant) and value.value is None):
            self._add("wrong_return", value, "None")
        self.generic_visit(node)

    def _defaults(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
            if isinstance(default, ast.Constant):
                value = default.value
                if isinstance(value, bool):
                    self._add("wrong_default", default, str(not value))
                elif isinstance(value, int):
                    self._add("wrong_default", default, str(value + 1))


def mutations(source: str) -> list[Mutation]:
    """Every candidate bug of ``source`` whose mutant still compiles, in source order."""
    collector = _Collector(source)
    collector.visit(syntax_tree(source))
    found = []
    for mutation in sorted(collector.found, key=lambda m: (m.start, m.kind, m.replacement)):
        try:
            compile(mutation.apply(source), "<mutant>", "exec")
        except SyntaxError:
            continue
        found.append(mutation)
    return found


def iter_functions(source: str) -> Iterator[tuple[str, int, int]]:
    """(qualified name, first line, last line) of every function and method of ``source``."""

    def walk(body, scope):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = ".".join([*scope, node.name])
                yield name, node.lineno, node.end_lineno
                yield from walk(node.body, [*scope, node.name])
            elif isinstance(node, ast.ClassDef):
                yield from walk(node.body, [*scope, node.name])

    yield from walk(syntax_tree(source).body, [])
