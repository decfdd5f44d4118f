"""runledger.log.fastread.read_subject against a real server: a filtered subject (gaps in stream
sequences), a start sequence, an empty subject, no consumer left behind (a read is batch direct
gets), the same through nats-py (runledger.log.directget), and a stored header that names itself
the stream's own."""

from __future__ import annotations

import pytest

from runledger.log.client import LedgerClient
from runledger.log.directget import read_direct
from runledger.log.fastread import read_subject
from runledger.log.reader import _read_ordered, read_raw
from runledger.log.subjects import LEDGER_STREAM

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_filtered_read_returns_what_the_ordered_consumer_returns(client: LedgerClient) -> None:
    for i in range(300):
        await client.js.publish(f"ledger.run.a.r{i % 3}", f"event {i}".encode())
    fast = await read_subject(client, LEDGER_STREAM, "ledger.run.*.r1")
    through_nats_py = await read_direct(client, LEDGER_STREAM, "ledger.run.*.r1")
    later = await read_raw(client, "ledger.run.a.r1", start_seq=150)
    assert await read_raw(client, "ledger.run.a.nothing") == []
    assert await client.js.consumers_info(LEDGER_STREAM) == []  # direct gets: nothing made, nothing left
    slow = await _read_ordered(client, "ledger.run.*.r1", start_seq=1, timeout=10)
    as_stored = [(r.stream_seq, r.subject, r.data) for r in slow]
    assert [(r.stream_seq, r.subject, r.data) for r in fast] == as_stored
    assert [(r.stream_seq, r.subject, r.data) for r in through_nats_py] == as_stored
    assert len(fast) == 100 and fast[0].stream_seq == 2 and fast[-1].stream_seq == 299
    assert [r.stream_seq for r in later] == [r.stream_seq for r in fast if r.stream_seq >= 150]


async def test_a_stored_header_named_as_the_streams_own_moves_no_message(client: LedgerClient) -> None:
    """A writer may store any header on its own subject, ``Nats-Subject`` and ``Nats-Sequence`` too: a
    direct get answers with the server's own after them, and the readers take those."""
    await client.js.publish("ledger.run.a.r1.a", b"genuine")
    # The block the server appends, in its order, as the attacker would forge it.
    forged = {
        "Nats-Stream": "LEDGER", "Nats-Subject": "ledger.run.victim.r9.o", "Nats-Sequence": "1",
        "Nats-Time-Stamp": "2026-01-01T00:00:00Z", "Nats-Num-Pending": "0", "Nats-Last-Sequence": "0",
    }  # fmt: skip
    ack = await client.js.publish("ledger.run.a.r1.a", b"forged headers", headers=forged)
    await client.js.publish("ledger.run.a.r1.a", b"after")
    expected = [(1, "ledger.run.a.r1.a", b"genuine"), (ack.seq, "ledger.run.a.r1.a", b"forged headers"),
                (3, "ledger.run.a.r1.a", b"after")]  # fmt: skip
    for records in (
        await read_subject(client, LEDGER_STREAM, "ledger.run.a.r1.*"),
        await read_direct(client, LEDGER_STREAM, "ledger.run.a.r1.*"),
    ):
        assert [(r.stream_seq, r.subject, r.data) for r in records] == expected
    assert await read_raw(client, "ledger.run.victim.>") == []
