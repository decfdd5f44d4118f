"""The projector: the LEDGER stream into a DuckDB file, batch by batch, exactly once.

A loop of three overlapping stages: the reader (``runledger.projections.reader``) reads batch k+1 of
contiguous raw records while the partitions (``runledger.projections.workers``: this process, or
worker processes for large backlogs) decode and fold batch k, while a thread commits batch
k-1: every table's rows together with the new stream position in one DuckDB transaction
(``ProjectionStore.commit``). Commits are strictly ordered. A crash anywhere leaves the
file at the end of the last committed batch; the next run starts right after it, so no
row is lost or doubled (tests/integration/test_projector_crash.py SIGKILLs it at every
named point and from outside).

Folding is incremental: each partition keeps the checkpoints of the runs (and the states
of the keys) it saw most recently, up to ``cache_limit``; others are reloaded from the
``checkpoints`` and ``effect_keys`` tables when they show up again, reading committed
data only (the cache always holds the last two batches' runs, whose rows may still be in
flight). A long run is thus folded once, not from its first event every batch.

``rebuild`` projects from the stream's first sequence into a fresh file and swaps it into
place with ``os.replace`` once complete; the old file stays readable until then. Nothing reads
the fresh file before the swap and a rebuild that stops is started again from scratch, so its
keyed tables are filled without primary keys, added once before the swap
(``ProjectionStore(bulk=True)``, ``add_keys``): every batch still commits its rows with its
position in one transaction.

A hostile message never wedges the projection (the stream forbids deletion: a batch that can
never be committed would stop every later ``project`` and ``sql``). What does not decode is
quarantined by the partitions. An event that decodes but cannot become a row (a value Arrow,
Python or DuckDB refuses: ``UnprojectableError``, from the fold or from the commit) makes the
projector evict every run and key and project that batch, and any batch folded on top of it,
again from the committed state, in this process, cutting it in halves until the events that
fail alone are found; those are quarantined with the reason, every other event is projected
(``_recover``). Valid batches pay nothing for this.

Rejected: one transaction per event or per run (a commit fsyncs: ~1 ms), re-folding
runs from the ``events`` table (quadratic in a run's length), and a fold in SQL (a
second copy of the fold).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import nats

from runledger.log.client import LedgerClient
from runledger.log.server import runledger_home
from runledger.log.subjects import LEDGER_STREAM
from runledger.projections import crashpoints
from runledger.projections.errors import EventsExpiredError, ProjectionError, StreamReadError, UnprojectableError
from runledger.projections.partition import BatchRows, PartitionProjector, RouteCache
from runledger.projections.progress import ProgressLine
from runledger.projections.reader import PULL_BATCH, PullReader, StreamReader, open_reader
from runledger.projections.store import (
    ProjectionStore,
    ProjectorState,
    StreamIdentity,
    fold_fingerprint,
    lock_path,
    replace_file,
    take_lock,
)
from runledger.projections.workers import LocalPartitions, Partitions, PartitionWork, ProcessPartitions, partition_of
from runledger.record.records import RawRecord

logger = logging.getLogger(__name__)

DB_NAME = "ledger.duckdb"
BATCH = 2 * PULL_BATCH  # events a transaction: fewer commits (each fsyncs) at ~20 MB of memory
# A rebuild's transactions are larger: DuckDB's work a row falls with the rows a transaction
# (measured in CPU a record, the whole store: 68 us at 20,000, 49 at 60,000, 37 at 240,000), and the
# rebuilt file is thrown away if the rebuild stops before its swap, so a crash loses nothing more.
# Memory: ~60 MB a batch, three batches in flight (read, folded, committed), and the cache must
# cover two batches' runs: up to 120,000 checkpoints (measured: ~0.75 GB a worker at 1 M events).
REBUILD_BATCH = 6 * PULL_BATCH
WORKERS_FROM = 50_000  # backlog (events) from which worker processes pay for their start-up


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


def default_workers() -> int:
    """Worker processes for large backlogs: one per core, at most 4; none on one core.

    Measured on 2 cores: 2 workers beat 1 (the projector itself mostly waits: it reads and
    DuckDB commits, in C), and folding in-process is slowest."""
    cores = os.cpu_count() or 1
    return 0 if cores < 2 else min(cores, 4)


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
        raise StreamReadError(f"could not read the state of stream {stream}: {exc!r}; is the server up?") from exc
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
    reader: str = ""  # "pull" (the fast reader) or "ordered" (nats-py's), "" when nothing was read

    @property
    def rate(self) -> float:
        return (self.events + self.quarantined) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Pipeline:
    """The batches in flight in ``Projector.run``: ``folding`` the partitions' work on ``folded``,
    ``committing`` the thread's commit of ``in_commit``. ``position`` is the last sequence read (or
    recovered); ``start`` the file's position when the run began, ``target`` the stream's last
    sequence then. ``totals``: events, quarantined, batches committed."""

    start: int
    target: int
    position: int
    folding: asyncio.Future[list[BatchRows]] | None = None
    folded: list[RawRecord] = field(default_factory=list)
    committing: asyncio.Future[None] | None = None
    in_commit: list[RawRecord] = field(default_factory=list)
    idle_rounds: int = 0
    totals: list[int] = field(default_factory=lambda: [0, 0, 0])


class Projector:
    """Projects the LEDGER stream into one open ``ProjectionStore``.

    ``workers``: 0 folds in this process; N > 0 folds in N worker processes
    (``runledger.projections.workers``), started only when the backlog is at least ``WORKERS_FROM``
    events (spawning costs about a second).
    """

    def __init__(
        self,
        client: LedgerClient,
        store: ProjectionStore,
        *,
        stream: str = LEDGER_STREAM,
        batch_size: int = BATCH,
        reader: str = "auto",
        progress: ProgressLine | None = None,
        cache_limit: int = 50_000,
        workers: int = 0,
    ) -> None:
        self.client = client
        self.store = store
        self.stream = stream
        self.batch_size = batch_size
        self.reader_kind = reader
        self.progress = progress
        # State to preload is read from committed data while the previous batch commits; with
        # room for two batches' routes, whatever was evicted was committed two batches ago.
        self.cache_limit = max(cache_limit, 2 * batch_size)
        self.workers = workers
        self.partitions: Partitions = LocalPartitions()
        self._route = RouteCache()
        self._cached: OrderedDict[str, None] = OrderedDict()
        self._evicted: set[str] = set()
        self._forget: dict[int, list[str]] = {}
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
        state = self._bind(status)
        pipe = _Pipeline(start=state.last_seq, target=status.last_seq, position=state.last_seq)
        if not follow and pipe.position >= pipe.target:
            return ProjectResult(str(self.store.path), 0, 0, 0, pipe.position, pipe.target, time.monotonic() - started)
        if self.workers > 0 and pipe.target - pipe.position >= WORKERS_FROM:
            self.partitions = ProcessPartitions(self.workers)
            await self.partitions.start()
        reader = await open_reader(self.client, self.stream, pipe.position + 1, self.reader_kind)
        try:
            with _quiet_gc():
                await self._pump(reader, pipe, follow, stop)
        finally:
            for future in (pipe.folding, pipe.committing):
                if future is not None:
                    with contextlib.suppress(Exception):
                        await future
            self.partitions.close()
            await reader.close()
        events, quarantined, batches = pipe.totals
        return ProjectResult(
            str(self.store.path), events, quarantined, batches, pipe.position, max(pipe.target, pipe.position),
            time.monotonic() - started, reader="pull" if isinstance(reader, PullReader) else "ordered",
        )  # fmt: skip

    def _bind(self, status: StreamStatus) -> ProjectorState:
        """Bind the file to the stream and return where it stands; warn (once) when its rows came
        from other fold code. Raises StreamMismatchError, or EventsExpiredError for a hole."""
        state = self.store.bind(status.identity, max(1, status.first_seq))
        if state.last_seq + 1 < status.first_seq:
            raise EventsExpiredError(state.last_seq, status.first_seq)
        if state.fold_fingerprint != fold_fingerprint():
            logger.warning(
                "%s was projected by other fold code; rows derived from now on follow the new code. "
                "`runledger project --rebuild` makes them uniform",
                self.store.path,
            )
            self.store.set_fingerprint(fold_fingerprint())
        self._file_had_rows = state.last_seq >= state.first_seq
        return state

    async def _pump(self, reader: StreamReader, pipe: _Pipeline, follow: bool, stop: asyncio.Event | None) -> None:
        """Read, fold and commit batches until caught up (or, with ``follow``, until ``stop``).

        Three stages overlap: the reader reads batch k+1 while the partitions fold batch k and a
        thread commits batch k-1 (DuckDB releases the GIL). Commits stay strictly ordered, each one
        transaction with its position."""
        while True:
            stopping = stop is not None and stop.is_set()
            done = not follow and pipe.position >= pipe.target
            records = [] if stopping or done else await self._read(reader, follow)
            work = self.plan(records) if records else None
            if records:
                crashpoints.crash_point("batch_read")
            work = await self._commit_folded(pipe, records, work)
            if work is not None:
                self.partitions.submit(work)
                pipe.folding = asyncio.ensure_future(self.partitions.results())
                pipe.folded = records
                pipe.position = records[-1].stream_seq
                pipe.idle_rounds = 0
            elif pipe.committing is not None:
                # idle or finishing: the position shown is the committed one
                if await _refused(pipe.committing):
                    await asyncio.to_thread(self._recover, [pipe.in_commit], pipe.totals)
                pipe.committing = None
            if pipe.folding is None and pipe.committing is None and (stopping or done):
                return
            if not records and not (stopping or done) and not follow:
                pipe.idle_rounds += 1
                if pipe.idle_rounds >= 3:
                    raise StreamReadError(
                        f"the stream reports sequence {pipe.target} but nothing after {pipe.position} "
                        "arrived within 15 s; run again"
                    )
            self._show(pipe.position - pipe.start, pipe.position, reader.pending)

    async def _commit_folded(
        self, pipe: _Pipeline, records: list[RawRecord], work: list[PartitionWork] | None
    ) -> list[PartitionWork] | None:
        """Take the batch the partitions folded (if any) and start its commit once the one before it
        is in. Returns ``work``, the plan of the batch just read, or None when that batch was recovered too.

        A batch whose rows cannot be built or written (UnprojectableError: an event that decodes but
        no column holds) is projected again event by event (``_recover``), with every batch folded on
        top of it, the one just read included; the pump then goes on from the committed state."""
        if pipe.folding is None:
            return work
        again: list[list[RawRecord]] = []
        try:
            parts: list[BatchRows] | None = await pipe.folding
        except UnprojectableError:
            parts = None
        pipe.folding = None
        if pipe.committing is not None:
            if await _refused(pipe.committing):
                again.append(pipe.in_commit)
            pipe.committing = None
        if again or parts is None:
            again.append(pipe.folded)  # folded on top of a refused batch, or refused itself
            if records and work is not None:
                again.append(records)  # planned on the same state
                self._unplan(work)
                work = None
                pipe.position = records[-1].stream_seq
            await asyncio.to_thread(self._recover, again, pipe.totals)
        else:
            pipe.committing = asyncio.ensure_future(asyncio.to_thread(self._commit, pipe.folded, parts, pipe.totals))
            pipe.in_commit = pipe.folded
        return work

    async def _read(self, reader: StreamReader, follow: bool) -> list[RawRecord]:
        """Up to ``batch_size`` records: several pull batches when the stream has them."""
        records = await reader.next_batch(self.batch_size, 1.0 if follow else 5.0)
        while records and len(records) < self.batch_size and reader.pending > 0:
            more = await reader.next_batch(self.batch_size - len(records), 0.05)
            if not more:
                break
            records.extend(more)
        return records

    # -- one batch ----------------------------------------------------------------------------------

    def plan(self, records: list[RawRecord]) -> list[PartitionWork]:
        """Split ``records`` by partition, with the stored state each partition lacks for them."""
        count = self.partitions.count
        work = [PartitionWork(forget=self._forget.pop(i, [])) for i in range(count)]
        routes: set[str] = set()
        for rec in records:
            route = self._route(rec.subject)
            work[partition_of(route, count)].records.append(rec)
            if route is not None:
                routes.add(route)
        misses = routes.difference(self._cached)
        if not self._file_had_rows:
            # A file this projector filled itself holds only what it committed: a miss is new,
            # unless it was evicted from the cache earlier.
            misses &= self._evicted
        if misses:
            runs = {r[4:] for r in misses if r.startswith("run:")}
            keys = {r[4:] for r in misses if r.startswith("key:")}
            for run_id, rf in self.store.load_runs(runs).items():
                work[partition_of("run:" + run_id, count)].runs[run_id] = rf
            for subject, ks in self.store.load_keys(keys).items():
                work[partition_of("key:" + subject, count)].keys[subject] = ks
        self._remember(routes)
        return work

    def _commit(self, records: list[RawRecord], parts: list[BatchRows], totals: list[int]) -> None:
        tables = {name: [p.tables[name] for p in parts] for name in parts[0].tables}
        events = sum(p.events for p in parts)
        quarantined = sum(p.quarantined for p in parts)
        self.store.commit(
            tables, first_seq=records[0].stream_seq, last_seq=records[-1].stream_seq, events=events,
            quarantined=quarantined, erased=sorted({run_id for p in parts for run_id in p.erased}),
        )  # fmt: skip
        totals[0] += events
        totals[1] += quarantined
        totals[2] += 1

    def project_batch(self, records: list[RawRecord]) -> None:
        """Plan, fold (in this process) and commit one batch, synchronously: the loop's steps in order."""
        assert isinstance(self.partitions, LocalPartitions)
        totals = [0, 0, 0]
        try:
            parts = self.partitions.fold(self.plan(records))
            self._commit(records, parts, totals)
        except UnprojectableError:
            self._recover([records], totals)

    # -- batches whose rows cannot be written ---------------------------------------------------------

    def _recover(self, batches: list[list[RawRecord]], totals: list[int]) -> None:
        """Project ``batches`` (in stream order, none of them committed) from the committed state,
        quarantining every event that cannot become a row.

        The partitions' state is ahead of the file (they folded a batch that was not committed),
        so every run and key is evicted: each is loaded again from the file when it next shows up.
        Rare, so simple: each batch is folded in this process, and a batch that still fails is
        cut in halves until the event that fails alone is found (log2(batch) extra commits an
        event; valid events keep their order and are projected in smaller batches).
        """
        self._evict_all()
        for records in batches:
            self._project_carefully(records, totals)

    def _project_carefully(self, records: list[RawRecord], totals: list[int]) -> None:
        try:
            self._commit(records, [self._fold_alone(records)], totals)
        except UnprojectableError as exc:
            if len(records) == 1:
                self._quarantine(records[0], exc.reason, totals)
                return
            half = len(records) // 2
            self._project_carefully(records[:half], totals)
            self._project_carefully(records[half:], totals)

    def _fold_alone(self, records: list[RawRecord]) -> BatchRows:
        """``records`` folded in this process by a fresh partition, from the state the file holds."""
        part = PartitionProjector()
        routes = {route for route in map(self._route, (rec.subject for rec in records)) if route is not None}
        runs = {route[4:] for route in routes if route.startswith("run:")}
        keys = {route[4:] for route in routes if route.startswith("key:")}
        part.preload(self.store.load_runs(runs), self.store.load_keys(keys))
        return part.project(records)

    def _quarantine(self, rec: RawRecord, reason: str, totals: list[int]) -> None:
        logger.warning(
            "stream sequence %d on %s decodes but cannot become a row (%s): quarantined",
            rec.stream_seq, rec.subject, reason,
        )  # fmt: skip
        # Its run is broken from here, as if it had never decoded (PartitionProjector.quarantined).
        part = PartitionProjector()
        route = self._route(rec.subject)
        if route is not None and route.startswith("run:"):
            part.preload(self.store.load_runs({route[4:]}), {})
        rows = part.quarantined(rec, f"cannot become a row: {reason}", UnprojectableError.__name__)
        self._commit([rec], [rows], totals)

    def _evict_all(self) -> None:
        """Every run and key leaves the cache: the partitions forget them (with their next work)
        and the next batch that needs one loads it from the file."""
        count = self.partitions.count
        for route in self._cached:
            self._forget.setdefault(partition_of(route, count), []).append(route)
        self._evicted.update(self._cached)
        self._cached.clear()
        # Runs and keys the careful path committed were never cached: a miss is no longer
        # necessarily new, so every miss is looked up in the file from now on.
        self._file_had_rows = True

    def _unplan(self, work: list[PartitionWork]) -> None:
        """Drop planned work that will not be submitted: what it told partitions to forget is still due."""
        for index, part in enumerate(work):
            if part.forget:
                self._forget.setdefault(index, []).extend(part.forget)

    def _show(self, done: int, position: int, lag: int) -> None:
        if self.progress is not None:
            self.progress.update(events=done, position=position, lag=lag)

    def _remember(self, routes: set[str]) -> None:
        cached = self._cached
        for route in routes:
            cached[route] = None
            cached.move_to_end(route)
        self._evicted.difference_update(routes)
        count = self.partitions.count
        while len(cached) > self.cache_limit:
            route = cached.popitem(last=False)[0]
            self._evicted.add(route)
            self._forget.setdefault(partition_of(route, count), []).append(route)


