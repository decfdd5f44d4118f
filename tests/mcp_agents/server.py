"""A small MCP server (the ``mcp`` SDK's MCPServer, formerly FastMCP) for the MCP integration tests.

Every tool call it executes is logged on stderr (``runledger-test-shop: executing TOOL``) and
appended to the file ``$MCP_WITNESS`` (one JSON line: tool, arguments, the idempotency key the
call's ``_meta`` carried) before it answers: the witness of how many times a tool really ran.
``refund`` honours that key (a key it executed before answers the first result again, without
executing or logging); ``find_refund`` answers what a key's refund was (a reconcile
function asks it). ``$MCP_REFUND_DELAY_S`` makes ``refund`` wait after it executed and before it
answers (a window to kill the agent in). ``$MCP_SCHEMA=v2`` serves another ``refund`` schema (an
extra required parameter): a changed server. ``$MCP_SERVER_DOWN`` set: the process exits before it
serves anything (a server that is down, as a client spawning it over stdio sees one).

``echo`` answers any JSON value it is given as structured content, ``keep`` (a write) too: what an
agent receives of a result, live and on replay (tests/mcp_paths.py).

``python server.py`` serves over stdio; ``python server.py http PORT`` serves streamable HTTP on
127.0.0.1:PORT at ``/mcp``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

KEY_META = "io.runledger/idempotency-key"
server = MCPServer("runledger-test-shop")
ORDERS = {"A1": {"order": "A1", "total": 120, "status": "delivered"}, "B2": {"order": "B2", "total": 40}}


def _witness(tool: str, args: dict[str, Any], key: str | None) -> None:
    # A log line on stderr, as servers write them (the SDK's "Processing request of type ..."):
    # where it ends up is the client's choice (tests/integration/test_mcp_stderr.py).
    print(f"runledger-test-shop: executing {tool}", file=sys.stderr, flush=True)
    path = os.environ.get("MCP_WITNESS")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"tool": tool, "args": args, "key": key, "pid": os.getpid()}) + "\n")
            log.flush()
            os.fsync(log.fileno())


def _executed() -> list[dict[str, Any]]:
    path = os.environ.get("MCP_WITNESS")
    if not path or not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as log:
        return [json.loads(line) for line in log if line.strip()]


def _key(ctx: Context) -> str | None:
    meta = ctx.request_context.meta or {}
    key = meta.get(KEY_META) if isinstance(meta, dict) else getattr(meta, KEY_META, None)
    return str(key) if key else None


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_order(order: str, ctx: Context) -> dict[str, Any]:
    """Look an order up."""
    _witness("lookup_order", {"order": order}, None)
    lookups = sum(1 for e in _executed() if e["tool"] == "lookup_order")  # this one included
    return {**ORDERS.get(order, {"order": order, "status": "unknown"}), "lookups": lookups}


def _refund(order: str, amount: int, ctx: Context, reason: str = "") -> dict[str, Any]:
    key = _key(ctx)
    for done in _executed():
        if done["tool"] == "refund" and key is not None and done["key"] == key:
            return {"refunded": done["args"]["amount"], "order": done["args"]["order"], "key": key, "again": True}
    args = {"order": order, "amount": amount, **({"reason": reason} if reason else {})}
    _witness("refund", args, key)
    time.sleep(float(os.environ.get("MCP_REFUND_DELAY_S", "0")))
    return {"refunded": amount, "order": order, "key": key}


if os.environ.get("MCP_SCHEMA") == "v2":

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def refund(order: str, amount: int, reason: str, ctx: Context) -> dict[str, Any]:
        """Refund an order (v2: a reason is required)."""
        return _refund(order, amount, ctx, reason)

else:

    @server.tool(annotations=ToolAnnotations(destructive_hint=True))
    def refund(order: str, amount: int, ctx: Context) -> dict[str, Any]:  # type: ignore[misc]
        """Refund an order."""
        return _refund(order, amount, ctx)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_refund(key: str) -> dict[str, Any]:
    """The refund executed under an idempotency key, if any (``found`` false otherwise)."""
    for done in _executed():
        if done["tool"] == "refund" and done["key"] == key:
            return {"found": True, "refunded": done["args"]["amount"], "order": done["args"]["order"], "key": key}
    return {"found": False}


@server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False))
def add_note(order: str, text: str) -> dict[str, Any]:
    """Add a note to an order (an additive write)."""
    _witness("add_note", {"order": order, "text": text}, None)
    return {"noted": True}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def echo(value: Any) -> dict[str, Any]:
    """Answer the value given as structured content (and as its JSON text), as the wire carried it."""
    return {"echo": value}


@server.tool(annotations=ToolAnnotations(destructive_hint=False))
def keep(order: str, value: Any) -> dict[str, Any]:
    """Keep a value for an order (a write): answers it back."""
    _witness("keep", {"order": order}, None)
    return {"kept": value, "order": order}


if __name__ == "__main__":
    if os.environ.get("MCP_SERVER_DOWN"):
        sys.exit(1)
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
