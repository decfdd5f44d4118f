"""``runledger.integrations.pydantic_ai`` on the in-memory ledger: a Pydantic AI agent (its own
``FunctionModel`` and ``TestModel``) with ``RunledgerDurability``, crashed in flight and resumed. The
model function's list of answered calls and each tool's own log are the witnesses (the agent is
tests/pydantic_ai_shop.py); the same agent is killed by SIGKILL in a process of its own in
tests/integration/test_pydantic_ai.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.test import TestModel

from runledger import ConfigurationError, LedgerClient, VersionMismatchError, load_run
from runledger.integrations.pydantic_ai import (
    PydanticAIResponse,
    RunledgerDurability,
    agent_spec,
    recording,
    request_messages,
    summary,
)
from runledger.log.memory import MemoryLedger
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run
from tests.pydantic_ai_shop import Crash, Shop, sync_spec_of


@pytest.fixture
async def client() -> AsyncIterator[LedgerClient]:
    c = await MemoryLedger().connect()
    yield c
    await c.close()


async def test_a_run_records_model_requests_and_tool_calls_as_steps(client: LedgerClient) -> None:
    shop = Shop()
    result = await start_run(client, agent_spec(shop.agent(), agent_version="v1"), "refund o-1", run_id="pa-1")
    assert result.status == "completed", result.error
    assert result.output == "done: refunded 5 on o-1"
    assert shop.answered == [1, 3, 5, 7]
    assert shop.tool_log == ["lookup o-1", "lookup o-1", "refund o-1"]
    assert shop.keys == ["refund:o-1"]  # the effect's function sees its idempotency key
    cp = fold((await load_run(client, "pa-1")).records)
    kinds = [(cp.steps[s].kind, cp.steps[s].name) for s in sorted(cp.steps)]
    model = ("model", "function:model:")  # FunctionModel's own name for a function called `model`
    assert kinds == [model, ("tool", "lookup"), model, ("tool", "lookup"), model, ("effect", "refund"), model]
    assert cp.committed_keys == ["refund:o-1"]


@pytest.mark.parametrize("crash_at_call", [2, 3, 4])
async def test_a_crashed_agent_resumes_without_repeating_a_model_or_tool_call(
    client: LedgerClient, crash_at_call: int
) -> None:
    shop = Shop(crash_at_call=crash_at_call)
    spec = agent_spec(shop.agent(), agent_version="v1")
    with pytest.raises(Crash):
        await start_run(client, spec, "refund o-1", run_id="pa-crash")
    before_answered, before_tools = list(shop.answered), list(shop.tool_log)
    assert len(before_answered) == crash_at_call - 1

    shop.crash_at_call = None
    result = await resume_run(client, spec, "pa-crash")
    assert result.status == "completed", result.error
    assert result.output == "done: refunded 5 on o-1"
    # Every call answered before the crash was served from the record: each happened once in all.
    assert shop.answered == [1, 3, 5, 7]
    assert shop.tool_log == ["lookup o-1", "lookup o-1", "refund o-1"]
    assert shop.answered[: len(before_answered)] == before_answered
    assert shop.tool_log[: len(before_tools)] == before_tools


async def test_model_responses_round_trip_through_the_record(client: LedgerClient) -> None:
    """TestModel's response (usage, model name, tool calls with generated arguments) is handed back on
    resume equal to the live one: the whole message history of a replayed run is the live one's."""
    histories: list[list[ModelMessage]] = []
    agent = Agent(TestModel(), name="tm", capabilities=[RunledgerDurability()])

    @agent.tool_plain
    def weather(city: str) -> str:
        return f"sunny in {city}"

    async def fn(run: Any) -> Any:
        with recording(run):
            result = await agent.run("weather?")
        histories.append(result.all_messages())
        if len(histories) == 1:
            raise Crash  # after every step is recorded: the resume replays them all
        return result.output

    spec = agent_spec(agent, agent_version="v1")
    spec = type(spec)(spec.name, fn, spec.model, agent_version="v1")
    with pytest.raises(Crash):
        await start_run(client, spec, None, run_id="pa-tm")
    replayed = await resume_run(client, spec, "pa-tm")
    assert replayed.status == "completed", replayed.error
    live, served = ([m for m in h if m.kind == "response"] for h in histories)
    assert len(served) == 2 and any(p.part_kind == "tool-call" for p in served[0].parts)
    dump = ModelMessagesTypeAdapter.dump_python
    assert dump(served, mode="json") == dump(live, mode="json")
    assert served == live


