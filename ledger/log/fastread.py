"""Reading the streams fast: the NATS protocol spoken on a connection of our own.

nats-py spends ~30-100 us a message in its parser, header parsing, ``Msg`` objects and a
task queue (measured here: ~11k msg/s with ``fetch()``, ~30-60k with an ordered push consumer).
The readers here open a plain socket with the client's login and inbox prefix
(runledger.protect.roles), parse messages straight from the socket buffer (~5 us a message), and
let TCP flow control replace the client-side slow-consumer drop that makes ordered consumers
lose messages.

They read by **batch direct gets** (``$JS.API.DIRECT.GET.<stream>`` with ``seq``, ``batch`` and
``next_by_subj``): the server answers with up to ``batch`` stored messages from ``seq`` on, each
carrying its stream sequence, subject and the count still pending, then an end-of-batch status.
A direct get is a read and nothing else: no consumer is created, so none is left behind, none is
deleted, and a reader never chooses where the server delivers. The roles allow nothing more
(runledger.protect.roles): only the admin creates or deletes consumers, except an agent, whose
reads must stay within its own runs and keys. A direct get by sequence or filter cannot be scoped
by a permission (the filter is in the request body), so an agent reads LEDGER through a consumer
whose filter is in the API subject (``$JS.API.CONSUMER.CREATE.LEDGER.<name>.<filter>``), which its
permissions match: ``read_subject`` does that for the agent role and falls back to it where a
direct get is refused (a server configured by hand).

``read_subject`` reads one subject filter once (a run, an effect key, a blob's chunks).
``StreamFollower`` follows the whole stream in large batches (the projector).

Neither trusts the delivery: ``StreamFollower`` checks that stream sequences are contiguous;
``read_subject`` cannot (a filtered subject has gaps), so it checks the server's own accounting:
every message carries how many matching messages are still pending, which drops by exactly one
per message within a batch, a batch's end names its last sequence, and the read ends only when
nothing is pending (the consumer read checks the same, and that it received at least what the
server said the subject held when the consumer was created).

The stream's own headers of a direct get answer (``Nats-Sequence``, ``Nats-Subject``) are read
from the end of the header block, where the server appends them after the stored message's own
headers: a writer who stored a message with a header of that name cannot pass it off as another
subject or sequence.

Both support plain connections with user/password or token (the client's options or URL).
TLS, credentials files and nkeys raise ``ReaderUnavailableError``: runledger.log.directget reads
the same way through nats-py.

Rejected: consumers for the roles that read everything (a role that may create a consumer may
create a push consumer, and a push consumer delivers to any subject the creator names: NATS
permissions see the API subject, never the deliver subject in the request body); a pull consumer
for an agent's reads (``$JS.API.CONSUMER.MSG.NEXT`` is not scoped by filter, and it costs a round
trip); ``fetch()`` (a task per message); trusting a delivery count without checking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from runledger.errors import DirectGetDenied, LedgerError, LedgerReadError, ReaderUnavailableError, StreamGapError
from runledger.log.client import LedgerClient
from runledger.log.subjects import LEDGER_STREAM
from runledger.record.records import RawRecord

PULL_BATCH = 10_000
PULL_MAX_BYTES = 32 * 1024 * 1024  # above the stream's 1 MiB message limit, so one message always fits
READ_CHUNK = 1 << 20
LINGER_S = 0.02  # with something to return, how long to wait for more before returning it
POLL_S = 0.05  # following: after an answer with nothing new, how long before asking again
REQUEST_SLACK_S = 5.0  # how long a batch may take to arrive whole before the read gives up
CONNECT_TIMEOUT_S = 5.0
# An agent's read consumer is removed by the server this long after its read ends (roles may not
# delete consumers: runledger.protect.roles).
SUBJECT_CONSUMER_IDLE_S = 10.0
_EOB = 204  # the status ending a batch of a direct get
_NOT_FOUND = 404  # nothing stored at or after the sequence asked for


def parse_ack_subject(reply: bytes, error: type[LedgerError] = LedgerReadError) -> tuple[int, int]:
    """(stream sequence, pending) from a JetStream delivery's reply subject (v1 or v2 form)."""
    if reply.count(b".") == 8:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        _, sseq, _, _, pending = reply.rsplit(b".", 4)
        return int(sseq), int(pending)
    tokens = reply.split(b".")
    if len(tokens) >= 12:  # $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>.<tok>
        return int(tokens[7]), int(tokens[10])
    raise error(f"not a JetStream delivery: reply subject {reply[:120]!r}")


