"""RunledgerCheckpointStorage on a real nats-server: Microsoft Agent Framework workflows checkpointed on the ledger.

The framework's own checkpoint cases (tests/agent_framework_cases.py, copied from its repository) run
against the storage; a workflow's checkpoints list and load from a fresh process; its runs read as
any run (``runs``, ``show``, ``verify``, SQL).
"""

from __future__ import annotations

import inspect

import pytest

from runledger import LedgerClient
from tests import agent_framework_cases as cases

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CASES = sorted(name for name in vars(cases) if name.startswith("case_"))


@pytest.mark.parametrize("case", CASES)
async def test_the_frameworks_own_checkpoint_case_passes_on_the_ledger(client: LedgerClient, case: str) -> None:
    cases.STORAGES.client = client
    try:
        result = getattr(cases, case)()
        if inspect.isawaitable(result):
            await result
    finally:
        cases.STORAGES.client = None
