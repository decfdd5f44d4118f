"""The counterfactual agent as a candidate that changes two elements at once: its code (its own
module) and its tools' parameter schemas. ``--set agent=`` refuses it and points to ``--set tools=``."""

from __future__ import annotations

from typing import Any

from runledger import AgentSpec, Run
from tests.sandbox_agents.counterfactual.agent import CLEARER_TOOLS, PROMPT, WitnessModel, ask


async def ask_reschemaed(run: Run) -> dict[str, Any]:
    return await ask(run, "reschemaed")


def spec() -> AgentSpec:
    return AgentSpec("cf", ask_reschemaed, WitnessModel(), tools=CLEARER_TOOLS, prompt=PROMPT)
