"""Folding batches in parallel: partitions of runs and keys, in this process or in workers.

Decoding, folding and building rows cost ~35-50 us an event in Python (``decode_record``,
``apply`` and the Arrow rows are most of it; docs/tables.md, "Rebuild speed"), several times
what reading the stream costs, and a process folds on one core. The
fold is per run and per key, so it partitions cleanly: route ``run:<id>`` / ``key:<subject>``
to partition ``crc32(route) % n``, and every event of a run meets that run's checkpoint in
the same partition, in stream order. Each partition is a ``PartitionProjector``.

``LocalPartitions`` folds in the calling thread (short catch-ups, one core, tests).
``ProcessPartitions`` runs one worker process per partition (a fresh
interpreter running ``_worker_main``, so nothing of the caller's threads or main
module is inherited or re-run, unlike ``multiprocessing``'s fork and spawn), fed raw
records over a socket and answering with Arrow tables; the projector reads and commits
while the workers fold. A worker exits when its socket closes, so a SIGKILLed projector
leaves no workers behind.

Rejected: threads (the GIL serialises the fold), a process pool with arbitrary task
placement (a run's checkpoint would have to travel with every batch), and shipping
Python objects back (Arrow tables pickle as buffers; Event objects cost ~15 us each).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import traceback
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

from runledger.projections.errors import ProjectionError, UnprojectableError
from runledger.projections.partition import BatchRows, PartitionProjector
from runledger.projections.rows import RunFold
from runledger.record.records import RawRecord
from runledger.sdk.effects import KeyState


def partition_of(route: str | None, count: int) -> int:
    """The partition of a route (records with no route carry no state: partition 0)."""
    if route is None or count == 1:
        return 0
    return zlib.crc32(route.encode("utf-8")) % count


@dataclass
class PartitionWork:
    """What one partition gets for one batch: its records, state to load, state to drop."""

    records: list[RawRecord] = field(default_factory=list)
    runs: dict[str, RunFold] = field(default_factory=dict)
    keys: dict[str, KeyState] = field(default_factory=dict)
    forget: list[str] = field(default_factory=list)


class Partitions(Protocol):
    count: int

    async def start(self) -> None: ...

    def submit(self, work: Sequence[PartitionWork]) -> None: ...

    async def results(self) -> list[BatchRows]: ...

    def close(self) -> None: ...


def _run(projector: PartitionProjector, work: PartitionWork) -> BatchRows:
    projector.forget(work.forget)
    projector.preload(work.runs, work.keys)
    return projector.project(work.records)


def _run_remote(projector: PartitionProjector, message: tuple[Any, ...]) -> BatchRows:
    seqs, subjects, datas, runs, keys, forget = message
    records = list(map(_raw_record, seqs, subjects, datas))
    return _run(projector, PartitionWork(records, runs, keys, forget))


def _raw_record(stream_seq: int, subject: str, data: bytes) -> RawRecord:
    # The frozen dataclass's __init__ sets each field through object.__setattr__ (~1.5 us); this
    # builds the same (equal) record at half that, 10k times a batch per worker.
    record = object.__new__(RawRecord)
    object.__setattr__(
        record, "__dict__", {"stream_seq": stream_seq, "subject": subject, "data": data, "headers": None}
    )
    return record


class LocalPartitions:
    """One partition, folded in the calling thread at ``submit``."""

    count = 1

    def __init__(self) -> None:
        self.projector = PartitionProjector()
        self._done: list[BatchRows] | UnprojectableError | None = None

    async def start(self) -> None:
        return None

    def fold(self, work: Sequence[PartitionWork]) -> list[BatchRows]:
        return [_run(self.projector, work[0])]

    def submit(self, work: Sequence[PartitionWork]) -> None:
        try:
            self._done = self.fold(work)
        except UnprojectableError as exc:  # raised by results(), where ProcessPartitions raises it
            self._done = exc

    async def results(self) -> list[BatchRows]:
        assert self._done is not None
        done, self._done = self._done, None
        if isinstance(done, UnprojectableError):
            raise done
        return done

    def close(self) -> None:
        return None


_WORKER = (
    "import sys; from multiprocessing.connection import Connection; "
    "from runledger.projections.workers import _worker_main; "
    "_worker_main(Connection(int(sys.argv[1])))"
)


def _worker_main(conn: Connection) -> None:  # pragma: no cover - runs in the worker process
    import gc

    gc.set_threshold(100_000, 10, 10)  # see projector._quiet_gc
    projector = PartitionProjector()
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the projector is gone: so are we
        if message is None:
            return
        try:
            conn.send(("rows", _run_remote(projector, message)))
        except UnprojectableError as exc:  # a value no column holds: the projector projects the batch again
            conn.send(("unprojectable", exc.reason))
        except Exception:  # reported to the projector, which stops without committing the batch
            conn.send(("error", traceback.format_exc()))


class ProcessPartitions:
    """``count`` worker processes, one partition each."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._conns: list[Connection] = []
        self._procs: list[Any] = []

    async def start(self) -> None:
        for _ in range(self.count):
            parent, child = socket.socketpair()
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
            child.close()
            self._procs.append(proc)
            self._conns.append(Connection(parent.detach()))
        for conn in self._conns:  # they import in parallel; wait until each can take work
            kind, _ = await asyncio.to_thread(_receive, conn)
            if kind != "ready":
                raise ProjectionError("a projection worker did not start")

    def submit(self, work: Sequence[PartitionWork]) -> None:
        for conn, part in zip(self._conns, work, strict=True):
            # Columns, not dataclasses (a third of the pickling time) nor tuples (an object each).
            records = part.records
            seqs = [r.stream_seq for r in records]
            subjects = [r.subject for r in records]
            datas = [r.data for r in records]
            conn.send((seqs, subjects, datas, part.runs, part.keys, part.forget))

    async def results(self) -> list[BatchRows]:
        replies = await asyncio.gather(*(asyncio.to_thread(_receive, conn) for conn in self._conns))
        out = []
        for kind, value in replies:
            if kind == "error":
                raise ProjectionError(f"a projection worker failed; nothing of this batch was committed:\n{value}")
        for kind, value in replies:
            if kind == "unprojectable":
                raise UnprojectableError(value)
            out.append(value)
        return out

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send(None)
            conn.close()
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._conns, self._procs = [], []


def _receive(conn: Connection) -> tuple[str, Any]:
    try:
        reply: tuple[str, Any] = conn.recv()
    except (EOFError, OSError) as exc:
        raise ProjectionError("a projection worker died; nothing of this batch was committed. Run again") from exc
    return reply
