"""A LangGraph support agent recorded by runledger: look up the order, ask a human, refund once.

The graph is ordinary LangGraph: an ``agent`` node calls a chat model with two tools bound, a
``review`` node asks a human to approve a refund with ``interrupt``, and a ``ToolNode`` runs the
tools. Three lines make it a runledger run, crash-safe and exactly once::

    saver = RunledgerSaver(client)                      # checkpoints and writes on the ledger
    model = saver.model(chat_model)                     # model calls: steps of the thread's run
    tools = [saver.tool(lookup_order), saver.tool(refund, effect="irreversible",
             key=lambda a: f"refund:{a['order']}", reconcile=reconcile_refund)]

The refund passes its effect's idempotency key to the payments service of the refund example
(``examples/refund_agent/payments.py``) as the ``Idempotency-Key``. The chat model is scripted
(no model service is reachable here): any LangChain chat model takes its place.

Run one ticket (``REFUND_PAYMENTS_URL`` names the payments service)::

    python -m runledger.examples.langgraph_support.agent --thread T-1 --order order-8891
    python -m runledger.examples.langgraph_support.agent --thread T-1 --order order-8891 --approve

The first stops at the approval; the second (or the first with ``--approve``) resumes the thread
from its last checkpoint, also after a crash anywhere.

Re-run a recorded thread in the sandbox (``spec`` is the graph as an agent: ``graph_agent``), here
with a stricter model that asks for a photo instead of refunding (a counterfactual)::

    runledger rerun T-1 --agent runledger.examples.langgraph_support.agent:spec --mode counterfactual \
        --at-step 2 --set model=runledger.examples.langgraph_support.agent:strict_model
    runledger diff T-1 br-<request id>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import urllib.request
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt

from runledger import EffectContext, LedgerClient, Run, connect
from runledger.examples.refund_agent.agent import ORDERS, payments_url, reconcile_refund
from runledger.integrations.langchain import ChatModelAdapter
from runledger.integrations.langgraph import GraphAgent, RedriveSaver, RunledgerSaver, graph_agent, redrive_thread

# -- tools ---------------------------------------------------------------------------------------------------------


@tool
def lookup_order(order: str) -> dict[str, Any]:
    """Look up an order of the shop by its number."""
    known = ORDERS.get(order)
    if known is not None:
        return {"order": order, **known}
    digits = re.fullmatch(r"order-(\d+)", order)
    if digits is None:
        raise LookupError(f"no order {order!r}")
    # The demo shop's other orders: gift cards, whose price the number tells.
    return {"order": order, "amount": 10.0 + int(digits.group(1)) % 90, "item": "gift card", "status": "delivered"}


@tool
def refund(order: str, amount: float) -> dict[str, Any]:
    """Refund an order: irreversible, so it is declared an effect with a key per order."""
    ctx = EffectContext.current()
    headers = {"Content-Type": "application/json"}
    if ctx is not None:  # None when called outside a run
        headers["Idempotency-Key"] = ctx.key  # the service answers a repeated key with its first refund
    req = urllib.request.Request(
        f"{payments_url()}/refunds",
        data=json.dumps({"order": order, "amount": amount}).encode(),
        headers=headers,
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


# -- the model -----------------------------------------------------------------------------------------------------


class SupportChatModel(BaseChatModel):
    """A scripted chat model that answers as a competent one would, deterministically: look the
    order up, then refund it, then tell the customer. Token usage is estimated from the text."""

    model_name: str = "scripted-support-1"  # the recorded model (the version tuple's)

    @property
    def _llm_type(self) -> str:
        return "scripted-support"

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self  # it knows its two tools

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        reply = self._reply(messages)
        text = "".join(str(m.content) for m in messages)
        reply.usage_metadata = {
            "input_tokens": max(1, len(text) // 4),
            "output_tokens": max(1, len(str(reply.content)) // 4 + 8 * len(reply.tool_calls)),
            "total_tokens": 0,
        }
        return ChatResult(generations=[ChatGeneration(message=reply)])

    @staticmethod
    def _reply(messages: list[BaseMessage]) -> AIMessage:
        request = next(m for m in messages if isinstance(m, HumanMessage))
        order = re.search(r"order-\d+", str(request.content))
        results = {m.name: m for m in messages if isinstance(m, ToolMessage)}
        if order is None:
            return AIMessage(content="Which order is it about?")
        if "lookup_order" not in results:
            call = {"name": "lookup_order", "args": {"order": order.group(0)}, "id": "call-lookup"}
            return AIMessage(content="", tool_calls=[call])
        if "refund" not in results:
            found = json.loads(str(results["lookup_order"].content))
            if found.get("status") != "delivered":
                return AIMessage(content=f"Your {found['item']} has not been delivered yet; no refund.")
            args = {"order": found["order"], "amount": found["amount"]}
            return AIMessage(content="", tool_calls=[{"name": "refund", "args": args, "id": "call-refund"}])
        return AIMessage(content=f"Refunded: {results['refund'].content}")


class StrictSupportChatModel(SupportChatModel):
    """A stricter model for counterfactual re-runs: it never refunds without a photo of the damage."""

    model_name: str = "scripted-strict-1"

    @staticmethod
    def _reply(messages: list[BaseMessage]) -> AIMessage:
        reply = SupportChatModel._reply(messages)
        refunds = [c for c in reply.tool_calls if c["name"] == "refund"]
        if not refunds:
            return reply
        order = refunds[0]["args"]["order"]
        return AIMessage(content=f"Please send us a photo of the damage so we can refund {order}.")


def strict_model() -> ChatModelAdapter:
    """The strict model as the model of a re-run (``--set model=...:strict_model``)."""
    return ChatModelAdapter(StrictSupportChatModel(), tools=[lookup_order, refund])


# -- the graph -----------------------------------------------------------------------------------------------------


class Support(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def build_graph(saver: RunledgerSaver | RedriveSaver, chat_model: BaseChatModel | None = None) -> Any:
    """The support graph, compiled with ``saver``: its model and tools journaled by it."""
    model = saver.model(chat_model or SupportChatModel())
    tools = [
        saver.tool(lookup_order),
        saver.tool(refund, effect="irreversible", key=lambda a: f"refund:{a['order']}", reconcile=reconcile_refund),
    ]
    bound = model.bind_tools(tools)

    async def agent(state: Support) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    def review(state: Support) -> Command[Any]:
        last = state["messages"][-1]
        calls = [c for c in getattr(last, "tool_calls", []) if c["name"] == "refund"]
        if not calls:
            return Command(goto="tools")
        decision = interrupt({"action": "refund", **calls[0]["args"]})  # a human approves, or not
        if decision.get("approved"):
            return Command(goto="tools")
        denied = ToolMessage(content="refund denied by a reviewer", name="refund", tool_call_id=calls[0]["id"])
        return Command(goto=END, update={"messages": [denied]})

    def route(state: Support) -> str:
        return "review" if getattr(state["messages"][-1], "tool_calls", None) else END

    g = StateGraph(Support)
    g.add_node("agent", agent)
    g.add_node("review", review)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["review", END])
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=saver)


async def rerun_thread(run: Run) -> dict[str, Any]:
    """A recorded thread re-driven in the sandbox (``runledger rerun``): the same graph, invoked with
    the thread's recorded inputs and answers, its model and tool calls served by the re-run."""
    state = await redrive_thread(run, build_graph)
    thread = str(run.input["thread_id"])
    if state.interrupts:
        return {"status": "waiting", "thread": thread, "approval": state.interrupts[0].value}
    return {"thread": thread, "answer": str(state.values["messages"][-1].content)}  # what `handle` records


