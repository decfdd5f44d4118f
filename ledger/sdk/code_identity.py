"""Code identity: which source an agent runs, as a hash of its import closure.

The code hash of an agent function is ``code:`` + 16 hex digits of a sha256 over the modules the
function's module imports from the agent's own project, transitively (its *import closure*): each
module's path as its name spells it (``pkg/__init__.py``, ``pkg/agent.py``) and its source bytes,
in name order. A module is the project's when it is Python source found outside the standard
library and installed distributions (site-packages, dist-packages, any ``sys.path`` entry holding
``*.dist-info``) and outside runledger itself; runledger's examples are agent code and count.
Imports are read from the source (each statement that starts a line, ``import`` or ``from ...
import``, relative ones, at any indentation: inside functions and ``TYPE_CHECKING`` blocks too),
resolved on ``sys.path`` without running any module;
importing a module runs its parent packages' ``__init__``, so those are part of it too. Imports
made by name at run time (``importlib.import_module(text)``) are not seen, nor data files.

The same closure is what a re-run's sandbox mounts (``runledger.sandbox.rerun.code_mounts``): the
top-level packages and modules it reaches, read-only. Hashing module names and bytes, not paths,
makes the host's hash and the guest's (over the mounted copy) the same number.

Rejected: the hash of the directory holding the agent's module (runledger before 0.2, kept as
``legacy_code_hash`` to compare runs recorded under it): a file added next to the agent, a fix
in a sibling module, made every recorded run foreign. Tracking ``sys.modules`` while the agent
imports: it depends on what the process imported before (a module imported earlier is not
"newly" imported), so two processes would disagree.

The closure of a module is computed once per process (``functools.cache``): the process runs
the code it imported, whatever the disk holds later; ``forget()`` clears it (tests, a reload).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
import site
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

UNKNOWN = "code:unknown"
_RUNTIME = "runledger"
_AGENT_CODE_IN_RUNTIME = "runledger.examples"


@dataclass(frozen=True)
class ClosureModule:
    """A module of an import closure: its dotted name, source file, and whether it is a package."""

    name: str
    path: Path
    package: bool

    @property
    def relative(self) -> str:
        """Where the module lies below its ``sys.path`` entry, spelled from its name."""
        parts = self.name.split(".")
        return "/".join(parts) + ("/__init__.py" if self.package else ".py")


@functools.cache
def _library_dirs() -> tuple[Path, ...]:
    """The standard library and every place installed distributions live, resolved."""
    # The standard library is where ``os`` lies (sysconfig would say the same, for 4 ms of start-up).
    places: set[str] = {os.path.dirname(os.__file__)}
    places.update(getattr(site, "getsitepackages", list)())
    user = getattr(site, "getusersitepackages", lambda: "")()
    if user:
        places.add(user)
    known = {Path(p).resolve() for p in places if p}
    for entry in sys.path:
        if not entry or entry.endswith((".zip", ".egg")):
            continue
        p = Path(entry).resolve()
        if any(p.is_relative_to(k) for k in known):
            continue  # the standard library's own entries: no need to list them
        if p.name in ("site-packages", "dist-packages") or _holds_distributions(p):
            known.add(p)
    return tuple(sorted(known))


def _holds_distributions(entry: Path) -> bool:
    try:
        return any(child.name.endswith(".dist-info") for child in entry.iterdir())
    except OSError:
        return False


def _is_library(path: Path) -> bool:
    return any(path.is_relative_to(d) for d in _library_dirs())


def _in_project(name: str, path: Path) -> bool:
    top = name.partition(".")[0]
    if top == _RUNTIME:
        return name == _AGENT_CODE_IN_RUNTIME or name.startswith(_AGENT_CODE_IN_RUNTIME + ".")
    return not _is_library(path)


def find_module(name: str) -> importlib.machinery.ModuleSpec | None:
    """The spec of module ``name``, found without running any module (a parent package is looked
    up on the path, not imported). None when it cannot be found."""
    loaded = sys.modules.get(name)
    known: importlib.machinery.ModuleSpec | None = getattr(loaded, "__spec__", None)
    if known is not None:
        return known
    parent, _, _ = name.rpartition(".")
    try:
        if not parent:
            return importlib.util.find_spec(name)  # a top-level name: no module runs to find it
        above = find_module(parent)
        if above is None or not above.submodule_search_locations:
            return None
        locations = list(above.submodule_search_locations)
        try:
            return importlib.machinery.PathFinder.find_spec(name, locations)
        except KeyError:
            return _namespace_spec(name, locations)
    except (ImportError, ValueError, AttributeError):
        return None


def _namespace_spec(name: str, locations: list[str]) -> importlib.machinery.ModuleSpec | None:
    """The spec of namespace package ``name`` (directories without ``__init__.py``) whose parent is
    not imported. The path finder builds a namespace package's path list from its parent's module
    in ``sys.modules``, and raises KeyError when nothing imported the parent (``from
    langgraph.checkpoint.sqlite import ...`` inside a function of the agent's module, before
    anything imported ``langgraph``); a KeyError from it means no regular module or package of that
    name was found, only namespace portions: the directories of that name under ``locations``."""
    last = name.rpartition(".")[2]
    portions = [str(Path(place) / last) for place in locations if (Path(place) / last).is_dir()]
    if not portions:
        return None
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = portions
    return spec


def _source_module(name: str) -> ClosureModule | None:
    spec = find_module(name)
    if spec is None or not spec.has_location or not spec.origin or not spec.origin.endswith(".py"):
        return None  # builtin, frozen, an extension, a namespace package: no source of its own
    path = Path(spec.origin).resolve()
    return ClosureModule(name, path, spec.submodule_search_locations is not None)


# An import statement at the start of a line (any indentation: inside a function too), with a
# parenthesised name list or backslash continuations. Each match is parsed on its own, which is exact
# for real imports and skips text that only looks like one (in a string); parsing whole modules was
# most of the cost (52 modules: 160 ms against 25 ms).
_IMPORT = re.compile(
    rb"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import[ \t]*(?:\([^)]*\)|(?:[^\n\\]|\\.)*)|import[ \t]+(?:[^\n\\]|\\.)*)",
    re.MULTILINE | re.DOTALL,
)


def _import_statements(source: bytes) -> list[ast.stmt]:
    found: list[ast.stmt] = []
    for match in _IMPORT.finditer(source):
        try:
            found.extend(ast.parse(match.group(0).strip()).body)
        except (SyntaxError, ValueError):
            continue  # not a statement (text in a string, a line cut oddly): nothing imported by it
    return found


def _imported_names(module: ClosureModule, statements: list[ast.stmt]) -> set[str]:
    """Every module name ``module``'s import statements may import (candidates: a ``from`` name may be an attribute)."""
    package = module.name if module.package else module.name.rpartition(".")[0]
    names: set[str] = set()
    for node in statements:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts) or not parts:
                    continue  # beyond the top-level package: the import fails anyway
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            elif node.module:
                base = node.module
            else:
                continue
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


