"""Agents for the worker tests (``tests/integration/sandbox/test_worker_poison.py``).

Parent runs are recorded with ``steady``; the others live in this same package (same code
hash), so a re-run of a steady run can be asked to execute them. Nothing here runs at import
time: the worker imports this module on the host, the sandbox in the container."""

from __future__ import annotations

import time
from typing import Any

from runledger import AgentSpec, Run, ScriptedModel, tool


@tool("read_doc")
def read_doc(args: Any) -> str:
    return f"document {args}"


@tool("wait_forever")
def wait_forever(args: Any) -> str:
    """Wedges the thread it runs in on the host (a live re-run runs read tools there)."""
    time.sleep(3600)
    return "never"


def _spec(fn: Any) -> AgentSpec:
    return AgentSpec("wrk", fn, ScriptedModel(lambda messages: "steady", name="steady-1"),
                     tools=[read_doc, wait_forever], agent_version=None)  # fmt: skip


async def steady(run: Run) -> Any:
    doc = await run.tool("read_doc", 1)
    return (await run.model([{"role": "user", "content": doc}])).content


async def wedged(run: Run) -> Any:
    """Stops talking to the host after its first step: the guest process blocks for an hour."""
    await run.tool("read_doc", 1)
    time.sleep(3600)
    return "never"


async def hanging(run: Run) -> Any:
    """Calls a host tool that never returns."""
    await run.tool("read_doc", 1)
    return await run.tool("wait_forever", 1)


def steady_spec() -> AgentSpec:
    return _spec(steady)


def wedged_spec() -> AgentSpec:
    return _spec(wedged)


def hanging_spec() -> AgentSpec:
    return _spec(hanging)


def exploding_spec() -> AgentSpec:
    """A request naming this agent fails its worker: the factory raises on the host, while the
    worker loads the agent, with an error no handler expects."""
    raise RuntimeError("the exploding agent's factory raised on the host")
