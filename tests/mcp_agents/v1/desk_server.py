"""A user's MCP server written for the ``mcp`` SDK 1.x (``FastMCP``, gone from 2.x), run by
tests/integration/test_mcp_sdk_v1.py in a venv that holds mcp 1.x and ``runledger[mcp]``.

Each tool call it executes is appended to ``$DESK_WITNESS`` (tool, arguments, the idempotency key
its ``_meta`` carried). FastMCP 1.x logs every request on stderr ("Processing request of type ...").
``python desk_server.py`` serves over stdio; ``python desk_server.py http PORT`` streamable HTTP.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

KEY_META = "io.runledger/idempotency-key"
PORT = int(sys.argv[2]) if len(sys.argv) > 2 else 8000
desk = FastMCP("desk-v1", host="127.0.0.1", port=PORT)


def _witness(tool: str, args: dict[str, Any], key: Any) -> None:
    with open(os.environ["DESK_WITNESS"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"tool": tool, "args": args, "key": key}) + "\n")


@desk.tool(annotations=ToolAnnotations(readOnlyHint=True))
def find_ticket(ticket: str) -> dict[str, Any]:
    """Find a ticket."""
    _witness("find_ticket", {"ticket": ticket}, None)
    return {"ticket": ticket, "status": "open"}


@desk.tool(annotations=ToolAnnotations(destructiveHint=True))
def close_ticket(ticket: str, ctx: Context) -> dict[str, Any]:  # type: ignore[type-arg]
    """Close a ticket."""
    meta = ctx.request_context.meta
    key = (meta.model_extra or {}).get(KEY_META) if meta is not None else None
    _witness("close_ticket", {"ticket": ticket}, key)
    return {"closed": ticket, "key": key}


if __name__ == "__main__":
    desk.run("streamable-http" if sys.argv[1:2] == ["http"] else "stdio")
