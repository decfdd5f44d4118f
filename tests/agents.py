"""Agents used by the crash and resume tests (importable by subprocesses as tests.agents:NAME)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from runledger import AgentSpec, Budgets, ModelResponse, Run, ScriptedModel


def _count(name: str, value: Any) -> Any:
    """Append a call to the file named by $TEST_CALLS_LOG: the tests count real calls."""
    with open(os.environ["TEST_CALLS_LOG"], "a") as f:
        f.write(json.dumps({"call": name, "value": value}) + "\n")
    return {"done": value}


async def spender(run: Run) -> int:
    """Calls the model until its token budget stops it (each call costs 40 tokens)."""
    for i in range(20):
        await run.model([{"role": "user", "content": f"turn {i}"}])
    return 20


def spender_spec() -> AgentSpec:
    reply = ModelResponse(content="ok", input_tokens=30, output_tokens=10)
    return AgentSpec(
        "spender",
        spender,
        ScriptedModel(lambda m: reply, name="fixed-40"),
        agent_version="v1",
        budgets=Budgets(tokens=100),
    )


async def unreconciled(run: Run) -> Any:
    """An effect with no reconcile function: a crash inside it leaves it in doubt."""
    first = await run.tool("read", 1, fn=lambda a: a)
    charged = await run.effect("charge", {"amount": 5}, key="charge:inv-1", fn=lambda a: _count("charge", a))
    return {"first": first, "charged": charged}


def unreconciled_spec() -> AgentSpec:
    return AgentSpec("unreconciled", unreconciled, ScriptedModel([]), agent_version="v1")


def calls(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
