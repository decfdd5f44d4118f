"""Exactly-once, single-writer appends to one subject.

Every publish carries ``Nats-Msg-Id`` (a retry inside the duplicate window is a
no-op) and ``Nats-Expected-Last-Subject-Sequence`` (the server rejects a writer
whose view of the subject is stale: the fencing that makes a zombie stop). On a run's or a
key's subject the fence covers every writer's subject of it
(``Nats-Expected-Last-Subject-Sequence-Subject``, runledger.log.subjects); a run's first message on
every agent's subjects of its id (the claim of the run id, ``fence_for``).

The request itself goes through runledger.log.fastpublish (one muxed ack inbox per connection,
acks handed over in nats-py's read loop, a plain ack read by one regular expression): what
``js.publish`` returns and raises, at a fraction of its CPU.

Rejected approaches: ``publish_async`` (its future never resolves when the server
rejects the message, nats.py #985, and hangs across a restart) and trusting
``duplicate=True`` blindly (on a replicated stream dedup is checked before the
fence, so a zombie re-using a msg id would be told "duplicate" for someone else's
event: the stored bytes are compared instead). A 10071 during a retry may be our
own earlier publish whose ack was lost (the fence is checked before dedup on a
single node): the subject's last message is read and its msg id compared.

On a cluster (replicated stream) a publish can also meet a leader election: 503 / no
responders / "JetStream system temporarily unavailable" for a few seconds. Those are
retried with the same msg id and fence until the policy's deadline, so a step is stored
exactly once, and a run never goes past a step that was not acknowledged. So is 10164, the
leader's "wrong last sequence" without a number while another fenced publish of the same run or
key is in process: asked again once that one is applied, the server says 10071 (FencedError,
unless the last message is our own) or stores ours. Direct gets may
be answered by a replica that lags the leader: a read that must see a given sequence asks
again until it does.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

import nats
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from runledger.errors import FencedError, PublishError
from runledger.log.fastpublish import inbox_for
from runledger.log.permissions import refused_at_once
from runledger.log.subjects import FENCE_HEADER, FENCE_SUBJECT_HEADER, LEDGER_STREAM, fence_for
from runledger.record.canonical import CONTENT_FORMAT, LEGACY_CHAIN_FORMAT
from runledger.record.events import GENESIS, Event, Payload, RunStarted, make_event

T = TypeVar("T")
WRONG_LAST_SEQUENCE = 10071
# A replicated stream's leader cannot check a fence yet: a fenced publish on the same run or key
# is in process (proposed, not applied). "wrong last sequence" with no number; not a verdict.
FENCE_IN_PROCESS = 10164
# JetStream errors of a cluster between leaders (temporarily unavailable, not the leader, stream
# offline, no quorum), and answers that are not verdicts yet (our own msg id in process, a fence in
# process). The publish is retried (same msg id, same fence): the server's next answer decides.
CLUSTER_TRANSIENT = frozenset({10008, 10009, 10118, 10158, FENCE_IN_PROCESS})


class PayloadTransform(Protocol):
    """What a payload becomes before it is recorded (redaction, sealing, blobs:
    runledger.protect.capture's ``PayloadProtector.protect``). ``encoded``: the canonical JSON of
    some of its content fields, by name, in the chain's format, when the caller has it already."""

    def __call__(self, body: Payload, encoded: Mapping[str, bytes] | None = None, /) -> Awaitable[Payload]: ...


_RETRYABLE = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.NoStreamResponseError,
)

# A direct get may be served by a replica that lags the leader by a few milliseconds.
_REPLICA_READS = 40
_REPLICA_WAIT_S = 0.05


@dataclass(frozen=True)
class RetryPolicy:
    """How long a publish keeps trying before it gives up with PublishError."""

    deadline_s: float = 30.0
    ack_timeout_s: float = 2.0
    backoff_s: float = 0.1
    max_backoff_s: float = 1.0


