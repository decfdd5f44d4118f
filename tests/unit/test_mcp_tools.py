"""runledger.integrations.mcp without a server: how a listing becomes runledger tools."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.types import ListToolsResult, Tool, ToolAnnotations

from runledger import AgentSpec, ConfigurationError, Run, ScriptedModel
from runledger.integrations.mcp import McpServer, effect_class_of


async def agent(run: Run) -> None:
    return None


SCHEMA = {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}


def listed(name: str, schema: dict[str, Any] = SCHEMA, **hints: Any) -> Tool:
    return Tool(name=name, input_schema=schema, annotations=ToolAnnotations(**hints) if hints else None)


@pytest.mark.parametrize(
    ("hints", "expected"),
    [
        ({"read_only_hint": True}, "read"),
        ({"read_only_hint": True, "destructive_hint": True}, "read"),  # destructive means nothing when read-only
        ({}, "irreversible"),  # no annotations: MCP's defaults, not read-only and destructive
        ({"destructive_hint": True}, "irreversible"),
        ({"destructive_hint": False}, "write"),
        ({"destructive_hint": False, "idempotent_hint": True}, "write"),  # still changes the world
        ({"read_only_hint": False, "idempotent_hint": False}, "irreversible"),
    ],
)
def test_annotations_decide_the_class(hints: dict[str, Any], expected: str) -> None:
    assert effect_class_of(listed("t", **hints)) == expected


def test_a_listing_declares_tools_whose_hashes_follow_schema_and_class() -> None:
    server = McpServer.http("http://127.0.0.1:1/mcp")
    listing = ListToolsResult(tools=[listed("lookup", read_only_hint=True), listed("refund")])
    lookup, refund = server.declare(listing, keys={"refund": lambda a: f"refund:{a['order']}"})
    assert (lookup.effect_class, refund.effect_class) == ("read", "irreversible")
    assert refund.key is not None and refund.key({"order": "A1"}) == "refund:A1"
    assert lookup.parameters == SCHEMA
    hashes = {t.name: t.schema_hash for t in (lookup, refund)}

    wider = {**SCHEMA, "properties": {**SCHEMA["properties"], "reason": {"type": "string"}}}
    changed = server.declare(ListToolsResult(tools=[listed("lookup", read_only_hint=True), listed("refund", wider)]))
    assert {t.name: t.schema_hash for t in changed}["refund"] != hashes["refund"]
    assert {t.name: t.schema_hash for t in changed}["lookup"] == hashes["lookup"]
    now_writes = server.declare(ListToolsResult(tools=[listed("lookup", destructive_hint=False)]))
    assert now_writes[0].schema_hash != hashes["lookup"]  # a read tool that became an effect: another tool


def test_an_effect_without_a_key_is_refused_with_the_fix_and_unknown_names_are_refused() -> None:
    server = McpServer.http("http://127.0.0.1:1/mcp")
    (refund,) = server.declare(ListToolsResult(tools=[listed("refund")]))
    assert refund.key is not None
    with pytest.raises(ConfigurationError, match=r"key=\.\.\."):
        refund.key({"order": "A1"})
    with pytest.raises(ConfigurationError, match="does not list"):
        server.declare(ListToolsResult(tools=[listed("refund")]), keys={"refnud": lambda a: "x"})
    with pytest.raises(ConfigurationError, match="stdio or over HTTP"):
        McpServer()


def test_an_unreachable_server_is_named_where_its_tools_are_first_needed() -> None:
    tools = McpServer.http("http://127.0.0.1:1/mcp").tools(keys={"refund": lambda a: "k"})  # no connection yet
    assert not tools.is_declared
    spec = AgentSpec("shop", agent, ScriptedModel(["unused"]), tools=tools)  # nor here
    with pytest.raises(ConfigurationError, match=r"cannot list the tools of the MCP server http://127\.0\.0\.1:1/mcp"):
        spec.version()
