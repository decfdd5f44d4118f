"""Output-commit durability: a run's events written behind it, in a bounded window.

``WindowedWriter`` is the run's writer under ``AgentSpec(durability="output")``. ``append``
builds the next event of the chain exactly as ``SubjectWriter`` does (same seq, prev_hash,
msg id, transform) and returns at once; the event waits in the window. The window is flushed
in the background when half of it is filled or its oldest event is ``max_ms`` old, one flush
at a time (the next flush waits for the previous one's ack, so every flush is fenced on the
stream sequence the previous one got). ``commit`` flushes and waits until every appended
event is acknowledged: the run calls it before anything leaves the process (an effect's
claim, an approval request, a child run, the run's outcome, ``run.commit()``). An ``append``
that would put more than ``max_events`` events out unacknowledged waits for the flush in
flight, so a crash loses at most ``max_events`` events, all of them internal steps.

A flush is fenced as strongly as a step-mode append: the whole window is one JetStream atomic
batch whose first message carries the run's fence (``Nats-Expected-Last-Subject-Sequence``
with ``-Subject`` over the run's wildcard): a stale fence rejects the whole batch and nothing
of it is stored. A window of fewer than ``ATOMIC_MIN`` events is published as that many fenced
publishes in order (a batch commit costs several single publishes, however small); a crash
in between leaves a prefix of the window, which is still a gap-free chain. A stream without
``allow_atomic`` (an older server, or an agent that may not update the stream) gets the
same per-event fenced publishes for every window.

After a rejected or unacknowledged flush the writer is failed: the error (FencedError when
another writer owns the run, PublishError when the server stayed unreachable) is raised by the
flush's waiter and by every later ``append`` and ``commit``. Events appended after the failed
window are never published.

Rejected approaches: ``publish_async`` with a fence on every message (a message's fence is the
stream sequence of the one before, unknown until its ack; and its futures never resolve when
the server rejects a message, nats.py #985); fencing only a window's first message and
publishing the rest unfenced (a zombie's first message is rejected but the rest, already on
the wire, would be stored after the new owner's events); one batch per step (a batch commit
costs more than the fenced publish it would replace).

A retried batch is not deduplicated by the server: a batch holding a msg id the stream has
already stored is refused whole (10201, "duplicate message id"), and a stale fence with 10071.
Either refusal during a retry may mean the earlier attempt was stored and only its ack was
lost: the run's last message is read, and if it is the window's last event (msg id and bytes),
the window is stored (an atomic batch is all or nothing).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import APIError

from runledger.errors import ConfigurationError, FencedError, PublishError
from runledger.log.permissions import refused_at_once
from runledger.log.publish import (
    WRONG_LAST_SEQUENCE,
    PayloadTransform,
    RetryPolicy,
    SubjectWriter,
    is_transient,
    last_subject_seq,
    publish_fenced,
    stored_as,
)
from runledger.log.subjects import FENCE_HEADER, FENCE_SUBJECT_HEADER, fence_filter, fence_for
from runledger.record.canonical import LEGACY_CHAIN_FORMAT
from runledger.record.events import GENESIS, Event, Payload

logger = logging.getLogger(__name__)

# A window this small is published as fenced single publishes: a batch commit cost ~2.8 ms
# however small against 0.35-0.45 ms a single fenced publish on a quiet machine (the two cross
# near 7 events); on a busy one they crossed near 4 (a window of 8: batch/singles 0.70x, of 32: 0.15x).
ATOMIC_MIN = 8
# JetStream's limit on the messages of one atomic batch.
MAX_WINDOW = 1000
# The server's answers to an atomic batch that are not a transient failure.
DUPLICATE_IN_BATCH = 10201  # a msg id the stream already holds: the whole batch is refused
# "atomic publish is disabled": the stream lacks allow_atomic.
_NO_ATOMIC = frozenset({10174})

BATCH_ID_HEADER = "Nats-Batch-Id"
BATCH_SEQUENCE_HEADER = "Nats-Batch-Sequence"
BATCH_COMMIT_HEADER = "Nats-Batch-Commit"


@dataclass(frozen=True)
class Window:
    """The bound on what output durability may lose: at most ``max_events`` events
    unacknowledged at any time, and none older than about ``max_ms`` milliseconds."""

    max_events: int = 64
    max_ms: float = 50.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_events <= MAX_WINDOW:
            raise ConfigurationError(f"a window holds 1 to {MAX_WINDOW} events, not {self.max_events}")
        if not self.max_ms > 0:
            raise ConfigurationError(f"a window's max_ms must be positive, not {self.max_ms}")

    @property
    def flush_at(self) -> int:
        """Pending events that start a flush: half the window, so the other half keeps filling
        while the first is in flight."""
        return max(1, self.max_events // 2)


class _Pending(NamedTuple):
    """An event in the window: its msg id and bytes (a tuple: made at every step, a frozen
    dataclass cost ~1 us more to build)."""

    msg_id: str
    data: bytes


class WindowedWriter(SubjectWriter):
    """A run's single writer that acknowledges events in windows (output durability).

    Same chain, msg ids and fence as SubjectWriter; ``append`` returns before the server
    acknowledged the event and ``commit`` waits for every event appended so far. Not safe for
    concurrent use (a run serializes its appends); ``commit`` may be awaited from several
    tasks. ``last_stream_seq`` is the stream sequence of the last acknowledged event."""

    def __init__(
        self,
        nc: NATS,
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
        window: Window = Window(),
    ) -> None:
        super().__init__(
            js, subject, run_id=run_id, agent=agent, msg_id_prefix=msg_id_prefix, next_seq=next_seq,
            prev_hash=prev_hash, last_stream_seq=last_stream_seq, policy=policy, transform=transform,
            chain_format=chain_format,
        )  # fmt: skip
        self.nc = nc
        self.window = window
        # Atomic batches came with nats-server 2.12 (an older one would store a batch's messages
        # one by one, the later ones unfenced); a stream without allow_atomic refuses them (10174).
        version = nc.connected_server_version
        self.atomic = (version.major, version.minor) >= (2, 12)
        self._pending: list[_Pending] = []
        self._oldest = 0.0  # monotonic time of the oldest pending event
        self._flight: asyncio.Task[None] | None = None
        self._in_flight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._failure: BaseException | None = None
        # Counters for operators and the benchmark: windows flushed, events acknowledged, flushes as a batch.
        self.flushes = 0
        self.acknowledged = 0
        self.batches = 0

    @property
    def unacknowledged(self) -> int:
        """Events appended but not acknowledged yet (what a crash now would lose)."""
        return len(self._pending) + self._in_flight

    async def append(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> Event:
        """Add the next event to the window and return it (not acknowledged yet).

        Waits only when the window is full (``max_events`` unacknowledged). Raises the failure
        of an earlier flush (FencedError, PublishError): nothing more is written after it."""
        self._raise_if_failed()
        while self.unacknowledged >= self.window.max_events:
            await self._drain_once()
        event, data = await self._next_event(body, encoded)
        if not self._pending:
            self._oldest = time.monotonic()
        self._pending.append(_Pending(f"{self.msg_id_prefix}:{self.next_seq}", data))
        self.next_seq += 1
        self.prev_hash = event.hash
        self._maybe_flush()
        return event

    async def commit(self) -> None:
        """Flush the window and return once every event appended so far is acknowledged.

        Raises FencedError when another writer owns the run (nothing of the window is stored),
        PublishError when the server stayed unreachable past the policy's deadline."""
        self._raise_if_failed()
        while self.unacknowledged:
            await self._drain_once()

    def flush_soon(self) -> None:
        """Start flushing the window now, unless a flush is in flight (``commit`` waits for both):
        its round trips then overlap what the caller does before it commits (an effect builds and
        seals its intent)."""
        self._start_flush()

    async def _drain_once(self) -> None:
        """Start a flush if none is in flight, then wait for the one in flight."""
        if self._flight is None:
            self._start_flush()
        flight = self._flight
        if flight is None:
            self._raise_if_failed()
            return
        # Shielded: a caller cancelled while it waits must not cancel the flush others rely on.
        await asyncio.wait([asyncio.shield(flight)])
        self._landed(flight)
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _maybe_flush(self) -> None:
        """Start a flush when the window asks for one, else make sure a timer will."""
        if self._flight is not None or not self._pending or self._failure is not None:
            return
        age_ms = (time.monotonic() - self._oldest) * 1000
        if len(self._pending) >= self.window.flush_at or age_ms >= self.window.max_ms:
            self._start_flush()
        elif self._timer is None:
            delay = (self.window.max_ms - age_ms) / 1000
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._maybe_flush()

    def _start_flush(self) -> None:
        if self._flight is not None or not self._pending or self._failure is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        window, self._pending = self._pending, []
        self._in_flight = len(window)
        flight = asyncio.ensure_future(self._flush(window))
        flight.add_done_callback(self._landed)
        self._flight = flight

    def _landed(self, flight: asyncio.Task[None]) -> None:
        """A flush ended (called by its waiter and by its done callback: idempotent)."""
        if self._flight is not flight:
            return
        self._flight = None
        self._in_flight = 0
        if flight.cancelled():
            self._failure = self._failure or PublishError(self.subject, "-", "the flush of its window was cancelled")
        elif (exc := flight.exception()) is not None:
            self._failure = self._failure or exc
        if self._failure is not None:
            logger.warning("run %s: output window not stored (%s); this writer stops", self.run_id, self._failure)
            return
        self._maybe_flush()

    async def _flush(self, window: list[_Pending]) -> None:
        if self.atomic and len(window) >= ATOMIC_MIN:
            seq = await self._publish_batch(window)
            if seq is not None:
                self.last_stream_seq = seq
                self.batches += 1
                self._done(window)
                return
            logger.info("the stream takes no atomic batches: run %s publishes its windows event by event", self.run_id)
            self.atomic = False
        for pending in window:
            self.last_stream_seq = await publish_fenced(
                self.js, self.subject, pending.data, pending.msg_id, self.last_stream_seq, self.policy
            )
            self._in_flight -= 1
            self.acknowledged += 1
        self.flushes += 1

    def _done(self, window: list[_Pending]) -> None:
        self._in_flight = 0
        self.acknowledged += len(window)
        self.flushes += 1

    async def _publish_batch(self, window: list[_Pending]) -> int | None:
        """Store ``window`` as one atomic batch fenced on ``last_stream_seq``; the stream
        sequence of its last event, or None when the stream takes no atomic batches (nothing was
        stored). Retries transient failures with a new batch id until the policy's deadline."""
        policy = self.policy
        deadline = time.monotonic() + policy.deadline_s
        backoff = policy.backoff_s
        attempt = 0
        last = window[-1]
        while True:
            attempt += 1
            try:
                # A denial (these credentials may not write the run) fails at once (runledger.log.permissions).
                return await refused_at_once(self.nc, self.subject, self._send_batch(window))
            except APIError as exc:
                code = getattr(exc, "err_code", None)
                if code in _NO_ATOMIC:
                    return None
                if code in (WRONG_LAST_SEQUENCE, DUPLICATE_IN_BATCH):
                    # Ours already, if an earlier attempt was stored and only its ack was lost.
                    if attempt > 1 and (seq := await stored_as(self.js, self.subject, last.msg_id, last.data, 0)):
                        return seq
                    actual = await last_subject_seq(self.js, fence_filter(self.subject) or self.subject)
                    raise FencedError(self.subject, window[0].msg_id, self.last_stream_seq, actual) from exc
                if not is_transient(exc):
                    raise PublishError(self.subject, window[0].msg_id, f"server rejected its window: {exc}") from exc
                failure: BaseException = exc
            except Exception as exc:
                if not is_transient(exc):
                    raise
                failure = exc
            if time.monotonic() + backoff > deadline:
                raise PublishError(
                    self.subject, window[0].msg_id, f"window of {len(window)} events not acknowledged after "
                    f"{attempt} attempts ({type(failure).__name__})",
                ) from failure  # fmt: skip
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, policy.max_backoff_s)

    async def _send_batch(self, window: list[_Pending]) -> int:
        batch_id = uuid.uuid4().hex
        fence = fence_for(self.subject, self.last_stream_seq)  # a run's first window claims its id
        count = len(window)
        for i, pending in enumerate(window[:-1], 1):
            headers = {BATCH_ID_HEADER: batch_id, BATCH_SEQUENCE_HEADER: str(i), "Nats-Msg-Id": pending.msg_id}
            if i == 1:
                headers.update(self._fence_headers(fence))
            await self.nc.publish(self.subject, pending.data, headers=headers)
        last = window[-1]
        headers = {
            BATCH_ID_HEADER: batch_id,
            BATCH_SEQUENCE_HEADER: str(count),
            BATCH_COMMIT_HEADER: "1",
            "Nats-Msg-Id": last.msg_id,
        }
        if count == 1:
            headers.update(self._fence_headers(fence))
        reply = await self.nc.request(self.subject, last.data, timeout=self.policy.ack_timeout_s, headers=headers)
        answer = json.loads(reply.data or b"{}")
        if "error" in answer:
            APIError.from_error(answer["error"])  # raises the typed error
        if answer.get("count") != count or not answer.get("seq"):
            raise PublishError(self.subject, last.msg_id, f"unexpected answer to an atomic batch: {answer}")
        return int(answer["seq"])

    def _fence_headers(self, fence: str | None) -> dict[str, str]:
        headers = {FENCE_HEADER: str(self.last_stream_seq)}
        if fence is not None:
            headers[FENCE_SUBJECT_HEADER] = fence
        return headers
