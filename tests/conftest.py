"""Shared fixtures: a real nats-server with JetStream on a free port and a temp data dir."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ledger.client import LedgerClient, connect
from ledger.server import EmbeddedServer, ServerState

T = TypeVar("T")
IN_CI = os.environ.get("CI") == "true"


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[ServerState]:
    """A fresh nats-server for one test. Fails (never skips) when the binary is missing."""
    server = EmbeddedServer(home=tmp_path / "home")
    state = server.start(data_dir=tmp_path / "data")
    try:
        yield state
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: ServerState) -> str:
    return nats_server.url


@pytest.fixture
async def client(nats_url: str) -> AsyncIterator[LedgerClient]:
    c = await connect(nats_url)
    try:
        yield c
    finally:
        await c.close()


async def eventually(check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll ``check`` (sync or async) until it returns a truthy value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last value: {last!r})")
