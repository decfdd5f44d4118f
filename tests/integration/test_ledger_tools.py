"""Typed tools in a recorded run (runledger.sdk.tools): an ordinary tool-calling agent whose tools
take keyword arguments; arguments the model got wrong are recorded as the tool's failure and
replay identically; a resumed run does not call recorded tools again; the version tuple holds the
hash of the schema derived from the signatures."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from runledger import AgentSpec, ModelResponse, Run, ScriptedModel, ToolFailedError, VersionMismatchError, tool
from runledger.log.client import LedgerClient
from runledger.ops.decisions import approve
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.effects import read_key
from runledger.sdk.lifecycle import resume_run, start_run

pytestmark = pytest.mark.integration

CALLS: dict[str, list[Any]] = {"lookup_order": [], "refund": []}
THREADS: list[int] = []


@tool
def lookup_order(order: str, include_items: bool = False) -> dict[str, Any]:
    """Look up an order."""
    CALLS["lookup_order"].append((order, include_items))
    THREADS.append(threading.get_ident())
    return {"order": order, "amount": 950.0, "items": ["laptop"] if include_items else []}


@tool("refund", effect="irreversible", key=lambda a: f"refund:{a['order']}")
async def refund(order: str, amount: float) -> dict[str, Any]:
    """Refund an order."""
    CALLS["refund"].append((order, amount))
    return {"refunded": amount, "order": order}


def _call(name: str, arguments: dict[str, Any]) -> ModelResponse:
    """A model's tool call, as OpenAI-compatible endpoints return it (arguments as JSON text)."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    return ModelResponse(content="", tool_calls=[{"id": f"call-{name}", "type": "function", "function": function}])


def careless_model(messages: list[dict[str, Any]]) -> str | ModelResponse:
    """Gets each tool's arguments wrong once, then corrects itself from the error it is shown."""
    last = str(messages[-1]["content"])
    if last.startswith("ticket"):
        return _call("lookup_order", {"order": "order-7777", "include_items": "yes please"})
    if "include_items" in last and "invalid arguments" in last:
        return _call("lookup_order", {"order": "order-7777", "include_items": True})
    if last.startswith("result lookup_order"):
        return _call("refund", {"order": "order-7777", "amount": "all of it"})
    if "amount" in last and "invalid arguments" in last:
        return _call("refund", {"order": "order-7777", "amount": 950.0})
    return "done"


async def support_agent(run: Run) -> dict[str, Any]:
    """An ordinary tool-calling loop: the model picks tools; their results (or errors) go back to it."""
    tools = [{"type": "function", "function": t.json_schema()} for t in (lookup_order, refund)]
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"ticket {run.input['ticket']}"}]
    seen_errors: list[str] = []
    for _ in range(8):
        reply = await run.model(messages, tools=tools)
        if not reply.tool_calls:
            return {"reply": reply.content, "errors": seen_errors}
        call = reply.tool_calls[0]["function"]
        name, args = call["name"], json.loads(call["arguments"])
        if name == "refund" and args.get("amount") == 950.0:
            await run.approval("refund", args)  # large refunds wait for an operator: the run suspends
        try:
            result = await run.tool(name, args)
        except ToolFailedError as exc:
            seen_errors.append(str(exc))
            messages.append({"role": "tool", "content": str(exc)})
        else:
            messages.append({"role": "tool", "content": f"result {name} {json.dumps(result, sort_keys=True)}"})
    raise AssertionError("the agent did not finish")


def make_spec() -> AgentSpec:
    return AgentSpec(
        "typed-tools",
        support_agent,
        ScriptedModel(careless_model),
        tools=[lookup_order, refund],
        agent_version="v1",
    )


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    for calls in CALLS.values():
        calls.clear()
    THREADS.clear()


async def test_bad_arguments_are_recorded_failures_and_a_resume_runs_no_recorded_tool_again(
    client: LedgerClient,
) -> None:
    spec = make_spec()
    first = await start_run(client, spec, {"ticket": "T-1"}, run_id="typed1")
    assert first.status == "suspended"
    assert CALLS == {"lookup_order": [("order-7777", True)], "refund": []}  # the bad call never ran
    assert THREADS and threading.get_ident() not in THREADS  # sync tools run off the event loop

    cp = fold((await load_run(client, "typed1")).records)
    steps = [(s.kind, s.name, s.status) for s in cp.steps.values()]
    assert steps == [
        ("model", "scripted-1", "ok"),
        ("tool", "lookup_order", "error"),
        ("model", "scripted-1", "ok"),
        ("tool", "lookup_order", "ok"),
        ("model", "scripted-1", "ok"),
        ("tool", "refund", "error"),  # an effect tool with bad arguments: a failed tool step, no key
        ("model", "scripted-1", "ok"),
        ("approval", "refund", "pending"),
    ]
    bad_lookup, bad_refund = cp.steps[1], cp.steps[5]
    assert bad_lookup.error is not None and bad_lookup.error["type"] == "ToolArgumentsError"
    assert bad_lookup.error["message"].startswith("invalid arguments for tool 'lookup_order': include_items: ")
    assert "yes please" not in bad_lookup.error["message"]
    assert bad_refund.error is not None and "amount: Input should be a valid number" in bad_refund.error["message"]
    assert (await read_key(client, "refund:order-7777")).status == "free"
    # What is recorded is the JSON object the agent passed, bad values included.
    log = await load_run(client, "typed1")
    called = [e.body for e in log.events if e.type == "tool.called"]
    assert called[0].args == {"order": "order-7777", "include_items": "yes please"}
    # The version tuple holds the hash of each signature's schema.
    started = next(e.body for e in log.events if e.type == "run.started")
    hashes = {"lookup_order": lookup_order.schema_hash, "refund": refund.schema_hash}
    assert started.version.tool_schema_hashes == hashes

    await approve(client, "typed1", first.pending[0], by="op")
    second = await resume_run(client, make_spec(), "typed1")
    assert second.status == "completed", second.error
    # The replay raised the recorded failures again, word for word: the model saw the same errors.
    assert second.output["reply"] == "done"
    assert second.output["errors"] == [
        f"tool 'lookup_order' (step 1) raised ToolArgumentsError: {bad_lookup.error['message']}",
        f"tool 'refund' (step 5) raised ToolArgumentsError: {bad_refund.error['message']}",
    ]
    # Recorded tool calls were not run again; the refund ran once, after the approval.
    assert CALLS == {"lookup_order": [("order-7777", True)], "refund": [("order-7777", 950.0)]}
    assert (await read_key(client, "refund:order-7777")).status == "committed"


async def test_changing_a_parameter_type_changes_the_version_tuple(client: LedgerClient) -> None:
    first = await start_run(client, make_spec(), {"ticket": "T-2"}, run_id="typed2")
    assert first.status == "suspended"

    @tool("lookup_order")
    def lookup_order_v2(order: int, include_items: bool = False) -> dict[str, Any]:
        return {}

    changed = AgentSpec(
        "typed-tools", support_agent, ScriptedModel(careless_model), tools=[lookup_order_v2, refund], agent_version="v1"
    )
    with pytest.raises(VersionMismatchError) as info:
        await resume_run(client, changed, "typed2")
    assert info.value.differs == ["tool_schema_hashes"]
