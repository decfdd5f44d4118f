"""Killing and restarting nats-server in the middle of a run loses and duplicates nothing."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from runledger import Run
from runledger.log.client import connect
from runledger.log.server import EmbeddedServer
from runledger.ops.verify import verify_runs
from runledger.protect.loading import load_run
from runledger.sdk.agent import AgentSpec
from runledger.sdk.lifecycle import start_run
from runledger.sdk.models import ScriptedModel
from tests.conftest import eventually

pytestmark = pytest.mark.integration
STEPS = 300


async def test_sigkill_and_restart_of_the_server_mid_run(tmp_path: Path) -> None:
    server = EmbeddedServer(home=tmp_path / "home")
    state = server.start(data_dir=tmp_path / "data")
    calls: list[int] = []

    def work(i: Any) -> int:
        calls.append(i)
        return int(i) * 2

    async def agent(run: Run) -> int:
        total = 0
        for i in range(STEPS):
            total += await run.tool("work", i, fn=work)
        return total

    spec = AgentSpec("restart", agent, ScriptedModel([]))
    client = await connect(state.url)
    try:
        task = asyncio.create_task(start_run(client, spec, None, run_id="restart1"))
        await eventually(lambda: len(calls) >= 60)
        os.kill(state.pid, signal.SIGKILL)
        await eventually(lambda: server.state() is None)
        at_kill = len(calls)
        await asyncio.sleep(0.5)  # the agent is now retrying against a dead server
        server.start(data_dir=Path(state.data_dir), port=state.port)
        result = await asyncio.wait_for(task, timeout=60)
        assert result.status == "completed"
        assert result.output == sum(i * 2 for i in range(STEPS))
        assert at_kill < STEPS  # the kill really happened mid-run
        assert calls == list(range(STEPS))  # every step ran exactly once
        log = await load_run(client, "restart1")
        steps = [e.payload["step"] for e in log.events if e.type == "tool.called"]
        assert steps == list(range(STEPS))  # nothing lost, nothing doubled
        assert [e.seq for e in log.events] == list(range(STEPS + 2))
        assert all(v.ok for v in await verify_runs(client, "restart1"))
    finally:
        await client.close()
        server.stop()