def header_value(header: bytes, name: bytes) -> bytes | None:
    """The value of the LAST header ``name`` in a header block (the server appends its own)."""
    at = header.rfind(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    end = header.find(b"\r\n", start)
    return header[start : end if end >= 0 else len(header)].strip()


def direct_fields(header: bytes, error: type[LedgerError] = LedgerReadError) -> tuple[int, bytes, int, int]:
    """(stream sequence, subject, pending, sequence before it) of a message a direct get answered,
    from the block of headers the server appends after the stored message's own (it starts at the
    last ``Nats-Stream``); pending and the sequence before are -1 when absent (a single get)."""
    at = header.rfind(b"\r\nNats-Stream:")
    lines = header[at + 2 :].split(b"\r\n") if at >= 0 else []
    if (
        len(lines) >= 6
        and lines[1][:14] == b"Nats-Subject: "
        and lines[2][:15] == b"Nats-Sequence: "
        and lines[4][:18] == b"Nats-Num-Pending: "
        and lines[5][:20] == b"Nats-Last-Sequence: "
    ):  # a batch's answer, as the server writes its block: the hot path, one split and no dict
        seq, subject, pending, before = lines[2][15:], lines[1][14:], lines[4][18:], lines[5][20:]
    else:
        fields = {}
        for line in lines:
            name, sep, value = line.partition(b":")
            if sep:
                fields[name] = value.strip()
        seq, subject = fields.get(b"Nats-Sequence", b""), fields.get(b"Nats-Subject", b"")
        pending, before = fields.get(b"Nats-Num-Pending", b""), fields.get(b"Nats-Last-Sequence", b"")
    if not seq.isdigit() or not subject:
        raise error(f"not a direct get answer: headers {header[:200]!r}")
    return int(seq), subject, int(pending) if pending.isdigit() else -1, int(before) if before.isdigit() else -1


class ProtocolParser:
    """Incremental parser of the NATS messages a reader receives.

    ``feed(chunk)`` returns complete items: ``("msg", subject, reply, data)`` (a consumer's
    delivery; its headers are skipped: the event is the body), ``("direct", subject, headers,
    data)`` (a direct get's answer, its headers kept), ``("status", subject, code, description,
    headers)``, ``("ping",)`` or ``("err", text)``. Message bytes are sliced straight from the buffer.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, chunk: bytes) -> list[tuple[Any, ...]]:
        buf = self._buf
        if self._pos:
            del buf[: self._pos]
            self._pos = 0
        buf += chunk
        out: list[tuple[Any, ...]] = []
        pos, size = 0, len(buf)
        while pos < size:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            op = buf[pos]
            if op == 0x48:  # HMSG <subject> <sid> [reply] <hdr len> <total len>
                parts = bytes(buf[pos + 5 : eol]).split(b" ")
                header_len, total = int(parts[-2]), int(parts[-1])
                end = eol + 2 + total
                if end + 2 > size:
                    break
                if len(parts) == 5:
                    out.append(("msg", parts[0], parts[2], bytes(buf[eol + 2 + header_len : end])))
                else:
                    header = bytes(buf[eol + 2 : eol + 2 + header_len])
                    if header.startswith(b"NATS/1.0\r\n"):  # a stored message, answered to a direct get
                        out.append(("direct", parts[0], header, bytes(buf[eol + 2 + header_len : end])))
                    else:  # a status from the server: "NATS/1.0 408 Request Timeout"
                        status = header.split(b"\r\n", 1)[0].split(b" ", 2)
                        code = int(status[1]) if len(status) > 1 and status[1].isdigit() else 0
                        text = status[2].decode("utf-8", "replace") if len(status) > 2 else ""
                        out.append(("status", parts[0], code, text, header))
                pos = end + 2
            elif op == 0x4D:  # MSG <subject> <sid> [reply] <len>
                parts = bytes(buf[pos + 4 : eol]).split(b" ")
                total = int(parts[-1])
                end = eol + 2 + total
                if end + 2 > size:
                    break
                reply = parts[2] if len(parts) == 4 else b""
                out.append(("msg", parts[0], reply, bytes(buf[eol + 2 : end])))
                pos = end + 2
            else:
                line = bytes(buf[pos:eol])
                if line.startswith(b"PING"):
                    out.append(("ping",))
                elif line.startswith(b"-ERR"):
                    out.append(("err", line[4:].strip().decode("utf-8", "replace")))
                pos = eol + 2  # PONG, +OK, INFO: nothing to do
        self._pos = pos
        return out


class _Login:
    """How to reach and log in to the client's server as the client does, or ReaderUnavailableError."""

    def __init__(self, client: LedgerClient, name: str) -> None:
        nc = client.nc
        url = nc.connected_url
        options = getattr(nc, "options", {}) or {}
        if url is None:
            raise ReaderUnavailableError("not connected")
        if (
            url.scheme in ("tls", "wss", "ws")
            or options.get("tls")
            or options.get("user_credentials")
            or options.get("nkeys_seed")
        ):
            raise ReaderUnavailableError("TLS, a .creds file or an nkey: use nats-py's reader")
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or 4222
        connect: dict[str, Any] = {
            "verbose": False, "pedantic": False, "tls_required": False, "name": name,
            "lang": "python", "version": "runledger", "protocol": 1, "headers": True, "no_responders": True,
        }  # fmt: skip
        # The same login as the client's: a role's user and password (runledger.protect.roles), or the URL's.
        if options.get("user") and options.get("password") is not None:
            connect["user"], connect["pass"] = options["user"], options["password"]
        elif options.get("token"):
            connect["auth_token"] = options["token"]
        elif url.username and url.password is not None:
            connect["user"], connect["pass"] = unquote(url.username), unquote(url.password)
        elif url.username:
            connect["auth_token"] = unquote(url.username)
        self.connect = connect
        # A role may subscribe only under its own inbox prefix (runledger.protect.roles): the client's.
        self.inbox_prefix = bytes(getattr(nc, "_inbox_prefix", b"_INBOX")).decode("ascii", "replace") or "_INBOX"

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A socket past the server's INFO, ready for CONNECT."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=READ_CHUNK * 4), timeout=CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            raise ReaderUnavailableError(f"cannot connect: {exc}") from exc
        try:
            info_line = await asyncio.wait_for(reader.readline(), timeout=CONNECT_TIMEOUT_S)
            if not info_line.startswith(b"INFO "):
                raise ReaderUnavailableError("no INFO from the server")
            info = json.loads(info_line[5:])
            if info.get("tls_required") or (
                info.get("nonce") and "auth_token" not in self.connect and "user" not in self.connect
            ):
                raise ReaderUnavailableError("the server wants TLS or nkey authentication")
        except (OSError, TimeoutError, ValueError) as exc:
            await _close(writer)
            raise ReaderUnavailableError(str(exc)) from exc
        except BaseException:
            await _close(writer)
            raise
        return reader, writer

    def connect_line(self) -> bytes:
        return b"CONNECT " + json.dumps(self.connect).encode() + b"\r\n"


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, ConnectionError):
        await writer.wait_closed()


