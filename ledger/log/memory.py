"""The ledger in this process's memory: a stand-in for nats-server, for fast tests of an agent.

``MemoryLedger`` holds streams (created from the same ``StreamConfig`` objects
``runledger.log.streams`` gives a real server), their messages and the key and blob buckets;
``await MemoryLedger().connect()`` returns a ``LedgerClient`` whose ``js`` and ``nc`` answer the
JetStream calls the library makes, so ``start_run``, ``resume_run``, ``load_run`` and
``RecordedRun`` work on it unchanged::

    ledger = MemoryLedger()
    client = await ledger.connect()
    result = await start_run(client, spec, {"ticket": 1})

What it keeps of the log's contract, as nats-server 2.12 on one node does:

- a publish's ``Nats-Expected-Last-Subject-Sequence`` (with ``-Subject``, over a wildcard) is
  checked before its ``Nats-Msg-Id``: a stale fence is the server's 10071 ("wrong last sequence:
  N", ``BadRequestError``), a msg id stored within the stream's duplicate window is acknowledged as
  a duplicate with the first message's sequence, and nothing is stored twice;
- an atomic batch (``Nats-Batch-Id`` on the connection, runledger.log.window) is stored whole or
  not at all: fenced on its first message, refused whole (10201) when it holds a stored msg id;
- per-subject reads in stream order, direct gets of a subject's last message (wildcards too), a
  message by sequence or the next one on a subject; per-subject counts (``stream_info``);
- ``deny_delete``/``deny_purge``, one message per subject where the stream says so (the key
  bucket), rollup headers; the key bucket is nats-py's own ``KeyValue`` over these calls.

- batch direct gets (``$JS.API.DIRECT.GET.<stream>`` with ``seq``, ``batch``, ``next_by_subj``),
  answered on a subscription of the connection as the server answers them: each message with its
  stream sequence, subject, the count still pending and the sequence before it, then the batch's
  end (what runledger.log.directget reads; runledger.log.fastread speaks the protocol on a socket:
  it reports itself unavailable here, and the readers read through nats-py's calls instead).

Not kept: clustering, retention by age, consumers other than the ordered push consumer an
agent's reads use where the socket cannot go (and a consumer's name and settings, kept as they
were created), and permissions (every role may do everything). Blobs live in a plain dict
(``MemoryObjectStore``), not in chunk messages.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple, cast

from nats.js.api import (
    ConsumerConfig,
    ConsumerInfo,
    ObjectInfo,
    PubAck,
    RawStreamMsg,
    StreamConfig,
    StreamInfo,
    StreamState,
)
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    NoStreamResponseError,
    NotFoundError,
    ObjectDeletedError,
    ObjectNotFoundError,
)
from nats.js.kv import KeyValue

from runledger.log.client import LedgerClient
from runledger.log.streams import StreamSettings, ensure_streams
from runledger.log.subjects import FENCE_HEADER, FENCE_SUBJECT_HEADER

MEMORY_URL = "memory://"
WRONG_LAST_SEQUENCE = 10071  # as runledger.log.publish
DELETE_DENIED = 10057  # as runledger.protect.keystore
PURGE_DENIED = 10056
NO_ATOMIC = 10174
DUPLICATE_IN_BATCH = 10201
ROLLUP_HEADER = "Nats-Rollup"
_BATCH_ID = "Nats-Batch-Id"
_DIRECT_GET = "$JS.API.DIRECT.GET."
_BATCH_COMMIT = "Nats-Batch-Commit"


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` is matched by ``pattern`` (NATS wildcards: ``*`` one token, ``>`` the rest)."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def _api_error(code: int, err_code: int, description: str) -> APIError:
    """The typed error nats-py raises for the server's answer (BadRequestError for 400, ...)."""
    try:
        APIError.from_error({"code": code, "err_code": err_code, "description": description})
    except APIError as exc:
        return exc
    raise AssertionError("APIError.from_error always raises")  # pragma: no cover


class _Stored(NamedTuple):
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    time: dt.datetime


