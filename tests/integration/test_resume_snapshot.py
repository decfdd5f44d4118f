"""Resume from a journal snapshot (runledger.sdk.snapshot) against a real nats-server: the same
journal, replies and fence as a full read; a missing, corrupt or erased snapshot falls back."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from runledger import AgentSpec, Run
from runledger.log.client import LedgerClient
from runledger.log.reader import read_run
from runledger.log.subjects import BLOB_BUCKET, LEDGER_STREAM, run_subject
from runledger.ops.decisions import approve
from runledger.protect.blobs import BlobStore
from runledger.protect.capture import client_opener
from runledger.protect.erasure import erase_run
from runledger.protect.loading import load_run
from runledger.record.events import decode_fast
from runledger.record.fold import fold
from runledger.sdk import snapshot
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.models import ModelResponse, ScriptedModel
from runledger.sdk.snapshot import SNAPSHOT, load_journal, opened_journal

pytestmark = pytest.mark.integration

STEPS = 30  # 60+ events: interval snapshots every 16 events, one at suspension
AGENT = "snapper"


class Crash(BaseException):
    """Stands for the process dying: nothing records an outcome."""


@pytest.fixture(autouse=True)
def small_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot, "SNAPSHOT_EVERY", 16)
    monkeypatch.setattr(snapshot, "SNAPSHOT_MIN_EVENTS", 8)
    monkeypatch.setattr(snapshot, "TAIL_WINDOW", 64)


def make_spec(seen: list[Any], crash_at: list[int]) -> AgentSpec:
    """An agent of STEPS steps (model calls, read tools with keyword-ish dict args) and an approval;
    it notes what every step returned in ``seen``, and raises Crash at step ``crash_at[0]``."""

    async def agent(run: Run) -> dict[str, Any]:
        for i in range(STEPS):
            if crash_at and i == crash_at[0]:
                raise Crash
            if i % 2 == 0:
                reply = await run.model([{"role": "user", "content": f"question {i}"}], temperature=0)
                seen.append(reply.content)
            else:
                seen.append(await run.tool("lookup", {"z": i, "a": [i, "x"]}, fn=lambda a: {"v": a["z"] * 2}))
        decision = await run.approval("ship", {"n": STEPS})
        seen.append(decision["by"])
        return {"seen": len(seen)}

    model = ScriptedModel(lambda messages: ModelResponse(content=f"answer to {messages[-1]['content']}"))
    return AgentSpec(AGENT, agent, model, agent_version="v1")


async def suspended_run(client: LedgerClient, run_id: str) -> tuple[AgentSpec, list[Any]]:
    seen: list[Any] = []
    spec = make_spec(seen, [])
    first = await start_run(client, spec, run_id=run_id)
    assert first.status == "suspended", first
    await approve(client, run_id, first.pending[0], by="alice")
    return spec, seen


async def last_agent_event(client: LedgerClient, run_id: str) -> Any:
    msg = await client.js.get_last_msg(LEDGER_STREAM, run_subject(AGENT, run_id), direct=True)
    return decode_fast(msg.data or b"")


async def test_a_suspended_run_resumes_from_its_snapshot_as_from_every_event(client: LedgerClient) -> None:
    _, live = await suspended_run(client, "snap-same")
    assert (await last_agent_event(client, "snap-same")).type == SNAPSHOT  # written after run.suspended
    opener = client_opener(client)
    journal = await load_journal(client, "snap-same", AGENT, opener)
    assert journal is not None and journal.log.records[0].event.type == SNAPSHOT
    whole = await read_run(client, "snap-same", agent=AGENT)
    assert len(journal.log.records) < len(whole.records) // 4  # the snapshot and a short tail
    # The same checkpoint as the fold of every event (content opened on both sides), and the same fence.
    assert await opened_journal(journal.checkpoint, opener) == await opened_journal(fold(whole.records), opener)
    assert journal.log.last_stream_seq == whole.last_stream_seq

    replayed: list[Any] = []
    again = make_spec(replayed, [])
    result = await resume_run(client, again, "snap-same")
    assert result.status == "completed" and result.output == {"seen": STEPS + 1}
    assert replayed == [*live[:STEPS], "alice"]  # every recorded reply, as the agent saw it live
    cp = fold((await load_run(client, "snap-same")).records)  # the chain, checked from seq 0
    assert cp.status == "completed" and cp.attempts == 2


async def test_a_twin_resumed_from_every_event_ends_the_same(client: LedgerClient) -> None:
    outcomes = []
    for run_id, from_snapshot in (("twin-snap", True), ("twin-whole", False)):
        await suspended_run(client, run_id)
        replayed: list[Any] = []
        result = await resume_run(client, make_spec(replayed, []), run_id, from_snapshot=from_snapshot)
        types = [r.event.type for r in (await load_run(client, run_id)).records]
        outcomes.append((result.status, result.output, replayed, types))
    assert outcomes[0] == outcomes[1]


async def test_the_fence_counts_garbage_after_the_snapshot(client: LedgerClient) -> None:
    await suspended_run(client, "snap-garbage")
    await client.js.publish(run_subject(AGENT, "snap-garbage", "o"), b"not an event")
    journal = await load_journal(client, "snap-garbage", AGENT, client_opener(client))
    assert journal is not None and len(journal.log.quarantined) == 1
    whole = await read_run(client, "snap-garbage", agent=AGENT)
    assert journal.log.last_stream_seq == whole.last_stream_seq == whole.quarantined[0].stream_seq
    result = await resume_run(client, make_spec([], []), "snap-garbage")  # fenced on the garbage: accepted
    assert result.status == "completed"


async def test_two_resumes_from_one_snapshot_only_one_writes(client: LedgerClient) -> None:
    import asyncio

    from runledger.errors import FencedError

    await suspended_run(client, "snap-race")
    results = await asyncio.gather(
        *(resume_run(client, make_spec([], []), "snap-race") for _ in range(2)), return_exceptions=True
    )
    assert sorted(type(r).__name__ for r in results) == sorted(["RunResult", FencedError.__name__]), results
    assert fold((await load_run(client, "snap-race")).records).status == "completed"


async def test_a_crashed_run_resumes_from_its_last_interval_snapshot(client: LedgerClient) -> None:
    live: list[Any] = []
    with pytest.raises(Crash):
        await start_run(client, make_spec(live, [25]), run_id="snap-crash")
    last = await last_agent_event(client, "snap-crash")
    assert last.type != SNAPSHOT  # a step's event: the snapshot is found some way back
    journal = await load_journal(client, "snap-crash", AGENT, client_opener(client))
    assert journal is not None and journal.snapshot_seq >= 16
    whole = await read_run(client, "snap-crash", agent=AGENT)
    assert journal.log.records[-1].event == whole.records[-1].event
    assert journal.log.last_stream_seq == whole.last_stream_seq

    replayed: list[Any] = []
    result = await resume_run(client, make_spec(replayed, []), "snap-crash")
    assert result.status == "suspended"  # the approval, now asked for live
    assert replayed[:25] == live


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
async def test_a_damaged_snapshot_falls_back_to_the_whole_run(
    client: LedgerClient, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = f"snap-{damage}"
    _, live = await suspended_run(client, run_id)
    ref = (await last_agent_event(client, run_id)).payload["journal"]
    if damage == "missing":
        assert await BlobStore(client).delete(ref["sha256"])
    else:  # other bytes under the snapshot's name: the object store is addressed by name
        store = await client.js.object_store(BLOB_BUCKET)
        await store.put(ref["sha256"], b'{"run_id": "someone else"}')
    with caplog.at_level(logging.WARNING, logger="runledger.sdk.snapshot"):
        assert await load_journal(client, run_id, AGENT, client_opener(client)) is None
        replayed: list[Any] = []
        result = await resume_run(client, make_spec(replayed, []), run_id)
    assert "is not usable" in caplog.text and "reading the whole run" in caplog.text
    assert result.status == "completed" and replayed == [*live[:STEPS], "alice"]


async def test_the_snapshot_of_an_erased_run_is_unreadable(client: LedgerClient) -> None:
    from runledger.errors import PayloadUnavailableError

    await suspended_run(client, "snap-erased")
    ref = (await last_agent_event(client, "snap-erased")).payload["journal"]
    assert ref["enc"] == "A256GCM" and ref["kid"] == f"{AGENT}.snap-erased"  # sealed under the run's key
    await erase_run(client, "snap-erased", reason="test", by="op")
    assert not await BlobStore(client).exists(ref["sha256"])  # erasure deleted it with the run's blobs
    with pytest.raises(PayloadUnavailableError):
        await client_opener(client).open_value(ref)
    assert await load_journal(client, "snap-erased", AGENT, client_opener(client)) is None


async def test_the_journal_is_read_as_the_object_store_lays_it_out(
    client: LedgerClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Its metadata by a direct get and its chunks by one subject read (BlobStore.fetch), not
    through nats-py's object store ``get``, which stays the way for blobs stored otherwise."""
    await suspended_run(client, "snap-direct")

    async def refused(self: BlobStore, sha: str) -> bytes:
        raise AssertionError("nats-py's object store read was used")

    monkeypatch.setattr(BlobStore, "_read_through_store", refused)
    with caplog.at_level(logging.WARNING, logger="runledger.sdk.snapshot"):
        journal = await load_journal(client, "snap-direct", AGENT, client_opener(client))
    assert journal is not None and "not usable" not in caplog.text
    assert journal.keys is not None and journal.keys.kid == f"{AGENT}.snap-direct"  # read with it, for the writer


