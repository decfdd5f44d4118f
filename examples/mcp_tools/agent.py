"""An agent whose tools are an MCP server's, each call a recorded step of its run.

    runledger run --agent runledger.examples.mcp_tools.agent:spec --input '"T-1"'
    runledger show RUN_ID           # the find_ticket call (a read tool) and close_ticket (an effect)

The agent spawns the example's server (``server.py`` beside this file) over stdio; the spec declares
the tools the server lists (``McpServer.tools``), so their schemas are in the run's version tuple and a
changed server is refused at resume. ``close_ticket`` is destructive: an effect keyed by the ticket,
closed at most once across crashes and resumes. The model is scripted (no API key needed): it asks for
the lookup, then for the close, as a real model's tool calls would."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from runledger import AgentSpec, ModelResponse, Run, ScriptedModel
from runledger.integrations.mcp import McpServer

SERVER = McpServer.stdio(sys.executable, [str(Path(__file__).with_name("server.py"))])


def _call(name: str, args: dict[str, Any], call_id: str) -> ModelResponse:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    return ModelResponse(content="", tool_calls=[call], finish_reason="tool_calls")


def desk_model() -> ScriptedModel:
    def answer(messages: list[dict[str, Any]]) -> ModelResponse | str:
        ticket = str(messages[0]["content"])
        done = [m for m in messages if m.get("role") == "tool"]
        if not done:
            return _call("find_ticket", {"ticket": ticket}, "call-1")
        if len(done) == 1:
            return _call("close_ticket", {"ticket": ticket, "resolution": "refund sent again"}, "call-2")
        return f"closed {ticket}"

    return ScriptedModel(answer, name="scripted-desk")


async def handle(run: Run) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(run.input)}]
    async with SERVER.session(run) as desk:
        tools = [{"type": "function", "function": t.model_dump(include={"name", "description"}) | {
            "parameters": t.input_schema}} for t in (await desk.list_tools()).tools]  # fmt: skip
        for _ in range(4):
            reply = await run.model(messages, tools=tools)
            if not reply.tool_calls:
                return reply.content
            messages.append({"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls})
            for call in reply.tool_calls:
                fn = call["function"]
                result = await desk.call_tool(fn["name"], json.loads(fn["arguments"]), tool_call_id=call["id"])
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": json.dumps(result.structured_content)})  # fmt: skip
    return "gave up"


def spec() -> AgentSpec:
    """The agent; its tools are listed from the server when a run first needs them (a factory: runledger calls it)."""
    tools = SERVER.tools(keys={"close_ticket": lambda a: f"close:{a['ticket']}"})
    return AgentSpec("mcp-desk", handle, desk_model(), tools=tools, agent_version="v1")
