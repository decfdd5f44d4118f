"""RunledgerSaver behaves as LangGraph's own checkpointers do, against a real nats-server.

LangGraph's checkpointer conformance suite (put, put_writes, get_tuple, list, delete_thread) runs
as it is; the behaviours of SqliteSaver's and InMemorySaver's tests are ported, sync and async;
and real graphs (interrupts, Send, subgraphs, pending writes after a failure) run on one saver and
continue on a fresh one with its own connection, as a resumed process would. Content is redacted
and sealed in the record, large values are blobs, and delete_thread is an erasure.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import operator
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import Checkpoint, CheckpointMetadata, create_checkpoint, empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, Interrupt, Send, interrupt

from runledger import FencedError, LedgerClient, connect
from runledger.integrations.langgraph import RunledgerSaver, thread_run_id
from runledger.log.reader import read_raw
from runledger.log.subjects import run_filter
from runledger.ops.verify import verify_runs
from runledger.protect.blobs import is_blob_ref
from runledger.protect.loading import load_run
from runledger.record.fold import fold

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def fresh_saver(nats_url: str, **kwargs: Any) -> tuple[LedgerClient, RunledgerSaver]:
    """A saver on a connection of its own: what a resumed process has."""
    client = await connect(nats_url)
    return client, RunledgerSaver(client, **kwargs)


@pytest.fixture
async def saver(client: LedgerClient) -> RunledgerSaver:
    return RunledgerSaver(client)


# -- LangGraph's conformance suite --------------------------------------------------------------------------------


async def test_langgraph_conformance_suite_passes(client: LedgerClient) -> None:
    agents = itertools.count()

    @checkpointer_test(name="RunledgerSaver")
    async def factory() -> AsyncIterator[RunledgerSaver]:
        yield RunledgerSaver(client, agent=f"conformance{next(agents)}")  # each suite on threads of its own

    _assert_full(await validate(factory))


def _assert_full(report: CapabilityReport) -> None:
    """Level FULL with every capability the suite knows detected: delete_for_runs and prune included."""
    failures = {cap: r.failures for cap, r in report.results.items() if r.failures}
    assert report.conformance_level() == "FULL", failures
    assert {cap for cap, r in report.results.items() if r.detected} == {c.value for c in Capability}
    passed = {cap: r.tests_passed for cap, r in report.results.items()}
    assert passed["delete_for_runs"] == 7 and passed["prune"] == 8 and sum(passed.values()) >= 80, passed


class _ReadsFromTheLog(RunledgerSaver):
    """Writes as a RunledgerSaver; answers every read through a new saver on another connection, which
    knows nothing but the log: the conformance suite then checks what was recorded, not what this
    saver's in-memory parent (InMemorySaver) kept of its own writes."""

    def __init__(self, client: LedgerClient, reader: LedgerClient, agent: str) -> None:
        super().__init__(client, agent=agent)
        self._reader_client = reader

    def _reader(self) -> RunledgerSaver:
        return RunledgerSaver(self._reader_client, agent=self.agent)

    async def aget_tuple(self, config: RunnableConfig) -> Any:
        return await self._reader().aget_tuple(config)

    async def alist(  # type: ignore[override]
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[Any]:
        async for item in self._reader().alist(config, filter=filter, before=before, limit=limit):
            yield item


async def test_langgraph_conformance_suite_passes_reading_from_the_log(client: LedgerClient, nats_url: str) -> None:
    agents = itertools.count()
    reader = await connect(nats_url)
    try:

        @checkpointer_test(name="RunledgerSaver (reads from the log)")
        async def factory() -> AsyncIterator[RunledgerSaver]:
            yield _ReadsFromTheLog(client, reader, f"logread{next(agents)}")

        report = await validate(factory)
    finally:
        await reader.close()
    _assert_full(report)


# -- SqliteSaver's tests, ported (the async twins; the sync ones are below) ----------------------------------------


class Fixtures:
    def __init__(self) -> None:
        self.config_1: RunnableConfig = {
            "configurable": {"thread_id": "thread-1", "checkpoint_id": "1", "checkpoint_ns": ""}
        }
        self.config_2: RunnableConfig = {
            "configurable": {"thread_id": "thread-2", "checkpoint_id": "2", "checkpoint_ns": ""}
        }
        self.config_3: RunnableConfig = {
            "configurable": {"thread_id": "thread-2", "checkpoint_id": "2-inner", "checkpoint_ns": "inner"}
        }
        self.chkpnt_1: Checkpoint = empty_checkpoint()
        self.chkpnt_2: Checkpoint = create_checkpoint(self.chkpnt_1, {}, 1)
        self.chkpnt_3: Checkpoint = empty_checkpoint()
        self.metadata_1: CheckpointMetadata = {"source": "input", "step": 2, "writes": {}, "score": 1}  # type: ignore[typeddict-unknown-key]
        self.metadata_2: CheckpointMetadata = {"source": "loop", "step": 1, "writes": {"foo": "bar"}, "score": None}  # type: ignore[typeddict-unknown-key]
        self.metadata_3: CheckpointMetadata = {}


async def test_combined_metadata(saver: RunledgerSaver) -> None:
    f = Fixtures()
    config: RunnableConfig = {
        "configurable": {"thread_id": "thread-2", "checkpoint_ns": "", "__super_private_key": "super_private_value"},
        "metadata": {"run_id": "my_run_id"},
    }
    await saver.aput(config, f.chkpnt_2, f.metadata_2, {})
    checkpoint = await saver.aget_tuple(config)
    assert checkpoint is not None and checkpoint.metadata == {**f.metadata_2, "run_id": "my_run_id"}


async def _search(saver: RunledgerSaver, nats_url: str) -> None:
    f = Fixtures()
    await saver.aput(f.config_1, f.chkpnt_1, f.metadata_1, {})
    await saver.aput(f.config_2, f.chkpnt_2, f.metadata_2, {})
    await saver.aput(f.config_3, f.chkpnt_3, f.metadata_3, {})
    other_client, other = await fresh_saver(nats_url)  # the same answers from the log alone
    try:
        for s in (saver, other):
            assert [c.metadata async for c in s.alist(None, filter={"source": "input"})] == [f.metadata_1]
            found = [c.metadata async for c in s.alist(None, filter={"step": 1, "writes": {"foo": "bar"}})]
            assert found == [f.metadata_2]
            assert len([c async for c in s.alist(None, filter={})]) == 3
            assert [c async for c in s.alist(None, filter={"source": "update", "step": 1})] == []
            by_thread = [c async for c in s.alist({"configurable": {"thread_id": "thread-2"}})]
            assert {c.config["configurable"]["checkpoint_ns"] for c in by_thread} == {"", "inner"}
            before = [c async for c in s.alist(None, before=by_thread[1].config)]
            assert [c.config["configurable"]["thread_id"] for c in before] == ["thread-1"]
            limited = [c async for c in s.alist({"configurable": {"thread_id": "thread-2"}}, limit=1)]
            assert [c.config["configurable"]["thread_id"] for c in limited] == ["thread-2"]
    finally:
        await other_client.close()


async def test_search(saver: RunledgerSaver, nats_url: str) -> None:
    await _search(saver, nats_url)


async def test_list_is_newest_first_with_before_and_limit_across_a_restart(
    saver: RunledgerSaver, nats_url: str
) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    ids = []
    for step in range(5):
        cp = create_checkpoint(empty_checkpoint(), {}, step)
        config = await saver.aput(config, cp, {"source": "loop", "step": step, "parents": {}}, {})
        ids.append(config["configurable"]["checkpoint_id"])
    other_client, other = await fresh_saver(nats_url)
    try:
        thread: RunnableConfig = {"configurable": {"thread_id": "t"}}
        for s in (saver, other):
            listed = [c async for c in s.alist(thread)]
            assert [c.config["configurable"]["checkpoint_id"] for c in listed] == ids[::-1]
            assert [c.parent_config["configurable"]["checkpoint_id"] for c in listed[:-1]] == ids[::-1][1:]  # type: ignore[index]
            assert listed[-1].parent_config is None
            before = {"configurable": {"thread_id": "t", "checkpoint_id": ids[3]}}
            page = [c.config["configurable"]["checkpoint_id"] async for c in s.alist(thread, before=before, limit=2)]
            assert page == [ids[2], ids[1]]
            latest = await s.aget_tuple(thread)
            assert latest is not None and latest.config["configurable"]["checkpoint_id"] == ids[-1]
    finally:
        await other_client.close()


# -- values, pending writes and sends survive the log ---------------------------------------------------------------


def _values() -> dict[str, Any]:
    """Channel values of every kind LangGraph's serializer meets in a graph's state."""
    return {
        "messages": [
            HumanMessage(content="refund order-8891 please", id="m1"),
            AIMessage(
                content="", id="m2", tool_calls=[{"name": "lookup", "args": {"order": "order-8891"}, "id": "c1"}]
            ),
            ToolMessage(content='{"amount": 49.9}', tool_call_id="c1", id="m3"),
        ],
        "unsorted": {"b": 1, "a": 2, "$dollar": 3},
        "int_keys": {2: "two", 1: "one"},
        "numbers": [1, 1.0, 2.5, -(2**62), float("inf")],
        "versionish": "00000000000000000000000000000002.0.4111111111111111",
        "raw": b"\x00\xffbytes",
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "tuple": (1, "x"),
        "set": {1, 2},
        "nested": {"deep": [{"x": None, "y": True}]},
    }


async def test_values_writes_sends_and_interrupts_read_back_equal_from_a_fresh_saver(
    saver: RunledgerSaver, nats_url: str
) -> None:
    values = _values()
    cp = empty_checkpoint()
    cp["channel_values"] = values
    # Versions whose digits pass for a card number: what LangGraph schedules with is never redacted.
    version = "00000000000000000000000000000001.0.4111111111111111"
    cp["channel_versions"] = dict.fromkeys(values, version)
    config: RunnableConfig = {"configurable": {"thread_id": "values", "checkpoint_ns": ""}}
    saved = await saver.aput(config, cp, {"source": "loop", "step": 0, "parents": {}}, dict.fromkeys(values, version))
    await saver.aput_writes(saved, [("branch:to:a", None), ("__pregel_tasks", Send("node", {"x": 1}))], "task-1", "p1")
    await saver.aput_writes(saved, [("__interrupt__", [Interrupt(value={"ask": "approve?"}, id="i1")])], "task-2")
    await saver.aput_writes(saved, [("__error__", "boom")], "task-3")
    await saver.aput_writes(saved, [("branch:to:a", "again")], "task-1")  # a regular write is saved once
    mine = await saver.aget_tuple(saved)
    other_client, other = await fresh_saver(nats_url)
    try:
        theirs = await other.aget_tuple(saved)
    finally:
        await other_client.close()
    assert mine is not None and theirs is not None
    # Content is redacted in the record (the default policy): the fresh saver reads the token.
    assert mine.checkpoint["channel_values"].pop("versionish") == values["versionish"]
    assert "«redacted:card_number:" in theirs.checkpoint["channel_values"].pop("versionish")
    assert theirs.checkpoint == mine.checkpoint
    assert set(theirs.checkpoint["channel_versions"].values()) == {version}
    assert theirs.checkpoint["channel_values"]["tuple"] in ((1, "x"), [1, "x"])  # msgpack has no tuples
    assert theirs.checkpoint["channel_values"]["messages"] == values["messages"]
    assert list(theirs.checkpoint["channel_values"]["unsorted"]) == ["b", "a", "$dollar"]
    assert theirs.metadata == mine.metadata
    assert theirs.pending_writes == mine.pending_writes
    assert sorted(w[:2] for w in theirs.pending_writes or []) == [
        ("task-1", "__pregel_tasks"),
        ("task-1", "branch:to:a"),
        ("task-2", "__interrupt__"),
        ("task-3", "__error__"),
    ]
    assert ("task-1", "branch:to:a", None) in (theirs.pending_writes or [])  # the repeated write was not saved


async def test_values_above_the_threshold_are_blobs_by_reference(client: LedgerClient, nats_url: str) -> None:
    from runledger import DataPolicy

    saver = RunledgerSaver(client, data_policy=DataPolicy(blob_threshold=4096))
    big = "x" * 20_000
    cp = empty_checkpoint()
    cp["channel_values"] = {"doc": big}
    cp["channel_versions"] = {"doc": 1}
    config: RunnableConfig = {"configurable": {"thread_id": "big", "checkpoint_ns": ""}}
    await saver.aput(config, cp, {"source": "loop", "step": 0}, {"doc": 1})
    log = await load_run(client, thread_run_id("big"), agent="langgraph", open_content=False)
    checkpointed = [r.event for r in log.records if r.event.type == "graph.checkpointed"]
    assert len(checkpointed) == 1 and is_blob_ref(checkpointed[0].payload["values"])
    other_client, other = await fresh_saver(nats_url)
    try:
        got = await other.aget_tuple(config)
        assert got is not None and got.checkpoint["channel_values"]["doc"] == big
    finally:
        await other_client.close()


async def test_content_is_redacted_and_sealed_in_the_record(
    saver: RunledgerSaver, client: LedgerClient, nats_url: str
) -> None:
    key = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
    cp = empty_checkpoint()
    cp["channel_values"] = {"messages": [HumanMessage(content=f"my key is {key}, order-4242")]}
    cp["channel_versions"] = {"messages": 1}
    config: RunnableConfig = {"configurable": {"thread_id": "secret", "checkpoint_ns": ""}}
    saved = await saver.aput(config, cp, {"source": "input", "step": -1, "password": "hunter2-secret"}, {"messages": 1})
    await saver.aput_writes(saved, [("messages", f"again {key}")], "task-1")
    raw = b"".join(r.data for r in await read_raw(client, run_filter("langgraph", thread_run_id("secret"))))
    for plain in (key.encode(), b"order-4242", b"hunter2-secret"):
        assert plain not in raw  # sealed: not even the parts no detector flags are readable
    live = await saver.aget_tuple(saved)
    assert live is not None and key in live.checkpoint["channel_values"]["messages"][0].content  # live: as given
    other_client, other = await fresh_saver(nats_url)
    try:
        recorded = await other.aget_tuple(saved)
    finally:
        await other_client.close()
    assert recorded is not None
    text = recorded.checkpoint["channel_values"]["messages"][0].content
    assert key not in text and "«redacted:" in text and "order-4242" in text
    assert recorded.metadata["password"] != "hunter2-secret"  # type: ignore[typeddict-item]
    assert key not in json.dumps(recorded.pending_writes, default=str)
    assert all(r.ok for r in await verify_runs(client))


# -- delete_thread: an erasure ------------------------------------------------------------------------------------


async def test_delete_thread_erases_the_run_and_the_thread_starts_afresh(
    saver: RunledgerSaver, client: LedgerClient, nats_url: str
) -> None:
    f = Fixtures()
    await saver.aput(f.config_1, f.chkpnt_1, f.metadata_1, {})
    await saver.aput(f.config_2, f.chkpnt_2, f.metadata_2, {})
    await saver.adelete_thread("thread-1")
    assert await saver.aget_tuple(f.config_1) is None
    assert await saver.aget_tuple({"configurable": {"thread_id": "thread-2"}}) is not None
    log = await load_run(client, thread_run_id("thread-1"), agent="langgraph")
    assert fold(log.records).erased is not None  # the events stay, unreadable; the chain verifies
    assert all(r.ok for r in await verify_runs(client))
    other_client, other = await fresh_saver(nats_url)
    try:
        assert await other.aget_tuple({"configurable": {"thread_id": "thread-1"}}) is None
        assert [c async for c in other.alist(None)] != []  # thread-2 only
        assert {c.config["configurable"]["thread_id"] async for c in other.alist(None)} == {"thread-2"}
        # Used again, the thread records on a new run.
        cp = empty_checkpoint()
        await other.aput({"configurable": {"thread_id": "thread-1", "checkpoint_ns": ""}}, cp, {"step": 7}, {})
        got = await other.aget_tuple({"configurable": {"thread_id": "thread-1"}})
        assert got is not None and got.metadata == {"step": 7}
        await load_run(client, thread_run_id("thread-1", 2), agent="langgraph")
        await other.adelete_thread("no-such-thread")  # nothing recorded: nothing to do
    finally:
        await other_client.close()


# -- graphs ---------------------------------------------------------------------------------------------------------


class Approval(TypedDict):
    log: Annotated[list[str], operator.add]


def _approval_graph(calls: list[str]) -> StateGraph[Any]:
    def prepare(state: Approval) -> dict[str, Any]:
        calls.append("prepare")
        return {"log": ["prepared"]}

    def ask(state: Approval) -> dict[str, Any]:
        calls.append("ask")
        answer = interrupt({"question": "refund 49.90?"})
        return {"log": [f"answer:{answer}"]}

    g = StateGraph(Approval)
    g.add_node("prepare", prepare)
    g.add_node("ask", ask)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "ask")
    g.add_edge("ask", END)
    return g


