"""Two worker processes share 20 queued re-runs; one is SIGKILLed in the middle of a re-run.

The dead worker's request is redelivered after ``ack_wait`` and the survivor resumes the same
branch run (fenced). Afterwards every re-run completed exactly once, nothing was paid twice,
the survivor removed the sandboxes the dead worker left behind, and after the survivor is
stopped (SIGTERM) no container of either worker remains.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runledger.errors import RunNotFoundError
from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.sandbox.rerun import RerunRequest
from runledger.sandbox.worker import submit
from runledger.sdk.lifecycle import start_run
from tests.conftest import eventually
from tests.integration.sandbox.owned import containers_of

pytestmark = [pytest.mark.integration, pytest.mark.docker]
ROOT = Path(__file__).resolve().parents[3]
AGENT = "runledger.examples.refund_agent.agent:spec"
RERUNS = 20


def worker(url: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "runledger", "worker", "--nats", url, "--pool", "1", "--ack-wait", "3"],
            cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


async def test_a_fleet_loses_a_worker_mid_rerun_and_every_rerun_completes_once(
    client: LedgerClient, nats_url: str, docker: Any, sandbox_image: str, payments: PaymentsService, tmp_path: Path
) -> None:
    await start_run(client, spec(), TICKETS[0], run_id="fleet-parent")
    paid_before = len(payments.calls())
    requests = [
        RerunRequest(parent_run_id="fleet-parent", agent=AGENT, mode="redrive", fork_step=1) for _ in range(RERUNS)
    ]
    for request in requests:
        await submit(client, request)

    env = {"REFUND_PAYMENTS_URL": payments.url, "REFUND_OUTBOX": os.environ["REFUND_OUTBOX"]}
    # The doomed worker SIGKILLs itself right after step 2 (a live model call) of its 4th re-run was recorded.
    doomed = worker(nats_url, {**env, "RUNLEDGER_CRASH_AT": "step:2:recorded", "RUNLEDGER_CRASH_SKIP": "3"},
                    tmp_path / "doomed.log")  # fmt: skip
    survivor = worker(nats_url, env, tmp_path / "survivor.log")
    try:
        assert await asyncio.to_thread(doomed.wait, 120) == -signal.SIGKILL, (tmp_path / "doomed.log").read_text()

        async def finished() -> bool:
            for request in requests:
                try:
                    log = await load_run(client, request.branch_run_id, open_content=False)
                except RunNotFoundError:
                    return False  # not started yet
                if not log.records or log.records[-1].event.type not in ("run.completed", "run.failed"):
                    return False
            return True

        await eventually(finished, timeout=180, interval=0.5)
        # The survivor reaps what the dead worker left on this engine (its owner pid is gone).
        await eventually(lambda: not containers_of(docker, doomed.pid), timeout=40, interval=0.5)
    finally:
        if doomed.poll() is None:  # the test failed before the crash point: never leave it serving
            doomed.kill()
            doomed.wait()
        survivor.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(survivor.wait, 60) == 0, (tmp_path / "survivor.log").read_text()

    interrupted = 0
    for request in requests:
        log = await load_run(client, request.branch_run_id, open_content=False)
        types = [r.event.type for r in log.records]
        assert types.count("run.started") == 1 and types.count("run.completed") == 1, (request.request_id, types)
        assert "run.failed" not in types
        interrupted += "run.resumed" in types
    assert interrupted >= 1, "no re-run was interrupted: the worker was not killed mid-re-run"
    assert len(payments.calls()) == paid_before  # re-drives pay nothing: effects come from the record
    survivor_log = (tmp_path / "survivor.log").read_text()
    assert survivor_log.count(" completed") >= RERUNS - 3  # the survivor did the bulk, the resumed one included
    # Nothing of either worker remains (scoped by owner: other processes may use this engine too).
    await eventually(lambda: not containers_of(docker, survivor.pid, doomed.pid), timeout=30)
