"""The example's MCP server: a small ticket desk (the ``mcp`` SDK's MCPServer), over stdio.

``find_ticket`` is annotated read-only; ``close_ticket`` destructive. Its state is a JSON file
(``$TICKET_DESK_FILE``, else ``tickets.json`` in the working directory), so a second process, or the
same server spawned again by a resumed agent, sees what the first one did."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

desk = MCPServer("ticket-desk")
STATE = Path(os.environ.get("TICKET_DESK_FILE", "tickets.json"))
SEED = {"T-1": {"ticket": "T-1", "subject": "refund not received", "status": "open"}}


def _tickets() -> dict[str, Any]:
    tickets: dict[str, Any] = json.loads(STATE.read_text()) if STATE.exists() else dict(SEED)
    return tickets


@desk.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_ticket(ticket: str) -> dict[str, Any]:
    """A ticket by its id."""
    found: dict[str, Any] = _tickets().get(ticket, {"ticket": ticket, "status": "unknown"})
    return found


@desk.tool(annotations=ToolAnnotations(destructive_hint=True))
def close_ticket(ticket: str, resolution: str) -> dict[str, Any]:
    """Close a ticket with a resolution (cannot be undone)."""
    tickets = _tickets()
    tickets[ticket] = {**tickets.get(ticket, {"ticket": ticket}), "status": "closed", "resolution": resolution}
    STATE.write_text(json.dumps(tickets))
    closed: dict[str, Any] = tickets[ticket]
    return closed


if __name__ == "__main__":
    desk.run()