async def test_an_interrupt_resumes_on_a_fresh_saver(saver: RunledgerSaver, nats_url: str) -> None:
    calls: list[str] = []
    config: RunnableConfig = {"configurable": {"thread_id": "approval"}}
    out = await _approval_graph(calls).compile(checkpointer=saver).ainvoke({"log": []}, config)
    assert out["__interrupt__"][0].value == {"question": "refund 49.90?"}
    other_client, other = await fresh_saver(nats_url)
    try:
        graph = _approval_graph(calls).compile(checkpointer=other)
        state = await graph.aget_state(config)
        assert state.next == ("ask",) and state.interrupts[0].value == {"question": "refund 49.90?"}
        out = await graph.ainvoke(Command(resume="yes"), config)
        assert out["log"] == ["prepared", "answer:yes"]
        assert calls == ["prepare", "ask", "ask"]  # prepare ran once; ask again on resume, as LangGraph does
        assert (await graph.aget_state(config)).next == ()
    finally:
        await other_client.close()


class Fanout(TypedDict):
    items: list[str]
    done: Annotated[list[str], operator.add]


async def test_send_and_pending_writes_of_a_failed_superstep(saver: RunledgerSaver, nats_url: str) -> None:
    """One of three Send tasks fails: the two that succeeded are saved as pending writes and do not
    run again when a fresh process resumes the thread (LangGraph's pending-writes guarantee)."""
    runs: dict[str, int] = {}
    fail = {"c": True}

    def work(arg: dict[str, str]) -> dict[str, Any]:
        item = arg["item"]
        runs[item] = runs.get(item, 0) + 1
        if fail.get(item):
            raise RuntimeError(f"{item} failed")
        return {"done": [item]}

    def fan(state: Fanout) -> list[Send]:
        return [Send("work", {"item": i}) for i in state["items"]]

    def build(checkpointer: RunledgerSaver) -> Any:
        g = StateGraph(Fanout)
        g.add_node("work", work)  # type: ignore[call-overload]
        g.add_conditional_edges(START, fan)
        g.add_edge("work", END)
        return g.compile(checkpointer=checkpointer)

    config: RunnableConfig = {"configurable": {"thread_id": "fanout"}}
    with pytest.raises(RuntimeError, match="c failed"):
        await build(saver).ainvoke({"items": ["a", "b", "c"], "done": []}, config)
    fail["c"] = False
    other_client, other = await fresh_saver(nats_url)
    try:
        out = await build(other).ainvoke(None, config)
    finally:
        await other_client.close()
    assert sorted(out["done"]) == ["a", "b", "c"], (out, runs)
    assert runs == {"a": 1, "b": 1, "c": 2}


