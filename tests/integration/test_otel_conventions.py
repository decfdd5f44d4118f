"""Every span the OTLP export sends, for runs of each integration, checked against the GenAI semantic
conventions' required and conditionally required attributes (``tests/otel_conventions.py``).

Runs are recorded on a real nats-server through each way an agent is built: the plain SDK (the
refund example's runs, a branch, parallel tool calls, a child run, a failed tool, and a model whose
id names its provider), the ``openai`` package against a local server speaking the chat-completions
and responses wire formats (a tool-call turn without a finish reason, a streamed call, request
parameters, and the rest of its surface: parse, stream(), embeddings...), a LangGraph thread through
``RunledgerSaver`` with LangChain model and tools, the MCP example against its real MCP server
process, a Pydantic AI agent with RunledgerDurability, and an OpenAI Agents SDK agent (tools, an
effect, a handoff) through its own Responses model against a local Responses API, and a Microsoft
Agent Framework workflow checkpointed on the ledger (its executors' side effects as effects). They
are exported to a real OTLP/HTTP receiver; each span it decodes is validated with the facts of its
call taken from the record. A span broken on purpose, one attribute at a time, fails the validator.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.types import Command

from runledger import AgentSpec, ModelResponse, Run, ScriptedModel
from runledger.examples.langgraph_support.agent import SupportChatModel, build_graph
from runledger.examples.langgraph_support.agent import spec as support_spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.integrations.langgraph import RunledgerSaver, thread_run_id
from runledger.integrations.openai import OpenAIModel, recorded
from runledger.integrations.otel import export_runs, otlp_exporter, trace_id_of
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.sdk.lifecycle import start_run
from tests.integration import test_openai_sdk as wire
from tests.integration import test_otel_export as otel_export
from tests.integration.test_openai_complete import surface_script, use_the_surface
from tests.integration.test_openai_sdk import API_KEY, QUICK, TOOLS, Answer, Server, chat_sse, completion, response
from tests.integration.test_otel_export import OtlpReceiver, lookup, record
from tests.otel_conventions import SCHEMA_URL, ExportedSpan, Known, exported, problems, record_facts

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
UNKNOWN = "unknown"  # the export's custom gen_ai.provider.name where no well-known value applies
receiver = otel_export.receiver  # the fixtures: a real OTLP/HTTP receiver, a server of OpenAI's wire formats
server = wire.server


def received(receiver: OtlpReceiver) -> list[tuple[bytes, ExportedSpan, Any]]:
    """(trace id, the span for the validator, the raw span) of everything the receiver decoded."""
    out = []
    with receiver.lock:
        for request in receiver.requests:
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    out += [(s.trace_id, exported(s, ss.schema_url, rs.schema_url), s) for s in ss.spans]
    return out


def step_of(span: ExportedSpan) -> int | None:
    step = span.attributes.get("runledger.step")
    return step if isinstance(step, int) else None


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname and parts.port
    return parts.hostname, parts.port


async def check_every_span(
    client: LedgerClient, receiver: OtlpReceiver, runs: Mapping[str, Known | str | None], content: bool
) -> dict[str, list[ExportedSpan]]:
    """Export ``runs`` (run id -> what the test knows of its calls: ``Known``, or the provider its model
    calls had, None: any), validate every span the receiver got; returns each run's spans."""
    receiver.clear()
    result = await export_runs(client, runs, otlp_exporter(receiver.url), content=content)
    spans = received(receiver)
    assert len(spans) == result.spans > len(runs)
    by_run: dict[str, list[ExportedSpan]] = {}
    found = []
    for run_id, provider in runs.items():
        facts = record_facts(await load_run(client, run_id), provider)
        mine = [span for trace, span, _ in spans if trace == trace_id_of(run_id).to_bytes(16, "big")]
        assert len(mine) == len(facts), run_id  # a span per step and the root, each with its facts
        by_run[run_id] = mine
        for span in mine:
            assert span.resource_schema_url == SCHEMA_URL
            found += [f"{run_id} {span.name!r}: {p}" for p in problems(span, facts[step_of(span)])]
    assert sum(map(len, by_run.values())) == len(spans)  # every span was validated
    assert found == [], "spans that break the GenAI conventions:\n" + "\n".join(found)
    return by_run