@dataclass
class _Stream:
    config: StreamConfig
    messages: dict[int, _Stored] = field(default_factory=dict)  # by sequence, in stream order
    last_seq: int = 0
    msg_ids: dict[str, tuple[int, float]] = field(default_factory=dict)  # msg id: (sequence, monotonic time)
    subscriptions: list[_Subscription] = field(default_factory=list)
    consumers: dict[str, ConsumerConfig] = field(default_factory=dict)  # by name: as created, nothing delivered

    def holds(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.config.subjects or [])

    def last_on(self, pattern: str) -> _Stored | None:
        for seq in reversed(self.messages):
            msg = self.messages[seq]
            if subject_matches(pattern, msg.subject):
                return msg
        return None

    def duplicate_of(self, msg_id: str) -> int | None:
        window = float(self.config.duplicate_window or 120.0)
        found = self.msg_ids.get(msg_id)
        if found is None or time.monotonic() - found[1] > window:
            return None
        return found[0]

    def fence_error(self, subject: str, headers: dict[str, str]) -> APIError | None:
        """The server's refusal of a publish whose expected last subject sequence is stale."""
        expected = headers.get(FENCE_HEADER)
        if expected is None:
            return None
        last = self.last_on(headers.get(FENCE_SUBJECT_HEADER) or subject)
        actual = last.seq if last is not None else 0
        if actual == int(expected):
            return None
        return _api_error(400, WRONG_LAST_SEQUENCE, f"wrong last sequence: {actual}")

    def store(self, subject: str, data: bytes, headers: dict[str, str]) -> int:
        if headers.get(ROLLUP_HEADER) == "sub":
            for seq in [s for s, m in self.messages.items() if m.subject == subject]:
                del self.messages[seq]
        self.last_seq += 1
        seq = self.last_seq
        self.messages[seq] = _Stored(seq, subject, data, dict(headers), dt.datetime.now(dt.UTC))
        if msg_id := headers.get("Nats-Msg-Id"):
            self.msg_ids[msg_id] = (seq, time.monotonic())
        per_subject = self.config.max_msgs_per_subject or -1
        if per_subject > 0:
            older = [s for s, m in self.messages.items() if m.subject == subject]
            for s in older[:-per_subject]:
                del self.messages[s]
        for sub in list(self.subscriptions):
            sub.offer(self.messages[seq])
        return seq

    def pending_after(self, seq: int, pattern: str) -> int:
        return sum(1 for s, m in self.messages.items() if s > seq and subject_matches(pattern, m.subject))

    def raw(self, msg: _Stored) -> RawStreamMsg:
        headers = {
            **msg.headers, "Nats-Stream": self.config.name or "", "Nats-Subject": msg.subject,
            "Nats-Sequence": str(msg.seq), "Nats-Time-Stamp": msg.time.isoformat(),
        }  # fmt: skip
        return RawStreamMsg(subject=msg.subject, seq=msg.seq, data=msg.data, headers=headers, time=msg.time)