class _DirectSocket:
    """A connection of our own that asks one stream for batches of stored messages by direct get,
    answered on this connection's inbox. ``error``: the error a broken read raises."""

    def __init__(self, client: LedgerClient, stream: str, name: str, error: type[LedgerError]) -> None:
        self.login = _Login(client, name)
        self.stream = stream
        self.error = error
        self.inbox = f"{self.login.inbox_prefix}.rlget{os.urandom(8).hex()}"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._parser = ProtocolParser()
        self._request = 0
        self._subjects: dict[bytes, str] = {}  # decoded once: a run's subject repeats for each event

    async def open(self) -> None:
        """Log in and listen on the inbox; ReaderUnavailableError when that fails."""
        self._reader, self._writer = await self.login.open()
        try:
            self._writer.write(self.login.connect_line() + f"SUB {self.inbox}.* 1\r\nPING\r\n".encode())
            await self._until_pong()  # logged in, allowed to listen on the inbox (a violation arrives first)
        except (OSError, TimeoutError, ValueError) as exc:
            await self.close()
            raise ReaderUnavailableError(str(exc)) from exc
        except BaseException:
            await self.close()
            raise

    async def _until_pong(self) -> None:
        assert self._reader is not None and self._writer is not None
        await self._writer.drain()
        while True:
            line = await asyncio.wait_for(self._reader.readline(), timeout=CONNECT_TIMEOUT_S)
            if not line:
                raise ReaderUnavailableError("the server closed the connection")
            if line.startswith(b"-ERR"):
                raise ReaderUnavailableError(line.decode("utf-8", "replace").strip())
            if line.startswith(b"PONG"):
                return

    def _ask(self, seq: int, size: int, subject_filter: str | None) -> bytes:
        assert self._writer is not None
        self._request += 1
        request: dict[str, Any] = {"seq": max(1, seq), "batch": max(2, size), "max_bytes": PULL_MAX_BYTES}
        if subject_filter:
            request["next_by_subj"] = subject_filter
        body = json.dumps(request).encode()
        reply = f"{self.inbox}.{self._request}"
        self._writer.write(f"PUB $JS.API.DIRECT.GET.{self.stream} {reply} {len(body)}\r\n".encode() + body + b"\r\n")
        return reply.encode()

    async def batch(self, seq: int, size: int, subject_filter: str | None = None) -> tuple[list[RawRecord], int]:
        """Up to ``size`` stored messages (on ``subject_filter``) from stream sequence ``seq`` on, in
        stream order, and how many the server still held after them (0: none, for now).

        Raises ``error`` when a message went missing on the way or the server ended the read, and
        DirectGetDenied when this login may not send the request."""
        assert self._reader is not None and self._writer is not None
        reply = self._ask(seq, size, subject_filter)
        out: list[RawRecord] = []
        deadline = time.monotonic() + REQUEST_SLACK_S
        while True:
            try:
                chunk = await asyncio.wait_for(self._reader.read(READ_CHUNK), max(deadline - time.monotonic(), 0.001))
            except TimeoutError as exc:
                raise self.error(
                    f"{self.stream} did not answer a read within {REQUEST_SLACK_S:g}s; read again"
                ) from exc
            if not chunk:
                raise self.error(f"the server closed the connection while {self.stream} was read")
            deadline = time.monotonic() + REQUEST_SLACK_S  # it answers: a big batch may take a while
            for item in self._parser.feed(chunk):
                done = self._take(item, reply, out)
                if done is not None:
                    return out, done

    def _take(self, item: tuple[Any, ...], reply: bytes, out: list[RawRecord]) -> int | None:
        """Add a direct get's answer to ``out``; the count pending once the batch ended, else None."""
        kind = item[0]
        if kind == "direct" and item[1] == reply:
            seq, subject, _, before = direct_fields(item[2], self.error)
            # Each answer names the sequence of the one before it in the batch (0 for the first):
            # anything else is a message lost on the way.
            previous = out[-1].stream_seq if out else 0
            if before != previous:
                raise self.error(f"{self.stream}: stream sequence {seq} came after {previous}, not after "
                                 f"{before}: messages were lost on the way; read again")  # fmt: skip
            name = self._subjects.get(subject)
            if name is None:
                if len(self._subjects) > 100_000:
                    self._subjects.clear()
                name = self._subjects[subject] = subject.decode("utf-8", "replace")
            out.append(RawRecord(seq, name, item[3]))
        elif kind == "status" and item[1] == reply:
            code, text, header = item[2], item[3], item[4]
            if code == _NOT_FOUND and not out:
                return 0
            if code != _EOB:
                raise self.error(f"the server ended the read of {self.stream} ({code} {text}); read again")
            last = header_value(header, b"Nats-Last-Sequence")
            if out and last is not None and int(last) != out[-1].stream_seq:
                raise self.error(f"{self.stream}: the batch ended at {int(last)}, the last message received "
                                 f"was {out[-1].stream_seq}: messages were lost on the way; read again")  # fmt: skip
            pending = header_value(header, b"Nats-Num-Pending")
            return int(pending) if pending is not None and pending.isdigit() else 0
        elif kind == "ping":
            assert self._writer is not None
            self._writer.write(b"PONG\r\n")
        elif kind == "err":
            if "permissions violation" in item[1].lower():
                raise DirectGetDenied(f"these credentials may not read {self.stream} by direct get ({item[1]})")
            raise self.error(f"the server reported an error reading {self.stream}: {item[1]}")
        return None

    async def close(self) -> None:
        if self._writer is not None:
            await _close(self._writer)
            self._writer = None


