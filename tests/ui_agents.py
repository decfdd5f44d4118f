"""Agents the page's browser tests record (importable by subprocesses as tests.ui_agents:NAME)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from runledger import AgentSpec, Run, ScriptedModel

HOSTILE = "<script>window.__pwned = 1</script><img src=x onerror=window.__pwned=2>"


def _wait(args: dict[str, Any]) -> Any:
    """Blocks until the file $TEST_RELEASE exists (at most two minutes): a run that stays running,
    held by a live process."""
    release = Path(os.environ["TEST_RELEASE"])
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"released": release.exists()}


async def waiter(run: Run) -> Any:
    await run.tool("lookup", {"order": "order-1"}, fn=lambda a: {"order": a["order"], "amount": 12})
    return await run.tool("wait", {"for": "release"}, fn=_wait)


def waiter_spec() -> AgentSpec:
    return AgentSpec("waiter", waiter, ScriptedModel([]), agent_version="v1")


def _parse(args: dict[str, Any]) -> Any:
    raise ValueError(f"cannot parse {args['text']!r}: {HOSTILE}")


async def breaker(run: Run) -> Any:
    """Looks an order up, then fails on a tool whose error (and so the run's traceback) carries markup."""
    order = await run.tool("lookup", {"order": "order-2"}, fn=lambda a: {"order": a["order"], "amount": 40})
    return await run.tool("parse", {"text": f"amount {order['amount']} {HOSTILE}"}, fn=_parse)


def breaker_spec() -> AgentSpec:
    return AgentSpec("breaker", breaker, ScriptedModel([]), agent_version="v1")


def named_spec(name: str) -> AgentSpec:
    """The waiter's steps under another agent name (long names for the list's width)."""
    return AgentSpec(name, breaker_ok, ScriptedModel([]), agent_version="v1")


async def breaker_ok(run: Run) -> Any:
    return await run.tool("lookup", {"order": "order-3"}, fn=lambda a: {"order": a["order"], "amount": 7})
