"""A LangGraph thread's run follows its graph, against a real nats-server: completed when the graph
ends, suspended at an interrupt, failed on an error, running again when it is invoked again, with
no runledger-specific call; and ``RunledgerSaver.from_conn_string`` in ``with`` and ``async with``.
"""

from __future__ import annotations

import asyncio
import json
import operator
import threading
from pathlib import Path
from typing import Annotated, Any, TypedDict

import duckdb
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from runledger import ConfigurationError, LedgerClient, connect
from runledger.cli import main
from runledger.integrations.langgraph import RunledgerSaver, thread_run_id
from runledger.log.server import ENV_HOME, ENV_URL, ServerState
from runledger.ops.trace import list_runs
from runledger.projections.projector import project
from runledger.protect.loading import load_run
from runledger.sdk.holder import this_holder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(behaviour: dict[str, str]) -> StateGraph[Any]:
    """prepare -> act: ``act`` returns, interrupts or raises as ``behaviour["act"]`` says."""

    def prepare(state: Log) -> dict[str, Any]:
        return {"log": ["prepared"]}

    def act(state: Log) -> dict[str, Any]:
        how = behaviour.get("act", "return")
        if how == "interrupt":
            return {"log": [f"answer:{interrupt('refund 49.90?')}"]}
        if how == "raise":
            raise RuntimeError("the payments service is down")
        return {"log": ["acted"]}

    g = StateGraph(Log)
    g.add_node("prepare", prepare)
    g.add_node("act", act)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "act")
    g.add_edge("act", END)
    return g


async def _status(client: LedgerClient, thread_id: str) -> str:
    """The status ``runledger runs`` shows for the thread's run."""
    runs = {r.run_id: r for r in await list_runs(client, agent="langgraph")}
    return runs[thread_run_id(thread_id)].status


async def _outcomes(client: LedgerClient, thread_id: str) -> list[str]:
    log = await load_run(client, thread_run_id(thread_id), agent="langgraph", open_content=False)
    return [r.event.type for r in log.records if r.event.type.startswith("run.")]


async def test_a_thread_that_ends_is_completed_in_runs_and_in_the_projection(
    client: LedgerClient, tmp_path: Path
) -> None:
    saver = RunledgerSaver(client)
    graph = _graph({}).compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "ends"}}
    assert (await graph.ainvoke({"log": []}, config))["log"] == ["prepared", "acted"]
    assert await _status(client, "ends") == "completed"
    db = tmp_path / "ledger.duckdb"
    await project(client, db)
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("select status from runs where run_id = ?", [thread_run_id("ends")]).fetchone()
    assert row == ("completed",)
    # Invoked again with new input, the thread's run goes on (re-opened) and completes again.
    await graph.ainvoke({"log": ["again"]}, config)
    assert await _status(client, "ends") == "completed"
    assert await _outcomes(client, "ends") == ["run.started", "run.completed", "run.resumed", "run.completed"]


async def test_an_interrupt_suspends_the_run_and_a_resume_on_a_fresh_saver_completes_it(
    client: LedgerClient, nats_url: str
) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "asks"}}
    out = await _graph({"act": "interrupt"}).compile(checkpointer=RunledgerSaver(client)).ainvoke({"log": []}, config)
    assert out["__interrupt__"][0].value == "refund 49.90?"
    assert await _status(client, "asks") == "suspended"
    other = await connect(nats_url)  # the answer comes in another process
    try:
        graph = _graph({"act": "interrupt"}).compile(checkpointer=RunledgerSaver(other))
        assert (await graph.ainvoke(Command(resume="yes"), config))["log"] == ["prepared", "answer:yes"]
    finally:
        await other.close()
    assert await _status(client, "asks") == "completed"
    assert await _outcomes(client, "asks") == ["run.started", "run.suspended", "run.resumed", "run.completed"]


