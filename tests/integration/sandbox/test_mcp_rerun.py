"""A live re-execution of an agent whose tools are an MCP server's, in a real Docker sandbox.

The agent (tests/mcp_agents/agent.py) runs in the guest, which lists the server's tools from a stdio
server it starts itself (the sandbox image built with `--extra mcp`); every tool call goes to the
host, which calls the real server (its own log is the witness) for the read tool named live and
stubs or serves the effects, as for any runledger effect."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.sandbox.containers import SandboxPolicy, SandboxPool
from runledger.sandbox.image import find_image
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.lifecycle import start_run
from tests.integration.sandbox.owned import containers_of
from tests.mcp_agents import agent as mcp_agent

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(240)]
AGENT = "tests.mcp_agents.agent:spec"


@pytest.fixture
async def mcp_rerunner(docker: Any, client: LedgerClient) -> AsyncIterator[Rerunner]:
    pool = SandboxPool(docker, SandboxPolicy(image=find_image(docker, ["mcp"]), timeout_s=90), size=0)
    try:
        yield Rerunner(client, pool)
    finally:
        await pool.close()
        assert containers_of(docker, os.getpid()) == [], "a sandbox container was left behind"


def executed(witness: Path, tool: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in witness.read_text().splitlines() if x.strip()] if witness.exists() else []
    return [x for x in lines if x["tool"] == tool]


async def test_a_live_reexecution_calls_the_read_tool_live_and_serves_the_effects_from_their_keys(
    client: LedgerClient, mcp_rerunner: Rerunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    witness = tmp_path / "witness.jsonl"
    monkeypatch.setenv("MCP_WITNESS", str(witness))
    monkeypatch.delenv("MCP_TEST_URL", raising=False)
    parent = await start_run(client, mcp_agent.spec(), {"order": "A1"}, run_id="mcp-parent")
    assert parent.status == "completed", parent.error
    assert parent.output["found"]["lookups"] == 1
    assert [len(executed(witness, t)) for t in ("lookup_order", "refund", "add_note")] == [1, 1, 1]

    request = RerunRequest(parent_run_id="mcp-parent", agent=AGENT, mode="live", fork_step=0,
                           live_tools=["lookup_order"], timeout_s=90)  # fmt: skip
    result = await mcp_rerunner.rerun(request)
    assert result.status == "completed", result.error
    # The read tool ran again, live, on the real server: its second execution answered the branch.
    assert len(executed(witness, "lookup_order")) == 2
    assert result.output["found"]["lookups"] == 2
    # The effects did not: their keys were committed with these arguments, so the branch is served
    # their recorded results (the server's log still holds one refund and one note).
    assert len(executed(witness, "refund")) == 1 and len(executed(witness, "add_note")) == 1
    assert result.output["paid"] == parent.output["paid"]
    records = (await load_run(client, result.run_id)).records
    assert [r.event.payload.get("via") for r in records if r.event.type == "effect.committed"] == ["record"] * 2

    # Not named live: the read tool is refused from the fork on, and the server is not called.
    refused = await mcp_rerunner.rerun(request.model_copy(update={"live_tools": [], "request_id": "mcp-refused"}))
    assert refused.status == "failed" and "not marked live" in (refused.error or ""), refused.error
    assert len(executed(witness, "lookup_order")) == 2