async def test_the_run_needs_the_pydantic_ai_model_adapter(client: LedgerClient) -> None:
    from runledger import ScriptedModel

    spec = agent_spec(Shop().agent(), agent_version="v1", model=None)
    wrong = type(spec)(spec.name, spec.fn, ScriptedModel(["hi"]), agent_version="v1")
    result = await start_run(client, wrong, "refund o-1", run_id="pa-wrong")
    assert result.status == "failed"
    assert "PydanticAIModel" in str(result.error)


def test_an_agent_without_the_capability_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="RunledgerDurability"):
        agent_spec(Agent(TestModel(), name="plain"))


def test_request_messages_carry_no_timestamps_and_summary_reads_the_response() -> None:
    messages: list[ModelMessage] = ModelMessagesTypeAdapter.validate_python(
        [
            {"kind": "request", "instructions": "be brief",
             "parts": [{"part_kind": "user-prompt", "content": "hi", "timestamp": "2026-01-01T00:00:00Z"}]},
            {"kind": "response", "parts": [{"part_kind": "tool-call", "tool_name": "f", "args": {"x": 1},
                                            "tool_call_id": "t1"}]},
            {"kind": "request", "parts": [{"part_kind": "tool-return", "tool_name": "f", "content": 2,
                                           "tool_call_id": "t1"}]},
        ]
    )  # fmt: skip
    assert request_messages(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "name": "f", "content": "2"},
    ]  # fmt: skip
    response = ModelResponse(parts=[TextPart("ok")], model_name="m")
    payload = ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]
    recorded = summary(payload)
    assert isinstance(recorded, PydanticAIResponse)
    assert (recorded.content, recorded.tool_calls, recorded.finish_reason) == ("ok", [], "stop")
    assert ModelMessagesTypeAdapter.validate_python([recorded.message])[0] == response


async def test_the_example_refunds_once_and_resumes_from_the_record(client: LedgerClient) -> None:
    from runledger.examples.pydantic_ai_support import agent as example

    example.REFUNDS.clear()
    spec = example.spec()
    result = await start_run(client, spec, "Please refund order-8891, it arrived broken.", run_id="pa-example")
    assert result.status == "completed", result.error
    assert example.REFUNDS == {"refund:order-8891": {"refund_id": "rf-1", "order": "order-8891", "amount": 42.0}}
    assert "rf-1" in result.output
    cp = fold((await load_run(client, "pa-example")).records)
    assert [cp.steps[s].kind for s in sorted(cp.steps)] == ["model", "tool", "model", "effect", "model"]
    assert cp.committed_keys == ["refund:order-8891"]
    request = (await load_run(client, "pa-example")).records[1].event.payload["request"]
    instructions = "You are a support agent. Look the order up before you refund it."
    assert request["messages"][0] == {"role": "system", "content": instructions}  # the request as recorded


