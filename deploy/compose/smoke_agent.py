"""The agent deploy/compose/smoke.sh records on the cluster and re-runs on the compose workers.

It lives in the checkout, not in runledger, so it reaches the containerised workers the way a
user's agent does: through the checkout mounted at its own path (compose.yaml) and imported as
``deploy.compose.smoke_agent`` (``deploy`` and ``deploy.compose`` are namespace packages), then
mounted into the sandbox from that same host path. It needs nothing but runledger.
"""

from __future__ import annotations

from typing import Any

from runledger import AgentSpec, Run, ScriptedModel, tool


@tool("double")
def double(n: Any) -> int:
    return 2 * int(n)


def _model(messages: list[dict[str, Any]]) -> str:
    return f"the double is {messages[-1]['content']}"


async def agent(run: Run) -> str:
    doubled = await run.tool("double", run.input)
    return (await run.model([{"role": "user", "content": str(doubled)}])).content


def spec() -> AgentSpec:
    return AgentSpec("compose-smoke", agent, ScriptedModel(_model, name="echo-1"), tools=[double], agent_version=None)
