"""delete_for_runs and prune on an append-only log, against a real nats-server: a tombstone
(``graph.checkpoints_deleted``) that every saver reading the thread back honours, while the events
stay, the chain verifies and the thread's run keeps its status; prune's ``delete`` is an erasure.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig

from runledger import LedgerClient, connect
from runledger.integrations.langgraph import RunledgerSaver, thread_run_id
from runledger.ops.trace import list_runs
from runledger.ops.verify import verify_runs
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from tests.integration.test_langgraph_lifecycle import _graph

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _config(thread: str, run_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}, "metadata": {"run_id": run_id}}


async def _types(client: LedgerClient, thread: str) -> list[str]:
    log = await load_run(client, thread_run_id(thread), agent="langgraph", open_content=False)
    return [r.event.type for r in log.records]


async def _read_back(nats_url: str, thread: str) -> list[Any]:
    """The thread's checkpoints as a fresh saver on a new connection lists them (a later process)."""
    reader = await connect(nats_url)
    try:
        return [t async for t in RunledgerSaver(reader).alist({"configurable": {"thread_id": thread}})]
    finally:
        await reader.close()


async def test_delete_for_runs_is_a_tombstone_every_reader_honours(client: LedgerClient, nats_url: str) -> None:
    saver = RunledgerSaver(client)
    graph = _graph({}).compile(checkpointer=saver)
    await graph.ainvoke({"log": ["first"]}, _config("t", "run-1"))
    await graph.ainvoke({"log": ["second"]}, _config("t", "run-2"))
    await graph.ainvoke({"log": ["other"]}, _config("u", "run-1"))  # another thread, the same LangGraph run id
    before = await _types(client, "t")
    await saver.adelete_for_runs(["run-1"])
    for thread in ("t", "u"):
        for listed in ([c async for c in saver.alist({"configurable": {"thread_id": thread}})],
                       await _read_back(nats_url, thread)):  # fmt: skip
            assert {c.metadata.get("run_id") for c in listed} == ({"run-2"} if thread == "t" else set())
    after = await _types(client, "t")
    assert after[: len(before)] == before and after[len(before) :] == ["graph.checkpoints_deleted"]
    log = await load_run(client, thread_run_id("t"), agent="langgraph")
    tombstone = log.records[-1].event.payload
    assert tombstone["reason"] == "delete_for_runs" and tombstone["run_ids"] == ["run-1"]
    assert len(tombstone["checkpoints"][""]) == 4  # the first invocation's input, loop and end checkpoints
    assert fold(log.records).status == "completed"  # a deletion is no invocation: the run stays at rest
    assert all(r.ok for r in await verify_runs(client))
    # The thread goes on from what is left: the latest checkpoint, whose state holds what came before it.
    out = await _graph({}).compile(checkpointer=saver).ainvoke({"log": ["third"]}, _config("t", "run-3"))
    assert out["log"] == [*(x for word in ("first", "second", "third") for x in (word, "prepared", "acted"))]


async def test_prune_from_a_fresh_process_keeps_the_latest_and_the_run_at_rest(
    client: LedgerClient, nats_url: str
) -> None:
    graph = _graph({}).compile(checkpointer=RunledgerSaver(client))
    await graph.ainvoke({"log": []}, _config("p", "run-1"))
    latest = (await graph.aget_state({"configurable": {"thread_id": "p"}})).config
    other = await connect(nats_url)  # a maintenance job: its own process, its own connection
    try:
        await RunledgerSaver(other).aprune(["p", "never-used"], strategy="keep_latest")
    finally:
        await other.close()
    listed = await _read_back(nats_url, "p")
    assert [c.config["configurable"]["checkpoint_id"] for c in listed] == [latest["configurable"]["checkpoint_id"]]
    assert listed[0].checkpoint["channel_values"]["log"] == ["prepared", "acted"]  # values older ones stored
    runs = {r.run_id: r.status for r in await list_runs(client, agent="langgraph")}
    assert runs[thread_run_id("p")] == "completed"
    assert (await _types(client, "p"))[-3:] == ["run.resumed", "graph.checkpoints_deleted", "run.completed"]
    # A copy of the pruned thread reads as it does.
    saver = RunledgerSaver(client)
    await saver.acopy_thread("p", "p-copy")
    copied = await _read_back(nats_url, "p-copy")
    assert [c.checkpoint for c in copied] == [c.checkpoint for c in listed]


async def test_prune_delete_erases_the_thread(client: LedgerClient, nats_url: str) -> None:
    saver = RunledgerSaver(client)
    await _graph({}).compile(checkpointer=saver).ainvoke({"log": []}, _config("gone", "run-1"))
    await saver.aprune(["gone"], strategy="delete")
    assert await _read_back(nats_url, "gone") == []
    assert fold((await load_run(client, thread_run_id("gone"), agent="langgraph")).records).erased is not None
    with pytest.raises(Exception, match="prune strategy 'oldest'"):
        await saver.aprune(["gone"], strategy="oldest")
