"""Reading the LEDGER stream in order, fast, and never silently short.

Two readers with one contract (``StreamReader``): ``next_batch`` returns the next records in
stream order, each exactly one sequence after the previous (``SequenceGapError`` otherwise),
or ``[]`` when nothing arrived within ``wait``.

``PullReader`` (the default) speaks the NATS protocol itself on a connection of its own: an
ephemeral pull consumer (no acks) asked for large batches, whose messages are parsed
straight from the socket buffer. nats-py spends ~30 us a message in its parser, header
parsing, ``Msg`` objects and a task queue (PITFALLS: ~11k msg/s with ``fetch()``, ~30-60k
with an ordered push consumer); this reader spends ~5 us, and TCP flow control replaces
the client-side slow-consumer drop that makes ordered consumers lose messages. It supports
plain connections with user/password or token in the URL.

``OrderedReader`` (nats-py's ordered push consumer with a callback) is the fallback for
what ``PullReader`` does not speak (TLS, credentials files, nkeys). It treats a
slow-consumer error as fatal and checks sequences, since the client can drop messages
after advancing its own sequence tracking (PITFALLS).

Rejected: ``fetch()`` (a task per message), and trusting either consumer's delivery count
without checking stream sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import deque
from typing import Any, Protocol
from urllib.parse import unquote

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from ledger.client import LedgerClient
from ledger.records import RawRecord
from projections.errors import SequenceGapError, StreamReadError

PULL_BATCH = 10_000
PULL_MAX_BYTES = 32 * 1024 * 1024  # above the stream's 1 MiB message limit, so one message always fits
READ_CHUNK = 1 << 20
LINGER_S = 0.02  # with something to return, how long to wait for more before returning it
REQUEST_SLACK_S = 5.0  # past a pull request's expiry, how long to wait for its end before giving up


class StreamReader(Protocol):
    """Contiguous records of a stream from a start sequence on."""

    pending: int  # messages the server still held after the last one returned

    async def start(self, start_seq: int) -> None: ...

    async def next_batch(self, max_records: int, wait: float) -> list[RawRecord]: ...

    async def close(self) -> None: ...


class ReaderUnavailable(Exception):
    """PullReader cannot talk to this server (TLS, credentials files...): use OrderedReader."""


def _check_next(expected: int, got: int) -> None:
    if got != expected:
        raise SequenceGapError(expected, got)


def parse_ack_subject(reply: bytes) -> tuple[int, int]:
    """(stream sequence, pending) from a JetStream delivery's reply subject (v1 or v2 form)."""
    if reply.count(b".") == 8:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        _, sseq, _, _, pending = reply.rsplit(b".", 4)
        return int(sseq), int(pending)
    tokens = reply.split(b".")
    if len(tokens) >= 12:  # $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>.<tok>
        return int(tokens[7]), int(tokens[10])
    raise StreamReadError(f"not a JetStream delivery: reply subject {reply[:120]!r}")


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


