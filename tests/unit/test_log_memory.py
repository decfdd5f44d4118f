"""The log's contract (tests/log_contract.py) on the in-memory ledger, and what is its own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from runledger.log.memory import MemoryLedger, subject_matches
from tests.log_contract import AGENT_SUBJECT, LogContract


class TestMemoryLedger(LogContract):
    @pytest.fixture(autouse=True)
    async def _client(self) -> AsyncIterator[None]:
        self.ledger = MemoryLedger()
        self.client = await self.ledger.connect()
        yield
        await self.client.close()

    async def test_clients_of_one_ledger_share_it(self) -> None:
        other = await self.ledger.connect()
        await self.client.js.publish(AGENT_SUBJECT, b"x")
        assert (await other.js.get_last_msg("LEDGER", AGENT_SUBJECT)).data == b"x"
        assert [m.data for m in self.ledger.messages("ledger.run.>")] == [b"x"]

    async def test_a_subject_of_no_stream_has_no_responders(self) -> None:
        from nats.js.errors import NoStreamResponseError

        with pytest.raises(NoStreamResponseError):
            await self.client.js.publish("nowhere.at.all", b"x")


def test_subject_wildcards_match_as_nats_does() -> None:
    assert subject_matches("ledger.run.a.r1.*", "ledger.run.a.r1.w")
    assert not subject_matches("ledger.run.a.r1.*", "ledger.run.a.r1")
    assert not subject_matches("ledger.run.a.r1.*", "ledger.run.a.r1.w.x")
    assert subject_matches("ledger.>", "ledger.run.a")
    assert not subject_matches("ledger.>", "ledger")
    assert subject_matches("a.b", "a.b") and not subject_matches("a.b", "a.c")
