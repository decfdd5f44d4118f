"""The ``Run`` contract (tests/run_contract.py) on the in-memory ledger (runledger.log.memory): every
implementation of ``Run`` by behaviour, without a server. The same cases run on nats-server in
tests/integration/test_run_contract.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from runledger.log.memory import MemoryLedger
from tests.run_contract import (
    BranchRunContract,
    RecordedRunContract,
    RemoteRunContract,
    ResumedRunContract,
    SyncRunContract,
)


class OnMemory:
    @pytest.fixture(autouse=True)
    async def _client(self) -> AsyncIterator[None]:
        self.client = await MemoryLedger().connect()
        yield
        await self.client.close()


class TestRecordedRun(OnMemory, RecordedRunContract):
    pass


class TestResumedRun(OnMemory, ResumedRunContract):
    pass


class TestSyncRun(OnMemory, SyncRunContract):
    pass


class TestBranchRun(OnMemory, BranchRunContract):
    pass


class TestRemoteRun(OnMemory, RemoteRunContract):
    pass
