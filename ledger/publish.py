"""Exactly-once, single-writer appends to one subject.

Every publish carries ``Nats-Msg-Id`` (a retry inside the duplicate window is a
no-op) and ``Nats-Expected-Last-Subject-Sequence`` (the server rejects a writer
whose view of the subject is stale: the fencing that makes a zombie stop).

Rejected approaches: ``publish_async`` (its future never resolves when the server
rejects the message, nats.py #985, and hangs across a restart) and trusting
``duplicate=True`` blindly (on a replicated stream dedup is checked before the
fence, so a zombie re-using a msg id would be told "duplicate" for someone else's
event: the stored bytes are compared instead). A 10071 during a retry may be our
own earlier publish whose ack was lost (the fence is checked before dedup on a
single node): the subject's last message is read and its msg id compared.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from ledger.errors import FencedError, PublishError
from ledger.events import GENESIS, Event, Payload, make_event
from ledger.streams import LEDGER_STREAM

WRONG_LAST_SEQUENCE = 10071
# What a payload becomes before it is recorded (redaction, sealing, blobs: ledger.capture).
PayloadTransform = Callable[[Payload], Awaitable[Payload]]
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
    """Append ``data`` to ``subject`` iff the subject's last stream sequence is ``expected_last_seq``.

    Returns the stream sequence of the stored message, whether this call or an
    earlier attempt with the same msg id stored it. Raises FencedError when another
    writer appended first, PublishError when the server stays unreachable past the
    policy's deadline or rejects the message for another reason.
    """
    headers = {"Nats-Msg-Id": msg_id, "Nats-Expected-Last-Subject-Sequence": str(expected_last_seq)}
    deadline = time.monotonic() + policy.deadline_s
    backoff = policy.backoff_s
    attempt = 0
    while True:
        attempt += 1
        try:
            ack = await js.publish(subject, data, timeout=policy.ack_timeout_s, headers=headers)
        except APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise PublishError(subject, msg_id, f"server rejected it: {exc.description}") from exc
            seq = await _stored_as(js, subject, msg_id, data)
            if seq is not None:
                return seq
            actual = await last_subject_seq(js, subject)
            raise FencedError(subject, msg_id, expected_last_seq, actual) from exc
        except _RETRYABLE as exc:
            if time.monotonic() + backoff > deadline:
                raise PublishError(
                    subject, msg_id, f"no acknowledgement after {attempt} attempts ({type(exc).__name__})"
                ) from exc
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, policy.max_backoff_s)
            continue
        if ack.duplicate and not await _same_bytes(js, ack.seq, data, subject):
            raise FencedError(subject, msg_id, expected_last_seq, ack.seq)
        return int(ack.seq)


async def last_subject_seq(js: JetStreamContext, subject: str) -> int:
    """Stream sequence of the last message on ``subject`` (0 when empty)."""
    try:
        msg = await js.get_last_msg(LEDGER_STREAM, subject, direct=True)
    except NotFoundError:
        return 0
    return int(msg.seq or 0)


async def _stored_as(js: JetStreamContext, subject: str, msg_id: str, data: bytes) -> int | None:
    """The stream sequence under which our message was stored by an earlier attempt, if it was."""
    for _ in range(3):
        try:
            last = await js.get_last_msg(LEDGER_STREAM, subject, direct=True)
        except NotFoundError:
            return None
        except _RETRYABLE:
            await asyncio.sleep(0.2)
            continue
        headers = last.headers or {}
        if headers.get("Nats-Msg-Id") == msg_id and last.data == data:
            return int(last.seq or 0)
        return None
    return None


async def _same_bytes(js: JetStreamContext, seq: int, data: bytes, subject: str) -> bool:
    # The subject's last message first: a direct get by subject is what an agent role may do
    # (ledger.roles); a get by sequence could read any subject, so it is the fallback.
    try:
        last = await js.get_last_msg(LEDGER_STREAM, subject, direct=True)
    except NotFoundError:
        return False
    if last.seq == seq:
        return last.data == data
    msg = await js.get_msg(LEDGER_STREAM, seq=seq, direct=True)
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

    async def append(self, body: Payload) -> Event:
        """Publish the next event and return it once the server acknowledged it.

        With a ``transform``, what is published (and returned) is the transformed payload:
        every event of the subject passes through it, whoever builds the payload."""
        if self.transform is not None:
            body = await self.transform(body)
        event, data = make_event(
            body, run_id=self.run_id, agent=self.agent, seq=self.next_seq, prev_hash=self.prev_hash
        )
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
