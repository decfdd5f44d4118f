"""An agent whose tools are an MCP server's (tests/mcp_agents/server.py), recorded through
runledger.integrations.mcp: a lookup (read-only), a refund (destructive, keyed by the order, its
reconcile asks the server's ``find_refund``), a note (a non-destructive write keyed in the call).

The server is reached as ``$MCP_TEST_URL`` says (streamable HTTP) or, without it, spawned over
stdio with ``$MCP_WITNESS`` and ``$MCP_SCHEMA`` handed on. ``$MCP_AGENT_MARK`` names a file the agent
writes after the lookup and before the refund (or, with ``$MCP_AGENT_HOLD_AFTER=note``, after its last
call), then waits there to be killed (a moment to kill it at, held: the kill cannot land after the
next call); ``$MCP_AGENT_APPROVAL`` makes it ask for an approval after its calls; ``$MCP_NO_RECONCILE``
declares the refund without its reconcile function."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from runledger import NOT_FOUND, AgentSpec, Run, ScriptedModel
from runledger.integrations.mcp import McpServer

SERVER_SCRIPT = Path(__file__).with_name("server.py")
SERVER: McpServer | None = None  # the server of the spec built last (the agent's calls go through it)


def connect_from_env() -> McpServer:
    url = os.environ.get("MCP_TEST_URL")
    if url:
        return McpServer.http(url)
    handed = ("MCP_WITNESS", "MCP_SCHEMA", "MCP_REFUND_DELAY_S", "MCP_SERVER_DOWN", "PYTHONPATH")
    env = {k: os.environ[k] for k in handed if k in os.environ}
    return McpServer.stdio(sys.executable, [str(SERVER_SCRIPT)], env=env)


async def reconcile_refund(key: str) -> Any:
    """What the server knows of the refund under ``key``: its result, or NOT_FOUND."""
    assert SERVER is not None
    async with SERVER.connect() as session:
        found = await session.call_tool("find_refund", {"key": key})
    if not (found.structured_content or {}).get("found"):
        return NOT_FOUND
    return found.model_dump(mode="json", by_alias=True, exclude_none=True)


async def hold(after: str) -> None:
    """Write ``$MCP_AGENT_MARK`` and wait to be killed, if the agent is to be held ``after`` that call."""
    mark = os.environ.get("MCP_AGENT_MARK")
    if mark and os.environ.get("MCP_AGENT_HOLD_AFTER", "lookup") == after:
        Path(mark).write_text(after)
        await asyncio.Event().wait()  # held here until killed


async def shop(run: Run) -> dict[str, Any]:
    assert SERVER is not None
    order = run.input["order"]
    async with SERVER.session(run) as mcp:
        listed = sorted(t.name for t in (await mcp.list_tools()).tools)
        found = await mcp.call_tool("lookup_order", {"order": order})
        await hold("lookup")
        paid = await mcp.call_tool("refund", {"order": order, "amount": 5})
        noted = await mcp.call_tool("add_note", {"order": order, "text": "refunded"}, key=f"note:{order}")
        await hold("note")
    if os.environ.get("MCP_AGENT_APPROVAL"):
        await run.approval("close the case", {"order": order})
    return {"listed": listed, "found": found.structured_content, "paid": paid.structured_content,
            "noted": noted.structured_content}  # fmt: skip


def spec() -> AgentSpec:
    """The agent; its tools are listed from the server when a run first needs them (its version
    tuple holds their schemas)."""
    global SERVER
    SERVER = connect_from_env()
    # add_note's key comes from the call; its key function (the same key) is what a re-run's host derives
    # it with, since a sandboxed agent's call carries no key the host would trust.
    keys = {"refund": lambda a: f"refund:{a['order']}", "add_note": lambda a: f"note:{a['order']}"}
    reconcile = None if os.environ.get("MCP_NO_RECONCILE") else {"refund": reconcile_refund}
    tools = SERVER.tools(keys=keys, reconcile=reconcile)
    return AgentSpec("mcp-shop", shop, ScriptedModel(["unused"], name="scripted-mcp"), tools=tools)