async def publish_fenced(
    js: JetStreamContext,
    subject: str,
    data: bytes,
    msg_id: str,
    expected_last_seq: int,
    policy: RetryPolicy = RetryPolicy(),
) -> int:
    """Append ``data`` to ``subject`` iff the last stream sequence of the run or key it belongs to
    (``fence_for``: every writer's subject of it, and for a run's first message every agent's subject
    of its id; else ``subject`` alone) is ``expected_last_seq``.

    Returns the stream sequence of the stored message, whether this call or an
    earlier attempt with the same msg id stored it. Raises FencedError when another
    writer appended first, PublishError when the server stays unreachable past the
    policy's deadline or rejects the message for another reason.
    """
    headers = {"Nats-Msg-Id": msg_id, FENCE_HEADER: str(expected_last_seq)}
    fence = fence_for(subject, expected_last_seq)
    if fence is not None:
        headers[FENCE_SUBJECT_HEADER] = fence
    deadline = time.monotonic() + policy.deadline_s
    backoff = policy.backoff_s
    attempt = 0
    # The lean request for a plain JetStreamContext (runledger.log.fastpublish): same acks, same errors.
    acks = inbox_for(js)
    send = js.publish if acks is None else acks.publish
    while True:
        attempt += 1
        try:
            ack = await refused_at_once(js, subject, send(subject, data, timeout=policy.ack_timeout_s, headers=headers))
        except APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                actual = _actual_last_seq(exc)
                # Our own earlier attempt is the last message of our own subject, if it was stored
                # (another writer may have appended to the run since: the fence covers every writer).
                seq = await stored_as(js, subject, msg_id, data, actual if fence is None else 0)
                if seq is not None:
                    return seq
                actual = actual or await last_subject_seq(js, subject)
                raise FencedError(subject, msg_id, expected_last_seq, actual) from exc
            if not _transient(exc):
                raise PublishError(subject, msg_id, f"server rejected it: {exc.description}") from exc
            failure: BaseException = exc
        except _RETRYABLE as exc:
            failure = exc
        else:
            if ack.duplicate and not await _same_bytes(js, ack.seq, data, subject):
                raise FencedError(subject, msg_id, expected_last_seq, ack.seq)
            return int(ack.seq)
        if time.monotonic() + backoff > deadline:
            raise PublishError(
                subject, msg_id, f"no acknowledgement after {attempt} attempts ({_describe(failure)})"
            ) from failure
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, policy.max_backoff_s)


def _transient(exc: APIError) -> bool:
    if isinstance(exc, NotFoundError):
        return False  # an answer (and nats-py's KV errors leave code and err_code unset)
    code, err_code = getattr(exc, "code", None), getattr(exc, "err_code", None)
    return isinstance(exc, ServiceUnavailableError) or int(code or 0) >= 500 or err_code in CLUSTER_TRANSIENT


def is_transient(exc: BaseException) -> bool:
    """A failure that waiting can cure: no server, no answer, or a cluster between leaders."""
    return isinstance(exc, _RETRYABLE) or (isinstance(exc, APIError) and _transient(exc))


async def retrying(
    call: Callable[[], Awaitable[T]], deadline_s: float = RetryPolicy.deadline_s, *, also: frozenset[int] = frozenset()
) -> T:
    """``await call()``, again after transient failures (is_transient, or a JetStream error code
    in ``also``) until ``deadline_s`` passed.

    For idempotent requests other than a run's appends (stream setup, KV reads and
    compare-and-set writes)."""
    deadline = time.monotonic() + deadline_s
    backoff = 0.1
    while True:
        try:
            return await call()
        except Exception as exc:
            waitable = is_transient(exc) or (isinstance(exc, APIError) and getattr(exc, "err_code", None) in also)
            if not waitable or time.monotonic() + backoff > deadline:
                raise
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 1.0)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, APIError):
        return f"{type(exc).__name__} {exc.err_code or exc.code}: {exc.description}"
    return type(exc).__name__


def _actual_last_seq(exc: APIError) -> int:
    """The subject's last sequence on the leader, from "wrong last sequence: N" (0 if absent)."""
    match = re.search(r"wrong last sequence: (\d+)", exc.description or "")
    return int(match.group(1)) if match else 0


async def last_subject_seq(js: JetStreamContext, subject: str) -> int:
    """Stream sequence of the last message on ``subject`` (0 when empty)."""
    try:
        msg = await js.get_last_msg(LEDGER_STREAM, subject, direct=True)
    except NotFoundError:
        return 0
    return int(msg.seq or 0)