def named(spans: list[ExportedSpan], name: str) -> list[dict[str, Any]]:
    return [s.attributes for s in sorted(spans, key=lambda s: step_of(s) or -1) if s.name == name]


def root(spans: list[ExportedSpan]) -> dict[str, Any]:
    return next(s.attributes for s in spans if step_of(s) is None)


# -- the plain SDK ---------------------------------------------------------------------------------------


def claude_spec() -> AgentSpec:
    """A model whose id names its provider; a tool-call turn whose reply gives no finish reason."""
    turn = ModelResponse(
        content="",
        tool_calls=[{"id": "toolu_1", "type": "function", "function": {"name": "lookup", "arguments": '{"id": 3}'}}],
        input_tokens=12,
        output_tokens=5,
    )

    async def agent(run: Run) -> Any:
        ask = [{"role": "user", "content": "look up order 3"}]
        reply = await run.model(ask, temperature=0, seed=11, stop="END", max_tokens=100)
        found = await run.tool("lookup", json.loads(reply.tool_calls[0]["function"]["arguments"]), fn=lookup)
        return (await run.model([*ask, {"role": "tool", "tool_call_id": "toolu_1", "content": str(found)}])).content

    return AgentSpec("claude-agent", agent, ScriptedModel([turn, "order 3 found"], name="claude-sonnet-4-5"),
                     agent_version="c1")  # fmt: skip


async def test_plain_sdk_runs_conform(client: LedgerClient, tmp_path: Path, receiver: OtlpReceiver) -> None:
    runs: dict[str, str | None] = {run_id: UNKNOWN for run_id in (await record(client, tmp_path)).values()}
    claude = (await start_run(client, claude_spec(), {}, labels={"gen_ai.conversation.id": "conv-7"})).run_id
    runs[claude] = "anthropic"
    for content in (False, True):
        spans = await check_every_span(client, receiver, runs, content)
    chat, after = named(spans[claude], "chat claude-sonnet-4-5")
    assert chat["gen_ai.provider.name"] == "anthropic" == root(spans[claude])["gen_ai.provider.name"]
    assert root(spans[claude])["gen_ai.request.model"] == "claude-sonnet-4-5"
    assert "server.address" not in chat  # a scripted model calls no server
    assert chat["gen_ai.response.finish_reasons"] == ["tool_call"]  # the reply gave none: not "stop"
    assert after["gen_ai.response.finish_reasons"] == ["stop"]
    assert (chat["gen_ai.request.temperature"], chat["gen_ai.request.seed"]) == (0.0, 11)
    assert (chat["gen_ai.request.stop_sequences"], chat["gen_ai.request.max_tokens"]) == (["END"], 100)
    assert "gen_ai.request.stream" not in chat
    assert chat["gen_ai.conversation.id"] == "conv-7" == root(spans[claude])["gen_ai.conversation.id"]
    output = json.loads(chat["gen_ai.output.messages"])
    assert output[0]["finish_reason"] == "tool_call"
    assert output[0]["parts"] == [{"type": "tool_call", "id": "toolu_1", "name": "lookup", "arguments": {"id": 3}}]
    tool = named(spans[claude], "execute_tool lookup")[0]
    assert (tool["gen_ai.tool.call.id"], json.loads(tool["gen_ai.tool.call.arguments"])) == ("toolu_1", {"id": 3})


# -- the openai package ----------------------------------------------------------------------------------