class MemoryLedger:
    """Streams and buckets in memory; ``connect()`` gives a client of them (any number, shared state).

    ``duplicate_window_s`` and the other stream settings are ``settings`` (default: as
    ``runledger up`` makes them)."""

    def __init__(self, settings: StreamSettings | None = None) -> None:
        self.settings = settings or StreamSettings()
        self.streams: dict[str, _Stream] = {}
        self.blobs: dict[str, MemoryObjectStore] = {}
        self._batches: dict[str, list[tuple[str, bytes, dict[str, str]]]] = {}
        self.inboxes: list[_CoreSubscription] = []
        self._ready = False

    async def connect(self) -> LedgerClient:
        """A client of this ledger: the streams are made on first use (``ensure_streams``, as a real
        connection makes them)."""
        nc = MemoryNats(self)
        js = MemoryJetStream(self, nc)
        if not self._ready:
            await ensure_streams(cast(Any, js), self.settings)
            self._ready = True
        return LedgerClient(nc=cast(Any, nc), js=cast(Any, js), url=MEMORY_URL)

    def stream(self, name: str) -> _Stream:
        found = self.streams.get(name)
        if found is None:
            raise NotFoundError(code=404, err_code=10059, description="stream not found")
        return found

    def stream_of(self, subject: str) -> _Stream:
        for stream in self.streams.values():
            if stream.holds(subject):
                return stream
        raise NoStreamResponseError

    def messages(self, pattern: str = ">", stream: str | None = None) -> list[RawStreamMsg]:
        """Every stored message on ``pattern``, in stream order (of ``stream``, default every stream
        whose subjects the pattern can match): what a test inspects."""
        out: list[RawStreamMsg] = []
        for name, s in self.streams.items():
            if stream is None or name == stream:
                out += [s.raw(m) for m in s.messages.values() if subject_matches(pattern, m.subject)]
        return out

    def deliver(self, msg: _CoreMsg) -> None:
        """Hand ``msg`` to every plain subscription on its subject."""
        for sub in self.inboxes:
            if subject_matches(sub.pattern, msg.subject):
                sub.queue.put_nowait(msg)

    def direct_get(self, stream_name: str, request: dict[str, Any]) -> list[tuple[dict[str, str], bytes]]:
        """The server's answers to a direct get by sequence (``seq``, ``next_by_subj``, ``batch``):
        each message with the stream's headers after its own, then a batch's end (204 EOB); 404
        when nothing is stored at or after the sequence. ``max_bytes`` is not kept."""
        stream = self.stream(stream_name)
        seq, pattern = int(request.get("seq") or 0), request.get("next_by_subj") or ">"
        batch = int(request.get("batch") or 0)
        found = [m for s, m in stream.messages.items() if s >= seq and subject_matches(pattern, m.subject)]
        if not found:
            return [({"Status": "404", "Description": "Message Not Found"}, b"")]
        out: list[tuple[dict[str, str], bytes]] = []
        pending, before = len(found), 0
        for msg in found[: max(batch, 1)]:
            pending -= 1
            answer = {str(k): str(v) for k, v in (stream.raw(msg).headers or {}).items()}
            if batch:
                answer |= {"Nats-Num-Pending": str(pending), "Nats-Last-Sequence": str(before)}
            out.append((answer, msg.data))
            before = msg.seq
        if batch:
            out.append(({"Status": "204", "Description": "EOB", "Nats-Num-Pending": str(pending),
                         "Nats-Last-Sequence": str(before)}, b""))  # fmt: skip
        return out

    def publish(self, subject: str, data: bytes, headers: dict[str, str] | None) -> PubAck:
        """Store one message as the server would, or raise what ``js.publish`` raises."""
        headers = dict(headers or {})
        stream = self.stream_of(subject)
        refused = stream.fence_error(subject, headers)
        if refused is not None:
            raise refused
        if (msg_id := headers.get("Nats-Msg-Id")) and (seq := stream.duplicate_of(msg_id)) is not None:
            return PubAck(stream=stream.config.name or "", seq=seq, duplicate=True)
        return PubAck(stream=stream.config.name or "", seq=stream.store(subject, data, headers))

    def batch(self, subject: str, data: bytes, headers: dict[str, str]) -> dict[str, Any] | None:
        """Stage one message of an atomic batch; at its commit, store the batch whole or refuse it
        whole, and return the server's answer (None until the commit)."""
        batch_id = headers[_BATCH_ID]
        staged = self._batches.setdefault(batch_id, [])
        staged.append((subject, data, headers))
        if headers.get(_BATCH_COMMIT) != "1":
            return None
        del self._batches[batch_id]
        stream = self.stream_of(subject)
        if not stream.config.allow_atomic:
            return _error_answer(_api_error(400, NO_ATOMIC, "atomic publish is disabled"))
        first_subject, _, first_headers = staged[0]
        refused = stream.fence_error(first_subject, first_headers)
        if refused is not None:
            return _error_answer(refused)
        if any(stream.duplicate_of(h.get("Nats-Msg-Id", "")) is not None for _, _, h in staged):
            return _error_answer(
                _api_error(400, DUPLICATE_IN_BATCH, "atomic publish batch contains duplicate message id")
            )
        seq = 0
        for s, d, h in staged:
            seq = stream.store(s, d, {k: v for k, v in h.items() if not k.startswith("Nats-Batch")})
        return {"stream": stream.config.name, "seq": seq, "batch": batch_id, "count": len(staged)}


def _error_answer(exc: APIError) -> dict[str, Any]:
    return {"error": {"code": exc.code, "err_code": exc.err_code, "description": exc.description}}


class _Version(NamedTuple):
    major: int
    minor: int
    patch: int


@dataclass
class _Reply:
    subject: str
    data: bytes
    headers: dict[str, str] | None = None


class _CoreMsg(NamedTuple):
    subject: str
    data: bytes
    headers: dict[str, str] | None
    reply: str = ""


