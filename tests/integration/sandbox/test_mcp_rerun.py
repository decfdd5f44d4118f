"""A live re-execution of an agent whose tools are an MCP server's, in a real Docker sandbox.

The agent (tests/mcp_agents/agent.py over stdio; a package of the test's over streamable HTTP) runs in
the guest (the sandbox image built with `--extra mcp`), which declares the server's tools from the
listing the host sends (the host lists the server: the guest has no network); every tool call goes
to the host, which calls the real server (its own log is the witness) for the read tool named live
and stubs or serves the effects, as for any runledger effect."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.sandbox.containers import SandboxPolicy, SandboxPool
from runledger.sandbox.image import find_image
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.agent import ALLOW_CODE_ENV, load_agent
from runledger.sdk.lifecycle import start_run
from tests.integration.sandbox.owned import containers_of
from tests.integration.test_mcp import Shop
from tests.mcp_agents import agent as mcp_agent

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(240)]
AGENT = "tests.mcp_agents.agent:spec"


# An agent that reaches its MCP server over streamable HTTP at a URL written in its code, as a user's does.
HTTP_AGENT = """
from runledger import AgentSpec, ScriptedModel
from runledger.integrations.mcp import McpServer

SERVER = McpServer.http({url!r})


async def shop(run):
    async with SERVER.session(run) as session:
        listed = sorted(t.name for t in (await session.list_tools()).tools)
        found = await session.call_tool("lookup_order", {{"order": run.input["order"]}})
        paid = await session.call_tool("refund", {{"order": run.input["order"], "amount": 5}})
    return {{"listed": listed, "found": found.structured_content, "paid": paid.structured_content}}


def spec():
    tools = SERVER.tools(keys={{"refund": lambda a: "refund:" + a["order"]}})
    return AgentSpec("mcp-http-shop", shop, ScriptedModel(["unused"]), tools=tools)
"""


@pytest.fixture
def http_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Shop]]:
    """The HTTP server (tests/mcp_agents/server.py, a process of the test's) and a package of the
    test's (a name no other test imports) whose agent reaches it: its ``module:attr``."""
    shop = Shop("http", tmp_path)
    shop.start()
    name = f"rl_mcp_http_{os.urandom(4).hex()}"
    package = tmp_path / "code" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "agent.py").write_text(HTTP_AGENT.format(url=shop.url))
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    monkeypatch.setenv(ALLOW_CODE_ENV, f".,{name}")  # outside the working directory: allowed as an operator would
    try:
        yield f"{name}.agent:spec", shop
    finally:
        shop.stop()
        for module in [m for m in sys.modules if m.startswith(name)]:
            del sys.modules[module]


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


async def test_an_agent_on_an_http_mcp_server_is_re_run_live_in_the_sandbox(
    client: LedgerClient, http_agent: tuple[str, Shop], mcp_rerunner: Rerunner
) -> None:
    agent, shop = http_agent
    parent = await start_run(client, load_agent(agent), {"order": "A1"}, run_id="mcp-http-parent")
    assert parent.status == "completed", parent.error
    assert [len(executed(shop.witness, t)) for t in ("lookup_order", "refund")] == [1, 1]

    request = RerunRequest(parent_run_id="mcp-http-parent", agent=agent, mode="live", fork_step=0,
                           live_tools=["lookup_order"], timeout_s=90)  # fmt: skip
    result = await mcp_rerunner.rerun(request)
    # The guest (no network) declared the tools from the host's listing; the host called the server.
    assert result.status == "completed", result.error
    assert result.output["listed"] == parent.output["listed"]
    assert len(executed(shop.witness, "lookup_order")) == 2 and result.output["found"]["lookups"] == 2
    assert len(executed(shop.witness, "refund")) == 1 and result.output["paid"] == parent.output["paid"]