class StreamFollower:
    """The stream follower: batch direct gets of every subject, on a connection of its own.

    ``next_batch`` returns the next records in stream order, each exactly one sequence after
    the previous (``gap_error`` otherwise), or ``[]`` when nothing arrived within ``wait``
    (following, it asks again every ``POLL_S``). ``pending``: what the server still held after the
    last batch. A package reading through it may name its own errors (``read_error``, ``gap_error``)."""

    read_error: type[LedgerError] = LedgerReadError
    gap_error: type[LedgerError] = StreamGapError

    def __init__(self, client: LedgerClient, stream: str, *, batch: int = PULL_BATCH) -> None:
        self.client = client
        self.stream = stream
        self.batch = batch
        self.pending = 0
        self._socket: _DirectSocket | None = None
        self._next_seq = 0

    async def start(self, start_seq: int) -> None:
        self._socket = _DirectSocket(self.client, self.stream, "runledger-projector", self.read_error)
        await self._socket.open()
        self._next_seq = max(1, start_seq)

    async def next_batch(self, max_records: int, wait: float) -> list[RawRecord]:
        assert self._socket is not None
        try:
            out, self.pending, self._next_seq = await contiguous(
                self._socket.batch, self._next_seq, min(self.batch, max_records), max_records, wait, self.gap_error
            )
        except DirectGetDenied as exc:
            raise self.read_error(f"{exc}: read the stream with a role that reads everything") from exc
        return out

    async def close(self) -> None:
        if self._socket is not None:
            await self._socket.close()
            self._socket = None


