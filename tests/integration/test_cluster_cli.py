"""`runledger up --cluster 3`: three nodes on loopback, streams with 3 replicas, found by every command."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runledger.cli.app import main
from runledger.log.client import connect
from runledger.log.cluster import LocalCluster
from runledger.log.streams import StreamSettings
from runledger.log.subjects import LEDGER_STREAM

pytestmark = pytest.mark.integration


def test_up_cluster_status_and_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RUNLEDGER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RUNLEDGER_NATS_URL", raising=False)
    monkeypatch.delenv("RUNLEDGER_REPLICAS", raising=False)
    try:
        assert main(["up", "--cluster", "3"]) == 0
        out = capsys.readouterr().out
        assert "a 3-node JetStream cluster" in out and "3 replicas" in out
        state = LocalCluster(tmp_path / "home").state()
        assert state is not None and len(state.nodes) == 3

        # Every command finds the cluster without --nats; the log is replicated on all three nodes.
        assert main(["status"]) == 0
        status = capsys.readouterr().out
        assert "replicas 3" in status and status.count("(current)") >= 4

        async def replicas_after_a_plain_connect() -> int:
            # An agent connecting with default settings must not scale the stream down.
            client = await connect(state.url, settings=StreamSettings())
            try:
                return (await client.js.stream_info(LEDGER_STREAM)).config.num_replicas
            finally:
                await client.close()

        assert asyncio.run(replicas_after_a_plain_connect()) == 3
        assert main(["up"]) == 4  # a one-node server beside the cluster is refused, with a reason
        assert "local cluster is running" in capsys.readouterr().err
    finally:
        main(["down"])
    assert "stopped the local cluster" in capsys.readouterr().out
    assert LocalCluster(tmp_path / "home").state() is None
