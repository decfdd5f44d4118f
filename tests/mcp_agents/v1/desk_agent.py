"""An agent whose tools are a FastMCP 1.x server's (desk_server.py), recorded through
``runledger.integrations.mcp`` under mcp 1.x (tests/integration/test_mcp_sdk_v1.py).

The server is reached at ``$DESK_URL`` (streamable HTTP), else spawned over stdio. With
``$DESK_MARK`` the agent writes that file after its read and waits there to be killed."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from runledger import AgentSpec, Run, ScriptedModel
from runledger.integrations.mcp import McpServer

HERE = Path(__file__).resolve().parent
URL = os.environ.get("DESK_URL")
SERVER = (
    McpServer.http(URL)
    if URL
    else McpServer.stdio(
        sys.executable, [str(HERE / "desk_server.py")], env={"DESK_WITNESS": os.environ["DESK_WITNESS"]}
    )
)


async def desk(run: Run) -> dict[str, Any]:
    ticket = run.input["ticket"]
    async with SERVER.session(run) as session:
        listed = sorted(t.name for t in (await session.list_tools()).tools)
        found = await session.call_tool("find_ticket", {"ticket": ticket})
        mark = os.environ.get("DESK_MARK")
        if mark:
            Path(mark).write_text("found")
            await asyncio.Event().wait()  # held here until killed
        closed = await session.call_tool("close_ticket", {"ticket": ticket})
    # mcp 1.x names the fields as the wire does (structuredContent), as this user's code does.
    return {"listed": listed, "found": found.structuredContent, "closed": closed.structuredContent}


def spec() -> AgentSpec:
    tools = SERVER.tools(keys={"close_ticket": lambda a: f"close:{a['ticket']}"})
    return AgentSpec("desk-v1", desk, ScriptedModel(["unused"]), tools=tools)