Batches = Callable[[int, int], Awaitable[tuple[list[RawRecord], int]]]


async def contiguous(
    batches: Batches, next_seq: int, batch: int, max_records: int, wait: float, gap_error: type[LedgerError]
) -> tuple[list[RawRecord], int, int]:
    """Up to ``max_records`` records from ``next_seq`` on, each exactly one stream sequence after the
    previous (``gap_error`` otherwise), asking ``batches(seq, size)`` for at most ``batch`` at a time,
    and asking again every ``POLL_S`` while nothing is new, for at most ``wait`` seconds. Returns the
    records, the count still pending after them, and the next sequence to read."""
    out: list[RawRecord] = []
    pending = 0
    deadline = time.monotonic() + wait
    while len(out) < max_records:
        records, pending = await batches(next_seq, min(batch, max_records - len(out)))
        for rec in records:
            if rec.stream_seq != next_seq:
                raise gap_error(next_seq, rec.stream_seq)
            next_seq += 1
        out += records
        if out and pending == 0:
            break  # everything stored, for now
        if not records:
            if time.monotonic() + POLL_S >= deadline:
                break
            await asyncio.sleep(POLL_S)
    return out, pending, next_seq


def reads_by_consumer(client: LedgerClient, stream: str) -> bool:
    """An agent's login reads LEDGER through consumers filtered to its own subjects (its permissions
    scope them; a direct get by sequence or filter cannot be scoped); every other read is a direct get."""
    return stream == LEDGER_STREAM and getattr(client, "role", None) == "agent"


