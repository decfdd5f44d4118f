"""Exactly-once and single-writer guarantees against a real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from runledger.errors import FencedError
from runledger.log.client import LedgerClient
from runledger.log.publish import RetryPolicy, SubjectWriter, publish_fenced
from runledger.log.reader import read_raw
from runledger.log.subjects import run_subject
from runledger.protect.loading import load_run
from runledger.record.events import ClockRead

pytestmark = pytest.mark.integration


async def test_a_retried_publish_with_the_same_msg_id_stores_one_message(client: LedgerClient) -> None:
    subject = run_subject("a", "dedup1")
    first = await client.js.publish(subject, b"one", headers={"Nats-Msg-Id": "dedup1:0"})
    again = await client.js.publish(subject, b"one", headers={"Nats-Msg-Id": "dedup1:0"})
    assert again.duplicate and again.seq == first.seq
    assert len(await read_raw(client, subject)) == 1


async def test_retry_after_a_lost_ack_is_recognised_as_our_own_write(client: LedgerClient) -> None:
    subject = run_subject("a", "lostack")
    seq = await publish_fenced(client.js, subject, b"payload", "lostack:0", 0)
    # The ack of the first attempt was "lost": the retry carries the same msg id and fence.
    assert await publish_fenced(client.js, subject, b"payload", "lostack:0", 0) == seq
    assert len(await read_raw(client, subject)) == 1


async def test_a_second_writer_is_fenced_and_the_first_continues(client: LedgerClient) -> None:
    subject = run_subject("a", "fence1")
    first = SubjectWriter(client.js, subject, run_id="fence1", agent="a", msg_id_prefix="fence1")
    await first.append(ClockRead(step=0, value="t0"))
    # A zombie that read the run at the same point as the first writer...
    zombie = SubjectWriter(
        client.js,
        subject,
        run_id="fence1",
        agent="a",
        msg_id_prefix="fence1",
        next_seq=first.next_seq,
        prev_hash=first.prev_hash,
        last_stream_seq=first.last_stream_seq,
    )
    await first.append(ClockRead(step=1, value="t1"))
    with pytest.raises(FencedError) as info:
        await zombie.append(ClockRead(step=1, value="zombie"))
    assert "another writer owns" in str(info.value)
    await first.append(ClockRead(step=2, value="t2"))
    log = await load_run(client, "fence1")
    assert [e.payload["value"] for e in log.events] == ["t0", "t1", "t2"]
    assert not log.quarantined


async def test_twenty_racing_claims_on_a_new_subject_have_one_winner(client: LedgerClient) -> None:
    subject = "ledger.effect.race"

    async def claim(i: int) -> bool:
        try:
            await publish_fenced(client.js, subject, f"claim {i}".encode(), f"race:{i}", 0, RetryPolicy(deadline_s=5))
        except FencedError:
            return False
        return True

    wins = await asyncio.gather(*(claim(i) for i in range(20)))
    assert sum(wins) == 1
    assert len(await read_raw(client, subject)) == 1
