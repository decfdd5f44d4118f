"""The ``Run`` contract (tests/run_contract.py) on a real nats-server: the same scripted agents and the
same expectations as on the in-memory ledger (tests/unit/test_run_contract.py), so the memory ledger
cannot drift from the server the library is written for."""

from __future__ import annotations

import pytest

from runledger.log.client import LedgerClient
from tests.run_contract import (
    BranchRunContract,
    RecordedRunContract,
    RemoteRunContract,
    ResumedRunContract,
    SyncRunContract,
)

pytestmark = pytest.mark.integration


class OnNats:
    @pytest.fixture(autouse=True)
    def _client(self, client: LedgerClient) -> None:
        self.client = client


class TestRecordedRun(OnNats, RecordedRunContract):
    pass


class TestResumedRun(OnNats, ResumedRunContract):
    pass


class TestSyncRun(OnNats, SyncRunContract):
    pass


class TestBranchRun(OnNats, BranchRunContract):
    pass


class TestRemoteRun(OnNats, RemoteRunContract):
    pass