class Outer(TypedDict):
    log: Annotated[list[str], operator.add]


async def test_subgraph_namespaces_and_their_interrupts(saver: RunledgerSaver, nats_url: str) -> None:
    def inner_step(state: Outer) -> dict[str, Any]:
        answer = interrupt("inner?")
        return {"log": [f"inner:{answer}"]}

    sub = StateGraph(Outer)
    sub.add_node("inner_step", inner_step)
    sub.add_edge(START, "inner_step")

    def build(checkpointer: RunledgerSaver) -> Any:
        g = StateGraph(Outer)
        g.add_node("child", sub.compile())
        g.add_edge(START, "child")
        return g.compile(checkpointer=checkpointer)

    config: RunnableConfig = {"configurable": {"thread_id": "nested"}}
    await build(saver).ainvoke({"log": []}, config)
    namespaces = {c.config["configurable"]["checkpoint_ns"] async for c in saver.alist(config)}
    assert "" in namespaces and any(ns.startswith("child:") for ns in namespaces)
    other_client, other = await fresh_saver(nats_url)
    try:
        graph = build(other)
        state = await graph.aget_state(config, subgraphs=True)
        assert state.tasks[0].state is not None and state.tasks[0].state.interrupts[0].value == "inner?"  # type: ignore[union-attr]
        assert {c.config["configurable"]["checkpoint_ns"] async for c in other.alist(config)} == namespaces
        out = await graph.ainvoke(Command(resume="ok"), config)
        assert out["log"] == ["inner:ok"]
    finally:
        await other_client.close()


