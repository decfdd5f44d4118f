"""Agents for the start-up tests (importable in the sandbox as tests.integration.sandbox.preload_agent:NAME):
each reports when its module was imported, on the monotonic clock the host shares with its containers."""

from __future__ import annotations

import time
from typing import Any

from runledger import AgentSpec, Run, ScriptedModel

IMPORTED_AT = time.monotonic()


async def first(run: Run) -> dict[str, Any]:
    return {"imported_at": IMPORTED_AT, "ran": "first"}


async def second(run: Run) -> dict[str, Any]:
    return {"imported_at": IMPORTED_AT, "ran": "second"}


def spec() -> AgentSpec:
    return AgentSpec("preload_first", first, ScriptedModel([]))


def other() -> AgentSpec:
    return AgentSpec("preload_other", second, ScriptedModel([]))


def broken() -> AgentSpec:
    raise RuntimeError("this factory always fails")
