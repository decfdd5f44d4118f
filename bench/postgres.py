"""A private PostgreSQL for the Postgres peers: a cluster in a temp dir, on a free port, gone afterwards.

``postgres()`` finds Debian's server binaries (package ``postgresql``: /usr/lib/postgresql/<ver>/bin,
the newest version), runs ``initdb`` into a temp dir and ``pg_ctl start`` on a free loopback port with
its unix socket in that dir, ``fsync=on`` and ``synchronous_commit=on`` (what the defaults are, set
explicitly so a packaged ``postgresql.conf`` cannot change them), and yields a ``Postgres`` with its
URL. On exit the server is stopped (``pg_ctl stop -m immediate``: nothing of it is kept) and the dir
removed. ``unavailable()`` says why no cluster can be started here ("" when one can): the bench then
reports the Postgres peers as not measured, with that reason, instead of failing.

initdb and postgres refuse to run as root: as root, both run as an unprivileged user (``RUNAS``,
created with ``useradd --system`` if missing) through ``runuser``, and the temp dir is given to it.
Authentication is ``trust`` on loopback only (a throwaway cluster no other host can reach).

Rejected: testcontainers' Postgres (no registry is reachable for its image), and SQLite for DBOS
(its durability differs from the Postgres it runs on in production).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PG_ROOT = Path("/usr/lib/postgresql")
RUNAS = "runledger-bench"
USER = "bench"  # the cluster's superuser (initdb -U)
SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on", "max_connections": "50"}


class PostgresUnavailable(RuntimeError):
    """No private PostgreSQL can be started on this machine; the message says why and what to install."""


@dataclass(frozen=True)
class Postgres:
    """A running private cluster: ``url(dbname)`` connects to it as its superuser over loopback TCP."""

    bin_dir: Path
    data_dir: Path
    port: int
    version: str

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def settings(self) -> dict[str, str]:
        """fsync, synchronous_commit, wal_sync_method and full_page_writes, as the running server reports them."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            names = ("fsync", "synchronous_commit", "wal_sync_method", "full_page_writes")
            return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]

    def create_database(self, name: str) -> str:
        """Create database ``name`` (a plain identifier) and return its URL."""
        import psycopg

        if not name.replace("_", "").isalnum():
            raise ValueError(f"database name {name!r}: use letters, digits and _")
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def bin_dir() -> Path:
    """The newest installed PostgreSQL's bin dir. Raises PostgresUnavailable when there is none."""
    versions = sorted(
        (p for p in PG_ROOT.glob("*/bin") if (p / "initdb").exists() and (p / "pg_ctl").exists()),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parent.name.split(".")],
    )
    if not versions:
        raise PostgresUnavailable(
            f"no PostgreSQL server binaries under {PG_ROOT} (install Debian's: apt-get install -y postgresql)"
        )
    return versions[-1]


def server_version() -> str:
    """``postgres --version`` of the binaries the bench would start, or why there are none."""
    try:
        done = subprocess.run([str(bin_dir() / "postgres"), "--version"], capture_output=True, text=True, timeout=10)
    except (PostgresUnavailable, OSError, subprocess.SubprocessError) as exc:
        return f"not installed ({exc})"
    return done.stdout.strip() or done.stderr.strip()


def unavailable() -> str:
    """Why a private cluster cannot be started here ("" if it can): binaries, psycopg, a user to run as."""
    try:
        bin_dir()
        import psycopg  # noqa: F401
    except PostgresUnavailable as exc:
        return str(exc)
    except ImportError:
        return "psycopg is not installed: pip install -e '.[bench]'"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: initdb cannot be run as an unprivileged user"
    return ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> tuple[list[str], str | None]:
    """The command prefix that runs a server binary unprivileged, and the user to give the dir to."""
    if os.geteuid() != 0:
        return [], None
    try:
        pwd.getpwnam(RUNAS)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", RUNAS],
            check=True, capture_output=True,
        )  # fmt: skip
    return ["runuser", "-u", RUNAS, "--"], RUNAS


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise PostgresUnavailable(f"{what} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()}")


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    """A private cluster for the duration of the block (see the module docstring).

    Raises PostgresUnavailable when it cannot be set up (no binaries, initdb or start failed)."""
    if reason := unavailable():
        raise PostgresUnavailable(reason)
    bins = bin_dir()
    prefix, owner = _as_user()
    tmp = Path(tempfile.mkdtemp(prefix="runledger-bench-pg-"))
    data = tmp / "data"
    started = False
    try:
        if owner is not None:
            shutil.chown(tmp, owner, owner)
        _run([*prefix, str(bins / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8",
              "--no-instructions"], "initdb")  # fmt: skip
        port = _free_port()
        options = " ".join(
            [f"-p {port}", "-c listen_addresses=127.0.0.1", f"-c unix_socket_directories={tmp}"]
            + [f"-c {k}={v}" for k, v in SETTINGS.items()]
        )
        log = tmp / "postgres.log"
        _run([*prefix, str(bins / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60",
              "start"], "pg_ctl start")  # fmt: skip
        started = True
        version = (bins / "postgres").parent.parent.name
        yield Postgres(bins, data, port, version)
    finally:
        if started:
            subprocess.run(
                [*prefix, str(bins / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True, timeout=60,
            )  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def optional_postgres() -> Iterator[tuple[Postgres | None, str]]:
    """``postgres()``, or ``(None, reason)`` when no cluster can be started here (the Postgres peers are
    then reported as not measured). Errors inside the block propagate as they are."""
    with contextlib.ExitStack() as stack:
        try:
            pg = stack.enter_context(postgres())
        except PostgresUnavailable as exc:
            pg, reason = None, str(exc)
        else:
            reason = ""
        yield pg, reason