async def test_a_second_process_on_the_thread_fences_the_first(saver: RunledgerSaver, nats_url: str) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "fenced", "checkpoint_ns": ""}}
    await saver.aput(config, empty_checkpoint(), {}, {})
    other_client, other = await fresh_saver(nats_url)
    try:
        await other.aput(config, empty_checkpoint(), {}, {})  # takes the thread over (run.resumed)
        with pytest.raises(FencedError):
            await saver.aput(config, empty_checkpoint(), {}, {})
    finally:
        await other_client.close()


# -- the sync twins -----------------------------------------------------------------------------------------------


@pytest.fixture
def loop_thread() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop in a thread of its own: where the saver's client lives when graph code is sync."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def sync_saver(nats_server: Any, loop_thread: asyncio.AbstractEventLoop) -> Iterator[RunledgerSaver]:
    client, saver = asyncio.run_coroutine_threadsafe(fresh_saver(nats_server.url), loop_thread).result(30)
    try:
        yield saver
    finally:
        asyncio.run_coroutine_threadsafe(client.close(), loop_thread).result(30)


def test_sync_combined_metadata_and_search(sync_saver: RunledgerSaver) -> None:
    f = Fixtures()
    config: RunnableConfig = {
        "configurable": {"thread_id": "thread-9", "checkpoint_ns": "", "__super_private_key": "x"},
        "metadata": {"run_id": "my_run_id"},
    }
    sync_saver.put(config, f.chkpnt_2, f.metadata_2, {})
    got = sync_saver.get_tuple(config)
    assert got is not None and got.metadata == {**f.metadata_2, "run_id": "my_run_id"}
    sync_saver.put(f.config_1, f.chkpnt_1, f.metadata_1, {})
    sync_saver.put(f.config_3, f.chkpnt_3, f.metadata_3, {})
    assert [c.metadata for c in sync_saver.list(None, filter={"source": "input"})] == [f.metadata_1]
    assert len(list(sync_saver.list(None))) == 3
    assert len(list(sync_saver.list({"configurable": {"thread_id": "thread-9"}}, limit=1))) == 1
    saved = sync_saver.put(f.config_1, f.chkpnt_2, f.metadata_2, {})
    sync_saver.put_writes(saved, [("a", 1), ("b", 2)], "task-1")
    got = sync_saver.get_tuple(saved)
    assert got is not None and got.pending_writes == [("task-1", "a", 1), ("task-1", "b", 2)]
    sync_saver.delete_thread("thread-1")
    assert sync_saver.get_tuple({"configurable": {"thread_id": "thread-1"}}) is None


