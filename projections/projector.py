"""The projector: the LEDGER stream into a DuckDB file, batch by batch, exactly once.

One loop: read a batch of contiguous raw records (``projections.reader``), decode and fold
it (``PartitionProjector``, pure), and commit every table's rows together with the new
stream position in one DuckDB transaction (``ProjectionStore.commit``). A crash anywhere
leaves the file at the end of the last committed batch; the next run starts right after
it, so no row is lost or doubled (tests/integration/test_projector_crash.py SIGKILLs it at
every named point).

``rebuild`` projects from the stream's first sequence into a fresh file and swaps it into
place with ``os.replace`` once complete; the old file stays readable until then.

Memory is bounded: the projector keeps the checkpoints of the runs it saw most recently
(``cache_limit``) and reloads others from the ``checkpoints`` table when they show up again,
so a long-running run folds incrementally instead of from its first event every batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats

from ledger.client import LedgerClient
from ledger.records import RawRecord
from ledger.server import runledger_home
from ledger.streams import LEDGER_STREAM
from projections import crashpoints
from projections.errors import EventsExpiredError, ProjectionError, StreamReadError
from projections.partition import BatchRows, PartitionProjector
from projections.progress import ProgressLine
from projections.reader import PULL_BATCH, StreamReader, open_reader
from projections.store import ProjectionStore, StreamIdentity, _take_lock, fold_fingerprint, lock_path, replace_file

DB_NAME = "ledger.duckdb"
BATCH = 2 * PULL_BATCH  # events a transaction: fewer commits (each fsyncs) at ~20 MB of memory


@contextlib.contextmanager
def _quiet_gc() -> Iterator[None]:
    """Fewer cyclic-GC passes while folding: decoding allocates millions of short-lived dicts
    (freed by reference counting), which otherwise trigger a generation-0 pass every 700
    allocations; measured 20-25% of the projector's time."""
    threshold = gc.get_threshold()
    gc.set_threshold(100_000, threshold[1], threshold[2])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)


def default_db_path() -> Path:
    """``$RUNLEDGER_HOME/ledger.duckdb`` (``~/.runledger/ledger.duckdb``)."""
    return runledger_home() / DB_NAME


@dataclass(frozen=True)
class StreamStatus:
    identity: StreamIdentity
    first_seq: int
    last_seq: int
    messages: int


async def stream_status(client: LedgerClient, stream: str = LEDGER_STREAM) -> StreamStatus:
    """The stream's identity and bounds, from the server's own answer (creation time verbatim)."""
    try:
        msg = await client.nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5.0)
        info = json.loads(msg.data)
    except (TimeoutError, nats.errors.Error, ValueError) as exc:
        raise ProjectionError(f"could not read the state of stream {stream}: {exc}; is the server up?") from exc
    if "error" in info:
        error = info["error"]
        if error.get("code") == 404:
            raise ProjectionError(f"stream {stream} does not exist on {client.url}: start with `runledger up`")
        raise ProjectionError(f"stream {stream}: the server answered {error.get('description', error)}")
    server: dict[str, Any] = getattr(client.nc, "_server_info", None) or {}
    cluster = info.get("cluster") or {}
    url = client.nc.connected_url
    identity = StreamIdentity(
        stream=stream,
        created=str(info.get("created", "")),
        server_name=cluster.get("leader") or server.get("server_name"),
        server_id=server.get("server_id"),
        cluster=cluster.get("name"),
        url=f"{url.scheme}://{url.hostname}:{url.port}" if url is not None else None,
    )
    state = info.get("state") or {}
    return StreamStatus(identity, int(state.get("first_seq", 0)), int(state.get("last_seq", 0)),
                        int(state.get("messages", 0)))  # fmt: skip


@dataclass
class ProjectResult:
    """What one ``run`` did. ``position`` is the last projected stream sequence."""

    path: str
    events: int
    quarantined: int
    batches: int
    position: int
    stream_last_seq: int
    seconds: float
    rebuilt: bool = False

    @property
    def rate(self) -> float:
        return (self.events + self.quarantined) / self.seconds if self.seconds > 0 else 0.0


