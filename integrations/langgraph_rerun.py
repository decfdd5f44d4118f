"""Re-runs of a LangGraph thread: the graph as an agent function, re-driven in the sandbox.

``graph_agent(fn, build)`` makes the graph an agent (``GraphAgent``); in a re-run's guest,
``redrive_thread`` builds the same graph on a ``RedriveSaver`` (LangGraph's ``InMemorySaver``, whose
journaled model and tool calls go to the guest's Run API) and invokes it with the thread's recorded
inputs (``thread_invocations``). The design and what was rejected: runledger.integrations.langgraph.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from runledger import require_extra

require_extra("langgraph", "runledger.integrations.langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langchain_core.tools import BaseTool, StructuredTool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.types import Command, StateSnapshot  # noqa: E402

from runledger import (  # noqa: E402
    AgentSpec,
    Budgets,
    ConfigurationError,
    DataPolicy,
    Event,
    GraphCheckpointed,
    GraphWritesSaved,
    LedgerClient,
    ModelAdapter,
    Run,
    Tool,
    load_run,
)
from runledger.integrations.langchain import (  # noqa: E402
    ChatModelAdapter,
    JournaledChatModel,
    chat_model_name,
    declare_tool,
    journaled_tool,
)
from runledger.integrations.langgraph_values import (  # noqa: E402
    DEFAULT_AGENT,
    NULL_TASK_ID,
    RESUME,
    START_CHANNEL,
    record_to_typed,
)

T = TypeVar("T")
G = TypeVar("G")


def call_in_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], owner: str) -> T:
    """Run ``coro`` on ``loop`` from another thread and return its result: the blocking twins of a saver's
    async methods. Raises InvalidStateError when called from the loop's own thread (it would deadlock)."""
    with contextlib.suppress(RuntimeError):
        if asyncio.get_running_loop() is loop:
            coro.close()
            raise asyncio.InvalidStateError(
                f"synchronous calls to {owner} are only allowed from a thread other than its event "
                "loop's; in async code use the async methods (graph.ainvoke, aget_state, ...)"
            )
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


