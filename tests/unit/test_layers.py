"""The package's shape: no module imports in a circle, and every layer imports only the ones below.

Read from the source with ``ast`` (nothing is imported), so a lazy import inside a function
counts like one at the top: it would still close a circle at run time. Imports under
``if TYPE_CHECKING:`` are left out; they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The folders of the repository and the names they install as (pyproject.toml, package-dir).
ROOTS = {"ledger": "runledger", "projections": "runledger.projections", "sandbox": "runledger.sandbox",
         "integrations": "runledger.integrations", "ui": "runledger.ui", "examples": "runledger.examples"}  # fmt: skip
# Lower layers never import higher ones; the core's subpackages stack the way the package docstring draws them.
LAYERS = [
    ("runledger.errors", "runledger.extras"),
    ("runledger.record",),
    ("runledger.log",),
    ("runledger.protect",),
    ("runledger.sdk",),
    ("runledger.ops",),
    ("runledger.cli", "runledger.__main__"),
    ("runledger.projections",),
    ("runledger.sandbox",),
    ("runledger.integrations",),
    ("runledger.testing",),
    ("runledger.ui",),
    ("runledger.examples",),
]


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, name in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = path
    return found


MODULES = _modules()


def _runtime_imports(tree: ast.AST) -> list[str]:
    """Absolute names imported, leaving out ``if TYPE_CHECKING:`` blocks."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
            names.append(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _resolve(name: str) -> str | None:
    """The deepest module of ours that ``name`` names (``runledger.log.client.connect`` -> the module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        edges = {_resolve(n) for n in _runtime_imports(ast.parse(path.read_text(), str(path)))}
        # A module's own packages are being imported already when it runs: not an edge of a circle.
        graph[module] = {e for e in edges if e and e != module and not module.startswith(e + ".")}
    return graph


def _layer(module: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS and to the package docstring")


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        if module != "runledger":
            _layer(module)


def test_no_module_imports_in_a_circle() -> None:
    graph = _graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module)
    assert cycles == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_layers_import_only_downwards() -> None:
    graph = _graph()
    upward = [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if module != "runledger"
        for target in sorted(targets)
        if _layer(target) > _layer(module)
    ]
    assert upward == []


@pytest.mark.parametrize("folder", [*ROOTS, "tests", "bench"])
def test_nothing_imports_the_folders_by_their_repository_names(folder: str) -> None:
    """``ledger``, ``sandbox``... are folders, not packages: only ``runledger.*`` may be imported."""
    bad = []
    for path in sorted((REPO / folder).rglob("*.py")):
        for name in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if name.split(".")[0] in ROOTS:
                bad.append(f"{path.relative_to(REPO)}: {name}")
    assert bad == []
