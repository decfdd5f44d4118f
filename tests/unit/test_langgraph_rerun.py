"""What a LangGraph thread's re-run is made of, without a server: the thread's inputs read from
its events, a model reply as the record keeps it and back, the graph as an agent (its tools,
model and version), and the extras' layer refusing an extra runledger lacks."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, convert_to_openai_messages
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from runledger import ConfigurationError
from runledger.examples.langgraph_support.agent import build_graph, spec, strict_model
from runledger.integrations.langchain import ai_message, model_response
from runledger.integrations.langgraph import (
    GraphAgent,
    graph_agent,
    record_to_typed,
    thread_invocations,
    typed_to_record,
)
from runledger.integrations.langgraph_values import NULL_TASK_ID, RESUME, START_CHANNEL
from runledger.record.events import GENESIS, Event, GraphCheckpointed, GraphWritesSaved, Payload, make_event
from runledger.sandbox.errors import ImageError
from runledger.sandbox.image_extras import extra_requirements

SERDE = JsonPlusSerializer()


def record(value: object) -> dict[str, object]:
    return typed_to_record(SERDE.dumps_typed(value))


def events(*bodies: Payload) -> list[Event]:
    out, prev = [], GENESIS
    for seq, body in enumerate(bodies):
        event, _ = make_event(body, run_id="t", agent="langgraph", seq=seq, prev_hash=prev)
        out.append(event)
        prev = event.hash
    return out


def checkpoint(cid: str, source: str, channels: dict[str, object], ns: str = "") -> GraphCheckpointed:
    return GraphCheckpointed(
        thread_id="t", checkpoint_ns=ns, checkpoint_id=cid, source=source, header={"v": 4},
        metadata={"type": "null"}, channels=list(channels), values=[record(v) for v in channels.values()],
    )  # fmt: skip


def writes(cid: str, task: str, channels: dict[str, object]) -> GraphWritesSaved:
    return GraphWritesSaved(thread_id="t", checkpoint_id=cid, task_id=task, channels=list(channels),
                            writes=[record(v) for v in channels.values()])  # fmt: skip


def test_a_threads_inputs_and_resume_values_are_read_in_order() -> None:
    first = {"messages": [HumanMessage(content="refund order-8891", id="h1")]}
    found = thread_invocations(events(
        checkpoint("c1", "input", {START_CHANNEL: first}),
        checkpoint("c2", "loop", {"messages": []}),
        writes("c2", "task-1", {"messages": ["x"], RESUME: ["a task's own resume list"]}),
        checkpoint("s1", "input", {START_CHANNEL: {"ignored": True}}, ns="sub:1"),  # a subgraph's input
        writes("c2", NULL_TASK_ID, {RESUME: {"approved": True}}),
        checkpoint("c3", "input", {START_CHANNEL: {"messages": [HumanMessage(content="thanks", id="h2")]}}),
    ))  # fmt: skip
    assert [next(iter(i)) for i in found] == ["input", "resume", "input"]
    assert SERDE.loads_typed(record_to_typed(found[0]["input"])) == first
    assert SERDE.loads_typed(record_to_typed(found[1]["resume"])) == {"approved": True}
    assert thread_invocations(events(checkpoint("c1", "loop", {"messages": []}))) == []


def test_a_model_reply_rebuilt_from_the_record_makes_the_same_prompt() -> None:
    reply = AIMessage(
        content="", id="run-1", response_metadata={"finish_reason": "tool_calls", "model": "x"},
        tool_calls=[{"name": "refund", "args": {"order": "order-8891", "amount": 49.9}, "id": "call-refund"}],
        usage_metadata={"input_tokens": 12, "output_tokens": 9, "total_tokens": 21},
    )  # fmt: skip
    rebuilt = ai_message(model_response(reply))
    assert convert_to_openai_messages([rebuilt]) == convert_to_openai_messages([reply])
    assert rebuilt.tool_calls == reply.tool_calls and rebuilt.usage_metadata == reply.usage_metadata
    assert model_response(rebuilt) == model_response(reply)


def test_the_example_graph_is_an_agent_with_its_tools_model_and_code_version() -> None:
    agent = spec()
    assert isinstance(agent, GraphAgent) and agent.name == "langgraph"
    assert {t.name: t.effect_class for t in agent.tools} == {"lookup_order": "read", "refund": "irreversible"}
    refund = agent.tool_map["refund"]
    assert refund.key is not None and refund.key({"order": "order-1", "amount": 1.0}) == "refund:order-1"
    version = agent.version()
    assert version.model == "scripted-support-1" and version.agent_version.startswith("code:")
    assert strict_model().name == "scripted-strict-1"  # a counterfactual changes the model element only


def test_a_graph_with_two_differently_named_models_needs_model_given() -> None:
    from runledger.examples.langgraph_support.agent import StrictSupportChatModel, SupportChatModel

    def two_models(saver: object) -> object:
        saver.model(StrictSupportChatModel())  # type: ignore[attr-defined]
        return build_graph(saver, SupportChatModel())  # type: ignore[arg-type]

    with pytest.raises(ConfigurationError, match="2 chat models"):
        graph_agent(spec().fn, two_models)
    assert graph_agent(spec().fn, two_models, model=strict_model()).model.name == "scripted-strict-1"


def test_an_extra_runledger_lacks_is_refused() -> None:
    assert any(r.startswith("langgraph==") for r in extra_requirements("langgraph"))
    with pytest.raises(ImageError, match="no extra 'nope'"):
        extra_requirements("nope")