class _CoreSubscription:
    """A plain subscription (an inbox): the messages published to its subject, in order, to its
    callback or to ``next_msg``."""

    def __init__(self, ledger: MemoryLedger, pattern: str, cb: Callable[[Any], Awaitable[None]] | None) -> None:
        self._ledger = ledger
        self.pattern = pattern
        self.queue: asyncio.Queue[_CoreMsg] = asyncio.Queue()
        self._task = asyncio.ensure_future(self._run(cb)) if cb is not None else None
        ledger.inboxes.append(self)

    async def _run(self, cb: Callable[[Any], Awaitable[None]]) -> None:
        while True:
            await cb(await self.queue.get())

    async def next_msg(self, timeout: float | None = 1.0) -> _CoreMsg:
        if not self.queue.empty():  # a server's answers are all in the socket already: no wait
            return self.queue.get_nowait()
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def unsubscribe(self) -> None:
        if self in self._ledger.inboxes:
            self._ledger.inboxes.remove(self)
        if self._task is not None:
            self._task.cancel()


class MemoryNats:
    """The connection calls the library makes on ``client.nc``: a window's atomic batch
    (runledger.log.window), batch direct gets answered on an inbox (runledger.log.directget),
    closing. Not connected to any URL, so the socket readers of runledger.log.fastread report
    themselves unavailable."""

    connected_url = None
    connected_server_version = _Version(2, 12, 0)
    options: dict[str, Any] = {}

    def __init__(self, ledger: MemoryLedger) -> None:
        self._ledger = ledger
        self.is_closed = False

    def new_inbox(self) -> str:
        return f"_INBOX.{uuid.uuid4().hex}"

    async def subscribe(self, subject: str, queue: str = "", cb: Any = None, **_: Any) -> _CoreSubscription:
        return _CoreSubscription(self._ledger, subject, cb)

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        if subject.startswith(_DIRECT_GET) and reply:
            for answer, data in self._ledger.direct_get(subject[len(_DIRECT_GET) :], json.loads(payload or b"{}")):
                self._ledger.deliver(_CoreMsg(reply, data, answer))
            return
        if headers and _BATCH_ID in headers:
            self._ledger.batch(subject, payload, dict(headers))
            return
        self._ledger.publish(subject, payload, headers)

    async def request(
        self, subject: str, payload: bytes = b"", timeout: float = 0.5, headers: dict[str, str] | None = None
    ) -> _Reply:
        if headers and _BATCH_ID in headers:
            answer = self._ledger.batch(subject, payload, dict(headers)) or {}
        else:
            try:
                ack = self._ledger.publish(subject, payload, headers)
                answer = {"stream": ack.stream, "seq": ack.seq, **({"duplicate": True} if ack.duplicate else {})}
            except APIError as exc:
                answer = _error_answer(exc)
        return _Reply(subject, json.dumps(answer).encode())

    async def drain(self) -> None:
        self.is_closed = True

    async def close(self) -> None:
        self.is_closed = True


class _Sequence(NamedTuple):
    stream: int
    consumer: int


class _Metadata(NamedTuple):
    sequence: _Sequence
    num_pending: int


@dataclass
class _Delivery:
    """A message as an ordered push consumer hands it to its callback."""

    subject: str
    data: bytes
    headers: dict[str, str] | None
    metadata: _Metadata


class _Subscription:
    """An ordered push consumer on one stream: every stored message on its filter from its start,
    then each new one, to its callback or to ``next_msg``."""

    def __init__(
        self, stream: _Stream, pattern: str, start_seq: int, cb: Callable[[Any], Awaitable[None]] | None
    ) -> None:
        self._stream = stream
        self._pattern = pattern
        self._cb = cb
        self._queue: asyncio.Queue[_Stored] = asyncio.Queue()
        self._delivered = 0
        self._task: asyncio.Task[None] | None = None
        for msg in list(stream.messages.values()):
            if msg.seq >= start_seq:
                self.offer(msg)
        stream.subscriptions.append(self)
        if cb is not None:
            self._task = asyncio.ensure_future(self._run(cb))

    def offer(self, msg: _Stored) -> None:
        if subject_matches(self._pattern, msg.subject):
            self._queue.put_nowait(msg)

    def _delivery(self, msg: _Stored) -> _Delivery:
        self._delivered += 1
        pending = self._stream.pending_after(msg.seq, self._pattern)
        meta = _Metadata(_Sequence(msg.seq, self._delivered), pending)
        return _Delivery(msg.subject, msg.data, dict(msg.headers) or None, meta)

    async def _run(self, cb: Callable[[Any], Awaitable[None]]) -> None:
        while True:
            await cb(self._delivery(await self._queue.get()))

    async def next_msg(self, timeout: float | None = 1.0) -> _Delivery:
        return self._delivery(await asyncio.wait_for(self._queue.get(), timeout))

    async def unsubscribe(self) -> None:
        if self in self._stream.subscriptions:
            self._stream.subscriptions.remove(self)
        if self._task is not None:
            self._task.cancel()


