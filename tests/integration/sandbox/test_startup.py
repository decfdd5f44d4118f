"""Start-up of a sandbox: a warm one has the agent its pool is keyed by loaded before it says hello,
and the re-run still gets the agent it names (another one, or the load's error as its outcome)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient
from runledger.sandbox.broker import Broker
from runledger.sandbox.containers import SandboxPool, package_mounts
from runledger.sandbox.errors import AgentFailedError
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.lifecycle import start_run
from tests.conftest import eventually

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(120)]
CODE = package_mounts(Path(__file__).resolve().parents[3], "tests")
MODULE = "tests.integration.sandbox.preload_agent"


async def handed_out(pool: SandboxPool, preload: str, agent: str) -> tuple[float, Any]:
    """(when the pool handed the sandbox out, on the monotonic clock; what the guest ran ``agent`` to)."""
    sandbox = await pool.acquire(CODE, preload)
    acquired = time.monotonic()
    try:
        reader, writer = await sandbox.channel(5.0)
        start = {"agent": agent, "run_id": "startup-test", "agent_name": "x", "input": None}
        broker = Broker(reader, writer, start, deadline=time.monotonic() + 30)
        return acquired, await broker.serve(None, sandbox.hello)
    finally:
        await pool.discard(sandbox)


async def test_the_agent_is_loaded_before_the_sandbox_is_handed_out(pool: SandboxPool) -> None:
    acquired, output = await handed_out(pool, f"{MODULE}:spec", f"{MODULE}:spec")
    assert output == {"imported_at": output["imported_at"], "ran": "first"}
    assert output["imported_at"] < acquired


async def test_without_a_preload_the_agent_is_loaded_after(pool: SandboxPool) -> None:
    # The witness of the test above: the same agent, not named when the sandbox was created.
    acquired, output = await handed_out(pool, "", f"{MODULE}:spec")
    assert output["imported_at"] > acquired


async def test_a_re_run_naming_another_agent_gets_that_one(pool: SandboxPool) -> None:
    _, output = await handed_out(pool, f"{MODULE}:spec", f"{MODULE}:other")
    assert output["ran"] == "second"


async def test_an_agent_that_fails_to_load_ahead_fails_its_re_run(pool: SandboxPool) -> None:
    # The guest still says hello (else the pool would report a sandbox that never connected) and
    # the re-run's outcome is the load's error, as when nothing is loaded ahead.
    with pytest.raises(AgentFailedError, match="this factory always fails"):
        await handed_out(pool, f"{MODULE}:broken", f"{MODULE}:broken")


async def test_warm_sandboxes_are_kept_per_agent(pool: SandboxPool) -> None:
    pool.size = 1
    await pool.prewarm(CODE, f"{MODULE}:spec")
    other = await pool.acquire(CODE, f"{MODULE}:other")
    assert (pool.warm_hits, pool.cold_starts) == (0, 1)  # the one warm sandbox loaded another agent
    await pool.discard(other)
    first = await pool.acquire(CODE, f"{MODULE}:spec")
    assert (pool.warm_hits, pool.cold_starts) == (1, 1)
    await pool.discard(first)


async def test_a_request_that_already_ran_removes_the_sandbox_taken_for_it(
    client: LedgerClient, rerunner: Rerunner, pool: SandboxPool, payments: PaymentsService
) -> None:
    # The sandbox is acquired while the branch is opened, before the branch's record says the
    # request already ran: that sandbox is removed at once, not kept until the pool closes.
    await start_run(client, spec(), TICKETS[0], run_id="p-startup")
    request = RerunRequest(parent_run_id="p-startup", agent="runledger.examples.refund_agent.agent:spec",
                           mode="redrive", fork_step=1)  # fmt: skip
    assert (await rerunner.rerun(request)).status == "completed"
    again = await rerunner.rerun(request)
    assert again.nothing_to_do and again.status == "completed"
    assert pool.cold_starts == 2
    await eventually(lambda: len(pool) == 0)