async def _last_msg(js: JetStreamContext, subject: str, at_least: int) -> RawStreamMsg | None:
    """The subject's last message once a replica has it at stream sequence ``at_least`` or later.

    A direct get may be answered by a replica that has not caught up with the leader yet: it
    is asked again rather than believed. None when the subject is empty and ``at_least`` is 0,
    or when no answer caught up within the reads."""
    for _ in range(_REPLICA_READS):
        try:
            last = await js.get_last_msg(LEDGER_STREAM, subject, direct=True)
        except NotFoundError:
            if at_least == 0:
                return None
        except _RETRYABLE:
            pass
        else:
            if (last.seq or 0) >= at_least:
                return last
        await asyncio.sleep(_REPLICA_WAIT_S)
    return None


async def stored_as(js: JetStreamContext, subject: str, msg_id: str, data: bytes, at_least: int) -> int | None:
    """The stream sequence under which our message was stored by an earlier attempt, if it was.

    ``at_least`` is the subject's last sequence as the leader reported it."""
    last = await _last_msg(js, subject, at_least)
    if last is not None and (last.headers or {}).get("Nats-Msg-Id") == msg_id and last.data == data:
        return int(last.seq or 0)
    return None


async def _same_bytes(js: JetStreamContext, seq: int, data: bytes, subject: str) -> bool:
    # The subject's last message first: a direct get by subject is what an agent role may do
    # (runledger.protect.roles); a get by sequence could read any subject, so it is the fallback.
    last = await _last_msg(js, subject, seq)
    if last is None:
        return False
    if last.seq == seq:
        return last.data == data
    try:
        msg = await js.get_msg(LEDGER_STREAM, seq=seq, direct=True)
    except NotFoundError:
        return False
    return msg.data == data


class SubjectWriter:
    """The single writer of one hash-chained subject (a run, or one idempotency key).

    Holds the chain position (next seq, last hash) and the fencing position (the
    subject's last stream sequence). Not safe for concurrent use: a run's steps are
    sequential by design.
    """

    def __init__(
        self,
        js: JetStreamContext,
        subject: str,
        *,
        run_id: str,
        agent: str,
        msg_id_prefix: str,
        next_seq: int = 0,
        prev_hash: str = GENESIS,
        last_stream_seq: int = 0,
        policy: RetryPolicy = RetryPolicy(),
        transform: PayloadTransform | None = None,
        chain_format: int = LEGACY_CHAIN_FORMAT,
    ) -> None:
        self.js = js
        self.subject = subject
        self.run_id = run_id
        self.agent = agent
        self.msg_id_prefix = msg_id_prefix
        self.next_seq = next_seq
        self.prev_hash = prev_hash
        self.last_stream_seq = last_stream_seq
        self.policy = policy
        self.transform = transform
        self.chain_format = chain_format  # of the run (its run.started): runledger.record.canonical

    async def append(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> Event:
        """Publish the next event and return it once the server acknowledged it.

        With a ``transform``, what is published (and returned) is the transformed payload:
        every event of the subject passes through it, whoever builds the payload. ``encoded``:
        the canonical JSON of content fields the caller has already (for the transform)."""
        event, data = await self._next_event(body, encoded)
        self.last_stream_seq = await publish_fenced(
            self.js,
            self.subject,
            data,
            f"{self.msg_id_prefix}:{self.next_seq}",
            self.last_stream_seq,
            self.policy,
        )
        self.next_seq += 1
        self.prev_hash = event.hash
        return event

    async def commit(self) -> None:
        """Return once every appended event is acknowledged: at once here (``append`` waits for
        each ack); a writer that does not (runledger.log.window) waits for its window."""

    def flush_soon(self) -> None:
        """Start acknowledging every appended event now, in the background (``commit`` waits for
        it): nothing to do here; a writer with a window (runledger.log.window) starts its flush."""

    async def _next_event(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> tuple[Event, bytes]:
        """The next event of the chain for ``body`` (transformed) and its bytes; the position is
        left as it was (the caller advances it once the event is its to keep)."""
        if isinstance(body, RunStarted) and body.chain_format is not None:
            self.chain_format = body.chain_format  # a run's first event says the format of its chain
        if self.transform is not None:
            # The content the transform seals or stores by reference is serialized in the chain's
            # format too: what a replay opens must equal what the agent received live.
            token = CONTENT_FORMAT.set(self.chain_format)
            try:
                body = await self.transform(body, encoded)
            finally:
                CONTENT_FORMAT.reset(token)
        event, data = make_event(
            body,
            run_id=self.run_id,
            agent=self.agent,
            seq=self.next_seq,
            prev_hash=self.prev_hash,
            chain_format=self.chain_format,
        )
        return event, data
