"""One rule on every path back to agent code that calls MCP tools: what it receives live it receives again.

A probe agent calls the tools of the test MCP server (tests/mcp_agents/server.py, over streamable
HTTP) through ``runledger.integrations.mcp``'s ``RecordedSession``: ``echo`` (a read tool) and
``keep`` (a write, an effect keyed in the call) answer the drawn values they are given as structured
content (tests/integration/test_mcp_replay_paths.py draws them: dicts in any key order, whole-number
floats, ``-0.0``, big integers, names beyond U+FFFF). The agent puts what it received into its next
call's arguments (the structured content itself, and its JSON text written without ``sort_keys``),
so a result that differs in key order or number type makes the next call's digest differ. Each
``CallToolResult`` is observed as its class, the fields it has set and its fields in order, typed
at every node (tests/openai_paths.py's ``observed``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from runledger import AgentSpec, DataPolicy, Run, ScriptedModel
from runledger.integrations.mcp import McpServer
from tests.openai_paths import observed
from tests.replay_paths import replay_observed

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.testing import ReplayResult

AGENT = "mcp-probe"
VALUES: dict[str, Any] = {}  # "read", "write": the values the agent sends and gets back
STOP_AFTER: list[int] = []
OBSERVED: list[str] = []
URL: list[str] = []  # the server's endpoint, set by the test


class Killed(BaseException):
    """The process dying between two steps."""


def _saw(seen: list[Any], kind: str, value: Any) -> None:
    seen.append([kind, observed(value)])
    if STOP_AFTER and len(seen) >= STOP_AFTER[0]:
        raise Killed(f"killed after {len(seen)} observations")


async def prober(run: Run) -> Any:
    seen: list[Any] = []
    async with SERVER[0].session(run) as mcp:
        read = await mcp.call_tool("echo", {"value": VALUES["read"]})
        _saw(seen, "read", read)
        text = json.dumps(read.structured_content, ensure_ascii=False)
        order = run.input["order"]
        kept = await mcp.call_tool("keep", {"order": order, "value": [VALUES["write"], text]}, key=f"keep:{order}")
        _saw(seen, "write", kept)
        again = await mcp.call_tool(
            "echo", {"value": [kept.structured_content, json.dumps(kept.structured_content, ensure_ascii=False)]}
        )
        _saw(seen, "again", again)
    text = json.dumps(seen, ensure_ascii=False)
    OBSERVED.append(text)
    return {"observed": text}


SERVER: list[McpServer] = []


def spec() -> AgentSpec:
    SERVER[:] = [McpServer.http(URL[0])]
    tools = SERVER[0].tools(keys={"keep": lambda a: f"keep:{a['order']}"})
    return AgentSpec(AGENT, prober, ScriptedModel(["unused"]), tools=tools, agent_version="mcp-probe-v1",
                     data_policy=DataPolicy(capture="full"))  # fmt: skip


def reset(values: dict[str, Any]) -> None:
    VALUES.clear()
    VALUES.update(values)
    OBSERVED.clear()
    STOP_AFTER.clear()


async def live(client: LedgerClient, run_id: str, order: str) -> str:
    """A recorded run, driven live (``order``: the effect's business identity): what the agent observed."""
    from runledger.sdk.lifecycle import start_run

    result = await start_run(client, spec(), {"order": order}, run_id=run_id)
    assert result.status == "completed", result
    return str(result.output["observed"])


async def resumed(client: LedgerClient, run_id: str, order: str, stop_after: int) -> str:
    """A run killed after ``stop_after`` observations, then resumed: what the resume observed."""
    from runledger.sdk.lifecycle import resume_run, start_run

    STOP_AFTER.append(stop_after)
    try:
        await start_run(client, spec(), {"order": order}, run_id=run_id)
    except Killed:
        pass
    else:
        raise AssertionError("the first drive was not killed")
    STOP_AFTER.clear()
    result = await resume_run(client, spec(), run_id)
    assert result.status == "completed", result
    return str(result.output["observed"])


async def replayed(client: LedgerClient, run_id: str) -> tuple[ReplayResult, str]:
    return await replay_observed(client, run_id, spec(), OBSERVED)


async def redriven(client: LedgerClient, run_id: str, fork_step: int, pool: Any) -> str:
    """A re-drive of the recorded run from ``fork_step`` through ``Rerunner.rerun``: the agent on the
    guest's ``RemoteRun`` (in-process), the host's ``BranchRun`` answering from the record."""
    from runledger.sandbox.rerun import Rerunner, RerunRequest
    from runledger.sdk.agent import CodeAllowList

    request = RerunRequest(parent_run_id=run_id, agent="tests.mcp_paths:spec", mode="redrive", fork_step=fork_step)
    result = await Rerunner(client, pool, allowed=CodeAllowList((".", "tests"))).rerun(request)
    for sandbox in getattr(pool, "sandboxes", []):
        await sandbox.close()
    assert result.status == "completed", result
    return str(result.output["observed"])
