"""Publishing to JetStream and waiting for the ack, at a fraction of nats-py's cost per message.

``js.publish`` is a request: nats-py draws a token (a NUID and two random bytes), builds a future
with a done-callback, publishes, waits with ``asyncio.wait_for`` (a second future and a timer),
receives the ack through the muxed inbox subscription's queue and task, and builds a ``PubAck``
dataclass from ``json.loads``. Under load that was about a third of the CPU a recorded step spends
outside the SDK (bench/load.py, py-spy). ``AckInbox`` keeps what matters and drops the rest:

- one wildcard inbox subscription per connection (``nc.new_inbox()``, so the client's inbox prefix
  and with it its role's permissions hold), created at the first publish and re-subscribed by
  nats-py after a reconnect like any other subscription;
- the subscription is given a dispatcher as its ``future`` (nats-py's one-shot form), so nats-py's
  read loop hands each ack over synchronously: no queue, no task, no wake-up;
- a request token is a counter, a wait is one future and one timer;
- the ack's JSON is read by one regular expression when it is a plain ack (``{"stream":...,
  "seq":N}``, optionally ``"duplicate":true``); anything else (an error, a domain, fields a newer
  server adds) goes through ``json.loads`` and nats-py's own ``APIError.from_error`` / ``PubAck``.

What a caller sees is what ``js.publish`` gives: a ``PubAck``, or the same exceptions
(``APIError`` and its subclasses for a rejected message, ``nats.errors.TimeoutError`` when no ack
came in time, ``NoStreamResponseError`` for a 503 no-responders status, and whatever
``nc.publish`` raises: ``ConnectionClosedError``, ``OutboundBufferLimitError``, ...). So
runledger.log.publish keeps every semantic of ``publish_fenced`` (msg id, fence, retries, the
10071-during-retry check, cluster transients, timeouts) on top of it. A message the server
rejects is answered by an error ack, never left waiting (the ``publish_async`` pitfall, nats.py
#985, is a property of its futures, not of the request form used here); an ack that never comes
times out.

Only a plain ``JetStreamContext`` is served (``inbox_for``): a stand-in or a wrapped ``publish`` (a
test that loses acks on purpose) is called as it is.

Rejected: a connection of our own (as runledger.log.fastread reads): reconnects, cluster failover
and authentication would be ours to keep equal to nats-py's, for the few microseconds nats-py's
parser costs an ack; pre-encoded header bytes through nats-py's private ``_send_command``: the
public ``publish`` keeps its checks (closed, draining, buffer limits, payload size).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import weakref
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError

# A plain ack as nats-server writes it (server/stream.go): stream, seq, and "duplicate" when deduplicated.
_PLAIN_ACK = re.compile(rb'\{"stream":"[^"\\]*","seq":(\d+)(,"duplicate":true)?\}')
_NO_RESPONDERS = "503"


class _Dispatch:
    """What nats-py takes for a one-shot subscription's future: each reply is handed to the inbox."""

    __slots__ = ("_inbox",)

    def __init__(self, inbox: AckInbox) -> None:
        self._inbox = inbox

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False

    def set_result(self, msg: Msg) -> None:
        self._inbox._deliver(msg)


class AckInbox:
    """The acks of one connection's JetStream publishes (see the module docstring)."""

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._prefix: str | None = None
        self._prefix_len = 0
        self._subscribing: asyncio.Lock | None = None
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._tokens = itertools.count()

    async def _subscribe(self) -> str:
        if self._subscribing is None:
            self._subscribing = asyncio.Lock()
        async with self._subscribing:
            if self._prefix is None:
                prefix = self._nc.new_inbox() + "."
                await self._nc.subscribe(prefix + "*", future=_Dispatch(self))  # type: ignore[arg-type]
                self._prefix, self._prefix_len = prefix, len(prefix)
        return self._prefix

    def _deliver(self, msg: Msg) -> None:
        future = self._waiting.pop(msg.subject[self._prefix_len :], None)
        if future is not None and not future.done():
            future.set_result(msg)

    async def publish(
        self, subject: str, payload: bytes, *, timeout: float, headers: dict[str, str] | None = None
    ) -> PubAck:
        """``js.publish(subject, payload, timeout=timeout, headers=headers)``, acks read here."""
        prefix = self._prefix or await self._subscribe()
        token = str(next(self._tokens))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = future
        timer = loop.call_later(timeout, _expire, future)
        try:
            await self._nc.publish(subject, payload, reply=prefix + token, headers=headers)
            msg = await future
        finally:
            timer.cancel()
            self._waiting.pop(token, None)
        return parse_ack(msg)


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(nats.errors.TimeoutError())


def parse_ack(msg: Msg) -> PubAck:
    """The ``PubAck`` of a publish's reply, or the error ``js.publish`` raises for it."""
    if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
        raise nats.js.errors.NoStreamResponseError
    data = msg.data
    match = _PLAIN_ACK.fullmatch(data)
    if match is not None:
        stream = data[11 : data.index(b'"', 11)].decode()
        return PubAck(stream=stream, seq=int(match.group(1)), duplicate=True if match.group(2) else None)
    resp: Any = json.loads(data)
    if "error" in resp:
        raise APIError.from_error(resp["error"])
    return PubAck.from_response(resp)


_inboxes: weakref.WeakKeyDictionary[NATS, AckInbox] = weakref.WeakKeyDictionary()


def inbox_for(js: Any) -> AckInbox | None:
    """The ack inbox of ``js``'s connection; None for anything but a plain ``JetStreamContext``."""
    if type(js) is not JetStreamContext or "publish" in vars(js):
        return None
    nc = getattr(js, "_nc", None)
    if not isinstance(nc, NATS):
        return None
    inbox = _inboxes.get(nc)
    if inbox is None:
        inbox = _inboxes[nc] = AckInbox(nc)
    return inbox
