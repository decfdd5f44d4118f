"""One rule on every path back to a LangGraph graph: what its nodes observe live they observe again.

A probe graph, ordinary LangGraph code on ``RunledgerSaver`` (or, re-driven, on the guest's
``RedriveSaver``), receives values drawn by the tests (tests/unit/test_replay_paths_langgraph.py):

- ``think`` calls a journaled chat model (``saver.model``): its ``AIMessage`` carries drawn content
  (a string or a list of content blocks), a tool call whose arguments are a drawn dict (key order
  as drawn, whole-number floats), drawn ``response_metadata`` and ``additional_kwargs``;
- LangGraph's own ``ToolNode`` runs the tool call through a journaled read tool (``saver.tool``)
  whose result is drawn: the ``ToolMessage`` holds it as LangChain serialises it;
- ``act`` reads the reply and the tool's message back from the graph's state, calls a journaled
  effect with a drawn result, and writes a drawn value into a state channel (``data``);
- ``final`` reads that channel and calls the model again with the whole history, so a reply that
  differs (an argument dict in another key order) makes the request's digest differ.

Each observation is ``typed`` (tests/replay_paths.py: the type and key order at every node), kept in
``OBSERVED`` (by name: a node that runs again after a kill observes again) and in the graph's own
state (``seen``), which a re-drive's output carries. ``STOP_AFTER`` kills the drive (an uncaught
``BaseException`` inside a node) after that many observations, as a process dies between steps.
"""

from __future__ import annotations

import copy
import json
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from pydantic import BaseModel

from runledger import DataPolicy, Run
from runledger.integrations.langgraph import GraphAgent, RunledgerSaver, graph_agent, redrive_thread
from tests.replay_paths import typed

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient

AGENT = "lg-probe"
VALUES: dict[str, Any] = {}  # "reply", "final", "result", "effect", "data": set by the test
OBSERVED: dict[str, Any] = {}  # what each observation point saw last, typed
ACTED: list[Any] = []  # every real execution of the effect's function
STOP_AFTER: list[int] = []  # when set, the drive dies after that many observations
SEEN: list[str] = []  # the observation points passed in this drive, for STOP_AFTER


class Killed(BaseException):
    """The process dying inside a node: LangGraph records nothing more."""


def observed(value: Any) -> Any:
    """What a node observes of ``value``: ``typed`` at every node, a LangChain message (any pydantic
    model) as its class and fields in order. A ``ToolMessage``'s id is left out: ``add_messages`` names
    a message without one with a fresh uuid4, in every drive, with any checkpointer."""
    if isinstance(value, BaseModel):
        fields = value.model_dump()
        if isinstance(value, ToolMessage):
            fields.pop("id", None)
        return {type(value).__name__: typed(fields)}
    return typed(value)


def see(name: str, value: Any) -> list[Any]:
    entry = [name, observed(value)]
    OBSERVED[name] = entry[1]
    SEEN.append(name)
    if STOP_AFTER and len(SEEN) >= STOP_AFTER[0]:
        raise Killed(f"killed after {len(SEEN)} observations ({name})")
    return [entry]


class DrawnChatModel(BaseChatModel):
    """Answers the first request of a thread with ``VALUES["reply"]`` (an ``AIMessage``'s fields) and
    any later one with ``VALUES["final"]``: what a provider's integration builds from the wire."""

    model_name: str = "drawn-chat-1"

    @property
    def _llm_type(self) -> str:
        return "drawn"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        fields = VALUES["final"] if any(isinstance(m, ToolMessage) for m in messages) else VALUES["reply"]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(**copy.deepcopy(fields)))])


async def _probe(**kwargs: Any) -> Any:
    return VALUES["result"]


def _store(order: str) -> Any:
    ACTED.append(order)
    return VALUES["effect"]


# Any arguments (a JSON schema, not a pydantic model: LangChain hands them to the function as given).
probe = StructuredTool(
    name="probe", description="Answers a drawn value.", coroutine=_probe,
    args_schema={"type": "object", "properties": {}, "additionalProperties": True},
)  # fmt: skip
store = StructuredTool.from_function(_store, name="store", description="A write with a drawn result.")


