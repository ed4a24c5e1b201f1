"""AST mutations: each candidate bug is a small edit inside one function, and the mutant compiles."""

import ast

from environments.code_repair.mutations import iter_functions, mutations

SOURCE = """
LIMIT = 3 < 4


def window(seq, n=2, strict=False):
    if n < 1:
        raise ValueError("n must be positive")
    out = []
    for i in range(len(seq) - n + 1):
        out.append(seq[i:i + n])
    return pick(out, strict)


def pick(items, strict):
    if strict:
        return items[1:]
    return items


class Box:
    def has(self, item):
        return item in self.items

    def empty(self):
        return False
"""


def by_kind(kind):
    return [m for m in mutations(SOURCE) if m.kind == kind]


def test_every_kind_of_bug_is_found_with_its_function():
    kinds = {m.kind for m in mutations(SOURCE)}
    assert kinds == {"comparison", "off_by_one", "swapped_arguments", "dropped_branch", "wrong_return", "wrong_default"}
    assert {(m.function, m.replacement) for m in by_kind("comparison")} >= {
        ("window", "n >= 1"),
        ("window", "n <= 1"),
        ("Box.has", "item not in self.items"),
    }
    assert all(m.function for m in mutations(SOURCE))  # LIMIT = 3 < 4 at module level is never mutated
    assert ("window", "len(seq) - n + 1 + 1") in {(m.function, m.replacement) for m in by_kind("off_by_one")}
    assert {m.replacement for m in by_kind("swapped_arguments")} == {"strict, out"}
    assert {(m.function, m.replacement) for m in by_kind("wrong_default")} == {("window", "3"), ("window", "True")}
    assert ("Box.empty", "True") in {(m.function, m.replacement) for m in by_kind("wrong_return")}


def test_a_mutant_differs_from_the_original_in_its_own_lines_only_and_compiles():
    original = SOURCE.splitlines()
    for mutation in mutations(SOURCE):
        mutant = mutation.apply(SOURCE)
        ast.parse(mutant)
        changed = [i for i, (a, b) in enumerate(zip(original, mutant.splitlines())) if a != b]
        assert changed and changed[0] + 1 == mutation.line, mutation.description
        if mutation.kind != "dropped_branch":
            assert len(mutant.splitlines()) == len(original) and len(changed) == 1
    dropped = next(m for m in by_kind("dropped_branch") if m.function == "pick")
    assert "    pass\n    return items" in dropped.apply(SOURCE)


def test_functions_are_listed_with_their_lines():
    functions = {name: (first, last) for name, first, last in iter_functions(SOURCE)}
    assert set(functions) == {"window", "pick", "Box.has", "Box.empty"}
    first, last = functions["pick"]
    assert (
        SOURCE.splitlines()[first - 1].startswith("def pick")
        and SOURCE.splitlines()[last - 1].strip() == "return items"
    )
