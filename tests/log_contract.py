"""The log's contract, as the library relies on it: one abstract case run on nats-server
(tests/integration/test_log_contract.py) and on the in-memory ledger (tests/unit/test_log_memory.py),
so ``runledger.log.memory`` answers what the server answers.

- an append is fenced on the last sequence of its subject (or of the run's subjects, by the
  ``-Subject`` header): a stale fence is ``BadRequestError`` 10071 "wrong last sequence: N" and
  ``publish_fenced`` turns it into FencedError; nothing is stored; a run's first message is fenced
  on every agent's subjects of its id (the claim of the id), its later ones on the run's own;
- the fence is checked before the msg id; a msg id stored already, under a fence that holds, is
  acknowledged as a duplicate with the first sequence, and stored once; such an ack is believed only
  over the stored bytes (another writer's message under the run's next msg id fences the writer);
- a subject is read back in stream order, from a sequence; its last message by a direct get;
- an atomic batch is stored whole, or refused whole on a stale fence;
- run keys (KV, update with an expected revision) and blobs (by sha256) round-trip.
"""

from __future__ import annotations

import pytest
from nats.js.errors import BadRequestError

from runledger.errors import FencedError, KeyStoreError
from runledger.log.client import LedgerClient
from runledger.log.publish import RetryPolicy, SubjectWriter, last_subject_seq, publish_fenced
from runledger.log.reader import read_raw, subject_counts
from runledger.log.subjects import FENCE_HEADER, FENCE_SUBJECT_HEADER, LEDGER_STREAM, run_subject
from runledger.log.window import ATOMIC_MIN, Window, WindowedWriter
from runledger.protect.blobs import BlobStore
from runledger.protect.keystore import KVKeyStore
from runledger.record.events import ToolCalled

AGENT_SUBJECT = run_subject("a", "r1")  # ledger.run.a.r1.a
WORKER_SUBJECT = run_subject("a", "r1", "w")
QUICK = RetryPolicy(deadline_s=2.0)


