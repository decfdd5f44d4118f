"""The ledger's rules that integration tests hold on nats-server, held on the in-memory ledger too, so
the fast suite catches a break of either (the duplicate-ack rule is in tests/log_contract.py, run on
both):

- an approval binds to the digest of what it approved (tests/integration/test_ledger_resume.py: the
  same test, run here on memory);
- a key committed by an earlier run is not done again: its recorded result is served and the run
  says so (tests/integration/test_ledger_crash.py drives the CLI in processes; this is its twin);
- a key's event is stored under the key's own msg id, never the run's: under the run's, the server
  acknowledges it as a duplicate of the run's event and stores nothing (tests/integration/
  test_wire_msg_ids.py, run here on memory).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.cli.commands import _served_from_earlier
from runledger.log.client import LedgerClient
from runledger.log.memory import MemoryLedger
from runledger.protect.loading import load_run
from runledger.sdk.effects import read_key
from runledger.sdk.lifecycle import start_run
from tests.integration import test_ledger_resume, test_wire_msg_ids


@pytest.fixture
async def memory() -> AsyncIterator[LedgerClient]:
    client = await MemoryLedger().connect()
    try:
        yield client
    finally:
        await client.close()


async def test_an_approval_does_not_apply_to_a_changed_request(memory: LedgerClient) -> None:
    await test_ledger_resume.test_an_approval_does_not_apply_to_a_changed_request(memory)


async def test_a_claim_under_the_runs_msg_id_is_dropped_as_a_duplicate(memory: LedgerClient) -> None:
    await test_wire_msg_ids.test_a_claim_under_the_runs_msg_id_is_dropped_as_a_duplicate(memory)


async def test_a_key_committed_by_an_earlier_run_is_not_done_again_and_the_run_says_so(memory: LedgerClient) -> None:
    refunds: list[dict[str, Any]] = []

    def refund(args: dict[str, Any]) -> dict[str, Any]:
        refunds.append(args)
        return {"refund_id": f"rf-{len(refunds)}", **args}

    async def refunder(run: Run) -> Any:
        return {"done": await run.effect("refund", {"order": "o-1"}, key="refund:o-1", fn=refund)}

    spec = AgentSpec("refunder", refunder, ScriptedModel([]), agent_version="v1")
    first = await start_run(memory, spec, None, run_id="refund-1")
    again = await start_run(memory, spec, None, run_id="refund-2")
    assert (first.status, again.status) == ("completed", "completed")
    assert refunds == [{"order": "o-1"}]  # the witness: the function ran once across both runs
    assert again.output == first.output == {"done": {"refund_id": "rf-1", "order": "o-1"}}
    [committed] = [e for e in (await load_run(memory, "refund-2")).events if e.type == "effect.committed"]
    assert committed.payload["via"] == "record"
    assert (await read_key(memory, "refund:o-1", "refunder")).run_id == "refund-1"
    assert await _served_from_earlier(memory, "refund-2", "refunder") == [
        "note: effect 'refund:o-1' (step 0) was not done again: its key was committed by run refund-1, whose "
        "recorded result was served (`runledger effects show refund:o-1`)"
    ]
