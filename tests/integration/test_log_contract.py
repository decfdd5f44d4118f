"""The log's contract (tests/log_contract.py) on a real nats-server: what the in-memory ledger
(tests/unit/test_log_memory.py) is held to."""

from __future__ import annotations

import pytest

from runledger.log.client import LedgerClient
from tests.log_contract import LogContract

pytestmark = pytest.mark.integration


class TestNatsServer(LogContract):
    @pytest.fixture(autouse=True)
    def _client(self, client: LedgerClient) -> None:
        self.client = client
