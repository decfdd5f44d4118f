"""Files only their owner can read: what runledger writes to disk is mode 0600, its directories 0700.

The ledger's state holds what must not leak to other local users: the master key, role
passwords, the nats-server store, projections and exports of run content. ``private_dir``
and ``write_private`` set the modes explicitly (``chmod``/``fchmod``), so neither a permissive
umask (``0o000``) nor a file left by an older version with wider modes changes the result.

Files created by someone else's code (DuckDB's database and WAL, its Parquet files, the
nats-server store) are covered by ``private_umask``: while it is held, the process umask
masks group and other bits, so whatever is created meanwhile is private. The umask is
process-wide; holding it makes other threads' new files private too, which errs on the safe
side. It is reference-counted, so overlapping holders (a projector and an export in one
process) restore the umask once, when the last one leaves.

Rejected: fixing modes afterwards (``chmod`` after DuckDB wrote): a window in which the file
is readable, and DuckDB deletes and re-creates its WAL at every checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700
_PRIVATE_UMASK = 0o077

_lock = threading.Lock()
_holders = 0
_saved_umask = 0


def private_dir(path: Path) -> Path:
    """Create ``path`` (and any missing parents) mode 0700; an existing ``path`` loses its group
    and other bits (never gains a bit: what its owner made read-only stays so).

    Parents that exist already are left as they are: they may be shared (``/tmp``, a home)."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=DIR_MODE)
        os.chmod(d, DIR_MODE)  # mkdir's mode is masked by the umask only ever downwards; be exact
    # An existing directory only loses group and other bits: one its owner made read-only stays
    # read-only (and is then refused as a data dir), never silently made writable.
    current = stat.S_IMODE(os.stat(path).st_mode)
    if current & ~DIR_MODE:
        os.chmod(path, current & DIR_MODE)
    return path


def write_private(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, then rename), mode 0600.

    The parent directory must exist. A reader never sees a half-written file nor, even for a
    moment, a readable one."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mkstemp: 0600
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def open_private(path: Path, mode: str = "ab") -> int:
    """A file descriptor of ``path`` opened for appending or writing (created 0600, existing set to 0600)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode.startswith("a") else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def tighten(path: Path) -> None:
    """Set an existing file to 0600 or directory tree to 0700/0600 (what others created before us)."""
    path = Path(path)
    if path.is_dir():
        os.chmod(path, DIR_MODE)
        for root, dirs, files in os.walk(path):
            for name in dirs:
                os.chmod(os.path.join(root, name), DIR_MODE)
            for name in files:
                os.chmod(os.path.join(root, name), FILE_MODE)
    elif path.exists():
        os.chmod(path, FILE_MODE)


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Hold a umask that masks group and other bits (see the module docstring)."""
    acquire_private_umask()
    try:
        yield
    finally:
        release_private_umask()


def acquire_private_umask() -> None:
    """``private_umask`` for a holder whose life is not a ``with`` block (an open store); pair with release."""
    global _holders, _saved_umask
    with _lock:
        if _holders == 0:
            _saved_umask = os.umask(_PRIVATE_UMASK)
            os.umask(_saved_umask | _PRIVATE_UMASK)
        else:  # held already: make sure nothing loosened it meanwhile
            current = os.umask(_PRIVATE_UMASK)
            os.umask(current | _PRIVATE_UMASK)
        _holders += 1


def release_private_umask() -> None:
    global _holders
    with _lock:
        if _holders == 0:
            return
        _holders -= 1
        if _holders == 0:
            os.umask(_saved_umask)
