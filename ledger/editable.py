"""The sub-packages an editable install keeps in their own folders, shown to package walkers.

A wheel installs ``projections/``, ``sandbox/``, ``integrations/``, ``ui/`` and ``examples/`` inside
``runledger/``; ``pip install -e .`` leaves them where they are and setuptools' finder maps each name to
its folder, so they import, but ``runledger.__path__`` holds only ``ledger/`` and a walker
(``pkgutil.walk_packages(runledger.__path__, "runledger.")``, a plugin scanner, a documentation
builder) never saw them. ``show_siblings`` adds one entry to ``runledger.__path__`` whose importer
lists them and imports nothing itself (an import still goes through the install's own finder).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator, MutableSequence


class _Siblings:
    """The importer of the added path entry: lists the sub-packages that sit in other folders."""

    def __init__(self, parent: str, names: tuple[str, ...]) -> None:
        self._parent = parent
        self._names = names

    def find_spec(self, fullname: str, target: object = None) -> None:
        return None  # imports are the install's finder's business

    def invalidate_caches(self) -> None:
        pass

    def iter_modules(self, prefix: str = "") -> Iterator[tuple[str, bool]]:
        """What ``pkgutil.iter_modules`` asks an importer: each sub-package this install can import."""
        for name in self._names:
            if importlib.util.find_spec(f"{self._parent}.{name}") is not None:
                yield prefix + name, True


def show_siblings(path: MutableSequence[str], parent: str, names: tuple[str, ...]) -> None:
    """Add to ``path`` (the package's ``__path__``) an entry listing ``names``, the package's
    sub-packages an editable install maps from other folders."""
    entry = f"{path[0]}/<sub-packages of the editable install>"  # never a folder: only this hook claims it

    def hook(item: str) -> _Siblings:
        if item != entry:
            raise ImportError("not runledger's editable sub-packages")
        return _Siblings(parent, names)

    if entry not in path:
        sys.path_hooks.insert(0, hook)
        sys.path_importer_cache.pop(entry, None)
        path.append(entry)
