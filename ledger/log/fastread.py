"""Reading the LEDGER stream fast: the NATS protocol spoken on a connection of our own.

nats-py spends ~30-100 us a message in its parser, header parsing, ``Msg`` objects and a
task queue (measured here: ~11k msg/s with ``fetch()``, ~30-60k with an ordered push consumer).
Both readers here open a plain socket with the client's login and inbox prefix
(runledger.protect.roles), parse messages straight from the socket buffer (~5 us a message; stored
headers are skipped: the event is the body), and let TCP flow control replace the
client-side slow-consumer drop that makes ordered consumers lose messages.

``read_subject`` reads one subject filter once (a run, an effect key): a named push consumer
(no acks, memory, R1) filtered to the subject, created by a request on the same connection
and delivering to that connection's inbox, so the whole read is one round trip plus the data.
``StreamFollower`` follows the whole stream in large pull batches (the projector).

Neither trusts the delivery: ``StreamFollower`` checks that stream sequences are contiguous;
``read_subject`` cannot (a filtered subject has gaps), so it checks the consumer's own
accounting instead: every delivery carries how many matching messages are still pending,
which may drop by exactly one per message (more means one went missing), the read ends only
at pending 0 (drained), and the count received is at least what the server said the subject
held when the consumer was created.

Both support plain connections with user/password or token (the client's options or URL).
TLS, credentials files and nkeys raise ``ReaderUnavailableError``: use nats-py's ordered consumer.

Rejected: a pull consumer for ``read_subject`` (``$JS.API.CONSUMER.MSG.NEXT`` is not scoped by
filter, so an agent role may not send it, and it costs a round trip); ``fetch()`` (a task per
message); trusting a consumer's delivery count without checking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import deque
from typing import Any
from urllib.parse import unquote

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from runledger.errors import LedgerError, LedgerReadError, ReaderUnavailableError, StreamGapError
from runledger.log.client import LedgerClient
from runledger.record.records import RawRecord

PULL_BATCH = 10_000
PULL_MAX_BYTES = 32 * 1024 * 1024  # above the stream's 1 MiB message limit, so one message always fits
READ_CHUNK = 1 << 20
LINGER_S = 0.02  # with something to return, how long to wait for more before returning it
REQUEST_SLACK_S = 5.0  # past a pull request's expiry, how long to wait for its end before giving up
CONNECT_TIMEOUT_S = 5.0
# A subject read's consumer is deleted when the read ends; this bounds how long one outlives a
# reader that could not delete it (a crash, or a role without $JS.API.CONSUMER.DELETE).
SUBJECT_CONSUMER_IDLE_S = 10.0


def parse_ack_subject(reply: bytes, error: type[LedgerError] = LedgerReadError) -> tuple[int, int]:
    """(stream sequence, pending) from a JetStream delivery's reply subject (v1 or v2 form)."""
    if reply.count(b".") == 8:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        _, sseq, _, _, pending = reply.rsplit(b".", 4)
        return int(sseq), int(pending)
    tokens = reply.split(b".")
    if len(tokens) >= 12:  # $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>.<tok>
        return int(tokens[7]), int(tokens[10])
    raise error(f"not a JetStream delivery: reply subject {reply[:120]!r}")


