"""The operator's commands: rerun (replay, --local), diff."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from runledger.cli import main
from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import connect
from runledger.sdk.lifecycle import start_run

pytestmark = [pytest.mark.integration, pytest.mark.docker]
AGENT = "runledger.examples.refund_agent.agent:spec"


def record(url: str, run_id: str) -> None:
    async def go() -> None:
        async with await connect(url) as client:
            await start_run(client, spec(), TICKETS[0], run_id=run_id)

    asyncio.run(go())


def test_rerun_replay_local_and_diff(
    nats_url: str, sandbox_image: str, payments: PaymentsService, capsys: pytest.CaptureFixture[str]
) -> None:
    record(nats_url, "cli-parent")
    assert main(["rerun", "cli-parent", "--nats", nats_url, "--agent", AGENT, "--mode", "replay"]) == 0
    out = capsys.readouterr().out
    assert "model.called" in out and "effect.committed" in out and "refund:order-88" in out

    code = main(["rerun", "cli-parent", "--nats", nats_url, "--agent", AGENT, "--mode", "counterfactual",
                 "--at-step", "2", "--base-mode", "live",
                 "--set", "model=runledger.examples.refund_agent.agent:strict_model",
                 "--local"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    branch = out.split()[1]
    assert "changed model" in out and f"runledger diff cli-parent {branch}" in out

    assert main(["diff", "cli-parent", branch, "--nats", nats_url]) == 0
    out = capsys.readouterr().out
    assert "first difference at step 2" in out and "version model" in out
    lines = out.splitlines()
    at = lines.index("decision at the fork:")  # first, before the steps
    assert '"refund": true' in lines[at + 1] and '"refund": false' in lines[at + 2]
    assert at < lines.index(next(x for x in lines if x.startswith("first difference")))
    assert "aligned by kind and name: 0 equal, 2 changed, 0 inserted, 1 removed" in out
    assert main(["diff", "cli-parent", branch, "--nats", nats_url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["first_difference"] == 2 and data["outcome"]["branch"] == "completed"
    # The strict branch's email reuses the parent's key with another body: shown with both digests.
    (changed,) = data["args_differ"]
    assert changed["key"] == "email:T-1001" and changed["step"] == 3 and changed["parent_step"] == 4
    assert len(changed["args_digest"]) == len(changed["committed_args_digest"]) == 64
    assert changed["args_digest"] != changed["committed_args_digest"]
    assert (f"step 3 send_email key email:T-1001: args {changed['args_digest']}, "
            f"committed with {changed['committed_args_digest']}") in out  # fmt: skip
    assert [s["op"] for s in data["steps"]] == ["changed", "removed", "changed"]
    assert data["steps"][-1]["branch"]["status"] == "simulated"
    assert len(payments.calls()) == 1

    code = main(["rerun", "cli-parent", "--nats", nats_url, "--agent", AGENT, "--mode", "counterfactual",
                 "--set", "model=x:y", "--set", "prompt=p", "--local"])  # fmt: skip
    assert code == 6 and "exactly one" in capsys.readouterr().err


def test_rerun_plan_refuses_a_model_outside_the_allow_list_before_calling_it(
    nats_url: str, payments: PaymentsService, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    record(nats_url, "cli-abort")
    calls: list[str] = []
    monkeypatch.setattr(os, "abort", lambda: calls.append("os.abort"))  # before the fix: called, the CLI gone
    code = main(["rerun", "cli-abort", "--nats", nats_url, "--agent", AGENT, "--mode", "counterfactual",
                 "--set", "model=os:abort", "--plan"])  # fmt: skip
    out = capsys.readouterr().out
    assert (code, calls) == (6, [])  # Exit.REFUSED
    assert "a worker would refuse it" in out and "model 'os:abort' is not on this host's allow-list" in out
    code = main(["rerun", "cli-abort", "--nats", nats_url, "--agent", AGENT, "--mode", "counterfactual",
                 "--set", "model=os:abort"])  # fmt: skip
    assert (code, calls) == (6, []) and "$RUNLEDGER_ALLOW_CODE=" in capsys.readouterr().err  # nothing queued
