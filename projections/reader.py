"""Reading the LEDGER stream in order, fast, and never silently short.

Two readers with one contract (``StreamReader``): ``next_batch`` returns the next records in
stream order, each exactly one sequence after the previous (``SequenceGapError`` otherwise),
or ``[]`` when nothing arrived within ``wait``. Both read by batch direct gets, which create
nothing on the server (no consumer to leave behind or to point at another subject: the roles
that read everything may create none, runledger.protect.roles), and check that each answer names
the one before it.

``PullReader`` (the default; runledger.log.fastread) speaks the NATS protocol itself on a
connection of its own and parses messages straight from the socket buffer. nats-py spends ~30 us
a message in its parser, header parsing, ``Msg`` objects and a task queue; this reader spends
~5 us, and TCP flow control replaces the client-side slow-consumer drop. It supports plain
connections with user/password or token in the URL.

``OrderedReader`` (the same requests through nats-py: runledger.log.directget) is the fallback for
what ``PullReader`` does not speak (TLS, credentials files, nkeys) and the in-memory ledger's.

Rejected: consumers (a pull consumer's ``fetch()`` spends a task per message, an ordered push
consumer loses messages behind a slow callback, and creating either is what the roles deny), and
trusting a delivery count without checking stream sequences.
"""

from __future__ import annotations

from typing import Protocol

from runledger.errors import DirectGetDenied, ReaderUnavailableError
from runledger.log import fastread
from runledger.log.client import LedgerClient
from runledger.log.directget import DirectReader
from runledger.log.fastread import PULL_BATCH as PULL_BATCH
from runledger.log.fastread import PULL_MAX_BYTES as PULL_MAX_BYTES
from runledger.log.fastread import ProtocolParser as ProtocolParser
from runledger.projections.errors import SequenceGapError, StreamReadError
from runledger.record.records import RawRecord


class StreamReader(Protocol):
    """Contiguous records of a stream from a start sequence on."""

    pending: int  # messages the server still held after the last one returned

    async def start(self, start_seq: int) -> None: ...

    async def next_batch(self, max_records: int, wait: float) -> list[RawRecord]: ...

    async def close(self) -> None: ...


def parse_ack_subject(reply: bytes) -> tuple[int, int]:
    """(stream sequence, pending) from a JetStream delivery's reply subject (v1 or v2 form)."""
    return fastread.parse_ack_subject(reply, StreamReadError)


class PullReader(fastread.StreamFollower):
    """The fast reader: runledger.log.fastread's StreamFollower raising the projection's errors."""

    read_error = StreamReadError
    gap_error = SequenceGapError


class OrderedReader:
    """nats-py's batch direct gets (runledger.log.directget): the fallback reader."""

    def __init__(self, client: LedgerClient, stream: str) -> None:
        self.client = client
        self.stream = stream
        self.pending = 0
        self._reader = DirectReader(client, stream, StreamReadError)
        self._next_seq = 0

    async def start(self, start_seq: int) -> None:
        self._next_seq = max(1, start_seq)
        await self._reader.open()

    async def next_batch(self, max_records: int, wait: float) -> list[RawRecord]:
        try:
            out, self.pending, self._next_seq = await fastread.contiguous(
                self._reader.batch, self._next_seq, PULL_BATCH, max_records, wait, SequenceGapError
            )
        except DirectGetDenied as exc:
            raise StreamReadError(f"{exc}: read the stream with a role that reads everything") from exc
        return out

    async def close(self) -> None:
        await self._reader.close()


async def open_reader(client: LedgerClient, stream: str, start_seq: int, kind: str = "auto") -> StreamReader:
    """A started reader: ``pull`` (fast), ``ordered`` (nats-py), or ``auto`` (pull, else ordered)."""
    if kind in ("auto", "pull"):
        pull = PullReader(client, stream)
        try:
            await pull.start(start_seq)
            return pull
        except ReaderUnavailableError as exc:
            if kind == "pull":
                raise StreamReadError(f"the fast reader cannot read from this server: {exc}") from exc
    ordered = OrderedReader(client, stream)
    await ordered.start(start_seq)
    return ordered
