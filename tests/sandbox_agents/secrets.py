"""An agent whose tool output carries secrets (for the sandbox channel test)."""

from __future__ import annotations

from typing import Any

from runledger import AgentSpec, Run, ScriptedModel, tool

API_KEY = "sk-proj-" + "Q7x9" * 10
CARD = "4111 1111 1111 1111"


@tool("fetch_profile")
def fetch_profile(args: Any) -> dict[str, Any]:
    return {"note": f"customer card {CARD}, their key is {API_KEY}", "name": "Ana"}


async def agent(run: Run) -> Any:
    profile = await run.tool("fetch_profile", {"id": 1})
    reply = await run.model([{"role": "user", "content": f"summarise {profile['note']}"}])
    return {"name": profile["name"], "reply": reply.content}


def spec() -> AgentSpec:
    return AgentSpec("secrets", agent, ScriptedModel(lambda m: "summary ok"), tools=[fetch_profile])
