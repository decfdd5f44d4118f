"""runledger.log.fastread.read_subject against a real server: a filtered subject (gaps in stream
sequences), a start sequence, an empty subject, and the consumer deleted afterwards."""

from __future__ import annotations

import pytest

from runledger.log.client import LedgerClient
from runledger.log.fastread import read_subject
from runledger.log.reader import _read_ordered, read_raw
from runledger.log.subjects import LEDGER_STREAM
from tests.conftest import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_filtered_read_returns_what_the_ordered_consumer_returns(client: LedgerClient) -> None:
    for i in range(300):
        await client.js.publish(f"ledger.run.a.r{i % 3}", f"event {i}".encode())
    fast = await read_subject(client, LEDGER_STREAM, "ledger.run.*.r1")
    slow = await _read_ordered(client, "ledger.run.*.r1", start_seq=1, timeout=10)
    assert [(r.stream_seq, r.subject, r.data) for r in fast] == [(r.stream_seq, r.subject, r.data) for r in slow]
    assert len(fast) == 100 and fast[0].stream_seq == 2 and fast[-1].stream_seq == 299
    later = await read_raw(client, "ledger.run.a.r1", start_seq=150)
    assert [r.stream_seq for r in later] == [r.stream_seq for r in fast if r.stream_seq >= 150]
    assert await read_raw(client, "ledger.run.a.nothing") == []

    async def no_consumers_left() -> bool:  # every read deletes its consumer (asynchronously)
        return not await client.js.consumers_info(LEDGER_STREAM)

    await eventually(no_consumers_left)
