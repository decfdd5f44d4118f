"""How a sub-command reaches the ledger: which server (``--nats``, ``$RUNLEDGER_NATS_URL``, the
local cluster, else the embedded server), with which credentials, and one connection per command.
Every package's sub-commands share these, so the three packages' commands agree on where the log is.

Every sub-command's registration imports this module, so it imports nothing heavy at its top: the
NATS client, the cluster's state and the master key are imported by the functions that connect
(``runledger --help`` builds every parser and connects nowhere; tests/unit/test_cli_imports.py).
Finding the server costs two small file reads (``<home>/cluster.json``, ``<home>/server.json``)
and a pid check (0.1-0.3 ms), and ``connect`` checks the streams' settings in four round trips
(1-2 ms of CPU on a loopback server): not cached across calls, since a cache would save that little
and could hide a server restarted elsewhere or a stream changed since. A command's start is its
imports (docs/benchmarks.md, "cli").
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from runledger.errors import LedgerError
from runledger.log.server import ENV_URL, NO_LOGINS_WARNING, EmbeddedServer

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient

log = logging.getLogger(__name__)

T = TypeVar("T")


def ledger_address(url: str | None = None, creds: str | None = None, *, start: bool = True) -> tuple[str, str | None]:
    """Where the ledger is and with which credentials, as every ``runledger`` command finds it: the
    URL ``url``, else ``$RUNLEDGER_NATS_URL``, else the local cluster (``runledger cluster up``),
    else the embedded server (``runledger up``; started if need be, unless ``start`` is false, then
    ``LedgerError``); the credentials file ``creds``, else ``$RUNLEDGER_CREDS``, else the admin
    credentials of a secure embedded server when the URL was found rather than given. Returns
    ``(url, credentials file or None)``: pass them to ``runledger.connect(url, user_credentials=...)``.
    """
    given = url or os.environ.get(ENV_URL)
    return given or _local_url(start), _credentials(creds, given=bool(given))


def _local_url(start: bool) -> str:
    """The local cluster's URL, else the embedded server's (started if need be and ``start``)."""
    from runledger.log.cluster import LocalCluster

    cluster = LocalCluster().state()
    if cluster is not None:
        return cluster.url
    server = EmbeddedServer()
    state = server.state()
    if state is None:
        if not start:
            raise LedgerError("no embedded server is running: start it with `runledger up`")
        from runledger.protect.keystore import ensure_master_key

        state = server.start()
        ensure_master_key(server.home)  # as `runledger up` does: the runs recorded here wrap their keys under it
        log.warning("started the embedded nats-server at %s (data in %s)", state.url, state.data_dir)
        log.warning("%s", NO_LOGINS_WARNING)
    return state.url


def _credentials(creds: str | None, *, given: bool) -> str | None:
    found: str | None = creds or os.environ.get("RUNLEDGER_CREDS")
    if found or given:
        return found
    state = EmbeddedServer().state()
    if state is not None and state.creds_dir:
        return os.path.join(state.creds_dir, "admin.json")
    return None


def nats_url(args: argparse.Namespace, *, start: bool = True) -> str:
    """--nats, else RUNLEDGER_NATS_URL, else the local cluster, else the embedded server (``ledger_address``)."""
    url: str | None = getattr(args, "nats", None) or os.environ.get(ENV_URL)
    return url or _local_url(start)


def credentials(args: argparse.Namespace) -> str | None:
    """--creds, else $RUNLEDGER_CREDS, else the admin credentials of a secure embedded server (``ledger_address``)."""
    return _credentials(
        getattr(args, "creds", None), given=bool(getattr(args, "nats", None) or os.environ.get(ENV_URL))
    )


async def connect(url: str, **options: Any) -> LedgerClient:
    """``runledger.log.client.connect``, imported when a command connects (tests replace this name)."""
    from runledger.log.client import connect as open_client

    return await open_client(url, **options)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    import asyncio  # here, not at the top: `runledger --help` runs no loop

    return asyncio.run(coro)


def with_client(args: argparse.Namespace, fn: Callable[[LedgerClient], Awaitable[T]]) -> T:
    """Connect (per --nats / env / embedded), call ``fn(client)``, close."""

    async def go() -> T:
        client = await connect(nats_url(args), user_credentials=credentials(args))
        try:
            return await fn(client)
        finally:
            await client.close()

    return run_async(go())


def common_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--nats", metavar="URL", help=f"NATS server URL (default: ${ENV_URL}, else the embedded server)"
    )
    common.add_argument(
        "--creds",
        metavar="FILE",
        help="credentials file of a role (runledger up --secure writes them; default: $RUNLEDGER_CREDS)",
    )
    return common