def test_sync_graph_with_an_interrupt(sync_saver: RunledgerSaver) -> None:
    calls: list[str] = []
    graph = _approval_graph(calls).compile(checkpointer=sync_saver)
    config: RunnableConfig = {"configurable": {"thread_id": "sync-approval"}}
    out = graph.invoke({"log": []}, config)
    assert out["__interrupt__"][0].value == {"question": "refund 49.90?"}
    assert graph.invoke(Command(resume="no"), config)["log"] == ["prepared", "answer:no"]
    assert [s.metadata["step"] for s in graph.get_state_history(config)] == [2, 1, 0, -1]  # type: ignore[index]


async def test_sync_calls_on_the_loop_thread_are_refused(saver: RunledgerSaver) -> None:
    with pytest.raises(asyncio.InvalidStateError, match="async methods"):
        saver.get_tuple({"configurable": {"thread_id": "x"}})


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def test_sync_graph_with_journaled_model_and_tools(sync_saver: RunledgerSaver) -> None:
    """graph.invoke: the journaled model and tools called from LangGraph's worker threads record
    their steps through the saver's loop."""

    @tool
    def lookup(order: str) -> str:
        """Look an order up."""
        return f"{order}: 49.90"

    call = {"name": "lookup", "args": {"order": "order-1"}, "id": "c1"}
    fake = FakeMessagesListChatModel(responses=[AIMessage(content="", tool_calls=[call]), AIMessage(content="done")])
    model = sync_saver.model(fake)
    tools = [sync_saver.tool(lookup)]

    def agent(state: Chat) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(Chat)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "tools" if s["messages"][-1].tool_calls else END, ["tools", END])
    g.add_edge("tools", "agent")
    config: RunnableConfig = {"configurable": {"thread_id": "sync-journal"}}
    out = g.compile(checkpointer=sync_saver).invoke({"messages": [HumanMessage(content="refund order-1")]}, config)
    assert out["messages"][-1].content == "done"
    assert out["messages"][-2].content == "order-1: 49.90"

    async def steps() -> list[tuple[str, str]]:
        log = await load_run(sync_saver.client, "sync-journal", agent="langgraph")
        return [(s.kind, s.name) for s in fold(log.records).steps.values()]

    recorded = asyncio.run_coroutine_threadsafe(steps(), sync_saver.loop).result(30)
    assert recorded == [
        ("model", "FakeMessagesListChatModel"),
        ("tool", "lookup"),
        ("model", "FakeMessagesListChatModel"),
    ]


