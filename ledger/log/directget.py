"""Reading a stream by batch direct gets through nats-py: what ``runledger.log.fastread`` reads on a
socket of its own, where that socket cannot go (TLS, credentials files, nkeys) and on the
in-memory ledger (runledger.log.memory).

The same request (``$JS.API.DIRECT.GET.<stream>`` with ``seq``, ``batch`` and ``next_by_subj``,
answered on an inbox of the connection) and the same checks: each answer names the stream
sequence of the one before it in its batch, the batch's end names the last one and how many are
still pending, and a read ends only when nothing is. No consumer is created (a direct get only
reads), which is all the roles that read everything may do (runledger.protect.roles). nats-py
builds a message object per answer (~30 us): slower than the socket, never short.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from typing import Any

import nats

from runledger.errors import DirectGetDenied, LedgerError, LedgerReadError, PermissionDeniedError
from runledger.log.client import LedgerClient
from runledger.log.fastread import PULL_BATCH, PULL_MAX_BYTES, REQUEST_SLACK_S, read_to_end
from runledger.log.permissions import refused_at_once
from runledger.record.records import RawRecord

_PENDING_MSGS = 1_000_000  # a batch is at most PULL_BATCH answers; room for several, never a drop
_PENDING_BYTES = 4 * PULL_MAX_BYTES


class DirectReader:
    """Batch direct gets of one stream, answered on one subscription of the client's connection.

    Open it (``async with``, or ``open``/``close``); ``batch`` asks for the next stored messages.
    ``error``: what a broken read raises (a package reading through it may name its own)."""

    def __init__(self, client: LedgerClient, stream: str, error: type[LedgerError] = LedgerReadError) -> None:
        self.client = client
        self.stream = stream
        self.error = error
        self.api = f"$JS.API.DIRECT.GET.{stream}"
        self._inbox = ""
        self._sub: Any = None
        self._request = 0
        self._answers: deque[Any] = deque()
        self._ended = asyncio.Event()  # a batch's end (a status) arrived

    async def open(self) -> DirectReader:
        nc = self.client.nc
        self._inbox = nc.new_inbox()
        self._sub = await nc.subscribe(
            f"{self._inbox}.*", cb=self._on_answer, pending_msgs_limit=_PENDING_MSGS, pending_bytes_limit=_PENDING_BYTES
        )
        return self

    async def _on_answer(self, msg: Any) -> None:
        # Never blocks: a callback that waits makes nats-py drop what arrives behind it.
        self._answers.append(msg)
        if msg.headers and "Status" in msg.headers:
            self._ended.set()

    async def __aenter__(self) -> DirectReader:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):  # the connection is gone: so is the subscription
                await self._sub.unsubscribe()
            self._sub = None

    async def batch(
        self, seq: int, size: int = PULL_BATCH, subject_filter: str | None = None
    ) -> tuple[list[RawRecord], int]:
        """Up to ``size`` stored messages (on ``subject_filter``) from stream sequence ``seq`` on, in
        stream order, and how many the server still held after them (0: none, for now).

        Raises ``error`` when a message went missing or the server ended the read, DirectGetDenied
        when this login may not read the stream so."""
        self._request += 1
        reply = f"{self._inbox}.{self._request}"
        request: dict[str, Any] = {"seq": max(1, seq), "batch": max(2, size), "max_bytes": PULL_MAX_BYTES}
        if subject_filter:
            request["next_by_subj"] = subject_filter
        self._ended.clear()
        await self.client.nc.publish(self.api, json.dumps(request).encode(), reply=reply)
        out: list[RawRecord] = []
        while True:
            try:
                await refused_at_once(
                    self.client.nc, self.api, asyncio.wait_for(self._ended.wait(), timeout=REQUEST_SLACK_S)
                )
            except PermissionDeniedError as exc:
                raise DirectGetDenied(f"these credentials may not read {self.stream} by direct get") from exc
            except TimeoutError as exc:
                raise self.error(
                    f"{self.stream} did not answer a read within {REQUEST_SLACK_S:g}s (or these credentials may not "
                    "read it: a refused request looks like a timeout); read again"
                ) from exc
            self._ended.clear()
            while self._answers:
                msg = self._answers.popleft()
                if msg.subject != reply:
                    continue  # a late answer to an earlier request
                pending = self._take(msg.headers or {}, msg.data, out)
                if pending is not None:
                    return out, pending

    def _take(self, headers: dict[str, str], data: bytes, out: list[RawRecord]) -> int | None:
        status = headers.get("Status")
        last = headers.get("Nats-Last-Sequence")
        if status is None:
            seq, subject = headers.get("Nats-Sequence", ""), headers.get("Nats-Subject")
            if not seq.isdigit() or subject is None:
                raise self.error(f"not a direct get answer from {self.stream}: headers {headers}")
            previous = out[-1].stream_seq if out else 0
            if last is not None and int(last) != previous:
                raise self.error(f"{self.stream}: stream sequence {seq} came after {previous}, not after {last}: "
                                 "messages were lost on the way; read again")  # fmt: skip
            out.append(RawRecord(int(seq), subject, data))
            return None
        if status == "404" and not out:
            return 0
        if status != "204":
            raise self.error(
                f"the server ended the read of {self.stream} ({status} {headers.get('Description', '')}); read again"
            )
        if out and last is not None and int(last) != out[-1].stream_seq:
            raise self.error(f"{self.stream}: the batch ended at {last}, the last message received was "
                             f"{out[-1].stream_seq}: messages were lost on the way; read again")  # fmt: skip
        pending = headers.get("Nats-Num-Pending", "0")
        return int(pending) if pending.isdigit() else 0


async def read_direct(client: LedgerClient, stream: str, subject_filter: str, *, start_seq: int = 1) -> list[RawRecord]:
    """Every message on ``subject_filter`` of ``stream`` from ``start_seq`` on, in stream order,
    complete (``runledger.log.fastread.read_subject``'s direct read, through nats-py).

    Raises LedgerReadError (read again), DirectGetDenied (this login may not)."""
    async with DirectReader(client, stream) as reader:
        return await read_to_end(reader.batch, start_seq, subject_filter)
