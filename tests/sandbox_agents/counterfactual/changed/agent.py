"""The counterfactual agent with other code (its own module): every model request it sends says
"(v2)", so even the requests before the fork differ from the parent's; its tool calls do not."""

from __future__ import annotations

from typing import Any

from runledger import AgentSpec, Run
from tests.sandbox_agents.counterfactual.agent import PROMPT, TOOLS, WitnessModel, ask


async def ask_v2(run: Run) -> dict[str, Any]:
    return await ask(run, "v2")


def spec() -> AgentSpec:
    return AgentSpec("cf", ask_v2, WitnessModel(), tools=TOOLS, prompt=PROMPT)