async def test_a_snapshot_whose_head_is_not_where_the_stream_holds_it_is_refused(
    client: LedgerClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A snapshot whose event and journal agree on a head stream sequence the stream does not hold
    the head at (one earlier) is checked against the stream, not only against itself."""
    from runledger.record.events import JournalSnapshotted

    opened = snapshot.opened_journal

    async def journal_off_by_one(cp: Any, opener: Any) -> dict[str, Any]:
        data = await opened(cp, opener)
        return {**data, "last_stream_seq": data["last_stream_seq"] - 1}

    def event_off_by_one(**body: Any) -> JournalSnapshotted:
        return JournalSnapshotted(**{**body, "head_stream_seq": body["head_stream_seq"] - 1})

    with monkeypatch.context() as patched:  # while the run is recorded
        patched.setattr(snapshot, "opened_journal", journal_off_by_one)
        patched.setattr(snapshot, "JournalSnapshotted", event_off_by_one)
        _, live = await suspended_run(client, "snap-elsewhere")
    assert (await last_agent_event(client, "snap-elsewhere")).type == SNAPSHOT
    with caplog.at_level(logging.WARNING, logger="runledger.sdk.snapshot"):
        assert await load_journal(client, "snap-elsewhere", AGENT, client_opener(client)) is None
        replayed: list[Any] = []
        result = await resume_run(client, make_spec(replayed, []), "snap-elsewhere")
    assert "is not its head" in caplog.text or "no event at" in caplog.text
    assert result.status == "completed" and replayed == [*live[:STEPS], "alice"]
