"""Shared fixtures: a real nats-server with JetStream on a free port and a temp data dir."""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import nats
import pytest

from runledger.log.client import LedgerClient, connect
from runledger.log.cluster import ClusterState, LocalCluster
from runledger.log.server import EmbeddedServer, ServerState
from runledger.log.subjects import LEDGER_STREAM
from runledger.protect.roles import secure

# The abstract contracts run by test modules of both suites: their asserts explain themselves too.
pytest.register_assert_rewrite("tests.log_contract", "tests.run_contract")

T = TypeVar("T")
IN_CI = os.environ.get("CI") == "true"


def unavailable(why: str) -> NoReturn:
    """A test whose real part (a browser, node) is missing: it skips on a developer's machine and
    fails under CI=true, where .ci/run installs everything."""
    if IN_CI:
        pytest.fail(why)
    pytest.skip(why)


# Run keys are wrapped under a master key kept outside NATS (runledger.protect.keystore): one for the
# session, inherited by every process a test starts. Tests of the master key itself take it away.
os.environ.setdefault("RUNLEDGER_MASTER_KEY", base64.b64encode(os.urandom(32)).decode())
# A stdio MCP server's stderr goes to a log beside the run in the runledger home by default: the session's
# servers write one file in a temp folder instead, never the developer's ~/.runledger (the tests of that
# default, tests/integration/test_mcp_stderr.py, drop this and name a home of their own).
os.environ.setdefault("RUNLEDGER_MCP_STDERR", os.path.join(tempfile.mkdtemp(prefix="runledger-tests-"), "mcp.log"))
# Set by pytest itself for each phase of a test: never a leak.
_ENV_OWNED_BY_PYTEST = frozenset({"PYTEST_CURRENT_TEST"})


@pytest.fixture(autouse=True)
def environment_left_as_found() -> Iterator[None]:
    """Fail a test that leaves ``os.environ`` changed (use ``monkeypatch.setenv``), and put the
    environment back so the leak cannot change what later tests see. Autouse fixtures are set
    up first, so this check runs after ``monkeypatch`` has undone its own changes."""
    before = {k: v for k, v in os.environ.items() if k not in _ENV_OWNED_BY_PYTEST}
    yield
    after = {k: v for k, v in os.environ.items() if k not in _ENV_OWNED_BY_PYTEST}
    if after == before:
        return
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    for key in changed:
        if key in before:
            os.environ[key] = before[key]
        else:
            del os.environ[key]
    pytest.fail(f"the test left os.environ changed ({', '.join(changed)}): use monkeypatch.setenv/delenv")


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
def secure_server(tmp_path: Path) -> Iterator[ServerState]:
    """A fresh nats-server with role logins (``runledger up --secure``) for agents ``alpha`` and ``beta``;
    its credentials files are in ``state.creds_dir``."""
    server = EmbeddedServer(home=tmp_path / "home")
    state = server.start(data_dir=tmp_path / "data", auth=secure(["alpha", "beta"]))
    try:
        yield state
    finally:
        server.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, ClusterState]]:
    """A fresh 3-node JetStream cluster on loopback (``runledger.log.cluster``)."""
    local = LocalCluster(home=tmp_path / "cluster-home")
    state = local.start(size=3, data_dir=tmp_path / "cluster-data")
    try:
        yield local, state
    finally:
        local.stop()


async def cluster_client(url: str) -> LedgerClient:
    """A client of a fresh cluster once every stream has a leader: before that, the first burst
    of connecting agents can spend its whole ready timeout on stream infos nobody answers."""
    client = await connect(url, ready_timeout=60)

    async def all_led() -> bool:
        try:
            infos = await client.js.streams_info()
        except (TimeoutError, nats.errors.Error):
            return False
        return bool(infos) and all(i.cluster is not None and i.cluster.leader for i in infos)

    await eventually(all_led, timeout=60, interval=0.2)
    return client


async def stream_leader(client: LedgerClient, other_than: str | None = None) -> str:
    """The LEDGER stream's leader node once there is one (between leaders requests time out or
    503), and it is not ``other_than`` (a node just killed may still be named for a moment)."""

    async def leader() -> str | None:
        try:
            info = await client.js.stream_info(LEDGER_STREAM)
        except (TimeoutError, nats.errors.Error):
            return None
        leader = info.cluster.leader if info.cluster is not None else None
        return leader if leader != other_than else None

    found: str = await eventually(leader, timeout=30, interval=0.2)
    return found


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