class RedriveSaver(InMemorySaver):
    """LangGraph's ``InMemorySaver`` with the journal of a re-run: ``model`` and ``tool`` wrap as
    ``RunledgerSaver``'s do, but their steps go to ``run`` (in the sandbox, the guest's Run API,
    answered by the broker), and nothing of the graph's checkpoints leaves the process.

    Without a run it only collects what a graph declares (``graph_agent`` builds the graph once on
    one to learn its tools and chat models); a step then raises ConfigurationError."""

    def __init__(self, run: Run | None = None, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__()
        self.run = run
        self.loop = loop
        self.tools: dict[str, Tool[Any, Any]] = {}
        self.lc_tools: list[BaseTool] = []
        self.chat_models: list[Any] = []

    async def run_for(self, config: RunnableConfig) -> Run:
        if self.run is None:
            raise ConfigurationError("a RedriveSaver without a run only collects a graph's declarations")
        return self.run

    def model(self, chat_model: Any) -> JournaledChatModel:
        self.chat_models.append(chat_model)
        return JournaledChatModel(model=chat_model, saver=self)

    def tool(self, lc_tool: BaseTool, **declaration: Any) -> StructuredTool:
        declared = declare_tool(lc_tool, **declaration)
        journaled = journaled_tool(lc_tool, self, declared)
        if lc_tool.name not in self.tools:
            self.lc_tools.append(journaled)
        self.tools[lc_tool.name] = declared
        return journaled

    def watch(self, graph: G) -> G:
        """``graph`` as it is: a re-drive's branch is a new run whose end the re-run records, so a
        ``build`` written for ``RunledgerSaver.watch`` builds here too."""
        return graph

    def call_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        if self.loop is None:
            coro.close()
            raise ConfigurationError("this RedriveSaver has no event loop: create it inside one")
        return call_in_loop(self.loop, coro, "RedriveSaver")


GraphBuilder = Callable[[Any], Any]  # saver (RunledgerSaver or RedriveSaver) -> the compiled graph


class GraphAgent(AgentSpec):
    """The ``AgentSpec`` of a LangGraph graph (``graph_agent``): ``runledger rerun --agent
    module:factory`` loads it. ``rerun_input`` is what the re-runner asks of it before a branch
    starts: the thread's recorded inputs, for ``redrive_thread``."""

    async def rerun_input(self, client: LedgerClient, parent_run_id: str, input: Any) -> dict[str, Any]:
        """``input`` (the parent's run input, ``{"thread_id": ...}``) with ``invocations``: the
        thread's inputs and resume values in order (``thread_invocations``), read from the parent's
        record with its content opened. Raises ConfigurationError when the parent records none."""
        log = await load_run(client, parent_run_id, fetch=True)
        invocations = thread_invocations([r.event for r in log.records])
        if not invocations:
            raise ConfigurationError(
                f"run {parent_run_id} records no input of a LangGraph graph (no root checkpoint with source "
                "'input'): only a thread recorded by RunledgerSaver can be re-run"
            )
        return {**(input if isinstance(input, dict) else {}), "invocations": invocations}


def thread_invocations(events: Sequence[Event]) -> list[dict[str, Any]]:
    """The inputs a thread's graph was invoked with, in order, from its run's events: ``{"input":
    record}`` for each root checkpoint whose source is ``input`` (the value of ``__start__``), and
    ``{"resume": record}`` for each ``Command(resume=value)`` (a ``__resume__`` write of no task),
    values as ``typed_to_record`` makes them. An invocation with ``None`` (a continuation after a
    crash) has no input to record. A resume by interrupt id (a dict of ids, derived from
    time-based task ids) and a Command's ``update`` or ``goto`` are not among them."""
    found: list[dict[str, Any]] = []
    for ev in events:
        p = ev.payload
        if p.get("checkpoint_ns", "") != "":
            continue  # a subgraph's checkpoints: its input comes from the root graph
        if ev.type == GraphCheckpointed.TYPE and p.get("source") == "input":
            values = dict(zip(p.get("channels") or [], p.get("values") or [], strict=False))
            if START_CHANNEL in values:
                found.append({"input": values[START_CHANNEL]})
        elif ev.type == GraphWritesSaved.TYPE and p.get("task_id") == NULL_TASK_ID:
            for channel, record in zip(p.get("channels") or [], p.get("writes") or [], strict=False):
                if channel == RESUME:
                    found.append({"resume": record})
    return found


def graph_agent(
    fn: Callable[[Run], Coroutine[Any, Any, Any]],
    build: GraphBuilder,
    *,
    name: str = DEFAULT_AGENT,
    model: ModelAdapter | None = None,
    prompt: str = "",
    budgets: Budgets | None = None,
    data_policy: DataPolicy | None = None,
    agent_version: str | None = None,
) -> GraphAgent:
    """The agent of the graph that ``build(saver)`` compiles, re-run by ``fn`` (an agent function
    in the graph's own module that calls ``redrive_thread``: its package is what the sandbox
    mounts, and its code hash is the version tuple's ``agent_version``).

    ``build`` is called once on a ``RedriveSaver`` to learn the graph's declarations: its tools
    (``saver.tool(...)``, with their effect declarations) become the spec's tools, which a re-run
    calls on the host, and its chat model (``saver.model(...)``) the spec's model, called live from
    the fork on (``ChatModelAdapter`` with the tools bound). A graph with chat models of different
    names needs ``model``. Record the threads with ``RunledgerSaver(client, agent=<this spec>)``."""
    collect = RedriveSaver()
    build(collect)
    if model is None:
        names = {chat_model_name(m) for m in collect.chat_models}
        if len(names) != 1:
            raise ConfigurationError(
                f"graph_agent({name!r}): the graph wraps {len(names)} chat models with saver.model(...) "
                f"({', '.join(sorted(names)) or 'none'}): pass model= (a model adapter, e.g. ChatModelAdapter(...))"
            )
        model = ChatModelAdapter(collect.chat_models[0], tools=collect.lc_tools)
    return GraphAgent(
        name,
        fn,
        model,
        tools=list(collect.tools.values()),
        prompt=prompt,
        agent_version=agent_version,
        budgets=budgets or Budgets(),
        data_policy=data_policy or DataPolicy(),
    )


async def redrive_thread(run: Run, build: GraphBuilder) -> StateSnapshot:
    """Re-drive the thread ``run`` stands for (a re-run's guest): build the graph on a
    ``RedriveSaver`` of ``run`` and invoke it with the recorded inputs (``run.input``, as
    ``GraphAgent.rerun_input`` gathered them). A recorded resume is given only while the graph
    waits at an interrupt (a branch that took another path may never ask); one it then needs and
    the record does not hold leaves it waiting. Returns the thread's last state (``state.interrupts``
    non-empty when it waits)."""
    data = run.input if isinstance(run.input, dict) else {}
    invocations = data.get("invocations")
    if not isinstance(invocations, list) or not invocations or "thread_id" not in data:
        raise ConfigurationError(
            "a re-driven LangGraph thread needs its recorded inputs ({'thread_id', 'invocations'}): re-run it "
            "with an agent made by graph_agent(...)"
        )
    saver = RedriveSaver(run, loop=asyncio.get_running_loop())
    graph = build(saver)
    config: RunnableConfig = {"configurable": {"thread_id": str(data["thread_id"])}}
    for invocation in invocations:
        if "input" in invocation:
            await graph.ainvoke(saver.serde.loads_typed(record_to_typed(invocation["input"])), config)
        elif (await graph.aget_state(config)).interrupts:
            resume = saver.serde.loads_typed(record_to_typed(invocation["resume"]))
            await graph.ainvoke(Command(resume=resume), config)
    state: StateSnapshot = await graph.aget_state(config)
    return state


__all__ = [
    "GraphAgent",
    "GraphBuilder",
    "RedriveSaver",
    "call_in_loop",
    "graph_agent",
    "redrive_thread",
    "thread_invocations",
]
