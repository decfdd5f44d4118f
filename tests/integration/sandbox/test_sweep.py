"""A sweep re-drives the runs an SQL condition selects and fails on regressions."""

from __future__ import annotations

import asyncio
import json
import xml.etree.ElementTree as ET
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
STRICT_MODEL = "model=runledger.examples.refund_agent.agent:strict_model"


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
    # Over the failure (the lookup of a missing order raises at step 1), a model forked at step 2 is never
    # called: not exercised, and the failure still fails, which closes the gate unless allowed.
    failed = ["rerun", "--nats", nats_url, "--agent", AGENT, "--where", "status = 'failed'", *strict]
    code = main(failed)
    out = capsys.readouterr().out
    assert code == 1, out
    assert "1 runs re-driven" in out and "0 regressed" in out and "gate: CLOSED (1 not_exercised)" in out
    assert "no model call from the fork (step 2) on: the changed model was never read" in out
    code = main([*failed, "--allow-still-failing"])
    out = capsys.readouterr().out
    assert code == 0 and "1 still failing, allowed (--allow-still-failing)" in out, out
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


def test_the_gate_writes_junit_and_json_with_costs_and_a_check_judges_the_decision_at_the_fork(
    nats_url: str, sandbox_image: str, payments: PaymentsService, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A planted regression (the strict model asks for a photo where the record refunded: its branch
    diverges) closes the gate: exit 1, a JUnit failure naming the divergence and the diff command, the same
    verdicts in --json, each branch's tokens and cost. A check of the decision at the fork (it wanted
    exactly that photo) opens it: the diverged branch is `improved`, exit 0."""
    monkeypatch.setenv("RUNLEDGER_HOME", str(tmp_path / "home"))

    async def record() -> None:
        async with await connect(nats_url) as client:
            for ticket in TICKETS[:2]:  # a refund, a question
                await start_run(client, spec(), ticket, run_id=f"gate-{ticket['ticket']}")

    asyncio.run(record())
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"scripted-support-1": {"input": 1.0, "output": 2.0},
                                  "scripted-strict-1": {"input": 3.0, "output": 6.0}}))  # fmt: skip
    junit = tmp_path / "sweep.xml"
    strict = [
        "rerun", "--nats", nats_url, "--agent", AGENT, "--where", "run_id LIKE 'gate-%'", "--prices", str(prices),
        "--mode", "counterfactual", "--at-step", "2", "--set", STRICT_MODEL,
    ]  # fmt: skip

    code = main([*strict, "--junit", str(junit), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["exit_code"] == 1 and report["gate"] == "closed"
    cases = {c["parent_run_id"]: c for c in report["cases"]}
    assert cases["gate-T-1001"]["verdict"] == "regressed" and cases["gate-T-1001"]["branch_reason"] == "diverged"
    # The question (its model calls are steps 0 and 1) calls no model from step 2: not exercised, not `pass`.
    assert cases["gate-T-1002"]["verdict"] == "not_exercised"
    for case in cases.values():  # the branches' served model steps are priced as the record's
        assert case["branch_cost"]["tokens"] > 0 and case["branch_cost"]["usd"] > 0 and case["branch_cost"]["priced"]
    assert report["cost"]["branches"]["usd"] == pytest.approx(sum(c["branch_cost"]["usd"] for c in cases.values()))

    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
    testcases = {tc.get("name"): tc for tc in suite.iter("testcase")}
    assert set(testcases) == {"gate-T-1001", "gate-T-1002"}
    failure = testcases["gate-T-1001"].find("failure")
    assert failure is not None and failure.get("type") == "regressed"
    branch = cases["gate-T-1001"]["branch_run_id"]
    assert f"compare with: runledger diff gate-T-1001 {branch}" in (failure.text or "")
    assert "diverged" in (failure.text or "")
    assert testcases["gate-T-1002"].find("failure") is None
    verdicts = {tc.get("name"): {p.get("name"): p.get("value") for p in tc.iter("property")}["verdict"]
                for tc in testcases.values()}  # fmt: skip
    assert verdicts == {k: c["verdict"] for k, c in cases.items()}  # JUnit and JSON agree

    code = main([*strict, "--expect", "runledger.examples.refund_agent.checks:no_refund_without_a_photo"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "improved      gate-T-1001 -> " in out and "(check): asks for a photo where the recorded run refunded" in out
    assert "gate: open (1 improved, 1 not_exercised)" in out
    assert len(payments.calls()) == 1  # the recorded refund only: no branch paid


def test_a_check_outside_the_allow_list_is_refused_before_anything_runs(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RUNLEDGER_HOME", str(tmp_path / "home"))
    code = main(["rerun", "--nats", nats_url, "--agent", AGENT, "--where", "true", "--mode", "redrive",
                 "--expect", "os:abort"])  # fmt: skip
    assert code == 6  # Exit.REFUSED: nothing ran
    assert "os:abort" in capsys.readouterr().err
