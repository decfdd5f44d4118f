"""The narrow channel between a sandboxed agent and its broker: JSON lines over a unix socket.

Chosen over attached stdio: we measured a round trip of ~0.07 ms over a mounted unix
socket against ~0.26 ms over docker's attached stdio, which also needs hand-parsed 8-byte
frame headers and can stall dockerd when attached with logs. Every line is capped
(``MAX_LINE``); anything that is not one JSON object per line ends the re-run.

Messages, guest -> host: ``{"id": n, "op": OP, ...}``; host -> guest: ``{"id": n, "ok": value}``
or ``{"id": n, "error": {"type": T, "message": M}}``. Ops: hello, model, tool, effect,
approval, child, now, random (requests), done, failed (the agent's outcome).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from runledger.sandbox.errors import ChannelError

MAX_LINE = 4 * 1024 * 1024
OPS = frozenset({"hello", "model", "tool", "effect", "approval", "child", "now", "random", "done", "failed"})


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def parse(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ChannelError(f"not JSON: {line[:80]!r}") from exc
    if not isinstance(message, dict):
        raise ChannelError(f"not a JSON object: {line[:80]!r}")
    return message


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None at end of stream. Raises ChannelError on bad input."""
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ChannelError("the channel closed in the middle of a message") from exc
        return None
    except asyncio.LimitOverrunError as exc:
        raise ChannelError(f"a message longer than {MAX_LINE} bytes") from exc
    except ValueError as exc:  # the StreamReader limit was hit
        raise ChannelError(f"a message longer than {MAX_LINE} bytes") from exc
    return parse(line)


def check_request(message: dict[str, Any]) -> tuple[int, str]:
    op, ident = message.get("op"), message.get("id")
    if op not in OPS:
        raise ChannelError(f"unknown op {op!r}")
    if not isinstance(ident, int) or isinstance(ident, bool):
        raise ChannelError(f"message id must be an integer, got {ident!r}")
    return ident, str(op)