class PullReader:
    """The fast reader: an ephemeral no-ack pull consumer on a connection of its own."""

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
        nc = self.client.nc
        url = nc.connected_url
        options = getattr(nc, "options", {}) or {}
        if url is None:
            raise ReaderUnavailable("not connected")
        if (
            url.scheme in ("tls", "wss", "ws")
            or options.get("tls")
            or options.get("user_credentials")
            or options.get("nkeys_seed")
        ):
            raise ReaderUnavailable("TLS, a .creds file or an nkey: use nats-py's reader")
        connect: dict[str, Any] = {
            "verbose": False, "pedantic": False, "tls_required": False, "name": "runledger-projector",
            "lang": "python", "version": "runledger", "protocol": 1, "headers": True, "no_responders": True,
        }  # fmt: skip
        # The same login as the client's: a role's user and password (ledger.roles), or the URL's.
        if options.get("user") and options.get("password") is not None:
            connect["user"], connect["pass"] = options["user"], options["password"]
        elif options.get("token"):
            connect["auth_token"] = options["token"]
        elif url.username and url.password is not None:
            connect["user"], connect["pass"] = unquote(url.username), unquote(url.password)
        elif url.username:
            connect["auth_token"] = unquote(url.username)
        # A role may subscribe only under its own inbox prefix (ledger.roles): the client's.
        prefix = bytes(getattr(nc, "_inbox_prefix", b"_INBOX")).decode("ascii", "replace") or "_INBOX"
        self._inbox = prefix + ".rlproj" + os.urandom(8).hex()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(url.hostname or "127.0.0.1", url.port or 4222, limit=READ_CHUNK * 4),
                timeout=5,
            )
        except (OSError, TimeoutError) as exc:
            raise ReaderUnavailable(f"cannot connect: {exc}") from exc
        self._reader, self._writer = reader, writer
        try:
            info_line = await asyncio.wait_for(reader.readline(), timeout=5)
            if not info_line.startswith(b"INFO "):
                raise ReaderUnavailable("no INFO from the server")
            info = json.loads(info_line[5:])
            if info.get("tls_required") or (
                info.get("nonce") and "auth_token" not in connect and "user" not in connect
            ):
                raise ReaderUnavailable("the server wants TLS or nkey authentication")
            writer.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
            await self._until_pong()  # logged in
            writer.write(f"SUB {self._inbox}.* 1\r\nPING\r\n".encode())
            await self._until_pong()  # allowed to listen on the inbox (a violation arrives before PONG)
        except (OSError, TimeoutError, ValueError) as exc:
            await self._close_socket()
            raise ReaderUnavailable(str(exc)) from exc
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
            raise StreamReadError(f"could not create a consumer on {self.stream}: {exc}") from exc
        self._consumer = info.name
        self._next_seq = max(1, start_seq)

    async def _until_pong(self) -> None:
        assert self._reader is not None and self._writer is not None
        await self._writer.drain()
        while True:
            line = await asyncio.wait_for(self._reader.readline(), timeout=5)
            if not line:
                raise ReaderUnavailable("the server closed the connection")
            if line.startswith(b"-ERR"):
                raise ReaderUnavailable(line.decode("utf-8", "replace").strip())
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
                    seq, self.pending = parse_ack_subject(item[2])
                    if seq != self._next_seq:
                        raise SequenceGapError(self._next_seq, seq)
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
                        raise StreamReadError(f"the server ended the read ({code} {text}); run again")
                elif kind == "ping":
                    self._writer.write(b"PONG\r\n")
                elif kind == "err":
                    raise StreamReadError(f"the server reported an error: {item[1]}")
            if len(out) >= max_records:
                break
            now = time.monotonic()
            if now >= deadline and not self._items:
                break
            if not self._request_open:
                self._send_request(max(deadline - now, 0.05))
                current = f"{self._inbox}.{self._request}".encode()
            elif now > self._request_deadline and not out:
                raise StreamReadError("the consumer stopped answering (its server left the cluster?); run again")
            # With records in hand, wait only briefly for more (low latency when following).
            timeout = min(LINGER_S, deadline - now) if out else deadline - now
            try:
                chunk = await asyncio.wait_for(self._reader.read(READ_CHUNK), timeout=max(timeout, 0.001))
            except TimeoutError:
                if out:
                    break
                continue
            if not chunk:
                raise StreamReadError("the server closed the connection while reading the stream")
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
            self._writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.wait_closed()
            self._writer = None


class OrderedReader:
    """nats-py's ordered push consumer with a callback: the fallback reader."""

    def __init__(self, client: LedgerClient, stream: str, subject: str = "ledger.>") -> None:
        self.client = client
        self.stream = stream
        self.subject = subject
        self.pending = 0
        self._queue: deque[RawRecord] = deque()
        self._arrived = asyncio.Event()
        self._sub: Any = None
        self._next_seq = 0
        self._slow_before = 0

    async def start(self, start_seq: int) -> None:
        self._next_seq = max(1, start_seq)
        self._slow_before = self.client.slow_consumer_errors

        async def on_msg(msg: Any) -> None:
            meta = msg.metadata  # never block here: the client drops messages behind a slow callback
            self.pending = meta.num_pending
            self._queue.append(RawRecord(meta.sequence.stream, msg.subject, msg.data))
            self._arrived.set()

        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if start_seq > 1 else DeliverPolicy.ALL,
            opt_start_seq=start_seq if start_seq > 1 else None,
        )
        try:
            self._sub = await self.client.js.subscribe(
                self.subject, stream=self.stream, config=config, cb=on_msg, ordered_consumer=True,
                pending_msgs_limit=1_000_000, pending_bytes_limit=1024 * 1024 * 1024,
            )  # fmt: skip
        except (TimeoutError, nats.errors.Error) as exc:
            raise StreamReadError(f"could not subscribe to {self.stream}: {exc}") from exc

    async def next_batch(self, max_records: int, wait: float) -> list[RawRecord]:
        if not self._queue:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout=wait)
        if self.client.slow_consumer_errors != self._slow_before:
            raise StreamReadError(
                "the client dropped messages (slow consumer); nothing past the last batch was committed"
            )
        out: list[RawRecord] = []
        while self._queue and len(out) < max_records:
            rec = self._queue.popleft()
            _check_next(self._next_seq, rec.stream_seq)
            self._next_seq = rec.stream_seq + 1
            out.append(rec)
        return out

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
            self._sub = None


async def open_reader(client: LedgerClient, stream: str, start_seq: int, kind: str = "auto") -> StreamReader:
    """A started reader: ``pull`` (fast), ``ordered`` (nats-py), or ``auto`` (pull, else ordered)."""
    if kind in ("auto", "pull"):
        pull = PullReader(client, stream)
        try:
            await pull.start(start_seq)
            return pull
        except ReaderUnavailable as exc:
            if kind == "pull":
                raise StreamReadError(f"the fast reader cannot read from this server: {exc}") from exc
    ordered = OrderedReader(client, stream)
    await ordered.start(start_seq)
    return ordered