class MemoryJetStream:
    """The JetStream calls the library makes on ``client.js``, answered from a ``MemoryLedger``."""

    def __init__(self, ledger: MemoryLedger, nc: MemoryNats) -> None:
        self._ledger = ledger
        self._nc = nc

    # -- streams ----------------------------------------------------------------------------------

    async def add_stream(self, config: StreamConfig | None = None, **params: Any) -> StreamInfo:
        config = (config or StreamConfig()).evolve(**params) if params else config
        assert config is not None and config.name
        self._ledger.streams.setdefault(config.name, _Stream(config))
        return await self.stream_info(config.name)

    async def update_stream(self, config: StreamConfig | None = None, **params: Any) -> StreamInfo:
        config = (config or StreamConfig()).evolve(**params) if params else config
        assert config is not None and config.name
        self._ledger.stream(config.name).config = config
        return await self.stream_info(config.name)

    async def stream_info(self, name: str, subjects_filter: str | None = None) -> StreamInfo:
        stream = self._ledger.stream(name)
        msgs = list(stream.messages.values())
        subjects: dict[str, int] | None = None
        if subjects_filter is not None:
            subjects = {}
            for m in msgs:
                if subject_matches(subjects_filter, m.subject):
                    subjects[m.subject] = subjects.get(m.subject, 0) + 1
        state = StreamState(
            messages=len(msgs), bytes=sum(len(m.data) for m in msgs), first_seq=msgs[0].seq if msgs else 0,
            last_seq=stream.last_seq, consumer_count=len(stream.subscriptions), subjects=subjects,
        )  # fmt: skip
        return StreamInfo(config=stream.config, state=state)

    async def purge_stream(
        self, name: str, seq: int | None = None, subject: str | None = None, keep: int | None = None
    ) -> bool:
        stream = self._ledger.stream(name)
        if stream.config.deny_purge:
            raise _api_error(400, PURGE_DENIED, "stream purge is not permitted")
        for s in [s for s, m in stream.messages.items() if subject is None or subject_matches(subject, m.subject)]:
            del stream.messages[s]
        return True

    async def delete_msg(self, name: str, seq: int) -> bool:
        stream = self._ledger.stream(name)
        if stream.config.deny_delete:
            raise _api_error(400, DELETE_DENIED, "message delete not permitted")
        if stream.messages.pop(seq, None) is None:
            raise NotFoundError(code=404, err_code=10037, description="no message found")
        return True

    # -- messages ---------------------------------------------------------------------------------

    async def publish(
        self, subject: str, payload: bytes = b"", timeout: float | None = None, stream: str | None = None,
        headers: dict[str, Any] | None = None, msg_ttl: float | None = None,
    ) -> PubAck:  # fmt: skip
        await asyncio.sleep(0)  # a publish is a round trip: other tasks run meanwhile, as they would
        return self._ledger.publish(subject, payload, headers)

    async def get_last_msg(self, stream_name: str, subject: str, direct: bool | None = False) -> RawStreamMsg:
        stream = self._ledger.stream(stream_name)
        msg = stream.last_on(subject)
        if msg is None:
            raise NotFoundError(code=404, err_code=10037, description="no message found")
        return stream.raw(msg)

    async def get_msg(
        self, stream_name: str, seq: int | None = None, subject: str | None = None, direct: bool | None = False,
        next: bool | None = False,
    ) -> RawStreamMsg:  # fmt: skip
        stream = self._ledger.stream(stream_name)
        if seq is None and subject is not None:
            return await self.get_last_msg(stream_name, subject)
        for s, msg in stream.messages.items():
            if (s == seq or (next and seq is not None and s > seq)) and (
                subject is None or subject_matches(subject, msg.subject)
            ):
                return stream.raw(msg)
        raise NotFoundError(code=404, err_code=10037, description="no message found")

    async def subscribe(
        self, subject: str, queue: str | None = None, cb: Callable[[Any], Awaitable[None]] | None = None,
        durable: str | None = None, stream: str | None = None, config: ConsumerConfig | None = None,
        **_: Any,
    ) -> _Subscription:  # fmt: skip
        """An ordered push consumer (what an agent's reads use where they cannot speak the protocol)."""
        target = self._ledger.stream(stream) if stream else self._ledger.stream_of(subject)
        start = (config.opt_start_seq if config is not None else None) or 1
        return _Subscription(target, subject, start, cb)

    async def add_consumer(self, stream: str, config: ConsumerConfig | None = None, **params: Any) -> ConsumerInfo:
        """A consumer's name and settings, kept (nothing is delivered through it here)."""
        config = (config or ConsumerConfig()).evolve(**params) if params else config
        assert config is not None
        name = config.name or config.durable_name or uuid.uuid4().hex
        self._ledger.stream(stream).consumers[name] = config
        return await self.consumer_info(stream, name)

    async def consumer_info(self, stream: str, consumer: str, timeout: float | None = None) -> ConsumerInfo:
        config = self._ledger.stream(stream).consumers.get(consumer)
        if config is None:
            raise NotFoundError(code=404, err_code=10014, description="consumer not found")
        return ConsumerInfo(name=consumer, stream_name=stream, config=config, created=dt.datetime.now(dt.UTC))

    # -- buckets ----------------------------------------------------------------------------------

    async def key_value(self, bucket: str) -> KeyValue:
        """nats-py's own KeyValue over these calls: revisions, update(last=) and purge as on a server."""
        name = f"KV_{bucket}"
        if name not in self._ledger.streams:
            raise BucketNotFoundError
        return KeyValue(name=bucket, stream=name, pre=f"$KV.{bucket}.", js=cast(Any, self), direct=True)

    async def create_object_store(
        self, bucket: str | None = None, config: Any = None, **params: Any
    ) -> MemoryObjectStore:
        name = bucket or config.bucket
        await self.add_stream(StreamConfig(name=f"OBJ_{name}", subjects=[f"$O.{name}.C.>", f"$O.{name}.M.>"]))
        return self._ledger.blobs.setdefault(name, MemoryObjectStore(name))

    async def object_store(self, bucket: str) -> MemoryObjectStore:
        if bucket not in self._ledger.blobs:
            raise BucketNotFoundError
        return self._ledger.blobs[bucket]


