"""Every re-run mode on the refund agent, in real Docker sandboxes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from runledger.examples.refund_agent.agent import ORDERS, TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient
from runledger.protect.runs import load_run
from runledger.record.canonical import digest
from runledger.record.fold import fold
from runledger.sandbox.diff import diff, render
from runledger.sandbox.errors import RerunRequestError
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.lifecycle import start_run

pytestmark = [pytest.mark.integration, pytest.mark.docker]
AGENT = "runledger.examples.refund_agent.agent:spec"
T1001 = TICKETS[0]


async def branch_checkpoint(client: LedgerClient, run_id: str):  # type: ignore[no-untyped-def]
    return fold((await load_run(client, run_id)).records)


async def test_redrive_serves_tools_from_the_record_and_runs_the_model_live(
    client: LedgerClient, rerunner: Rerunner, payments: PaymentsService
) -> None:
    parent = await start_run(client, spec(), T1001, run_id="p-redrive")
    assert len(payments.calls()) == 1
    result = await rerunner.rerun(RerunRequest(parent_run_id="p-redrive", agent=AGENT, mode="redrive", fork_step=1))
    assert result.status == "completed", result.error
    assert result.output == parent.output
    assert len(payments.calls()) == 1  # the refund was served from the record
    cp = await branch_checkpoint(client, result.run_id)
    assert cp.parent == {"parent_run_id": "p-redrive", "fork_step": 1, "mode": "redrive", "changed": None,
                         "changed_from": None, "changed_to": None}  # fmt: skip
    assert [cp.steps[s].kind for s in sorted(cp.steps)] == ["model", "tool", "model", "effect", "effect"]
    d = await diff(client, "p-redrive", result.run_id)
    assert d.first_difference is None


async def test_live_reexecution_never_repeats_a_committed_effect_and_simulates_new_ones(
    client: LedgerClient, rerunner: Rerunner, payments: PaymentsService
) -> None:
    await start_run(client, spec(), T1001, run_id="p-live")
    assert len(payments.calls()) == 1
    result = await rerunner.rerun(RerunRequest(parent_run_id="p-live", agent=AGENT, mode="live", fork_step=0))
    assert result.status == "completed", result.error
    assert len(payments.calls()) == 1  # the payments service's own log: no second refund
    cp = await branch_checkpoint(client, result.run_id)
    assert cp.steps[3].status == "committed" and cp.steps[3].key == "refund:order-8891"


async def test_live_reexecution_simulates_an_effect_the_original_never_committed(
    client: LedgerClient, rerunner: Rerunner, payments: PaymentsService, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    monkeypatch.setenv("REFUND_PAYMENTS_URL", f"http://127.0.0.1:{dead}")
    parent = await start_run(client, spec(), T1001, run_id="p-down")
    assert parent.status == "failed"  # the refund effect failed: the key is free
    monkeypatch.setenv("REFUND_PAYMENTS_URL", payments.url)
    result = await rerunner.rerun(RerunRequest(parent_run_id="p-down", agent=AGENT, mode="live", fork_step=0))
    assert result.status == "completed", result.error
    assert payments.calls() == []  # simulated, not committed
    cp = await branch_checkpoint(client, result.run_id)
    assert cp.simulated_keys == ["refund:order-8891", "email:T-1001"]
    assert "refund:order-8891" not in cp.committed_keys
    events = [r.event for r in (await load_run(client, result.run_id)).records]
    assert any(e.type == "effect.simulated" and e.payload["key"] == "refund:order-8891" for e in events)


async def test_counterfactual_model_makes_a_different_decision_at_the_fork(
    client: LedgerClient, rerunner: Rerunner, payments: PaymentsService
) -> None:
    await start_run(client, spec(), T1001, run_id="p-cf")
    request = RerunRequest(
        parent_run_id="p-cf", agent=AGENT, mode="counterfactual", fork_step=2, base_mode="live",
        change={"model": "runledger.examples.refund_agent.agent:strict_model"},
    )  # fmt: skip
    result = await rerunner.rerun(request)
    assert result.status == "completed", result.error
    assert result.output["refunded"] is False
    d = await diff(client, "p-cf", result.run_id)
    assert d.changed == "model"
    assert d.version_delta["model"] == ["scripted-support-1", "scripted-strict-1"]
    assert d.first_difference == 2  # the decision at the fork
    at_fork = d.steps[0]
    assert at_fork.step == 2 and not at_fork.same
    assert '"refund": true' in at_fork.parent["output"]["content"]
    assert '"refund": false' in at_fork.branch["output"]["content"]
    assert d.fork_decision is not None and not d.fork_decision.same
    assert (d.fork_decision.parent_step, d.fork_decision.branch_step) == (2, 2)
    # The strict branch drops the refund; the steps after it stay aligned by kind and name.
    assert [(s.op, s.parent_step, s.branch_step) for s in d.steps] == [
        ("changed", 2, 2), ("removed", 3, None), ("changed", 4, 3),
    ]  # fmt: skip
    # Its email reuses the parent's key with another body: simulated and marked, never "committed".
    cp = await branch_checkpoint(client, result.run_id)
    assert cp.steps[3].status == "simulated" and "email:T-1001" not in cp.committed_keys
    (e,) = d.args_differ
    assert e.key == "email:T-1001" and e.args_digest != e.committed_args_digest
    assert len(payments.calls()) == 1


async def test_live_branch_never_serves_a_key_committed_with_other_arguments(
    client: LedgerClient, rerunner: Rerunner, payments: PaymentsService, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    parent = await start_run(client, spec(), T1001, run_id="p-args")
    assert parent.status == "completed"
    sent = tmp_path / "outbox" / "sent.jsonl"
    assert len(payments.calls()) == 1 and len(sent.read_text().splitlines()) == 1
    # The order looks different now (read tools run live): the same refund, another email body.
    monkeypatch.setitem(ORDERS, "order-8891", {**ORDERS["order-8891"], "item": "juicer"})
    result = await rerunner.rerun(RerunRequest(parent_run_id="p-args", agent=AGENT, mode="live", fork_step=0))
    assert result.status == "completed", result.error
    assert len(payments.calls()) == 1  # no real effect: the refund's key was committed with these arguments
    assert len(sent.read_text().splitlines()) == 1  # and the email was not sent again

    p_cp, b_cp = await branch_checkpoint(client, "p-args"), await branch_checkpoint(client, result.run_id)
    assert b_cp.steps[3].status == "committed" and b_cp.steps[3].key == "refund:order-8891"  # same args: served
    email = b_cp.steps[4]
    assert email.kind == "effect" and email.key == "email:T-1001" and email.status == "simulated"
    assert "email:T-1001" not in b_cp.committed_keys and b_cp.simulated_keys == ["email:T-1001"]
    events = [r.event for r in (await load_run(client, result.run_id)).records]
    assert not any(e.type == "effect.committed" and e.payload["key"] == "email:T-1001" for e in events)
    (simulated,) = [e for e in events if e.type == "effect.simulated"]
    marker = simulated.payload["result"]
    body = {"ticket": "T-1001", "to": "ana@example.com", "body": "We have refunded 49.90 for your juicer."}
    assert marker == {"simulated": True, "effect": "send_email", "key": "email:T-1001", "reason": "args_differ",
                      "args_digest": digest(body), "committed_args_digest": p_cp.steps[4].args_digest}  # fmt: skip
    assert marker["args_digest"] != marker["committed_args_digest"]

    d = await diff(client, "p-args", result.run_id)
    (e,) = d.args_differ
    assert (e.step, e.name, e.key, e.parent_step) == (4, "send_email", "email:T-1001", 4)
    assert (e.args_digest, e.committed_args_digest) == (marker["args_digest"], marker["committed_args_digest"])
    assert d.fork_decision is not None and d.fork_decision.same  # the classification at the fork
    assert d.first_difference == 1  # the order the live lookup returned
    assert [s.op for s in d.steps] == ["equal", "changed", "changed", "equal", "changed"]
    text = render(d)
    assert f"step 4 send_email key email:T-1001: args {e.args_digest}, committed with {e.committed_args_digest}" in text


async def test_counterfactual_must_change_exactly_one_element(client: LedgerClient, rerunner: Rerunner,
                                                               payments: PaymentsService) -> None:  # fmt: skip
    await start_run(client, spec(), T1001, run_id="p-bad")
    with pytest.raises(RerunRequestError, match="exactly one"):
        await rerunner.rerun(RerunRequest(parent_run_id="p-bad", agent=AGENT, mode="counterfactual",
                                          change={"model": "x:y", "prompt": "p"}))  # fmt: skip
    with pytest.raises(RerunRequestError, match="only a counterfactual"):
        await rerunner.rerun(RerunRequest(parent_run_id="p-bad", agent=AGENT, mode="redrive", change={"prompt": "p"}))


async def test_redrive_reports_the_first_divergence(client: LedgerClient, rerunner: Rerunner,
                                                     payments: PaymentsService) -> None:  # fmt: skip
    await start_run(client, spec(), T1001, run_id="p-div")
    request = RerunRequest(
        parent_run_id="p-div", agent=AGENT, mode="counterfactual", fork_step=2, base_mode="redrive",
        change={"model": "runledger.examples.refund_agent.agent:strict_model"},
    )  # fmt: skip
    result = await rerunner.rerun(request)
    assert result.status == "failed" and result.reason == "diverged"
    assert "diverged at step 3" in (result.error or "")
    assert len(payments.calls()) == 1