async def test_parallel_tool_calls_are_steps_in_the_models_order_and_resume(client: LedgerClient) -> None:
    """A response asking for three tools at once: their steps follow the model's order, a crash
    after the second leaves the first two recorded, and the resume runs only the third."""
    calls: list[str] = []
    crash = [True]

    def model(messages: list[ModelMessage], info: Any) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("fetch", {"n": n}, tool_call_id=f"t{n}") for n in (3, 1, 2)])
        returns = [p.content for p in messages[-1].parts if p.part_kind == "tool-return"]
        return ModelResponse(parts=[TextPart(",".join(map(str, returns)))])

    agent = Agent(FunctionModel(model), name="par", capabilities=[RunledgerDurability()])

    @agent.tool_plain
    async def fetch(n: int) -> int:
        if n == 2 and crash[0]:
            raise Crash
        calls.append(f"fetch {n}")
        return n * 10

    spec = agent_spec(agent, agent_version="v1")
    with pytest.raises(Crash):
        await start_run(client, spec, "go", run_id="pa-par")
    assert calls == ["fetch 3", "fetch 1"]
    crash[0] = False
    result = await resume_run(client, spec, "pa-par")
    assert result.status == "completed", result.error
    assert result.output == "30,10,20"
    assert calls == ["fetch 3", "fetch 1", "fetch 2"]
    records = (await load_run(client, "pa-par")).records
    tools = [(r.event.payload["step"], r.event.payload["args"]) for r in records if r.event.type == "tool.called"]
    assert tools == [(1, {"n": 3}), (2, {"n": 1}), (3, {"n": 2})]


async def test_a_tool_whose_arguments_changed_is_a_version_change_at_resume(client: LedgerClient) -> None:
    shop = Shop(crash_at_call=2)
    spec = agent_spec(shop.agent(), agent_version="v1")
    assert sorted(spec.version().tool_schema_hashes) == ["lookup", "refund"]
    with pytest.raises(Crash):
        await start_run(client, spec, "refund o-1", run_id="pa-version")

    changed = Agent(FunctionModel(shop.model), name="shop", capabilities=[RunledgerDurability()])

    @changed.tool_plain
    def lookup(order: str, region: str = "eu") -> dict[str, Any]:  # a new argument
        return {}

    @changed.tool_plain
    async def refund(order: str, amount: int) -> str:
        return ""

    with pytest.raises(VersionMismatchError, match="tool_schema_hashes"):
        await resume_run(client, agent_spec(changed, agent_version="v1"), "pa-version")
    assert shop.tool_log == ["lookup o-1"]


@pytest.mark.parametrize("crash_at_call", [None, 3])
async def test_run_sync_in_a_blocking_agent_function_records_and_resumes_like_run(
    client: LedgerClient, crash_at_call: int | None
) -> None:
    """``agent.run_sync`` (Pydantic AI's blocking entry point) in a ``sync_agent`` function: the same steps
    as ``agent.run``, and a resume after a crash in flight serves every recorded one."""
    shop = Shop(crash_at_call=crash_at_call)
    spec = sync_spec_of(shop)
    if crash_at_call is not None:
        with pytest.raises(Crash):
            await start_run(client, spec, "refund o-1", run_id="pa-sync")
        assert shop.answered == [1, 3] and shop.tool_log == ["lookup o-1", "lookup o-1"]
        shop.crash_at_call = None
        result = await resume_run(client, spec, "pa-sync")
    else:
        result = await start_run(client, spec, "refund o-1", run_id="pa-sync")
    assert result.status == "completed", result.error
    assert result.output == "done: refunded 5 on o-1"
    assert shop.answered == [1, 3, 5, 7]  # each model call once, across the crash
    assert shop.tool_log == ["lookup o-1", "lookup o-1", "refund o-1"]
    assert shop.keys == ["refund:o-1"]  # the effect's function sees its key on the agent's own loop
    cp = fold((await load_run(client, "pa-sync")).records)
    model = ("model", "function:model:")
    kinds = [(cp.steps[s].kind, cp.steps[s].name) for s in sorted(cp.steps)]
    assert kinds == [model, ("tool", "lookup"), model, ("tool", "lookup"), model, ("effect", "refund"), model]


async def test_run_sync_in_an_async_agent_function_is_refused_saying_what_to_use(client: LedgerClient) -> None:
    agent = Shop().agent()

    async def fn(run: Any) -> Any:
        with recording(run):
            return agent.run_sync("refund o-1").output

    spec = agent_spec(agent, agent_version="v1")
    result = await start_run(client, type(spec)(spec.name, fn, spec.model, agent_version="v1"), None, run_id="pa-as")
    assert result.status == "failed"
    assert "ConfigurationError" in str(result.error) and "await agent.run(...)" in str(result.error), result.error
    assert "runledger.sync_agent" in str(result.error), result.error
