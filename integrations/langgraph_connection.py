"""A LangGraph saver with a connection of its own: ``RunledgerSaver.from_conn_string(url)``.

LangGraph's durable savers are made from a connection string as a context manager
(``PostgresSaver.from_conn_string``, ``SqliteSaver``, ``AsyncPostgresSaver``), and LangGraph users
look for it. ``SaverConnection`` is both kinds at once, since one ``RunledgerSaver`` serves sync and
async graphs:

- ``with RunledgerSaver.from_conn_string(url) as saver:`` (sync code, ``graph.invoke``): the
  connection lives on an event loop in a thread of its own, started on entry; the saver's sync
  methods hand their work to it. On exit the connection is closed and the thread stopped.
- ``async with RunledgerSaver.from_conn_string(url) as saver:`` (async code, ``graph.ainvoke``):
  the connection lives on the running loop and is closed on exit.

With no URL (``from_conn_string()``) the saver finds the ledger as the ``runledger`` commands do
(``runledger.ledger_address``): ``$RUNLEDGER_NATS_URL``, else the local cluster, else the embedded
server (started if need be), with ``$RUNLEDGER_CREDS`` or a secure embedded server's credentials;
found when the block is entered, so a saver made at import time starts nothing.

Nothing is lost at exit: every append is acknowledged by the server before the saver returns it
to LangGraph. A connection that cannot be made raises as ``runledger.connect`` does (naming the URL).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

from runledger import ConfigurationError, LedgerClient, connect

S = TypeVar("S")


class SaverConnection(Generic[S]):
    """A saver made by ``make(client, loop)`` on a connection to ``url`` (None: where the ``runledger``
    commands find the ledger; ``connect_options`` go to ``runledger.connect``), for the length of a
    ``with`` or ``async with`` block."""

    def __init__(
        self,
        url: str | None,
        make: Callable[[LedgerClient, asyncio.AbstractEventLoop], S],
        connect_options: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self._make = make
        self._options = dict(connect_options or {})
        self._client: LedgerClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _check_unused(self) -> None:
        if self._client is not None:
            raise ConfigurationError("this from_conn_string(...) block is already open: call from_conn_string again")

    def _target(self) -> tuple[str, dict[str, Any]]:
        """The URL and connect options: ``ledger_address``'s when no URL was given."""
        if self.url is not None:
            return self.url, self._options
        # The CLI's lookup, imported only here: a sandbox guest loads this module and holds no CLI.
        from runledger import ledger_address

        url, creds = ledger_address(creds=self._options.get("user_credentials"))
        return url, {**self._options, "user_credentials": creds} if creds else self._options

    # -- sync: a loop in a thread of its own --------------------------------------------------------------------

    def __enter__(self) -> S:
        self._check_unused()
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="runledger-saver", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            url, options = self._target()
            self._client = asyncio.run_coroutine_threadsafe(connect(url, **options), loop).result()
            return self._make(self._client, loop)
        except BaseException:
            self._stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop()

    def _stop(self) -> None:
        loop, thread, client = self._loop, self._thread, self._client
        self._loop, self._thread, self._client = None, None, None
        if loop is None:
            return
        try:
            if client is not None:
                asyncio.run_coroutine_threadsafe(client.close(), loop).result(30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(30)
            loop.close()

    # -- async: the running loop --------------------------------------------------------------------------------

    async def __aenter__(self) -> S:
        self._check_unused()
        url, options = self._target()
        self._client = await connect(url, **options)
        try:
            return self._make(self._client, asyncio.get_running_loop())
        except BaseException:
            await self._client.close()
            self._client = None
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()