async def read_subject(
    client: LedgerClient, stream: str, subject_filter: str, *, start_seq: int = 1, timeout: float = 30.0
) -> list[RawRecord]:
    """Every message on ``subject_filter`` from ``start_seq`` on, in stream order, complete.

    Raises ReaderUnavailableError when this connection cannot be spoken fast (read through nats-py),
    LedgerReadError when the read is incomplete or times out, and LedgerError when the server
    refuses the read (these credentials may not read the subject)."""
    if not reads_by_consumer(client, stream):
        try:
            return await _read_direct(client, stream, subject_filter, start_seq=start_seq, timeout=timeout)
        except DirectGetDenied:
            pass  # a server whose permissions allow this login consumers instead (configured by hand)
    return await _read_by_consumer(client, stream, subject_filter, start_seq=start_seq, timeout=timeout)


async def _read_direct(
    client: LedgerClient, stream: str, subject_filter: str, *, start_seq: int, timeout: float
) -> list[RawRecord]:
    socket = _DirectSocket(client, stream, "runledger-reader", LedgerReadError)
    await socket.open()
    try:
        async with asyncio.timeout(timeout):
            return await read_to_end(socket.batch, start_seq, subject_filter)
    except TimeoutError as exc:
        raise LedgerReadError(f"reading {subject_filter} timed out after {timeout:g}s") from exc
    except (OSError, ValueError) as exc:
        raise LedgerReadError(f"reading {subject_filter}: {type(exc).__name__}: {exc}") from exc
    finally:
        await socket.close()


async def _read_by_consumer(
    client: LedgerClient, stream: str, subject_filter: str, *, start_seq: int, timeout: float
) -> list[RawRecord]:
    """``read_subject`` through a named push consumer (no acks, memory, R1) filtered to the subject,
    created by a request on the same connection and delivering to that connection's inbox, so the
    whole read is one round trip plus the data. The server removes it once nobody listens
    (``SUBJECT_CONSUMER_IDLE_S``)."""
    login = _Login(client, "runledger-reader")
    token = os.urandom(8).hex()
    inbox = f"{login.inbox_prefix}.rlread{token}"
    reply, deliver = f"{inbox}.c".encode(), f"{inbox}.d"
    name = f"rl{token}"
    config: dict[str, Any] = {
        "name": name,
        "deliver_subject": deliver,
        "filter_subject": subject_filter,
        "ack_policy": "none",
        "replay_policy": "instant",
        "mem_storage": True,
        "num_replicas": 1,
        "inactive_threshold": int(SUBJECT_CONSUMER_IDLE_S * 1e9),
        **(
            {"deliver_policy": "by_start_sequence", "opt_start_seq": start_seq}
            if start_seq > 1
            else {"deliver_policy": "all"}
        ),
    }
    body = json.dumps({"stream_name": stream, "config": config, "action": "create"}).encode()
    reader, writer = await login.open()
    try:
        # One write: log in, listen on the inbox, create the consumer (its filter in the API
        # subject, where a role's permissions can match it), PING. The server handles them in
        # order, so the inbox is subscribed before the consumer delivers to it.
        writer.write(
            login.connect_line()
            # The deliver subject literally: a push consumer sees no interest from a wildcard subscription.
            + f"SUB {deliver} 1\r\nSUB {inbox}.c 2\r\n".encode()
            + f"PUB $JS.API.CONSUMER.CREATE.{stream}.{name}.{subject_filter} {inbox}.c {len(body)}\r\n".encode()
            + body
            + b"\r\nPING\r\n"
        )
        return await asyncio.wait_for(_drain(reader, writer, reply, subject_filter, start_seq), timeout=timeout)
    except TimeoutError as exc:
        raise LedgerReadError(f"reading {subject_filter} timed out after {timeout:g}s") from exc
    except (OSError, ValueError) as exc:
        raise LedgerReadError(f"reading {subject_filter}: {type(exc).__name__}: {exc}") from exc
    finally:
        await _close(writer)


