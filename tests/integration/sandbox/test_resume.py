"""Resuming a branch never acts on the host (runledger.sandbox.resume), tried as an unlucky operator would.

The parent is a refund over the approval threshold, never approved. Its live re-run from step 0 (no
``--allow-effects``) reaches the same approval in the branch and suspends; the operator approves the
branch and resumes it, as the re-run's own output tells them to. Before the fix, ``resume`` drove the
branch on the host as a plain run and the refund was paid for real. The witness is the payments
service's own log; the branch's record and the engine's container events show where it was driven.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from runledger.cli import main
from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient, connect
from runledger.ops.decisions import approve
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sandbox.containers import LABEL, SandboxPolicy
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sandbox.worker import run_worker
from runledger.sdk.lifecycle import start_run
from runledger.ui.actions import Resumer
from tests.integration.sandbox.owned import containers_of

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(180)]
AGENT = "runledger.examples.refund_agent.agent:spec"
LAPTOP = TICKETS[3]  # order-7777, 950.00: above the approval threshold


async def _unapproved_parent(client: LedgerClient, run_id: str) -> None:
    parent = await start_run(client, spec(), LAPTOP, run_id=run_id)
    assert parent.status == "suspended" and parent.reason == "approval"


async def _pending(client: LedgerClient, run_id: str) -> str:
    [request] = fold((await load_run(client, run_id)).records).pending_approvals
    return str(request)


def _sandboxes_created(docker: Any, since: int) -> int:
    """Containers the engine created for this process's sandboxes since ``since`` (removed ones too)."""
    events = docker.events(since=since, until=int(time.time()) + 1, decode=True,
                           filters={"type": "container", "event": "create", "label": LABEL})  # fmt: skip
    owners = [e.get("Actor", {}).get("Attributes", {}).get(f"{LABEL}.owner", "") for e in events]
    return sum(1 for owner in owners if owner.endswith(f":{os.getpid()}"))


async def _branch_went_on_in_a_sandbox(client: LedgerClient, branch: str) -> None:
    """The branch's record: resumed by a re-runner (not by a host process), the refund stubbed."""
    log = await load_run(client, branch)
    cp = fold(log.records)
    assert cp.status == "completed", cp.error
    resumed = [e.payload for e in log.events if e.type == "run.resumed"]
    assert resumed and resumed[-1]["worker"] == "rerun"
    refunds = [e for e in log.events if e.payload.get("key") == "refund:order-7777"]
    assert [e.type for e in refunds] == ["effect.simulated"]
    assert cp.output["refund"]["simulated"] is True


def test_resume_of_a_branch_re_drives_it_in_a_sandbox_and_pays_nothing(
    nats_url: str, sandbox_image: str, docker: Any, payments: PaymentsService, capsys: pytest.CaptureFixture[str]
) -> None:
    async def record() -> None:
        async with await connect(nats_url) as client:
            await _unapproved_parent(client, "laptop")

    asyncio.run(record())
    code = main(["rerun", "laptop", "--nats", nats_url, "--agent", AGENT, "--mode", "live", "--at-step", "0",
                 "--local"])  # fmt: skip
    out = capsys.readouterr().out
    branch = out.split()[1]
    assert code == 5 and "suspended (approval)" in out, out
    assert f"runledger approve {branch}" in out and "then resume" in out  # what the operator is told to do

    async def pending() -> str:
        async with await connect(nats_url) as client:
            return await _pending(client, branch)

    request = asyncio.run(pending())
    assert main(["approve", branch, request, "--by", "op", "--nats", nats_url]) == 0
    capsys.readouterr()
    since = int(time.time())
    code = main(["resume", branch, "--agent", AGENT, "--nats", nats_url])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert f"branch {branch} of laptop (live from step 0): completed" in out
    assert "re-driven in a sandbox (live, effects stubbed)" in err
    assert payments.calls() == []  # the witness: no refund was paid, for the branch or anyone
    assert _sandboxes_created(docker, since) >= 1
    assert containers_of(docker, os.getpid()) == []

    async def check() -> None:
        async with await connect(nats_url) as client:
            await _branch_went_on_in_a_sandbox(client, branch)
            assert fold((await load_run(client, "laptop")).records).status == "suspended"  # the parent waits on

    asyncio.run(check())
    # Resumed again: it ended, nothing runs.
    assert main(["resume", branch, "--agent", AGENT, "--nats", nats_url]) == 0
    assert f"branch {branch} is completed: nothing to do" in capsys.readouterr().out
    assert payments.calls() == []


async def test_the_pages_resume_after_an_approval_queues_the_branch_for_a_sandbox(
    client: LedgerClient, rerunner: Rerunner, docker: Any, sandbox_image: str, payments: PaymentsService
) -> None:
    await _unapproved_parent(client, "laptop-page")
    opened = await rerunner.rerun(RerunRequest(parent_run_id="laptop-page", agent=AGENT, mode="live", fork_step=0))
    assert opened.status == "suspended"
    branch = opened.run_id
    # The page: approve, then resume "through the same function" as the CLI (Resumer, resume_run).
    await approve(client, branch, await _pending(client, branch), by="op")
    resumer = Resumer([AGENT])
    assert resumer.resume_later(client, branch, "refund-agent")
    await asyncio.gather(*resumer.tasks)
    outcome = resumer.results[branch]
    assert not isinstance(outcome, str), outcome
    assert payments.calls() == []  # nothing was driven on the host
    # A worker takes the branch's own request and re-drives it in a sandbox.
    since = int(time.time())
    handled = await asyncio.wait_for(
        run_worker(client, docker, policy=SandboxPolicy(image=sandbox_image, timeout_s=20), pool_size=0,
                   max_requests=1),
        120,
    )  # fmt: skip
    assert handled == 1
    assert payments.calls() == []
    assert _sandboxes_created(docker, since) >= 1
    await _branch_went_on_in_a_sandbox(client, branch)