async def project(
    client: LedgerClient,
    path: Path,
    *,
    follow: bool = False,
    stop: asyncio.Event | None = None,
    progress: ProgressLine | None = None,
    batch_size: int = BATCH,
    reader: str = "auto",
    workers: int | None = None,
) -> ProjectResult:
    """Catch ``path`` up with the stream (creating it if needed); with ``follow``, keep it current."""
    with ProjectionStore(path) as store:
        projector = Projector(client, store, batch_size=batch_size, reader=reader, progress=progress,
                              workers=default_workers() if workers is None else workers)  # fmt: skip
        return await projector.run(follow=follow, stop=stop)


async def _refused(commit: asyncio.Future[None]) -> bool:
    """Wait for ``commit``: True when DuckDB refused a value of its batch (nothing was written)."""
    try:
        await commit
    except UnprojectableError:
        return True
    return False


def rebuild_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.rebuild")


async def rebuild(
    client: LedgerClient,
    path: Path,
    *,
    progress: ProgressLine | None = None,
    batch_size: int = REBUILD_BATCH,
    reader: str = "auto",
    workers: int | None = None,
) -> ProjectResult:
    """Project the whole stream into a fresh file, then atomically put it at ``path``.

    Holds ``path``'s lock throughout, so no projector writes to the old file meanwhile.
    ``model_prices`` (analyst input, not derived from the stream) is carried over.
    """
    path = Path(path)
    lock = take_lock(path)
    fresh = rebuild_path(path)
    try:
        for leftover in (fresh, fresh.with_name(fresh.name + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
        workers = default_workers() if workers is None else workers
        # A new file swapped in whole: keyed tables filled without keys, which are added at the end
        # (ProjectionStore, ``bulk``); DuckDB gets the cores the fold workers leave (at least one).
        threads = max(1, (os.cpu_count() or 1) - workers)
        with ProjectionStore(fresh, bulk=True, threads=threads) as store:
            _carry_over_prices(store, path)
            projector = Projector(client, store, batch_size=batch_size, reader=reader, progress=progress,
                                  workers=workers)  # fmt: skip
            result = await projector.run()
            store.add_keys()
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
    except duckdb.Error as exc:  # an unreadable old file must not stop its own rebuild
        logger.warning(
            "model_prices not carried over from %s: %s. The rebuilt file has none: insert them again", old, exc
        )


def _sql_string(text: str) -> str:
    return text.replace("'", "''")