class LogContract:
    client: LedgerClient

    async def test_a_stale_fence_is_refused_as_the_server_refuses_it(self) -> None:
        js = self.client.js
        assert await publish_fenced(js, AGENT_SUBJECT, b"one", "r1:0", 0) > 0
        with pytest.raises(BadRequestError) as refused:
            await js.publish(AGENT_SUBJECT, b"two", headers={"Nats-Msg-Id": "r1:1", FENCE_HEADER: "0"})
        first = await last_subject_seq(js, AGENT_SUBJECT)
        assert (refused.value.err_code, refused.value.description) == (10071, f"wrong last sequence: {first}")
        with pytest.raises(FencedError) as fenced:
            await publish_fenced(js, AGENT_SUBJECT, b"two", "r1:1", 0, QUICK)
        assert (fenced.value.expected, fenced.value.actual) == (0, first)
        assert [r.data for r in await read_raw(self.client, AGENT_SUBJECT)] == [b"one"]

    async def test_the_fence_covers_every_writer_of_the_run(self) -> None:
        js = self.client.js
        seq = await publish_fenced(js, AGENT_SUBJECT, b"agent", "r1:0", 0)
        with pytest.raises(FencedError):  # the worker's subject is empty, but the run is not
            await publish_fenced(js, WORKER_SUBJECT, b"worker", "r1:0w", 0, QUICK)
        assert await publish_fenced(js, WORKER_SUBJECT, b"worker", "r1:1", seq) > seq
        wildcard = {FENCE_HEADER: str(seq), FENCE_SUBJECT_HEADER: "ledger.run.a.r1.*", "Nats-Msg-Id": "r1:2"}
        with pytest.raises(BadRequestError):
            await js.publish(AGENT_SUBJECT, b"stale", headers=wildcard)

    async def test_a_runs_first_message_claims_its_id_over_every_agent(self) -> None:
        js = self.client.js
        bob, alice = run_subject("bob", "r9"), run_subject("alice", "r9")
        seq = await publish_fenced(js, bob, b"bob", "r9:0", 0)
        with pytest.raises(FencedError):  # alice's subject of r9 is empty, but the run id is bob's
            # (another msg id than bob's r9:0: the fence refuses it, not the duplicate window)
            await publish_fenced(js, alice, b"alice", "r9-alice:0", 0, QUICK)
        assert [r.data for r in await read_raw(self.client, "ledger.run.*.r9.*")] == [b"bob"]
        # Once claimed, the run's appends are fenced on its own subjects: what another agent writes
        # under the id (unfenced) never fences the owner out.
        await js.publish(alice, b"squat")
        assert await publish_fenced(js, bob, b"bob2", "r9:1", seq) > seq

    async def test_a_msg_id_is_stored_once_and_the_fence_is_checked_first(self) -> None:
        js = self.client.js
        seq = await publish_fenced(js, AGENT_SUBJECT, b"one", "r1:0", 0)
        again = await js.publish(AGENT_SUBJECT, b"one", headers={"Nats-Msg-Id": "r1:0", FENCE_HEADER: str(seq)})
        assert (again.seq, again.duplicate) == (seq, True)
        with pytest.raises(BadRequestError):  # same msg id, stale fence: the fence answers first
            await js.publish(AGENT_SUBJECT, b"one", headers={"Nats-Msg-Id": "r1:0", FENCE_HEADER: "0"})
        # A retry whose first ack was lost: publish_fenced finds its own message and returns it.
        assert await publish_fenced(js, AGENT_SUBJECT, b"one", "r1:0", 0, QUICK) == seq
        assert len(await read_raw(self.client, AGENT_SUBJECT)) == 1

    async def test_another_writers_bytes_under_the_runs_next_msg_id_fence_the_writer(self) -> None:
        """Msg ids are compared stream-wide, the payload never: another writer (another agent, on its
        own subject) stores anything under the run's next msg id first, and the server answers the
        run's append with a duplicate ack of that message. The writer must not take it for its own
        event (docs/architecture.md: a duplicate ack is believed only if the stored bytes are ours):
        it is fenced, and the run holds its one message."""
        js = self.client.js
        writer = SubjectWriter(js, AGENT_SUBJECT, run_id="r1", agent="a", msg_id_prefix="r1", policy=QUICK)
        await writer.append(ToolCalled(step=0, name="t", args={"n": 0}, args_digest="d0"))
        forged = await js.publish(
            run_subject("mallory", "m1"), b'{"not": "the run\'s"}', headers={"Nats-Msg-Id": "r1:1"}
        )
        with pytest.raises(FencedError) as fenced:
            await writer.append(ToolCalled(step=1, name="t", args={"n": 1}, args_digest="d1"))
        assert fenced.value.actual == forged.seq
        assert writer.next_seq == 1  # the writer did not move past the event it never stored
        assert len(await read_raw(self.client, "ledger.run.a.r1.*")) == 1

    async def test_subjects_read_back_in_stream_order(self) -> None:
        js = self.client.js
        seqs = []
        last = 0
        for i in range(5):
            subject = AGENT_SUBJECT if i % 2 == 0 else WORKER_SUBJECT
            last = await publish_fenced(js, subject, f"m{i}".encode(), f"r1:{i}", last)
            seqs.append(last)
        everything = await read_raw(self.client, "ledger.run.a.r1.*")
        assert [r.data for r in everything] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        assert [r.stream_seq for r in everything] == seqs
        assert [r.data for r in await read_raw(self.client, WORKER_SUBJECT)] == [b"m1", b"m3"]
        assert [r.data for r in await read_raw(self.client, "ledger.run.a.r1.*", start_seq=seqs[2])] == [
            b"m2", b"m3", b"m4",
        ]  # fmt: skip
        assert await subject_counts(self.client, "ledger.run.a.r1.*") == {AGENT_SUBJECT: 3, WORKER_SUBJECT: 2}
        assert await read_raw(self.client, "ledger.run.a.nothing.*") == []
        assert await last_subject_seq(js, "ledger.run.a.r1.*") == seqs[-1]
        assert (await js.get_last_msg(LEDGER_STREAM, AGENT_SUBJECT, direct=True)).data == b"m4"

    async def test_a_window_is_one_atomic_batch_stored_whole_or_not_at_all(self) -> None:
        def writer(last: int) -> WindowedWriter:
            return WindowedWriter(
                self.client.nc, self.client.js, AGENT_SUBJECT, run_id="r1", agent="a", msg_id_prefix="r1",
                last_stream_seq=last, policy=QUICK, window=Window(max_events=ATOMIC_MIN * 2, max_ms=10_000),
            )  # fmt: skip

        first = writer(0)
        for step in range(ATOMIC_MIN):
            await first.append(ToolCalled(step=step, name="t", args=step, args_digest="d"))
        await first.commit()
        assert (first.batches, len(await read_raw(self.client, AGENT_SUBJECT))) == (1, ATOMIC_MIN)
        zombie = writer(0)  # a writer whose view of the run is stale
        zombie.next_seq = ATOMIC_MIN
        for step in range(ATOMIC_MIN):
            await zombie.append(ToolCalled(step=ATOMIC_MIN + step, name="t", args=step, args_digest="d"))
        with pytest.raises(FencedError):
            await zombie.commit()
        assert len(await read_raw(self.client, AGENT_SUBJECT)) == ATOMIC_MIN  # nothing of the batch

    async def test_run_keys_are_created_once_and_stay_destroyed(self) -> None:
        store = KVKeyStore(self.client.js)
        keys = await store.create("a.r1")
        assert await store.create("a.r1") == keys  # a second creator gets the same keys
        assert await store.get("a.r1") == keys
        assert await store.get("a.other") is None
        assert await store.destroy("a.r1") is True
        assert await store.get("a.r1") is None
        with pytest.raises(KeyStoreError, match="destroyed"):
            await store.create("a.r1")

    async def test_blobs_round_trip_by_sha256(self) -> None:
        blobs = BlobStore(self.client)
        ref = await blobs.put(b'{"big": true}')
        assert await blobs.exists(ref["sha256"])
        assert await blobs.fetch(ref) == b'{"big": true}'
        assert await blobs.delete(ref["sha256"]) is True
        assert not await blobs.exists(ref["sha256"])