@functools.cache
def import_closure(module: str) -> tuple[ClosureModule, ...]:
    """The modules of the agent's project that importing ``module`` runs, ``module`` first, then
    by name. ``module`` itself is included whatever its place (a function of runledger's own is
    still the code that runs); a module that cannot be found or read is left out."""
    root = _source_module(module)
    if root is None:
        return ()
    found: dict[str, ClosureModule] = {root.name: root}
    todo = [root] + [m for p in _with_parents(module)[:-1] if (m := _project_module(p)) is not None]
    seen = {m.name for m in todo}
    while todo:
        current = todo.pop()
        found[current.name] = current
        try:
            statements = _import_statements(current.path.read_bytes())
        except OSError:
            continue
        for name in sorted(_imported_names(current, statements)):
            for each in _with_parents(name):
                if each in seen:
                    continue
                seen.add(each)
                candidate = _project_module(each)
                if candidate is not None:
                    todo.append(candidate)
    rest = sorted((m for n, m in found.items() if n != root.name), key=lambda m: m.name)
    return (root, *rest)


def _project_module(name: str) -> ClosureModule | None:
    found = _source_module(name)
    return found if found is not None and _in_project(found.name, found.path) else None


def closure_digest(modules: tuple[ClosureModule, ...]) -> str:
    """``code:`` + 16 hex of the sha256 over each module's relative path and source bytes, by name."""
    if not modules:
        return UNKNOWN
    h = hashlib.sha256()
    for m in sorted(modules, key=lambda m: m.relative):
        h.update(m.relative.encode())
        h.update(b"\0")
        h.update(m.path.read_bytes())
        h.update(b"\0")
    return "code:" + h.hexdigest()[:16]


@functools.cache
def _module_hash(module: str) -> str:
    try:
        return closure_digest(import_closure(module))
    except OSError:
        return UNKNOWN


def defining_module(fn: Callable[..., Any]) -> str | None:
    """The name of the module that defines ``fn`` (after unwrapping decorators), or None."""
    target = inspect.unwrap(fn)
    name = getattr(target, "__module__", None)
    return name if isinstance(name, str) else None


def code_hash(fn: Callable[..., Any]) -> str:
    """The code hash of ``fn``: its module's import closure (module docstring). ``code:unknown`` for a
    function without a source module."""
    module = defining_module(fn)
    return _module_hash(module) if module else UNKNOWN


@functools.cache
def _dir_hash(directory: str) -> str:
    h = hashlib.sha256()
    root = Path(directory)
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(str(path.relative_to(root)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return "code:" + h.hexdigest()[:16]


def legacy_code_hash(fn: Callable[..., Any]) -> str:
    """The code hash of runs recorded before import closures (their version tuple has no
    ``code_hash``): every ``*.py`` below the directory of ``fn``'s source file. Only to compare
    such a run with the code at hand."""
    source = inspect.getsourcefile(inspect.unwrap(fn))
    if source is None:
        return UNKNOWN
    return _dir_hash(str(Path(source).resolve().parent))


def forget() -> None:
    """Forget every closure and hash computed in this process (the next one reads the disk again)."""
    for cached in (import_closure, _module_hash, _dir_hash, _library_dirs):
        cached.cache_clear()