async def test_copy_thread_reads_back_equal_from_a_fresh_saver(saver: RunledgerSaver, nats_url: str) -> None:
    calls: list[str] = []
    await _approval_graph(calls).compile(checkpointer=saver).ainvoke({"log": []}, {"configurable": {"thread_id": "a"}})
    await saver.acopy_thread("a", "b")
    other_client, other = await fresh_saver(nats_url)
    try:
        for s in (saver, other):
            src = [t async for t in s.alist({"configurable": {"thread_id": "a"}})]
            dst = [t async for t in s.alist({"configurable": {"thread_id": "b"}})]
            assert [t.checkpoint for t in dst] == [t.checkpoint for t in src]
            assert [t.pending_writes for t in dst] == [t.pending_writes for t in src]
        out = (
            await _approval_graph(calls)
            .compile(checkpointer=other)
            .ainvoke(Command(resume="copied"), {"configurable": {"thread_id": "b"}})
        )
        assert out["log"] == ["prepared", "answer:copied"]
    finally:
        await other_client.close()


# -- a growing message list: each checkpoint records only its tail -------------------------------------------------


class Chat2(TypedDict):
    messages: Annotated[list[Any], add_messages]


def _chat_graph(until: int) -> StateGraph[Any]:
    """An agent loop that adds one message a step (a reply, then a tool result) until ``until`` messages."""

    def agent(state: Chat2) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(content=f"reply {n}", id=f"ai-{n}")]}

    def tools(state: Chat2) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [ToolMessage(content=f"result {n}", tool_call_id=f"c{n}", id=f"tool-{n}")]}

    def route(state: Chat2) -> str:
        return "tools" if len(state["messages"]) < until else END

    builder: StateGraph[Any] = StateGraph(Chat2)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tools", END])
    builder.add_edge("tools", "agent")
    return builder


