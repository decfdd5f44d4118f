"""The ``Run`` contract (tests/run_contract.py) with the agent in a real sandbox: the guest's
``RemoteRun`` in a container, across the broker's socket, the host's ``BranchRun`` answering. The
in-process guest of tests/integration/test_run_contract.py runs the same code without Docker."""

from __future__ import annotations

import pytest

from runledger.log.client import LedgerClient
from runledger.sandbox.containers import SandboxPool
from tests.run_contract import Drive, RemoteRunContract, remote

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(180)]


class TestRemoteRunInAContainer(RemoteRunContract):
    @pytest.fixture(autouse=True)
    def _client(self, client: LedgerClient, pool: SandboxPool) -> None:
        self.client = client
        self.pool = pool

    async def drive(self, run_id: str) -> Drive:
        return await remote(self.client, run_id, 2, self.pool)
