"""The counterfactual agent with code that leaves the record before the fork: its first lookup
asks for another question, which the parent's record cannot answer."""

from __future__ import annotations

from typing import Any

from runledger import AgentSpec, Run
from tests.sandbox_agents.counterfactual.agent import PROMPT, TOOLS, WitnessModel, tool_schemas


async def ask_elsewhere(run: Run) -> dict[str, Any]:
    reply = await run.model([{"role": "system", "content": run.prompt}, {"role": "user", "content": "question 0"}],
                            tools=tool_schemas())  # fmt: skip
    found = await run.tool("lookup", {"q": "z"})
    return {"code": "elsewhere", "answers": [[reply.content, found]]}


def spec() -> AgentSpec:
    return AgentSpec("cf", ask_elsewhere, WitnessModel(), tools=TOOLS, prompt=PROMPT)