async def test_openai_runs_conform(client: LedgerClient, server: Server, receiver: OtlpReceiver) -> None:
    silent = completion(None, [{"id": "call_q", "type": "function",
                                "function": {"name": "lookup", "arguments": '{"order": "o-9"}'}}])  # fmt: skip
    silent["choices"][0]["finish_reason"] = None  # a server that gives no finish reason
    server.script = [Answer(body=silent), Answer(sse=chat_sse(completion("streamed"))), Answer(body=response("hi"))]

    async def agent(run: Run) -> str:
        async with openai.AsyncOpenAI(api_key=API_KEY, base_url=server.url) as sdk:
            oa = recorded(sdk, run)
            ask = [{"role": "user", "content": "order o-9?"}]
            await oa.chat.completions.create(
                model="gpt-test", messages=ask, tools=TOOLS, temperature=0.2, top_p=0.9, max_tokens=64, seed=7, n=2,
                stop=["END"], response_format={"type": "json_object"},
            )  # fmt: skip
            stream = await oa.chat.completions.create(
                model="gpt-test", messages=ask, stream=True, stream_options={"include_usage": True}
            )
            async with stream:
                _ = [chunk async for chunk in stream]
            return (await oa.responses.create(model="gpt-test", input="say hi")).output_text

    spec = AgentSpec("openai-sdk", agent, OpenAIModel(model="gpt-test", retry=QUICK), agent_version="v1")
    run_id = (await start_run(client, spec, labels={"gen_ai.conversation.id": "conv-42"})).run_id
    known = Known("openai", server=host_port(server.url))
    for content in (False, True):
        spans = (await check_every_span(client, receiver, {run_id: known}, content))[run_id]
    first, streamed, responses = named(spans, "chat gpt-test")
    assert first["gen_ai.provider.name"] == "openai" == root(spans)["gen_ai.provider.name"]
    assert root(spans)["gen_ai.request.model"] == "gpt-test"
    assert all((s["server.address"], s["server.port"]) == known.server for s in (first, streamed, responses))
    assert (first["gen_ai.response.id"], first["gen_ai.response.model"]) == ("chatcmpl-1", "gpt-test")
    assert first["gen_ai.response.finish_reasons"] == ["tool_call"]  # none given: not the adapter's "stop"
    assert (first["gen_ai.request.temperature"], first["gen_ai.request.top_p"]) == (0.2, 0.9)
    assert (first["gen_ai.request.seed"], first["gen_ai.request.choice.count"]) == (7, 2)
    assert (first["gen_ai.request.max_tokens"], first["gen_ai.output.type"]) == (64, "json")
    assert first["gen_ai.request.stop_sequences"] == ["END"]
    assert "gen_ai.request.stream" not in first and streamed["gen_ai.request.stream"] is True
    assert streamed["gen_ai.response.finish_reasons"] == ["stop"]
    assert responses["gen_ai.response.id"] == "resp_1"
    assert all(s["gen_ai.conversation.id"] == "conv-42" for s in (first, streamed, responses, root(spans)))
    call = json.loads(first["gen_ai.output.messages"])[0]["parts"][0]
    assert (call["name"], call["arguments"]) == ("lookup", {"order": "o-9"})


async def test_the_rest_of_the_openai_surface_conforms(
    client: LedgerClient, server: Server, receiver: OtlpReceiver
) -> None:
    """parse, stream(), with_raw_response, with_options, embeddings and models, as the OpenAI
    integration records them: embeddings are an embeddings span, stream() a streamed request."""
    server.script = surface_script()

    async def agent(run: Run) -> str:
        async with openai.AsyncOpenAI(api_key=API_KEY, base_url=server.url) as sdk:
            await use_the_surface(recorded(sdk, run), [])
        return "ok"

    spec = AgentSpec("openai-surface", agent, OpenAIModel(model="gpt-test", retry=QUICK), agent_version="v1")
    run_id = (await start_run(client, spec)).run_id
    for content in (False, True):
        spans = (await check_every_span(client, receiver, {run_id: Known("openai", server=host_port(server.url))},
                                        content))[run_id]  # fmt: skip
    parsed, streamed, raw, tuned = named(spans, "chat gpt-test")
    assert parsed["gen_ai.output.type"] == "json" == streamed["gen_ai.output.type"]
    assert streamed["gen_ai.request.stream"] is True
    assert not any("gen_ai.request.stream" in s for s in (parsed, raw, tuned))
    (embedded,) = named(spans, "embeddings text-emb")
    assert embedded["gen_ai.operation.name"] == "embeddings" and embedded["gen_ai.provider.name"] == "openai"
    assert (embedded["gen_ai.response.model"], embedded["gen_ai.usage.input_tokens"]) == ("text-emb", 4)
    assert not {"gen_ai.output.messages", "gen_ai.usage.output_tokens"} & set(embedded)