class Projector:
    """Projects the LEDGER stream into one open ``ProjectionStore``."""

    def __init__(
        self,
        client: LedgerClient,
        store: ProjectionStore,
        *,
        stream: str = LEDGER_STREAM,
        batch_size: int = BATCH,
        reader: str = "auto",
        progress: ProgressLine | None = None,
        cache_limit: int = 20_000,
    ) -> None:
        self.client = client
        self.store = store
        self.stream = stream
        self.batch_size = batch_size
        self.reader_kind = reader
        self.progress = progress
        self.cache_limit = cache_limit
        self.partition = PartitionProjector()
        self._cached: OrderedDict[str, None] = OrderedDict()
        self._evicted: set[str] = set()
        state = store.state()
        self._file_had_rows = state is not None and state.last_seq >= state.first_seq

    async def run(self, *, follow: bool = False, stop: asyncio.Event | None = None) -> ProjectResult:
        """Catch up to the stream's last sequence (and with ``follow``, keep going until ``stop``).

        Raises StreamMismatchError (another stream's file), EventsExpiredError (a hole the
        stream can no longer fill), StreamReadError (the read was incomplete: nothing past
        the last complete batch was committed; run again).
        """
        started = time.monotonic()
        status = await stream_status(self.client, self.stream)
        state = self.store.state()
        first = max(1, status.first_seq)
        if state is None:
            state = self.store.bind(status.identity, first)
        else:
            state = self.store.bind(status.identity, first)
            if state.last_seq + 1 < status.first_seq:
                raise EventsExpiredError(state.last_seq, status.first_seq)
            if state.fold_fingerprint != fold_fingerprint() and self.progress is not None:
                print(
                    f"runledger: note: {self.store.path} was projected by other fold code; rows derived "
                    "from now on follow the new code. `runledger project --rebuild` makes them uniform",
                    file=sys.stderr,
                )
                self.store.set_fingerprint(fold_fingerprint())
        self._file_had_rows = state.last_seq >= state.first_seq
        position = state.last_seq
        target = status.last_seq
        totals = [0, 0, 0]  # events, quarantined, batches
        if not follow and position >= target:
            return ProjectResult(str(self.store.path), 0, 0, 0, position, target, time.monotonic() - started)
        reader = await open_reader(self.client, self.stream, position + 1, self.reader_kind)
        # The commit of batch k runs in a thread (DuckDB releases the GIL) while batch k+1 is
        # read and folded; commits stay strictly ordered and each is one transaction.
        committing: asyncio.Future[None] | None = None
        idle_rounds = 0
        try:
            with _quiet_gc():
                while not (stop is not None and stop.is_set()):
                    records = await self._read(reader, follow)
                    if not records:
                        if committing is not None:  # idle: let the position shown be the committed one
                            await committing
                            committing = None
                        if not follow:
                            idle_rounds += 1
                            if idle_rounds >= 3:
                                raise StreamReadError(
                                    f"the stream reports sequence {target} but nothing after {position} "
                                    "arrived within 15 s; run again"
                                )
                        self._show(position - state.last_seq, position, reader.pending)
                        continue
                    idle_rounds = 0
                    crashpoints.crash_point("batch_read")
                    if self._needs_stored_state(records) and committing is not None:
                        await committing  # stored state must include the batch in flight
                        committing = None
                    rows = self.fold_batch(records)
                    if committing is not None:
                        await committing
                    committing = asyncio.ensure_future(asyncio.to_thread(self.commit_batch, rows, totals))
                    position = rows.last_seq
                    self._show(position - state.last_seq, position, reader.pending)
                    if not follow and position >= target:
                        break
                if committing is not None:
                    await committing
                    committing = None
        finally:
            if committing is not None:
                with contextlib.suppress(Exception):
                    await committing
            await reader.close()
        return ProjectResult(
            str(self.store.path), totals[0], totals[1], totals[2], position, max(target, position),
            time.monotonic() - started,
        )  # fmt: skip

    async def _read(self, reader: StreamReader, follow: bool) -> list[RawRecord]:
        """Up to ``batch_size`` records: several pull batches when the stream has them."""
        records = await reader.next_batch(self.batch_size, 1.0 if follow else 5.0)
        while records and len(records) < self.batch_size and reader.pending > 0:
            more = await reader.next_batch(self.batch_size - len(records), 0.05)
            if not more:
                break
            records.extend(more)
        return records

    def fold_batch(self, records: list[RawRecord]) -> BatchRows:
        """Decode and fold ``records`` (contiguous, right after the last batch) into rows."""
        self._preload(records)
        rows = self.partition.project(records)
        self._remember(rows.touched)
        return rows

    def commit_batch(self, rows: BatchRows, totals: list[int] | None = None) -> None:
        """Write ``rows`` and the new position in one transaction."""
        self.store.commit(
            {name: [table] for name, table in rows.tables.items()},
            first_seq=rows.first_seq, last_seq=rows.last_seq, events=rows.events, quarantined=rows.quarantined,
        )  # fmt: skip
        if totals is not None:
            totals[0] += rows.events
            totals[1] += rows.quarantined
            totals[2] += 1

    def project_batch(self, records: list[RawRecord]) -> BatchRows:
        """``fold_batch`` then ``commit_batch``: one batch, synchronously (the loop overlaps them)."""
        rows = self.fold_batch(records)
        self.commit_batch(rows)
        return rows

    def _show(self, done: int, position: int, lag: int) -> None:
        if self.progress is not None:
            self.progress.update(events=done, position=position, lag=lag)

    # -- the run/key cache ----------------------------------------------------------------------------

    def _stored_misses(self, records: list[RawRecord]) -> tuple[set[str], set[str]]:
        runs, keys = self.partition.missing(records)
        if not self._file_had_rows:
            # A file this projector filled itself holds only what it committed: a miss is new,
            # unless it was evicted from the cache earlier.
            runs = {r for r in runs if "run:" + r in self._evicted}
            keys = {k for k in keys if "key:" + k in self._evicted}
        return runs, keys

    def _needs_stored_state(self, records: list[RawRecord]) -> bool:
        runs, keys = self._stored_misses(records)
        return bool(runs or keys)

    def _preload(self, records: list[RawRecord]) -> None:
        runs, keys = self._stored_misses(records)
        if runs or keys:
            self.partition.preload(self.store.load_runs(runs), self.store.load_keys(keys))

    def _remember(self, touched: list[str]) -> None:
        cached = self._cached
        for route in touched:
            cached[route] = None
            cached.move_to_end(route)
            self._evicted.discard(route)
        if len(cached) > self.cache_limit:
            drop = [cached.popitem(last=False)[0] for _ in range(len(cached) - self.cache_limit)]
            self.partition.forget(drop)
            self._evicted.update(drop)


