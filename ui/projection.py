"""The page's projection: a DuckDB file this process owns and keeps current by following the stream.

The run list is a query on the projection (``runs``, ``run_costs``); the file is kept current by a
``Projector`` in follow mode, in a background task of the page's process, the same projector
``runledger project --follow`` runs. A page that must show what is already in the stream (a list
requested right after an approval) waits, bounded, until the committed position reaches the
stream's last sequence at the time of the request (``caught_up``).

Reads go through one cursor of their own, used by one thread at a time: the projector commits on
the store's connection in a thread of its own, and a DuckDB connection is not to be shared between
threads. DuckDB lets one process write a file, so the page defaults to a file of its own
(``$RUNLEDGER_HOME/ui.duckdb``), leaving ``ledger.duckdb`` to ``runledger project`` and ``sql``.

Rejected: projecting on each request (a request would pay for the stream's status and a reader's
start-up every time: milliseconds per request for nothing when the file is current), and reading
the run list from the log (``runledger runs`` does; it reads every run's events each time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runledger.errors import LedgerError
from runledger.log.client import LedgerClient
from runledger.log.server import runledger_home
from runledger.projections.errors import ProjectionError, StreamReadError
from runledger.projections.projector import Projector, stream_status
from runledger.projections.queries import QueryResult, run_sql
from runledger.projections.store import ProjectionStore

logger = logging.getLogger(__name__)

DB_NAME = "ui.duckdb"


def default_ui_db() -> Path:
    return runledger_home() / DB_NAME


class ProjectionFollower:
    """Owns the projection file while the page runs: follows the stream into it, answers queries."""

    def __init__(self, client: LedgerClient, path: Path) -> None:
        self.client = client
        self.path = Path(path)
        self.error: str | None = None  # why following stopped for good (another stream's file, ...)
        self._store: ProjectionStore | None = None
        self._cursor: Any = None
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open (create, migrate) the file and start following. Raises ProjectionError."""
        self._store = await asyncio.to_thread(ProjectionStore, self.path)
        self._cursor = self._store.con.cursor()
        self._task = asyncio.create_task(self._follow(), name="runledger-ui-projector")

    async def _follow(self) -> None:
        backoff = 0.5
        assert self._store is not None
        while not self._stop.is_set():
            try:
                await Projector(self.client, self._store, workers=0).run(follow=True, stop=self._stop)
            except StreamReadError as exc:
                logger.warning("projection: %s; following again in %gs", exc, backoff)
            except ProjectionError as exc:  # another stream's file, events expired: not cured by waiting
                self.error = str(exc)
                logger.error("projection stopped: %s", exc)
                return
            except LedgerError as exc:
                logger.warning("projection: %s; following again in %gs", exc, backoff)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=backoff)
            backoff = min(backoff * 2, 10.0)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout=10)
        async with self._lock:
            if self._cursor is not None:
                self._cursor.close()
                self._cursor = None
        if self._store is not None:
            await asyncio.to_thread(self._store.close)
            self._store = None

    # -- reading --------------------------------------------------------------------------------------

    async def query(self, sql: str, params: Sequence[Any] | None = None) -> QueryResult:
        """One statement on the committed data. Raises QueryError."""
        async with self._lock:
            if self._cursor is None:
                raise ProjectionError("the page's projection is closed")
            return await asyncio.to_thread(run_sql, self._cursor, sql, params)

    async def position(self) -> int:
        result = await self.query("SELECT last_seq FROM projector_state")
        return int(result.rows[0][0]) if result.rows else 0

    async def caught_up(self, timeout: float = 3.0) -> bool:
        """Wait until everything in the stream now is projected (at most ``timeout`` seconds)."""
        if self.error is not None:
            return False
        target = (await stream_status(self.client)).last_seq
        deadline = time.monotonic() + timeout
        while await self.position() < target:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True
