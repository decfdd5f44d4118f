"""The mode tests' agent with other code (its own folder, so its own code hash): the same calls up
to the fork point (step 3), then it looks up something else and says which code ran."""

from __future__ import annotations

from typing import Any

from runledger import AgentSpec, Run
from tests.sandbox_agents.modes.agent import PROMPT, TOOLS, CountingModel


async def probe_v2(run: Run) -> dict[str, Any]:
    t0 = (await run.now()).isoformat()
    r0 = await run.random()
    a = await run.tool("lookup", {"q": "a"})
    m1 = (await run.model([{"role": "system", "content": run.prompt}, {"role": "user", "content": "first"}])).content
    b = await run.tool("lookup", {"q": "b, asked by v2"})
    return {"code": "v2", "t0": t0, "r0": r0, "a": a, "m1": m1, "b": b}


def spec() -> AgentSpec:
    return AgentSpec("modes", probe_v2, CountingModel(), tools=TOOLS, prompt=PROMPT)
