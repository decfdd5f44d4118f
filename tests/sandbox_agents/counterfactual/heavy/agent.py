"""The counterfactual agent as a candidate that imports a package this host has and the sandbox image
lacks (duckdb, the projections' extra): it loads here and not where a re-run runs it."""

from __future__ import annotations

from typing import Any

import duckdb  # noqa: F401  (installed on this host, not in the sandbox image)

from runledger import AgentSpec, Run
from tests.sandbox_agents.counterfactual.agent import PROMPT, TOOLS, WitnessModel, ask


async def ask_heavy(run: Run) -> dict[str, Any]:
    return await ask(run, "heavy")


def spec() -> AgentSpec:
    return AgentSpec("cf", ask_heavy, WitnessModel(), tools=TOOLS, prompt=PROMPT)
