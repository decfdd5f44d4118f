"""A package's public names imported on first use (PEP 562): ``lazy_names`` makes the module-level
``__getattr__`` and ``__dir__`` that ``runledger.testing`` and ``runledger.projections`` share, so
``from runledger.projections import project`` loads the projector and nothing else of the package.
(``runledger`` itself has its own: it also names each loaded class as ``runledger.<name>``.)"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any


def lazy_names(
    package: str, module_of: Mapping[str, str], namespace: MutableMapping[str, Any], public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` (its ``__name__``), whose public names are
    ``public`` (its ``__all__``), each found in the module ``module_of`` names; a name, once loaded, is
    kept in ``namespace`` (its ``globals()``), so later lookups skip ``__getattr__``."""

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:  # a submodule (``from package import module``) is imported by Python then
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(public))

    return __getattr__, __dir__
