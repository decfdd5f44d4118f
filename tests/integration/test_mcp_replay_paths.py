"""What agent code calling MCP tools receives live it receives on every path back, for any value.

The differential property test of tests/unit/test_replay_paths.py for runledger.integrations.mcp (the
probe agent: tests/mcp_paths.py) against the test MCP server (tests/mcp_agents/server.py) over
streamable HTTP, a real process started once for the module; the ledger in memory. Hypothesis draws
the values the server's tools answer as structured content; the ``CallToolResult``s the agent received
live, typed at every node, are compared with those of a resume after a kill at a random call, of the
in-process replayer and of a re-drive through the broker to the sandbox guest (in-process), forked
at a random step.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests import mcp_paths as probe
from tests.integration.processes import ROOT
from tests.replay_paths import differences
from tests.run_contract import InProcessPool
from tests.unit.test_replay_paths import JSON, on_memory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
SERVER = ROOT / "tests" / "mcp_agents" / "server.py"
# Fewer examples than on memory alone: each example lists the server and calls it over HTTP some 15 times.
ON_SERVER = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VALUES = st.fixed_dictionaries({"read": JSON, "write": JSON})
HOSTILE = {
    "read": {"tag": "a1", "n": 1, "usd": 210.0, "z": {"y": -0.0, "b": (1, 2.0)}, "\U0001f600": 2**70, "\uffff": []},
    "write": {"paid": 30.0, "ok": True, "cents": [21000, 0.5]},
}
_ids = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    witness = tmp_path_factory.mktemp("mcp") / "witness.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "http", str(port)], cwd=ROOT, env={**os.environ, "MCP_WITNESS": str(witness)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"the MCP server did not listen on {port}") from None
            time.sleep(0.05)
    probe.URL[:] = [f"http://127.0.0.1:{port}/mcp"]
    try:
        yield probe.URL[0]
    finally:
        proc.kill()
        proc.wait()


@ON_SERVER
@example(values=HOSTILE, stop_after=1)
@given(values=VALUES, stop_after=st.integers(min_value=1, max_value=3))
def test_a_resume_after_a_kill_observes_what_live_observed(values: dict[str, Any], stop_after: int) -> None:
    probe.reset(values)
    n = next(_ids)

    async def drive(client: Any) -> str:
        return await probe.live(client, f"mcp-live-{n}", f"o-{n}")

    async def kill_and_resume(client: Any) -> str:  # on a ledger of its own: the same order, its own key
        return await probe.resumed(client, f"mcp-kill-{n}", f"o-{n}", stop_after)

    live, resumed = on_memory(drive), on_memory(kill_and_resume)
    assert resumed == live, differences(live, resumed)


@ON_SERVER
@example(values=HOSTILE, fork_step=0)
@given(values=VALUES, fork_step=st.sampled_from([0, 1, 2, 3]))
def test_the_replayer_and_a_re_drive_observe_what_live_observed(values: dict[str, Any], fork_step: int) -> None:
    probe.reset(values)
    run_id = f"mcp-live-{next(_ids)}"

    async def drive(client: Any) -> tuple[str, Any, str, str]:
        live = await probe.live(client, run_id, "o-1")
        result, observed = await probe.replayed(client, run_id)
        with tempfile.TemporaryDirectory() as sockets:
            redriven = await probe.redriven(client, run_id, fork_step, InProcessPool(sockets))
        return live, result, observed, redriven

    live, result, observed, redriven = on_memory(drive)
    assert result.ok, str(result)
    assert observed == live, differences(live, observed)
    assert redriven == live, differences(live, redriven)
