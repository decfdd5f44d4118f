"""The sub-commands and ``export`` modes installed packages register (entry points), cached between calls.

``runledger`` assembles its sub-commands from the ``runledger.commands`` entry points and
``runledger export``'s modes from ``runledger.export`` (pyproject.toml). Finding them through
``importlib.metadata`` costs every command about 35 ms of CPU on a 2-core machine: ~25 ms to import
it (it brings ``email``, ``zipfile``, ``csv``...) and ~6 ms a group to read the metadata of every
installed distribution. Both groups are read once and kept in a cache file, which later calls
use as long as the Python environment is the one that wrote it: the same interpreter, the same
``sys.path``, and the same modification time of every ``sys.path`` entry. Installing, upgrading or
removing a distribution (an editable install too) adds or removes a ``*.dist-info`` folder in one
of those folders, which changes its modification time, so the next call reads the metadata again.
A ``*.dist-info/entry_points.txt`` edited in place by hand is not noticed: delete the cache file
(``$XDG_CACHE_HOME/runledger/``, default ``~/.cache/runledger/``).

The cache is only ever a shortcut: a file that cannot be read, written or parsed, or that is not
this environment's, is ignored, and the metadata is read as without it.

Rejected: reading the ``*.dist-info/entry_points.txt`` files without ``importlib.metadata`` (a
second implementation of the metadata's search and precedence rules); caching in ``$RUNLEDGER_HOME``
(it holds a ledger's server state and keys; which packages are installed is the environment's);
building only the parser of the command named on the command line (each package's ``register``
adds several commands, and ``--help`` needs them all).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The groups the CLI reads; both are read (and cached) together.
GROUPS = ("runledger.commands", "runledger.export")
_FORMAT = 1


@dataclass(frozen=True)
class Registered:
    """One entry point: its ``name`` and ``value`` (``module:attribute``), as ``importlib.metadata`` gives them."""

    name: str
    value: str

    def load(self) -> Any:
        """The object ``value`` names (what ``importlib.metadata.EntryPoint.load`` returns)."""
        module, _, attribute = self.value.split("[", 1)[0].partition(":")  # extras ("[name]") are not checked
        found: Any = importlib.import_module(module.strip())
        for part in filter(None, attribute.strip().split(".")):
            found = getattr(found, part)
        return found


def registered(group: str) -> list[Registered]:
    """The entry points of ``group`` (one of ``GROUPS``), sorted by name; from the cache when it is this
    environment's, else from ``importlib.metadata`` (then cached)."""
    return entry_points_of_groups()[group]


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "runledger"


def environment_key() -> list[Any]:
    """What the cached entry points hold for: the interpreter, ``sys.path`` and each entry's mtime."""
    stamps: list[int | None] = []
    for entry in sys.path:
        try:
            stamps.append(os.stat(entry or ".").st_mtime_ns)
        except OSError:
            stamps.append(None)
    return [_FORMAT, sys.executable, list(sys.path), stamps]


def entry_points_of_groups() -> dict[str, list[Registered]]:
    key = environment_key()
    # One file an environment (a venv, a PYTHONPATH); the key inside decides whether it is this one's.
    path = cache_dir() / f"entry-points-{zlib.crc32(json.dumps(key[:3]).encode()):08x}.json"
    cached = _read(path, key)
    if cached is not None:
        return cached
    found = _from_metadata()
    _write(path, {"key": key, "groups": {g: [[r.name, r.value] for r in found[g]] for g in GROUPS}})
    return found


def _from_metadata() -> dict[str, list[Registered]]:
    from importlib.metadata import entry_points

    return {
        group: sorted({ep.name: Registered(ep.name, ep.value) for ep in entry_points(group=group)}.values(),
                      key=lambda r: r.name)
        for group in GROUPS
    }  # fmt: skip


def _read(path: Path, key: list[Any]) -> dict[str, list[Registered]] | None:
    try:
        data = json.loads(path.read_text())
        if data["key"] != key:
            return None
        return {group: [Registered(str(name), str(value)) for name, value in data["groups"][group]] for group in GROUPS}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, data: dict[str, Any]) -> None:
    """Replace the cache file atomically (two calls writing at once leave one whole file); never raise."""
    import tempfile  # only when the cache is written: it imports random, shutil...

    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".entry-points-")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