class MemoryObjectStore:
    """The object store calls runledger.protect.blobs makes: put, get_info, get, delete."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.objects: dict[str, bytes] = {}
        self.deleted: set[str] = set()

    async def put(self, name: str, data: bytes, **_: Any) -> ObjectInfo:
        self.objects[name] = bytes(data)
        self.deleted.discard(name)
        return self._info(name)

    def _info(self, name: str) -> ObjectInfo:
        return ObjectInfo(name=name, bucket=self.bucket, nuid=uuid.uuid4().hex, size=len(self.objects.get(name, b"")),
                          deleted=name in self.deleted)  # fmt: skip

    async def get_info(self, name: str, show_deleted: bool | None = False) -> ObjectInfo:
        if name in self.deleted and not show_deleted:
            raise ObjectDeletedError
        if name not in self.objects and name not in self.deleted:
            raise ObjectNotFoundError
        info = self._info(name)
        if info.deleted:
            info.nuid = ""  # its chunks were purged with it
        return info

    async def get(self, name: str, writeinto: IO[bytes] | None = None, show_deleted: bool | None = False) -> Any:
        if name not in self.objects:
            raise ObjectNotFoundError
        if writeinto is not None:
            writeinto.write(self.objects[name])
        return self.objects[name]

    async def delete(self, name: str) -> ObjectInfo:
        if name not in self.objects:
            raise ObjectNotFoundError
        del self.objects[name]
        self.deleted.add(name)
        return self._info(name)


async def memory_client(ledger: MemoryLedger | None = None) -> LedgerClient:
    """A client of ``ledger`` (default: a new, empty one)."""
    return await (ledger or MemoryLedger()).connect()