class ProtocolParser:
    """Incremental parser of the NATS messages a pull subscription receives.

    ``feed(chunk)`` returns complete items: ``("msg", subject, reply, data)``,
    ``("status", subject, code, description)``, ``("ping",)`` or ``("err", text)``.
    Message bytes are sliced straight from the buffer; headers of stored messages are
    skipped (the event is the body).
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
                else:  # a status from the server: "NATS/1.0 408 Request Timeout"
                    status = bytes(buf[eol + 2 : eol + 2 + header_len]).split(b"\r\n", 1)[0].split(b" ", 2)
                    code = int(status[1]) if len(status) > 1 and status[1].isdigit() else 0
                    out.append(
                        ("status", parts[0], code, status[2].decode("utf-8", "replace") if len(status) > 2 else "")
                    )
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


class StreamFollower:
    """The stream follower: an ephemeral no-ack pull consumer on a connection of its own.

    ``next_batch`` returns the next records in stream order, each exactly one sequence after
    the previous (``gap_error`` otherwise), or ``[]`` when nothing arrived within ``wait``.
    A package reading through it may name its own errors (``read_error``, ``gap_error``)."""

    read_error: type[LedgerError] = LedgerReadError
    gap_error: type[LedgerError] = StreamGapError

    def __init__(self, client: LedgerClient, stream: str, *, batch: int = PULL_BATCH) -> None:
        self.client = client
        self.stream = stream
        self.batch = batch
        self.pending = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._parser = ProtocolParser()
        self._inbox = "_INBOX.rlproj" + os.urandom(8).hex()
        self._consumer: str | None = None
        self._next_seq = 0
        self._request = 0
        self._request_open = False
        self._request_left = 0
        self._request_deadline = 0.0  # when the open request must have ended (its expiry, plus slack)
        self._items: deque[tuple[Any, ...]] = deque()
        self._subjects: dict[bytes, str] = {}  # decoded once: a run's subject repeats for each event

    async def start(self, start_seq: int) -> None:
        login = _Login(self.client, "runledger-projector")
        self._inbox = login.inbox_prefix + ".rlproj" + os.urandom(8).hex()
        self._reader, self._writer = await login.open()
        try:
            self._writer.write(login.connect_line() + b"PING\r\n")
            await self._until_pong()  # logged in
            self._writer.write(f"SUB {self._inbox}.* 1\r\nPING\r\n".encode())
            await self._until_pong()  # allowed to listen on the inbox (a violation arrives before PONG)
        except (OSError, TimeoutError, ValueError) as exc:
            await self._close_socket()
            raise ReaderUnavailableError(str(exc)) from exc
        except BaseException:
            await self._close_socket()
            raise
        try:
            info = await self.client.js.add_consumer(
                self.stream,
                ConsumerConfig(
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=max(1, start_seq),
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=120.0,
                    mem_storage=True,
                    num_replicas=1,
                ),
            )
        except (TimeoutError, nats.errors.Error) as exc:
            await self._close_socket()
            raise self.read_error(f"could not create a consumer on {self.stream}: {exc}") from exc
        self._consumer = info.name
        self._next_seq = max(1, start_seq)

    async def _until_pong(self) -> None:
        assert self._reader is not None and self._writer is not None
        await self._writer.drain()
        while True:
            line = await asyncio.wait_for(self._reader.readline(), timeout=5)
            if not line:
                raise ReaderUnavailableError("the server closed the connection")
            if line.startswith(b"-ERR"):
                raise ReaderUnavailableError(line.decode("utf-8", "replace").strip())
            if line.startswith(b"PONG"):
                return

    def _send_request(self, expires: float) -> None:
        assert self._writer is not None and self._consumer is not None
        self._request += 1
        body = json.dumps(
            {"batch": self.batch, "max_bytes": PULL_MAX_BYTES, "expires": int(max(expires, 0.05) * 1e9)}
        ).encode()
        self._writer.write(
            f"PUB $JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self._consumer} {self._inbox}.{self._request} "
            f"{len(body)}\r\n".encode()
            + body
            + b"\r\n"
        )
        self._request_open = True
        self._request_left = self.batch
        # The server ends every request by its expiry (408) unless it filled it. No word long after
        # means the consumer is gone: on a cluster, its node died (an R1 consumer lives on one node).
        self._request_deadline = time.monotonic() + max(expires, 0.05) + REQUEST_SLACK_S

    async def next_batch(self, max_records: int, wait: float) -> list[RawRecord]:
        assert self._reader is not None and self._writer is not None
        out: list[RawRecord] = []
        deadline = time.monotonic() + wait
        current = f"{self._inbox}.{self._request}".encode()
        subjects = self._subjects
        while len(out) < max_records:
            while self._items and len(out) < max_records:
                item = self._items.popleft()
                kind = item[0]
                if kind == "msg":
                    seq, self.pending = parse_ack_subject(item[2], self.read_error)
                    if seq != self._next_seq:
                        raise self.gap_error(self._next_seq, seq)
                    self._next_seq = seq + 1
                    subject = subjects.get(item[1])
                    if subject is None:
                        if len(subjects) > 100_000:
                            subjects.clear()
                        subject = subjects[item[1]] = item[1].decode("utf-8", "replace")
                    out.append(RawRecord(seq, subject, item[3]))
                    self._request_left -= 1
                    if self._request_left <= 0:
                        self._request_open = False
                elif kind == "status":
                    _, subject, code, text = item
                    if subject != current or code == 100:
                        continue  # a late status of an earlier request, or an idle heartbeat
                    if code in (404, 408) or (code == 409 and ("Batch Completed" in text or "MaxBytes" in text)):
                        self._request_open = False  # the request ended normally: ask again if needed
                    else:  # consumer deleted, leadership change, ...: start over from the committed position
                        raise self.read_error(f"the server ended the read ({code} {text}); run again")
                elif kind == "ping":
                    self._writer.write(b"PONG\r\n")
                elif kind == "err":
                    raise self.read_error(f"the server reported an error: {item[1]}")
            if len(out) >= max_records:
                break
            now = time.monotonic()
            if now >= deadline and not self._items:
                break
            if not self._request_open:
                self._send_request(max(deadline - now, 0.05))
                current = f"{self._inbox}.{self._request}".encode()
            elif now > self._request_deadline and not out:
                raise self.read_error("the consumer stopped answering (its server left the cluster?); run again")
            # With records in hand, wait only briefly for more (low latency when following).
            timeout = min(LINGER_S, deadline - now) if out else deadline - now
            try:
                chunk = await asyncio.wait_for(self._reader.read(READ_CHUNK), timeout=max(timeout, 0.001))
            except TimeoutError:
                if out:
                    break
                continue
            if not chunk:
                raise self.read_error("the server closed the connection while reading the stream")
            self._items.extend(self._parser.feed(chunk))
        return out

    async def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(TimeoutError, nats.errors.Error):
                await self.client.js.delete_consumer(self.stream, self._consumer)
            self._consumer = None
        await self._close_socket()

    async def _close_socket(self) -> None:
        if self._writer is not None:
            await _close(self._writer)
            self._writer = None


async def read_subject(
    client: LedgerClient, stream: str, subject_filter: str, *, start_seq: int = 1, timeout: float = 30.0
) -> list[RawRecord]:
    """Every message on ``subject_filter`` from ``start_seq`` on, in stream order, complete.

    Raises ReaderUnavailableError when this connection cannot be spoken fast (fall back to nats-py),
    LedgerReadError when the read is incomplete or times out, and LedgerError when the server
    refuses the consumer (these credentials may not read the subject)."""
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
        # Fire and forget: a role that may not delete consumers gets a -ERR nobody reads, and the
        # server removes the consumer once nobody listens on its inbox (SUBJECT_CONSUMER_IDLE_S).
        with contextlib.suppress(OSError, ConnectionError):
            writer.write(f"PUB $JS.API.CONSUMER.DELETE.{stream}.{name} 0\r\n\r\n".encode())
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
            elif kind == "status" and item[2] not in (100,):
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