def spec() -> GraphAgent:
    """The support graph as an agent: what `runledger rerun --agent ...:spec` loads, and what its
    threads record (their version tuple)."""
    return graph_agent(rerun_thread, build_graph)


async def handle(client: LedgerClient, thread: str, order: str, approve: bool | None = None) -> dict[str, Any]:
    """Drive the ticket's thread as far as it goes: start it, continue it after a crash (from its
    last checkpoint), and answer its approval with ``approve`` (None: leave it waiting). Returns
    ``{"status": "waiting" | "completed", ...}``."""
    saver = RunledgerSaver(client, agent=spec())
    graph = build_graph(saver)
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    state = await graph.aget_state(config)
    if not state.values:
        await graph.ainvoke({"messages": [HumanMessage(content=f"Please refund {order}, it arrived broken.")]}, config)
    # Not `state.next`: a task whose writes were saved before a crash is no longer "next", yet the
    # graph goes on from it. Any task at all means the thread has not reached its end.
    while (state := await graph.aget_state(config)).tasks:
        if state.interrupts:
            if approve is None:
                return {"status": "waiting", "thread": thread, "approval": state.interrupts[0].value}
            await graph.ainvoke(Command(resume={"approved": approve}), config)
        else:
            await graph.ainvoke(None, config)  # a crash left it mid-way: LangGraph continues from its checkpoint
    answer = str(state.values["messages"][-1].content)
    await saver.acomplete(config, {"thread": thread, "answer": answer})
    return {"status": "completed", "thread": thread, "answer": answer}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="the ledger (runledger up prints it)")
    parser.add_argument("--thread", required=True, help="the ticket's thread id (also its run id)")
    parser.add_argument("--order", required=True)
    decision = parser.add_mutually_exclusive_group()
    decision.add_argument("--approve", action="store_true", help="approve the refund")
    decision.add_argument("--deny", action="store_true", help="deny the refund")
    args = parser.parse_args(argv)

    async def go() -> dict[str, Any]:
        async with await connect(args.nats) as client:
            return await handle(client, args.thread, args.order, True if args.approve else False if args.deny else None)

    print(json.dumps(asyncio.run(go())))


if __name__ == "__main__":
    main()
