"""Workers share the LEDGER_CMD queue; a request whose worker dies is redelivered and completed once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.sandbox.containers import SandboxPolicy
from runledger.sandbox.rerun import RerunRequest
from runledger.sandbox.worker import run_worker, submit
from runledger.sdk.lifecycle import start_run
from tests.conftest import eventually
from tests.integration.sandbox.owned import containers_of

pytestmark = [pytest.mark.integration, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[3]
AGENT = "runledger.examples.refund_agent.agent:spec"


async def test_a_queued_rerun_is_executed_by_a_worker(
    client: LedgerClient, docker: Any, sandbox_image: str, payments: PaymentsService
) -> None:
    await start_run(client, spec(), TICKETS[0], run_id="q-parent")
    requests = [RerunRequest(parent_run_id="q-parent", agent=AGENT, mode="redrive", fork_step=0) for _ in range(3)]
    for request in requests:
        await submit(client, request)
    await submit(client, requests[0])  # a duplicate submission is deduplicated by its id
    seen: list[Any] = []
    handled = await run_worker(client, docker, policy=SandboxPolicy(image=sandbox_image), pool_size=1,
                               max_requests=3, on_result=lambda r, o: seen.append(o))  # fmt: skip
    assert handled == 3
    assert sorted(o.run_id for o in seen) == sorted(r.branch_run_id for r in requests)
    assert all(o.status == "completed" for o in seen)
    assert any(o.warm for o in seen)  # the pool served at least one from a warm container
    assert len(payments.calls()) == 1


def _worker(url: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runledger", "worker", "--nats", url, "--pool", "0", "--max-requests", "1",
         "--ack-wait", "2"],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def test_a_worker_killed_mid_rerun_is_replaced_and_the_rerun_completes_once(
    client: LedgerClient, nats_url: str, docker: Any, sandbox_image: str, payments: PaymentsService
) -> None:
    await start_run(client, spec(), TICKETS[0], run_id="k-parent")
    request = RerunRequest(parent_run_id="k-parent", agent=AGENT, mode="live", fork_step=0)
    await submit(client, request)
    env = {"REFUND_PAYMENTS_URL": payments.url, "REFUND_OUTBOX": os.environ["REFUND_OUTBOX"]}
    first = _worker(nats_url, {**env, "RUNLEDGER_CRASH_AT": "step:1:recorded"})
    assert await asyncio.to_thread(first.wait, 60) == -9
    log = await load_run(client, request.branch_run_id)
    assert [e.type for e in log.events][-1] == "tool.called"  # it died mid-re-run
    second = _worker(nats_url, env)
    out, err = await asyncio.to_thread(second.communicate, timeout=90)
    assert second.returncode == 0, err
    assert f"branch {request.branch_run_id} completed" in out
    log = await load_run(client, request.branch_run_id)
    types = [e.type for e in log.events]
    assert types.count("run.completed") == 1 and types.count("run.started") == 1
    assert "run.resumed" in types
    assert len(payments.calls()) == 1

    await eventually(lambda: not containers_of(docker, first.pid, second.pid), timeout=20)