async def _message_records(client: LedgerClient, thread_id: str) -> list[tuple[str, dict[str, Any], bool]]:
    """(checkpoint id, value record, forked) of each checkpoint that records ``messages``, content opened."""
    log = await load_run(client, thread_run_id(thread_id), agent="langgraph", fetch=True)
    found = []
    for r in log.records:
        p = r.event.payload
        if r.event.type == "graph.checkpointed" and "messages" in p["channels"]:
            found.append((p["checkpoint_id"], p["values"][p["channels"].index("messages")], p["forked"]))
    return found


async def _same_history(live: RunledgerSaver, nats_url: str, thread_id: str) -> None:
    """Every checkpoint of the thread reads back equal from a fresh saver (what a resumed process reads)."""
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    other_client, other = await fresh_saver(nats_url)
    try:
        theirs = [(t.checkpoint, t.metadata, t.parent_config) async for t in other.alist(config)]
    finally:
        await other_client.close()
    mine = [(t.checkpoint, t.metadata, t.parent_config) async for t in live.alist(config)]
    assert len(mine) > 1 and theirs == mine


async def test_a_long_thread_records_each_message_once_and_reads_back_equal(
    saver: RunledgerSaver, client: LedgerClient, nats_url: str
) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "long"}, "recursion_limit": 500}
    out = await _chat_graph(120).compile(checkpointer=saver).ainvoke({"messages": [HumanMessage("go", id="h")]}, config)
    assert len(out["messages"]) == 120
    records = await _message_records(client, "long")
    assert records[0][1]["type"] == "msgpack" and all(r["type"] == "msgpack+tail" for _, r, _ in records[1:])
    assert sum(len(r["value"]) for _, r, _ in records) == 120  # each message recorded once, not once a step
    await _same_history(saver, nats_url, "long")
    assert all(r.ok for r in await verify_runs(client))


