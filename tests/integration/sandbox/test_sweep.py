"""A sweep re-drives the runs an SQL condition selects and fails on regressions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runledger.cli import main
from runledger.examples.refund_agent.agent import ORDERS, TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient, connect
from runledger.sandbox.containers import SandboxPool
from runledger.sandbox.rerun import RerunRequest
from runledger.sandbox.sweep import sweep
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


async def test_sweep_counts_effects_whose_key_was_committed_with_other_arguments(
    client: LedgerClient, pool: SandboxPool, payments: PaymentsService, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    for ticket in TICKETS[:2]:  # a refund, a question
        await start_run(client, spec(), ticket, run_id=f"swa-{ticket['ticket']}")
    # Live lookups now see another item: T-1001's email body changes, T-1002's does not.
    monkeypatch.setitem(ORDERS, "order-8891", {**ORDERS["order-8891"], "item": "juicer"})
    template = RerunRequest(parent_run_id="-", agent=AGENT, mode="live", fork_step=0)
    summary = await sweep(client, pool, ["swa-T-1001", "swa-T-1002"], template)
    assert summary.completed == 2 and summary.regressions == []
    assert summary.args_differ == 1 and summary.args_differ_runs == ["swa-T-1001"]
    text = summary.render()
    assert "effects with changed arguments: 1 in 1 runs" in text
    assert f"args differ: swa-T-1001 -> {summary.branches['swa-T-1001']}" in text
    assert len(payments.calls()) == 1
    assert len((tmp_path / "outbox" / "sent.jsonl").read_text().splitlines()) == 2  # the parents' emails only
