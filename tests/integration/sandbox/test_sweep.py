"""A sweep re-drives the runs an SQL condition selects and fails on regressions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runledger.cli import main
from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import connect
from runledger.sdk.lifecycle import start_run

pytestmark = [pytest.mark.integration, pytest.mark.docker]
AGENT = "runledger.examples.refund_agent.agent:spec"


def test_sweep_reports_divergence_and_exits_nonzero_on_regression(
    nats_url: str, sandbox_image: str, payments: PaymentsService, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("RUNLEDGER_HOME", str(tmp_path / "home"))

    async def record() -> None:
        async with await connect(nats_url) as client:
            for ticket in TICKETS[:3]:  # a refund, a question, a missing order (fails)
                await start_run(client, spec(), ticket, run_id=f"sweep-{ticket['ticket']}")

    asyncio.run(record())
    strict = [
        "--mode", "counterfactual", "--at-step", "2",
        "--set", "model=runledger.examples.refund_agent.agent:strict_model",
    ]  # fmt: skip
    code = main(["rerun", "--nats", nats_url, "--agent", AGENT, "--where", "status = 'completed'", *strict])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "2 runs re-driven: 1 completed, 1 diverged (50%)" in out
    assert "1 regressed" in out and "regressed: sweep-T-1001" in out
    assert "first differences: step 2: 1" in out
    # A change that regresses nothing passes the gate.
    code = main(["rerun", "--nats", nats_url, "--agent", AGENT, "--where", "status = 'failed'", *strict])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 runs re-driven" in out and "0 regressed" in out
    assert len(payments.calls()) == 1