async def test_an_error_fails_the_run_and_a_retry_completes_it(client: LedgerClient) -> None:
    behaviour = {"act": "raise"}
    graph = _graph(behaviour).compile(checkpointer=RunledgerSaver(client))
    config: RunnableConfig = {"configurable": {"thread_id": "breaks"}}
    with pytest.raises(RuntimeError, match="payments service is down"):
        await graph.ainvoke({"log": []}, config)
    runs = {r.run_id: r for r in await list_runs(client, agent="langgraph")}
    failed = runs[thread_run_id("breaks")]
    assert failed.status == "failed" and "payments service is down" in (failed.error or "")
    behaviour["act"] = "return"
    assert (await graph.ainvoke(None, config))["log"] == ["prepared", "acted"]  # LangGraph's retry
    assert await _status(client, "breaks") == "completed"
    assert await _outcomes(client, "breaks") == ["run.started", "run.failed", "run.resumed", "run.completed"]


@pytest.mark.parametrize("where", ["interrupt_before", "interrupt_after"])
async def test_a_static_breakpoint_suspends_the_run_and_invoking_with_none_completes_it(
    client: LedgerClient, where: str
) -> None:
    saver = RunledgerSaver(client)
    compiled = _graph({}).compile(checkpointer=saver, **{where: ["act" if where == "interrupt_before" else "prepare"]})
    graph = saver.watch(compiled)
    config: RunnableConfig = {"configurable": {"thread_id": where}}
    assert (await graph.ainvoke({"log": []}, config))["log"] == ["prepared"]
    assert (await graph.aget_state(config)).next == ("act",)
    runs = {r.run_id: r for r in await list_runs(client, agent="langgraph")}
    assert runs[thread_run_id(where)].status == "suspended"
    # LangGraph's resume from a breakpoint: the scheduled task's writes re-open the run.
    assert (await graph.ainvoke(None, config))["log"] == ["prepared", "acted"]
    assert await _status(client, where) == "completed"
    assert await _outcomes(client, where) == ["run.started", "run.suspended", "run.resumed", "run.completed"]
    log = await load_run(client, thread_run_id(where), agent="langgraph", open_content=False)
    types = [r.event.type for r in log.records]
    at = types.index("run.suspended")
    assert log.records[at].event.payload["reason"] == where
    assert types[at + 1] == "run.resumed"  # before the resumed task's writes: nothing is recorded while suspended


def test_a_breakpoint_of_a_sync_graph_suspends_its_run(nats_url: str) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "sync-breakpoint"}}
    with RunledgerSaver.from_conn_string(nats_url) as saver:
        graph = saver.watch(_graph({}).compile(checkpointer=saver, interrupt_before=["act"]))
        graph.invoke({"log": []}, config)
        assert saver.call_sync(_status(saver.client, "sync-breakpoint")) == "suspended"
        assert graph.invoke(None, config)["log"] == ["prepared", "acted"]
        assert saver.call_sync(_status(saver.client, "sync-breakpoint")) == "completed"


class Fan(TypedDict):
    log: Annotated[list[str], operator.add]


async def test_a_sibling_that_finishes_after_an_interrupt_leaves_the_run_suspended(client: LedgerClient) -> None:
    """Two parallel nodes: one interrupts at once, the other saves its writes after it. The late
    writes belong to the superstep that ended: the run stays suspended, and the resume completes it."""
    released = asyncio.Event()

    async def ask(state: Fan) -> dict[str, Any]:
        answer = interrupt("ok?")
        return {"log": [f"ask:{answer}"]}

    async def slow(state: Fan) -> dict[str, Any]:
        await asyncio.sleep(0.3)
        released.set()
        return {"log": ["slow"]}

    g = StateGraph(Fan)
    g.add_node("ask", ask)
    g.add_node("slow", slow)
    g.add_edge(START, "ask")
    g.add_edge(START, "slow")
    graph = g.compile(checkpointer=RunledgerSaver(client))
    config: RunnableConfig = {"configurable": {"thread_id": "fan"}}
    await graph.ainvoke({"log": []}, config)
    assert released.is_set()
    log = await load_run(client, thread_run_id("fan"), agent="langgraph", open_content=False)
    types = [r.event.type for r in log.records]
    assert types.index("run.suspended") < max(i for i, t in enumerate(types) if t == "graph.writes_saved")
    assert await _status(client, "fan") == "suspended"
    out = await graph.ainvoke(Command(resume="yes"), config)
    assert sorted(out["log"]) == ["ask:yes", "slow"]
    assert await _status(client, "fan") == "completed"