# -- LangGraph and LangChain -----------------------------------------------------------------------------


class ProviderChatModel(SupportChatModel):
    """The support model answering as a LangChain provider integration does: its reply names the
    provider, the model and the response id, and a tool-call turn gives Anthropic's ``stop_reason``
    (no ``finish_reason``)."""

    model_name: str = "support-bot-1"
    anthropic_api_url: str = "https://api.anthropic.com"  # where ChatAnthropic keeps its endpoint

    @staticmethod
    def _reply(messages: list[BaseMessage]) -> AIMessage:
        reply = SupportChatModel._reply(messages)
        reply.response_metadata = {
            "model_provider": "anthropic", "model_name": "claude-haiku-4-5-20251001", "id": "msg_01XyZ",
            "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
        }  # fmt: skip
        return reply


@pytest.fixture
def payments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    service = PaymentsService(tmp_path / "payments.log").start()
    monkeypatch.setenv("REFUND_PAYMENTS_URL", service.url)
    try:
        yield
    finally:
        service.stop()


async def test_langgraph_threads_conform(client: LedgerClient, receiver: OtlpReceiver, payments: None) -> None:
    thread = "ana@example.com/chat 1"
    saver = RunledgerSaver(client, agent=support_spec())
    graph = build_graph(saver, ProviderChatModel())
    config: Any = {"configurable": {"thread_id": thread}}
    await graph.ainvoke({"messages": [HumanMessage(content="Please refund order-8891, it arrived broken.")]}, config)
    await graph.ainvoke(Command(resume={"approved": True}), config)
    if hasattr(saver, "acomplete"):
        await saver.acomplete(config, {"thread": thread})
    run_id = thread_run_id(thread)
    known = Known("anthropic", server=("api.anthropic.com", 443), described=True)
    for content in (False, True):
        spans = (await check_every_span(client, receiver, {run_id: known}, content))[run_id]
    turns = named(spans, "chat support-bot-1")
    assert len(turns) == 3
    assert root(spans)["gen_ai.request.model"] == "support-bot-1"  # not the adapter's "langchain"
    assert all((t["server.address"], t["server.port"]) == ("api.anthropic.com", 443) for t in turns)
    assert all(t["gen_ai.conversation.id"] == thread for t in [*turns, root(spans)])
    assert all(t["gen_ai.provider.name"] == "anthropic" for t in turns)
    assert (turns[0]["gen_ai.response.id"], turns[0]["gen_ai.response.model"]) == (
        "msg_01XyZ", "claude-haiku-4-5-20251001",
    )  # fmt: skip
    # Anthropic's own stop_reason, kept as given
    assert [t["gen_ai.response.finish_reasons"] for t in turns] == [["tool_use"], ["tool_use"], ["end_turn"]]
    calls = [json.loads(t["gen_ai.output.messages"])[0]["parts"][0] for t in turns[:2]]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("lookup_order", {"order": "order-8891"}), ("refund", {"order": "order-8891", "amount": 49.9}),
    ]  # fmt: skip
    history = json.loads(turns[2]["gen_ai.input.messages"])
    asked = [p for m in history for p in m["parts"] if p["type"] == "tool_call"]
    assert asked and all(p["arguments"] is not None for p in asked)  # LangChain's "args", not null
    answered = [p for m in history for p in m["parts"] if p["type"] == "tool_call_response"]
    assert [p["id"] for p in answered] == ["call-lookup", "call-refund"]
    tools = {s.name for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"}
    assert tools == {"execute_tool lookup_order", "execute_tool refund"}


# -- the validator fails a broken span -------------------------------------------------------------------


async def test_a_span_broken_on_purpose_fails_the_validator(
    client: LedgerClient, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    run_id = (await start_run(client, claude_spec(), {}, labels={"gen_ai.conversation.id": "conv-7"})).run_id
    spans = (await check_every_span(client, receiver, {run_id: "anthropic"}, content=True))[run_id]
    facts = record_facts(await load_run(client, run_id), "anthropic")
    chat = next(s for s in spans if s.name == "chat claude-sonnet-4-5")
    tool = next(s for s in spans if s.name == "execute_tool lookup")
    top = next(s for s in spans if step_of(s) is None)

    def broken(span: ExportedSpan, **changes: Any) -> list[str]:
        attrs = {k: v for k, v in span.attributes.items() if changes.get(k, "") is not None}
        attrs |= {k: v for k, v in changes.items() if v is not None and not k.startswith("_")}
        bad = ExportedSpan(changes.get("_name", span.name), changes.get("_kind", span.kind), attrs,
                           changes.get("_error", span.error), changes.get("_scope", span.scope_schema_url))  # fmt: skip
        return problems(bad, facts[step_of(span)])

    assert problems(chat, facts[step_of(chat)]) == []
    assert broken(chat, **{"gen_ai.provider.name": None}) == ["required gen_ai.provider.name missing"]
    assert broken(chat, **{"gen_ai.provider.name": "openai"}) == [
        "gen_ai.provider.name='openai', but the record says 'anthropic'"
    ]
    assert broken(chat, **{"gen_ai.request.seed": None}) == ["conditionally required gen_ai.request.seed missing"]
    assert broken(chat, **{"gen_ai.request.stream": True}) == [
        "gen_ai.request.stream is true for a request that was not streamed"
    ]
    assert broken(chat, **{"gen_ai.conversation.id": None}) == ["conditionally required gen_ai.conversation.id missing"]
    assert broken(chat, **{"gen_ai.request.temperature": 0}) == ["gen_ai.request.temperature=0 is not a double"]
    assert broken(chat, **{"gen_ai.system": "anthropic"}) == ["deprecated attribute gen_ai.system"]
    assert broken(chat, _name="chat") == ["span name 'chat', not 'chat claude-sonnet-4-5'"]
    assert broken(chat, _kind="SERVER") == ["span kind SERVER, not CLIENT or INTERNAL"]
    assert broken(chat, _scope="") == [f"instrumentation scope schema URL '', not {SCHEMA_URL}"]
    assert broken(chat, **{"gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": []}])}) == [
        "gen_ai.output.messages[0] lacks finish_reason"
    ]
    assert broken(tool, **{"gen_ai.tool.name": None}) == [
        "required gen_ai.tool.name missing", "span name 'execute_tool lookup', not 'execute_tool None'",
    ]  # fmt: skip
    assert broken(tool, _error=True) == ["span status ERROR, but the call did not fail"]
    assert broken(top, **{"gen_ai.agent.version": None}) == ["conditionally required gen_ai.agent.version missing"]