async def _drain(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reply: bytes, subject_filter: str, start_seq: int
) -> list[RawRecord]:
    parser = ProtocolParser()
    out: list[RawRecord] = []
    subjects: dict[bytes, str] = {}
    created: int | None = None  # matching messages when the consumer was created
    pending = -1  # after the last delivery
    last_seq = start_seq - 1
    logged_in = False
    while True:
        chunk = await reader.read(READ_CHUNK)
        if not chunk:
            if not logged_in:
                raise ReaderUnavailableError("the server closed the connection while logging in")
            raise LedgerReadError(f"reading {subject_filter}: the server closed the connection")
        for item in parser.feed(chunk):
            kind = item[0]
            if kind == "msg":
                if item[1] == reply:
                    created = _created(item[3], subject_filter)
                    continue
                seq, left = parse_ack_subject(item[2])
                if seq <= last_seq or (pending >= 0 and left < pending - 1):
                    # Stream order, and the pending count drops by one per message (new messages
                    # may raise it): anything else means a message went missing on the way.
                    raise LedgerReadError(
                        f"reading {subject_filter}: stream sequence {seq} after {last_seq} with {left} pending "
                        f"after {pending}: messages were lost on the way; read again"
                    )
                last_seq, pending = seq, left
                subject = subjects.get(item[1])
                if subject is None:
                    subject = subjects[item[1]] = item[1].decode("utf-8", "replace")
                out.append(RawRecord(seq, subject, item[3]))
            elif kind == "ping":
                writer.write(b"PONG\r\n")
            elif kind == "err":
                text = item[1]
                if "Publish" in text:  # the consumer's API subject: a role that may not read this
                    raise LedgerError(f"cannot read {subject_filter}: these credentials may not read it ({text})")
                raise ReaderUnavailableError(f"the server refused the fast reader: {text}")
            elif kind == "status" and item[2] != 100:
                raise LedgerReadError(f"reading {subject_filter}: the server ended the read ({item[2]} {item[3]})")
        logged_in = True
        if created is not None and (created == 0 or pending == 0):
            if len(out) < created:
                raise LedgerReadError(
                    f"reading {subject_filter}: got {len(out)} messages, the server holds {created}; read again"
                )
            return out


def _created(data: bytes, subject_filter: str) -> int:
    """How many messages the new consumer had to deliver, from its creation reply."""
    info = json.loads(data)
    error = info.get("error")
    if error:
        code = error.get("err_code") or error.get("code")
        raise LedgerError(
            f"cannot read {subject_filter}: the server refused the consumer ({code} {error.get('description')})"
        )
    delivered = int((info.get("delivered") or {}).get("consumer_seq") or 0)
    return int(info.get("num_pending") or 0) + delivered


BatchFn = Callable[[int, int, str], Awaitable[tuple[list[RawRecord], int]]]


async def read_to_end(batch: BatchFn, start_seq: int, subject_filter: str) -> list[RawRecord]:
    """Every message on ``subject_filter`` from ``start_seq`` on, by batches of direct gets (``batch(seq,
    count, filter)`` answering the records and how many are still pending): complete when nothing is
    pending; a batch that sends nothing while some are pending raises LedgerReadError (read again)."""
    out: list[RawRecord] = []
    seq = start_seq
    while True:
        records, pending = await batch(seq, PULL_BATCH, subject_filter)
        out += records
        if pending == 0:
            return out
        if not records:
            raise LedgerReadError(f"reading {subject_filter}: {pending} pending, none sent; read again")
        seq = records[-1].stream_seq + 1