class Probe(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    data: Any
    seen: Annotated[list[Any], operator.add]


def build_graph(saver: Any) -> Any:
    model = saver.model(DrawnChatModel())
    tools = [saver.tool(probe)]
    stored = saver.tool(store, effect="write", key=lambda a: f"store:{a['order']}")

    async def think(state: Probe) -> dict[str, Any]:
        reply = await model.ainvoke(state["messages"])
        return {"messages": [reply], "seen": see("think.reply", reply)}

    async def act(state: Probe, config: RunnableConfig) -> dict[str, Any]:
        seen = see("act.reply", state["messages"][-2]) + see("act.tool", state["messages"][-1])
        done = await stored.ainvoke({"order": str(config["configurable"]["thread_id"])})
        return {"data": VALUES["data"], "seen": seen + see("act.effect", done)}

    async def final(state: Probe) -> dict[str, Any]:
        seen = see("final.data", state["data"])
        reply = await model.ainvoke(state["messages"])
        return {"messages": [reply], "seen": seen + see("final.reply", reply)}

    g = StateGraph(Probe)
    g.add_node("think", think)
    g.add_node("tools", ToolNode(tools))
    g.add_node("act", act)
    g.add_node("final", final)
    g.add_edge(START, "think")
    g.add_edge("think", "tools")
    g.add_edge("tools", "act")
    g.add_edge("act", "final")
    g.add_edge("final", END)
    return g.compile(checkpointer=saver)


QUESTION = {"messages": [HumanMessage(content="probe", id="h-1")], "data": None, "seen": []}
# Recorded in full: redaction (a drawn digit string may pass for a card number) is a deliberate
# difference between what a node got and what the record keeps, not the one under test.
POLICY = DataPolicy(capture="full")


async def redriven_thread(run: Run) -> Any:
    """A recorded thread re-driven (``runledger rerun``): what its nodes observed, from its last state."""
    state = await redrive_thread(run, build_graph)
    return {"seen": state.values.get("seen")}


def spec() -> GraphAgent:
    return graph_agent(redriven_thread, build_graph, name=AGENT, data_policy=POLICY)


def reset(values: dict[str, Any]) -> None:
    VALUES.clear()
    VALUES.update(values)
    OBSERVED.clear()
    ACTED.clear()
    STOP_AFTER.clear()
    SEEN.clear()


async def drive(
    client: LedgerClient, thread: str, stop_after: int | None = None, *, saver: RunledgerSaver | None = None
) -> list[Any]:
    """The thread driven to its end on ``saver``, by default a saver of its own (a process of its
    own: its index is loaded from the log), killed after ``stop_after`` observations when given.
    Returns what the graph's state says its nodes observed."""
    SEEN.clear()
    STOP_AFTER[:] = [stop_after] if stop_after else []
    saver = saver or RunledgerSaver(client, agent=spec())
    graph = build_graph(saver)
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    try:
        if not (await graph.aget_state(config)).values:
            await graph.ainvoke(copy.deepcopy(QUESTION), config)
        while (await graph.aget_state(config)).tasks:
            await graph.ainvoke(None, config)  # after a crash: LangGraph goes on from its checkpoint
    finally:
        STOP_AFTER.clear()
    state = await graph.aget_state(config)
    seen: list[Any] = state.values["seen"]
    return seen


async def redriven(client: LedgerClient, thread: str, fork_step: int, pool: Any) -> list[Any]:
    """A re-drive of the recorded thread from ``fork_step`` through ``Rerunner.rerun``, its graph on
    the guest's ``RedriveSaver`` (in-process here), the host's ``BranchRun`` answering its steps."""
    from runledger.integrations.langgraph import thread_run_id
    from runledger.sandbox.rerun import Rerunner, RerunRequest
    from runledger.sdk.agent import CodeAllowList

    request = RerunRequest(
        parent_run_id=thread_run_id(thread), agent="tests.langgraph_paths:spec", mode="redrive", fork_step=fork_step
    )
    result = await Rerunner(client, pool, allowed=CodeAllowList((".", "tests"))).rerun(request)
    for sandbox in getattr(pool, "sandboxes", []):
        await sandbox.close()
    assert result.status == "completed", result
    seen: list[Any] = result.output["seen"]
    return seen


def differences(live: list[Any], other: list[Any]) -> str:
    """The first observation that differs, for an assertion's message."""
    for x, y in zip(live, other, strict=False):
        if x != y:
            return f"{x[0]}: live {json.dumps(x[1])[:600]}\n   other {json.dumps(y[1])[:600]}"
    return f"{len(live)} observations live, {len(other)} on the other path"