async def test_a_fork_from_a_past_checkpoint_extends_that_checkpoints_list(
    saver: RunledgerSaver, client: LedgerClient, nats_url: str
) -> None:
    graph = _chat_graph(30).compile(checkpointer=saver)
    config: RunnableConfig = {"configurable": {"thread_id": "fork"}, "recursion_limit": 200}
    await graph.ainvoke({"messages": [HumanMessage("go", id="h")]}, config)
    history = [s async for s in graph.aget_state_history(config)]
    past = next(s for s in history if len(s.values.get("messages", [])) == 10)
    forked = await graph.aupdate_state(past.config, {"messages": [HumanMessage("a fork", id="fork")]})
    await graph.ainvoke(None, forked)
    records = {cid: (record, was_forked) for cid, record, was_forked in await _message_records(client, "fork")}
    record, was_forked = records[forked["configurable"]["checkpoint_id"]]
    assert was_forked and record["type"] == "msgpack+tail" and record["at"] == 10 and len(record["value"]) == 1
    latest = (await graph.aget_state(config)).values["messages"]
    assert [m.id for m in latest[:11]] == [*(m.id for m in past.values["messages"]), "fork"] and len(latest) >= 30
    await _same_history(saver, nats_url, "fork")  # both branches


async def test_a_thread_recorded_whole_reads_and_continues_with_tails(
    client: LedgerClient, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread recorded before tails (every value whole) reads back, and goes on in tails."""
    from runledger.integrations.langgraph import typed_to_record

    whole = RunledgerSaver(client)
    monkeypatch.setattr(whole, "_record_value", lambda *a: typed_to_record(a[-1]))
    config: RunnableConfig = {"configurable": {"thread_id": "old-form"}, "recursion_limit": 200}
    await _chat_graph(8).compile(checkpointer=whole).ainvoke({"messages": [HumanMessage("go", id="h")]}, config)
    before = await _message_records(client, "old-form")
    assert {r["type"] for _, r, _ in before} == {"msgpack"}
    other_client, other = await fresh_saver(nats_url)
    try:
        await _chat_graph(16).compile(checkpointer=other).ainvoke({"messages": [HumanMessage("more", id="h2")]}, config)
        records = await _message_records(client, "old-form")
        assert len(records) > len(before) and all(r["type"] == "msgpack+tail" for _, r, _ in records[len(before) :])
        await _same_history(other, nats_url, "old-form")
    finally:
        await other_client.close()


async def test_an_erased_long_thread_is_unreadable(saver: RunledgerSaver, client: LedgerClient, nats_url: str) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "gone"}, "recursion_limit": 200}
    await _chat_graph(40).compile(checkpointer=saver).ainvoke({"messages": [HumanMessage("go", id="h")]}, config)
    await saver.adelete_thread("gone")
    raw = b"".join(r.data for r in await read_raw(client, run_filter("langgraph", thread_run_id("gone"))))
    log = await load_run(client, thread_run_id("gone"), agent="langgraph", fetch=True)
    opened = json.dumps([r.event.payload for r in log.records], default=str)
    for text in ("reply 5", "result 38"):
        assert text.encode() not in raw and text not in opened  # no piece, base or tail, opens
    other_client, other = await fresh_saver(nats_url)
    try:
        assert await other.aget_tuple(config) is None and [t async for t in other.alist(config)] == []
    finally:
        await other_client.close()
    assert all(r.ok for r in await verify_runs(client))