async def project(
    client: LedgerClient,
    path: Path,
    *,
    follow: bool = False,
    stop: asyncio.Event | None = None,
    progress: ProgressLine | None = None,
    batch_size: int = BATCH,
    reader: str = "auto",
) -> ProjectResult:
    """Catch ``path`` up with the stream (creating it if needed); with ``follow``, keep it current."""
    with ProjectionStore(path) as store:
        projector = Projector(client, store, batch_size=batch_size, reader=reader, progress=progress)
        return await projector.run(follow=follow, stop=stop)


def rebuild_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.rebuild")


async def rebuild(
    client: LedgerClient,
    path: Path,
    *,
    progress: ProgressLine | None = None,
    batch_size: int = BATCH,
    reader: str = "auto",
) -> ProjectResult:
    """Project the whole stream into a fresh file, then atomically put it at ``path``.

    Holds ``path``'s lock throughout, so no projector writes to the old file meanwhile.
    ``model_prices`` (analyst input, not derived from the stream) is carried over.
    """
    path = Path(path)
    lock = _take_lock(path)
    fresh = rebuild_path(path)
    try:
        for leftover in (fresh, fresh.with_name(fresh.name + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        with ProjectionStore(fresh) as store:
            _carry_over_prices(store, path)
            projector = Projector(client, store, batch_size=batch_size, reader=reader, progress=progress)
            result = await projector.run()
        crashpoints.crash_point("rebuild_before_swap")
        replace_file(fresh, path)
        with contextlib.suppress(FileNotFoundError):
            lock_path(fresh).unlink()
    finally:
        lock.close()  # closing the descriptor releases the flock
    result.path = str(path)
    result.rebuilt = True
    return result


def _carry_over_prices(store: ProjectionStore, old: Path) -> None:
    if not old.exists():
        return
    try:
        store.con.execute(f"ATTACH '{_sql_string(str(old))}' AS previous (READ_ONLY)")
        try:
            store.con.execute("INSERT INTO model_prices SELECT * FROM previous.model_prices")
        finally:
            store.con.execute("DETACH previous")
    except Exception as exc:
        print(f"runledger: warning: model_prices not carried over from {old}: {exc}", file=sys.stderr)


def _sql_string(text: str) -> str:
    return text.replace("'", "''")
