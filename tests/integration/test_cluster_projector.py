"""A projector following a 3-node cluster while every node in turn is SIGKILLed and restarted.

Whichever node the projector's reader is connected to dies at some point; the projection
must end equal to the stream: every event once, positions contiguous, nothing skipped.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import nats
import pytest

from bench.project import publish_raw, workload
from ledger.client import connect
from ledger.cluster import ClusterState, LocalCluster
from ledger.streams import LEDGER_STREAM
from tests.conftest import eventually

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, ClusterState]]:
    local = LocalCluster(home=tmp_path / "home")
    state = local.start(size=3, data_dir=tmp_path / "data")
    try:
        yield local, state
    finally:
        local.stop()


async def test_the_projector_follows_through_a_rolling_kill_of_every_node(
    cluster: tuple[LocalCluster, ClusterState], tmp_path: Path
) -> None:
    local, state = cluster
    db = tmp_path / "ledger.duckdb"
    client = await connect(state.url)
    await publish_raw(client, workload(400))
    follower = subprocess.Popen(
        [sys.executable, "-m", "ledger.cli", "project", "--follow", "--db", str(db), "--batch", "200"],
        cwd=ROOT, env={**os.environ, "RUNLEDGER_NATS_URL": state.url},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(follower.stderr or []), daemon=True).start()

    async def total() -> int:
        return int((await client.js.stream_info(LEDGER_STREAM)).state.messages)

    async def has_leader() -> bool:
        try:
            info = await client.js.stream_info(LEDGER_STREAM)
        except (TimeoutError, nats.errors.Error):
            return False
        return info.cluster is not None and bool(info.cluster.leader)

    def caught_up(n: int) -> bool:
        return any(f"position {n:,}, lag 0" in line for line in lines)

    try:
        n = await total()
        await eventually(lambda: caught_up(n), timeout=60)
        for i, node in enumerate(("n1", "n2", "n3")):
            local.kill(node)
            await eventually(has_leader, timeout=30, interval=0.2)  # the raw publisher does not retry
            await publish_raw(client, workload(300, start=10_000 * (i + 1)))
            local.restart(node)
            await asyncio.to_thread(local.wait_healthy, 60)
            n = await total()
            await eventually(lambda: caught_up(n), timeout=90)  # noqa: B023 - awaited right here
        follower.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(follower.wait, 60) == 0, "".join(lines)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        await client.close()
    con = duckdb.connect(str(db), read_only=True)
    count, distinct, low, high = con.execute(
        "SELECT count(*), count(DISTINCT stream_seq), min(stream_seq), max(stream_seq) FROM events"
    ).fetchall()[0]
    con.close()
    assert (count, distinct, low, high) == (n, n, 1, n)