# -- from_conn_string -----------------------------------------------------------------------------------------------


def test_from_conn_string_in_a_with_block_runs_a_sync_graph(nats_url: str) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "sync-cm"}}
    with RunledgerSaver.from_conn_string(nats_url) as saver:
        assert _graph({}).compile(checkpointer=saver).invoke({"log": []}, config)["log"] == ["prepared", "acted"]
        loop_thread = [t for t in threading.enumerate() if t.name == "runledger-saver"]
        assert len(loop_thread) == 1
    assert saver.client.nc.is_closed and not loop_thread[0].is_alive()  # the block's connection is gone

    async def status() -> str:
        reader = await connect(nats_url)
        try:
            return await _status(reader, "sync-cm")
        finally:
            await reader.close()

    assert asyncio.run(status()) == "completed"
    with RunledgerSaver.from_conn_string(nats_url) as again:  # what a later process reads
        assert again.get_tuple(config) is not None
        assert _graph({}).compile(checkpointer=again).get_state(config).values["log"] == ["prepared", "acted"]


async def test_from_conn_string_in_an_async_with_block_runs_an_async_graph(nats_url: str) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "async-cm"}}
    async with RunledgerSaver.from_conn_string(nats_url, agent="support") as saver:
        assert saver.agent == "support" and saver.loop is asyncio.get_running_loop()
        await _graph({}).compile(checkpointer=saver).ainvoke({"log": []}, config)
    assert saver.client.nc.is_closed
    async with RunledgerSaver.from_conn_string(nats_url, agent="support") as reader:
        state = await _graph({}).compile(checkpointer=reader).aget_state(config)
        assert state.values["log"] == ["prepared", "acted"] and state.next == ()
        runs = {r.run_id: r.status for r in await list_runs(reader.client, agent="support")}
        assert runs[thread_run_id("async-cm")] == "completed"


