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
from pathlib import Path

import duckdb
import pytest

from bench.project import publish_raw, workload
from runledger.log.client import connect
from runledger.log.cluster import ClusterState, LocalCluster
from runledger.log.subjects import LEDGER_STREAM
from tests.conftest import eventually, stream_leader

# Its own waits: up to 60 s to catch up, then per node 30 + 60 + 120 s, then 60 s to stop.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]


async def test_the_projector_follows_through_a_rolling_kill_of_every_node(
    cluster: tuple[LocalCluster, ClusterState], tmp_path: Path
) -> None:
    local, state = cluster
    db = tmp_path / "ledger.duckdb"
    client = await connect(state.url)
    await publish_raw(client, workload(400))
    follower = subprocess.Popen(
        [sys.executable, "-m", "runledger", "project", "--follow", "--db", str(db), "--batch", "200"],
        cwd=ROOT, env={**os.environ, "RUNLEDGER_NATS_URL": state.url},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(follower.stderr or []), daemon=True).start()

    async def total() -> int:
        return int((await client.js.stream_info(LEDGER_STREAM)).state.messages)

    def caught_up(n: int) -> bool:
        if follower.poll() is not None:
            raise AssertionError(f"the projector exited with {follower.returncode}:\n{''.join(lines[-20:])}")
        return any(f"position {n:,}, lag 0" in line for line in lines)

    async def wait_caught_up(n: int, timeout: float) -> None:
        try:
            await eventually(lambda: caught_up(n), timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; stream at {n}; projector said:\n{''.join(lines[-15:])}") from None

    try:
        n = await total()
        await wait_caught_up(n, 60)
        for i, node in enumerate(("n1", "n2", "n3")):
            local.kill(node)
            await stream_leader(client, other_than=node)  # a leader first: the raw publisher does not retry
            await publish_raw(client, workload(300, start=10_000 * (i + 1)))
            local.restart(node)
            await asyncio.to_thread(local.wait_healthy, 60)
            n = await total()
            await wait_caught_up(n, 120)
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
