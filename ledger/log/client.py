"""A connection to the ledger: nats client + JetStream context, with errors translated."""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from runledger.errors import ConnectionFailedError
from runledger.log.permissions import watch
from runledger.log.publish import retrying
from runledger.log.server import ENV_URL as ENV_URL
from runledger.log.streams import StreamSettings, ensure_streams

# JetStream error codes of a cluster that is not ready yet, beyond what publish.is_transient
# waits out: "insufficient resources" (peers still joining).
_NOT_READY = frozenset({10023})


@dataclass
class LedgerClient:
    """An open connection. Close it with ``await client.close()`` or use ``async with``."""

    nc: NATS
    js: JetStreamContext
    url: str
    clustered: bool = False  # the server is a node of a JetStream cluster (new streams get 3 replicas)
    slow_consumer_errors: int = 0
    # The role of the credentials file this client logged in with (runledger.protect.roles), and the
    # agent of an agent's login: readers read such a client's own runs only (runledger.log.reader).
    role: str | None = None
    agent: str | None = None

    async def close(self) -> None:
        if self.nc.is_closed:
            return
        try:
            await asyncio.wait_for(self.nc.drain(), timeout=5)
        except (TimeoutError, OSError, nats.errors.Error):
            # The server is gone or slow: nothing unacknowledged is lost by closing, since
            # every write this client made was awaited until acknowledged.
            with contextlib.suppress(TimeoutError, OSError, nats.errors.Error):
                await self.nc.close()

    async def __aenter__(self) -> LedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect(
    url: str,
    *,
    ensure: bool | None = None,
    settings: StreamSettings | None = None,
    connect_timeout: float = 3.0,
    user_credentials: str | None = None,
    ready_timeout: float = 20.0,
    **options: Any,
) -> LedgerClient:
    """Connect to ``url`` and (by default) create or update the runledger streams.

    After the first connection succeeds the client reconnects forever in the
    background; publishers bound their own waiting (see ``runledger.log.publish``).
    Raises ConnectionFailedError naming the URL when no server answers.

    ``user_credentials`` (or $RUNLEDGER_CREDS) is either a runledger role credentials file
    (``*.json``, written by ``runledger up --secure``: user, password and inbox prefix, see
    ``runledger.protect.roles``) or a NATS ``.creds`` file. ``ensure`` defaults to True except for a
    role other than admin, which may not create streams.
    """
    holder: dict[str, LedgerClient] = {}

    async def on_error(exc: Exception) -> None:
        # A slow consumer means the client dropped messages: readers check for it
        # and fail rather than silently skip (nats-py's ordered consumer loses messages
        # silently when it drops them for a slow consumer).
        if isinstance(exc, nats.errors.SlowConsumerError) and "c" in holder:
            holder["c"].slow_consumer_errors += 1
        if "c" in holder:
            # A permissions violation reaches only this callback: a publish waiting on it fails at once.
            watch(holder["c"].nc, role, agent, where).saw(exc)

    creds = user_credentials or os.environ.get("RUNLEDGER_CREDS") or None
    role: str | None = None
    agent: str | None = None
    where: str | None = None
    if creds is not None and creds.endswith(".json"):
        from runledger.log.credentials import RoleCredentials

        login = RoleCredentials.read(creds)
        role, agent, where, creds = login.role, login.agent, os.path.dirname(os.path.abspath(creds)), None
        options = {"user": login.user, "password": login.password, "inbox_prefix": login.inbox_prefix, **options}
    if ensure is None:
        ensure = role in (None, "admin")
    await _probe(url, connect_timeout)
    try:
        # With unlimited reconnects nats-py retries the *first* connect forever too: bound it.
        nc = await asyncio.wait_for(
            nats.connect(
                servers(url),
                connect_timeout=int(max(1, connect_timeout)),
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,
                allow_reconnect=True,
                error_cb=on_error,
                user_credentials=creds,
                **options,
            ),
            timeout=connect_timeout * 3,
        )
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        raise ConnectionFailedError(url, _reason(exc)) from exc
    client = LedgerClient(
        nc=nc, js=nc.jetstream(timeout=5.0), url=url, clustered=bool(nc._server_info.get("cluster")), role=role,
        agent=agent if role == "agent" else None,
    )  # fmt: skip
    holder["c"] = client
    watch(nc, role, agent, where)
    if ensure:
        try:
            await _ensure_when_ready(client, settings, ready_timeout)
        except (TimeoutError, nats.errors.Error) as exc:
            await client.close()
            raise ConnectionFailedError(url, f"JetStream not available ({_reason(exc)})") from exc
    return client


async def _ensure_when_ready(client: LedgerClient, settings: StreamSettings | None, timeout: float) -> None:
    """Create the streams, waiting out a cluster that is still electing its JetStream leaders.

    A fresh or recovering cluster answers 503 / "JetStream system temporarily unavailable"
    (10008), "insufficient resources" (10023, peers still joining) or not at all for a few
    seconds; anything else is a real error."""
    await retrying(lambda: ensure_streams(client.js, settings, clustered=client.clustered), timeout, also=_NOT_READY)


def servers(url: str) -> list[str]:
    """The server URLs of a comma-separated URL (a cluster: every node; the client fails over)."""
    return [u.strip() for u in url.split(",") if u.strip()]


async def _probe(url: str, timeout: float) -> None:
    """Fail fast, naming the URL, when nothing listens at any of its servers."""
    last: BaseException | None = None
    for server in servers(url):
        parsed = urlparse(server if "://" in server else f"nats://{server}")
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(parsed.hostname or "127.0.0.1", parsed.port or 4222), timeout=timeout
            )
        except (OSError, TimeoutError) as exc:
            last = exc
            continue
        writer.close()
        return
    raise ConnectionFailedError(url, _reason(last or OSError("no server in URL")))


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, nats.errors.NoServersError):
        text = "connection refused or timed out"
    return text