# -- MCP -------------------------------------------------------------------------------------------------


async def test_mcp_runs_conform(
    client: LedgerClient, receiver: OtlpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runledger.examples.mcp_tools.agent import spec as desk_spec

    monkeypatch.chdir(tmp_path)  # the example's MCP server keeps its tickets in the working directory
    result = await start_run(client, desk_spec(), "T-1")
    assert result.status == "completed", result.error
    mcp = {"mcp.method.name": "tools/call", "network.transport": "pipe", "mcp.protocol.version": True}
    known = Known(UNKNOWN, described=True, mcp=mcp)
    for content in (False, True):
        spans = (await check_every_span(client, receiver, {result.run_id: known}, content))[result.run_id]
    tools = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert all(s.attributes["mcp.method.name"] == "tools/call" for s in tools)
    assert all(s.attributes["gen_ai.tool.description"] for s in tools)  # the server's listing's
    assert tools and all(s.attributes.get("gen_ai.tool.call.arguments") for s in tools)
    assert all(s.attributes.get("gen_ai.tool.call.id") for s in tools)  # the model's calls, matched


# -- Pydantic AI -----------------------------------------------------------------------------------------


async def test_pydantic_ai_runs_conform(client: LedgerClient, receiver: OtlpReceiver) -> None:
    from runledger.integrations.pydantic_ai import agent_spec
    from tests.pydantic_ai_shop import Shop

    result = await start_run(client, agent_spec(Shop().agent(), agent_version="s1"), "refund order o-1")
    assert result.status == "completed", result.error
    for content in (False, True):
        spans = (await check_every_span(client, receiver, {result.run_id: Known(described=True)}, content))[
            result.run_id
        ]
    chats = [s.attributes for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert root(spans)["gen_ai.request.model"] == chats[0]["gen_ai.request.model"] != "pydantic-ai"
    assert len(chats) == 4
    # FunctionModel gives no finish reason: a tool-call turn is tool_call, the answer keeps the recorded stop
    assert [c["gen_ai.response.finish_reasons"] for c in chats] == [["tool_call"]] * 3 + [["stop"]]
    calls = [json.loads(c["gen_ai.output.messages"])[0]["parts"][0] for c in chats[:3]]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("lookup", {"order": "o-1"}), ("lookup", {"order": "o-1"}), ("refund", {"order": "o-1", "amount": 5}),
    ]  # fmt: skip


# -- the OpenAI Agents SDK -------------------------------------------------------------------------------


async def test_openai_agents_runs_conform(
    client: LedgerClient, receiver: OtlpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shop agent (a read tool, an effect, a handoff) through the SDK's own Responses model and
    ``AsyncOpenAI`` client against a local Responses API: each chat span names where the call went."""
    from tests import openai_agents_shop as shop

    fake = shop.FakeResponses()
    with fake.serving() as url:
        monkeypatch.setenv("OA_SHOP_URL", url)
        monkeypatch.setenv("OA_SHOP_LOG", str(tmp_path))
        result = await start_run(client, shop.spec(), "My order o-7 arrived broken.")
    assert result.status == "completed", result.error
    known = Known("openai", server=host_port(url), described=True)
    for content in (False, True):
        spans = (await check_every_span(client, receiver, {result.run_id: known}, content))[result.run_id]
    chats = [s.attributes for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert len(chats) == 4 and all((c["server.address"], c["server.port"]) == known.server for c in chats)
    assert root(spans)["gen_ai.request.model"] == "fake-support" and root(spans)["gen_ai.provider.name"] == "openai"
    tools = {s.attributes["gen_ai.tool.name"]: s.attributes for s in spans if "gen_ai.tool.name" in s.attributes}
    assert sorted(tools) == ["lookup_order", "refund", "transfer_to_closer"]
    assert tools["refund"]["gen_ai.tool.description"].startswith("Refund an order")


# -- Microsoft Agent Framework ----------------------------------------------------------------------------


async def test_agent_framework_workflows_conform(
    client: LedgerClient, nats_url: str, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """A workflow of three executors checkpointed by ``RunledgerCheckpointStorage``, each side effect an
    effect of the run: its root span and its effects' spans conform (it makes no model call)."""
    from runledger import list_runs
    from tests import af_fulfilment

    assert await af_fulfilment.fulfil(nats_url, tmp_path / "witness", "o-otel")
    (run_id,) = [r.run_id for r in await list_runs(client) if r.run_id.startswith("af-")]
    for content in (False, True):
        spans = (await check_every_span(client, receiver, {run_id: None}, content))[run_id]
    assert root(spans)["gen_ai.operation.name"] == "invoke_agent"
    assert sorted(s.name for s in spans if step_of(s) is not None) == [
        "execute_tool charge",
        "execute_tool reserve",
        "execute_tool ship",
    ]