def test_from_conn_string_without_a_url_finds_the_ledger_as_the_cli_does(
    nats_server: ServerState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No $RUNLEDGER_NATS_URL, no cluster: the embedded server of $RUNLEDGER_HOME, as `runledger runs` finds it.
    monkeypatch.delenv(ENV_URL, raising=False)
    monkeypatch.setenv(ENV_HOME, str(tmp_path / "home"))
    config: RunnableConfig = {"configurable": {"thread_id": "found"}}
    with RunledgerSaver.from_conn_string() as saver:
        assert saver.client.url == nats_server.url
        _graph({}).compile(checkpointer=saver).invoke({"log": []}, config)
    assert main(["runs"]) == 0  # the CLI, with the same defaults, lists the thread the saver recorded
    assert "found" in capsys.readouterr().out


async def test_a_url_in_place_of_a_client_is_refused_at_construction(nats_url: str) -> None:
    with pytest.raises(ConfigurationError, match="from_conn_string"):
        RunledgerSaver(nats_url)  # type: ignore[arg-type]


# -- how a crashed thread goes on -------------------------------------------------------------------------------


def _live_page(url: str, db: Path, run_id: str) -> str:
    """The live part of the run's page, from the app ``runledger ui`` starts."""
    from starlette.testclient import TestClient

    from runledger.ui.app import UIConfig, create_app

    with TestClient(create_app(UIConfig(nats_url=url, db=db)), base_url="http://127.0.0.1:8642") as browser:
        response = browser.get(f"/runs/{run_id}/live")
        assert response.status_code == 200, response.text[:500]
        return response.text


async def test_a_crashed_threads_recovery_line_is_langgraphs_and_resume_says_exactly_what_to_run(
    client: LedgerClient,
    nats_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The record a SIGKILLed process leaves: the thread's run running, its holder a process that is gone
    # (this pid with another start time: runledger.sdk.holder).
    host, namespace, pid, start = this_holder().split("/")
    monkeypatch.setattr("runledger.sdk.lifecycle.this_holder", lambda: f"{host}/{namespace}/{pid}/{int(start) + 1}")
    config: RunnableConfig = {"configurable": {"thread_id": "sync-kill-2"}}
    graph = _graph({}).compile(checkpointer=RunledgerSaver(client), interrupt_before=["act"])  # stops mid-thread
    await graph.ainvoke({"log": []}, config)
    monkeypatch.undo()
    assert await _status(client, "sync-kill-2") == "stalled"
    how = '`graph.invoke(None, {"configurable": {"thread_id": "sync-kill-2"}})` on its LangGraph graph'

    assert await asyncio.to_thread(main, ["runs", "--nats", nats_url]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("sync-kill-2"))
    assert how in line and "--agent" not in line
    assert await asyncio.to_thread(main, ["show", "sync-kill-2", "--nats", nats_url]) == 0
    assert how in capsys.readouterr().out
    page = await asyncio.to_thread(_live_page, nats_url, tmp_path / "ledger.duckdb", "sync-kill-2")
    assert (
        "continue it with <code>graph.invoke(None, {&#34;configurable&#34;: {&#34;thread_id&#34;: &#34;sync-kill-2"
        in page
    )
    assert "runledger resume" not in page
    # `runledger resume` of the thread runs nothing and names LangGraph's recovery, with or without --agent.
    for extra in ([], ["--agent", "tests.ui_agents:waiter_spec"]):
        assert await asyncio.to_thread(main, ["resume", "sync-kill-2", "--nats", nats_url, *extra]) == 6
        err = capsys.readouterr().err
        assert "LangGraph thread" in err and how in err
    assert await _status(client, "sync-kill-2") == "stalled"  # nothing was recorded
    # Doing what it says, in another process, continues the thread's run (re-opened, fenced) to its end.
    other = await connect(nats_url)
    try:
        again = _graph({}).compile(checkpointer=RunledgerSaver(other), interrupt_before=["act"])
        assert (await again.ainvoke(None, config))["log"] == ["prepared", "acted"]
    finally:
        await other.close()
    assert await _outcomes(client, "sync-kill-2") == ["run.started", "run.resumed", "run.completed"]


# -- thread ids as the user wrote them --------------------------------------------------------------------------------


async def test_runs_shows_and_show_accepts_a_thread_id_that_is_no_run_id(
    client: LedgerClient, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    thread = "user@example.com/chat 1"
    assert thread_run_id(thread).startswith("lg-")  # it cannot stand in a subject: its run id is a digest
    await (
        _graph({})
        .compile(checkpointer=RunledgerSaver(client))
        .ainvoke({"log": []}, {"configurable": {"thread_id": thread}})
    )
    assert await asyncio.to_thread(main, ["runs", "--nats", nats_url]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if thread_run_id(thread) in line]
    assert len(listed) == 1 and 'thread "user@example.com/chat 1"' in listed[0] and "completed" in listed[0]
    assert await asyncio.to_thread(main, ["runs", "--json", "--nats", nats_url]) == 0
    assert [r["thread"] for r in json.loads(capsys.readouterr().out)] == [thread]
    assert await asyncio.to_thread(main, ["show", thread, "--nats", nats_url]) == 0
    shown = capsys.readouterr().out
    assert thread_run_id(thread) in shown and "graph.checkpointed" in shown and "run.completed" in shown
    assert await asyncio.to_thread(main, ["show", "user@example.com/chat 2", "--nats", nats_url]) != 0
    assert "nor does a run record a thread of that id" in capsys.readouterr().err
