"""Imports run one way (docs/layers.md): environments <- trace_ray's core <- actors, serve_apps <- trace_ray.app.

Every product file's imports are read with ``ast``, at module level and inside functions. The checks fail on an
import against the layer order, on a circle between files, on a project module imported inside a function outside
the entry points (``trace_ray/app``), on Ray imported at module level in the core, and on an optional heavy package
(vLLM, τ²-bench) imported at module level anywhere.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("environments", "trace_ray", "actors", "serve_apps")
ENTRY_POINTS = "trace_ray.app"  # the CLI, the stages, the pipeline: the only place that may defer project imports
OPTIONAL_PACKAGES = ("vllm", "tau2")  # imported only inside the functions that need them


def layer(module: str) -> int:
    top = module.split(".")[0]
    if top == "environments":
        return 1
    if module == ENTRY_POINTS or module.startswith(ENTRY_POINTS + "."):
        return 4
    if top in ("actors", "serve_apps"):
        return 3
    return 2


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the project module imported, or the outside package's top name
    line: int
    deferred: bool  # inside a function

    @property
    def project(self) -> bool:
        return self.target.split(".")[0] in PACKAGES


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(root: Path) -> list[Import]:
    """Every import of every product file; a project import resolves to the module it names (a package's
    ``__init__`` for ``from package import name`` unless ``name`` is a submodule)."""
    known = modules(root)

    def resolve(name: str) -> str:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name

    found = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        in_function = {
            id(node)
            for function in ast.walk(tree)
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(function)
        }
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.split(".")[0] in PACKAGES else name.split(".")[0]
                if target and target != module:
                    found.append(Import(module, target, node.lineno, id(node) in in_function))
    return found


def upward(found: list[Import]) -> list[str]:
    return [
        f"{i.source}:{i.line} imports {i.target} (layer {layer(i.source)} imports layer {layer(i.target)})"
        for i in found
        if i.project and layer(i.target) > layer(i.source)
    ]


def deferred(found: list[Import]) -> list[str]:
    return [
        f"{i.source}:{i.line} imports {i.target} inside a function"
        for i in found
        if i.project and i.deferred and layer(i.source) != 4
    ]


def module_level(found: list[Import], packages: tuple[str, ...], where=lambda module: True) -> list[str]:
    return [
        f"{i.source}:{i.line} imports {i.target} at module level"
        for i in found
        if not i.deferred and i.target in packages and where(i.source)
    ]


def circles(found: list[Import]) -> list[list[str]]:
    """Groups of files that import each other, directly or around a loop (Tarjan's strongly connected components)."""
    graph: dict[str, set[str]] = {}
    for i in found:
        if i.project:
            graph.setdefault(i.source, set()).add(i.target)
            graph.setdefault(i.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def problems(root: Path) -> list[str]:
    found = imports(root)
    return [
        *upward(found),
        *deferred(found),
        *module_level(found, ("ray",), where=lambda module: layer(module) == 2),
        *module_level(found, OPTIONAL_PACKAGES),
        *(f"circle: {' <-> '.join(group)}" for group in circles(found)),
    ]


def test_the_product_imports_one_way():
    assert problems(ROOT) == []


def test_the_checks_see_every_layer_and_the_functions_inside():
    found = imports(ROOT)
    by_layer = {layer(i.source) for i in found}
    assert by_layer == {1, 2, 3, 4}
    assert any(i.deferred and i.project for i in found)  # trace_ray.app defers some commands' heavy imports
    assert any(i.source == "actors.rollout_service" and i.target == "actors.rollout_pool" for i in found)


def planted_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    for package in PACKAGES:
        shutil.copytree(ROOT / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def plant(copy: Path, relative: str, text: str) -> None:
    path = copy / relative
    path.write_text(path.read_text() + "\n" + text + "\n")


def test_a_planted_upward_import_fails(tmp_path):
    copy = planted_copy(tmp_path)
    plant(copy, "environments/registry.py", "from trace_ray.config import TraceConfig")
    plant(copy, "trace_ray/rollout_loop.py", "from actors.rollout_pool import RolloutPool")
    plant(copy, "serve_apps/openai_chat.py", "import trace_ray.app.cli")
    found = problems(copy)
    # via the plant
    assert found[3:] == ["circle: actors.environment_actor <-> actors.rollout_pool <-> trace_ray.rollout_loop"]
    assert found[0].startswith("environments.registry:") and "trace_ray.config (layer 1 imports layer 2)" in found[0]
    assert "trace_ray.rollout_loop:" in found[1] and "actors.rollout_pool (layer 2 imports layer 3)" in found[1]
    assert "serve_apps.openai_chat:" in found[2] and "trace_ray.app.cli (layer 3 imports layer 4)" in found[2]


def test_a_planted_deferred_import_and_module_level_ray_fail(tmp_path):
    copy = planted_copy(tmp_path)
    plant(
        copy, "trace_ray/metrics.py", "def later():\n    from trace_ray.models import load_model\n    return load_model"
    )
    plant(copy, "trace_ray/trajectory.py", "import ray")
    plant(copy, "environments/device/state.py", "from tau2.data_model import tasks")
    found = problems(copy)
    assert [line.split(":")[0] for line in found] == [
        "trace_ray.metrics",
        "trace_ray.trajectory",
        "environments.device.state",
    ]
    assert (
        "inside a function" in found[0]
        and "imports ray at module level" in found[1]
        and "tau2 at module level" in found[2]
    )


def test_a_planted_circle_fails(tmp_path):
    copy = planted_copy(tmp_path)
    plant(copy, "trace_ray/trajectory.py", "from trace_ray.rollout_loop import EpisodeTask")  # rollout_loop imports it
    assert problems(copy) == ["circle: trace_ray.rollout_loop <-> trace_ray.trajectory"]
