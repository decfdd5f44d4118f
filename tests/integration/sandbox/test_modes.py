"""Every re-run mode on the refund agent, in real Docker sandboxes."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runledger import ScriptedModel
from runledger.cli import main
from runledger.examples.refund_agent import agent as refund_agent
from runledger.examples.refund_agent.agent import ORDERS, TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient
from runledger.log.subjects import LEDGER_STREAM
from runledger.protect.keystore import KVKeyStore, run_kid
from runledger.protect.loading import load_run
from runledger.record.canonical import digest
from runledger.record.digests import KEYED_DIGESTS, Digester
from runledger.record.fold import fold
from runledger.sandbox.branch import read_committed_claim
from runledger.sandbox.containers import LABEL, OWNER
from runledger.sandbox.diff import diff, render
from runledger.sandbox.errors import RerunRequestError
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.agent import code_hash
from runledger.sdk.lifecycle import RunResult, start_run
from tests.sandbox_agents.modes import agent as modes
from tests.sandbox_agents.modes.changed import agent as changed_agent

pytestmark = [pytest.mark.integration, pytest.mark.docker]
AGENT = "runledger.examples.refund_agent.agent:spec"
T1001 = TICKETS[0]


async def branch_checkpoint(client: LedgerClient, run_id: str):  # type: ignore[no-untyped-def]
    return fold((await load_run(client, run_id)).records)


class CountingOrders(dict[str, Any]):
    """The example's order table, counting the lookups its read tool makes on the host."""

    lookups = 0

    def get(self, key: str, default: Any = None) -> Any:
        type(self).lookups += 1
        return super().get(key, default)


async def test_redrive_serves_tools_from_the_record_and_runs_the_model_live(
    client: LedgerClient, rerunner: Rerunner, payments: PaymentsService, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = await start_run(client, spec(), T1001, run_id="p-redrive")
    assert len(payments.calls()) == 1
    # Host-side counters: the example's model is scripted, so its answers alone cannot tell a live
    # call from one served from the record; its calls and the order lookups are counted instead.
    model_calls: list[str] = []
    complete = ScriptedModel.complete

    async def counted(self: ScriptedModel, messages: list[dict[str, Any]], **params: Any) -> Any:
        model_calls.append(self.name)
        return await complete(self, messages, **params)

    monkeypatch.setattr(ScriptedModel, "complete", counted)
    monkeypatch.setattr(refund_agent, "ORDERS", CountingOrders(ORDERS))
    result = await rerunner.rerun(RerunRequest(parent_run_id="p-redrive", agent=AGENT, mode="redrive", fork_step=1))
    assert result.status == "completed", result.error
    assert result.output == parent.output
    assert model_calls == ["scripted-support-1"]  # step 2, the one model call from the fork on, ran live
    assert CountingOrders.lookups == 0  # step 1's lookup_order was served from the record
    assert len(payments.calls()) == 1  # the refund was served from the record
    cp = await branch_checkpoint(client, result.run_id)
    # run.forked also records the request that opened the branch (its resume re-drives it under it).
    assert {k: v for k, v in cp.parent.items() if k != "request"} == {
        "forked_from": "p-redrive", "fork_step": 1, "mode": "redrive", "changed": None,
        "changed_from": None, "changed_to": None}  # fmt: skip
    assert cp.parent["request"]["mode"] == "redrive" and cp.parent["request"]["fork_step"] == 1
    # As stored: run.forked schema version 2, the fork parent as forked_from (parent_run_id is a child's).
    forked = next(r.event for r in (await load_run(client, result.run_id)).records if r.event.type == "run.forked")
    assert forked.schema_version == 2 and forked.payload["forked_from"] == "p-redrive"
    assert "parent_run_id" not in forked.payload
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
    # Both digests as the claim that committed the key made its own: the parent's, under the parent's
    # digest key (each run digests under its own key: docs/wire.md, "Digests").
    parent_keys = await KVKeyStore(client.js).get(run_kid(p_cp.agent, "p-args"))
    assert parent_keys is not None and p_cp.digest_scheme == KEYED_DIGESTS
    theirs = Digester(p_cp.chain_format, KEYED_DIGESTS, parent_keys.digest_key)
    ours = theirs.digest(body)
    assert ours != digest(body, p_cp.chain_format)
    assert marker == {"simulated": True, "effect": "send_email", "key": "email:T-1001", "reason": "args_differ",
                      "args_digest": ours, "committed_args_digest": p_cp.steps[4].args_digest}  # fmt: skip
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


# -- live or recorded, counted on the host (tests/sandbox_agents/modes/agent.py) ------------------------------
# Every model, tool and effect call of ``modes.probe`` runs on the host and is counted there; the
# model never answers twice alike and the tool says which of its calls served a lookup, so a value
# served from the record cannot pass for a live one. Steps: 0 clock, 1 random, 2 lookup, 3 model
# (the fork), 4 lookup, 5 clock, 6 random, 7 model, 8 charge (an effect keyed charge:o-1).
MODES = "tests.sandbox_agents.modes.agent:spec"
# A re-run here waits at most its pool's connect timeout (30 s) plus its own timeout (20 s).
RERUN_S = 60


@pytest.fixture(autouse=True)
def fresh_counts() -> None:
    modes.reset()


async def record_modes(client: LedgerClient, run_id: str) -> RunResult:
    result = await start_run(client, modes.spec(), None, run_id=run_id)
    return result


def calls_since(before: Counter[str]) -> dict[str, int]:
    return {name: n - before[name] for name, n in modes.CALLS.items() if n != before[name]}


async def via_of_commits(client: LedgerClient, run_id: str) -> list[str | None]:
    records = (await load_run(client, run_id)).records
    return [r.event.payload.get("via") for r in records if r.event.type == "effect.committed"]


@pytest.mark.timeout(RERUN_S + 30)
async def test_redrive_calls_the_model_live_and_serves_tools_clock_random_and_effects_from_the_record(
    client: LedgerClient, rerunner: Rerunner
) -> None:
    was = (await record_modes(client, "m-redrive")).output
    before = Counter(modes.CALLS)
    result = await rerunner.rerun(RerunRequest(parent_run_id="m-redrive", agent=MODES, mode="redrive", fork_step=3))
    assert result.status == "completed", result.error
    assert calls_since(before) == {"model": 2}  # two live model calls; no tool, no charge
    out = result.output
    # The model answered anew (its third and fourth calls), not from the record.
    assert (out["m1"], out["m2"]) == ("answer 3 [Answer briefly.] to first", "answer 4 [] to second")
    assert (was["m1"], was["m2"]) == ("answer 1 [Answer briefly.] to first", "answer 2 [] to second")
    # Everything else is the parent's, before the fork and after it: the lookup its second call
    # served, the same instant, the same draw, the charge's recorded result.
    for name in ("t0", "r0", "a", "b", "t1", "r1", "paid"):
        assert out[name] == was[name], name
    assert out["b"]["served_by_call"] == 2
    assert await via_of_commits(client, result.run_id) == ["record"]


@pytest.mark.timeout(2 * RERUN_S + 30)
async def test_live_reexecution_runs_live_tools_clock_and_random_and_serves_a_committed_effect(
    client: LedgerClient, rerunner: Rerunner
) -> None:
    was = (await record_modes(client, "m-live")).output
    before = Counter(modes.CALLS)
    result = await rerunner.rerun(RerunRequest(parent_run_id="m-live", agent=MODES, mode="live", fork_step=3,
                                               live_tools=["lookup"]))  # fmt: skip
    assert result.status == "completed", result.error
    assert calls_since(before) == {"model": 2, "lookup": 1}  # the charge's key was committed: not acted again
    out = result.output
    for name in ("t0", "r0", "a"):  # before the fork: the record
        assert out[name] == was[name], name
    assert out["m1"] == "answer 3 [Answer briefly.] to first"
    assert out["b"] == {"q": "b", "served_by_call": 3} != was["b"]
    assert out["t1"] > was["t1"] and out["r1"] != was["r1"]  # a live clock is later; a live draw is new
    assert out["paid"] == was["paid"]  # the committed key's recorded result
    assert await via_of_commits(client, result.run_id) == ["record"]

    # A tool not marked live is refused from the fork on, and nothing calls it.
    before = Counter(modes.CALLS)
    refused = await rerunner.rerun(RerunRequest(parent_run_id="m-live", agent=MODES, mode="live", fork_step=3,
                                                live_tools=[]))  # fmt: skip
    assert refused.status == "failed" and "not marked live" in (refused.error or "")
    assert calls_since(before) == {"model": 1}


@pytest.mark.timeout(3 * RERUN_S + 30)
async def test_live_reexecution_acts_a_new_effect_only_when_effects_are_allowed(
    client: LedgerClient, rerunner: Rerunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(modes.CHARGE_DOWN, "1")
    assert (await record_modes(client, "m-effects")).status == "failed"  # the charge failed: its key is free
    monkeypatch.delenv(modes.CHARGE_DOWN)
    state, _ = await read_committed_claim(client, "charge:o-1")
    assert state.status != "committed"

    def live(allow: bool) -> RerunRequest:
        return RerunRequest(parent_run_id="m-effects", agent=MODES, mode="live", fork_step=3, live_tools=["lookup"],
                            allow_effects=allow)  # fmt: skip

    before = Counter(modes.CALLS)
    stubbed = await rerunner.rerun(live(False))
    assert stubbed.status == "completed", stubbed.error
    assert stubbed.output["paid"] == {"simulated": True, "effect": "charge", "key": "charge:o-1"}
    assert modes.CALLS["charge"] == before["charge"]
    assert (await branch_checkpoint(client, stubbed.run_id)).simulated_keys == ["charge:o-1"]

    acted = await rerunner.rerun(live(True))
    assert acted.status == "completed", acted.error
    assert modes.CALLS["charge"] == before["charge"] + 1  # the real charge ran, once
    assert acted.output["paid"] == {"charged": 5, "by_call": modes.CALLS["charge"]}
    assert (await branch_checkpoint(client, acted.run_id)).committed_keys == ["charge:o-1"]
    assert await via_of_commits(client, acted.run_id) == ["act"]  # committed by acting, not from a record
    state, _ = await read_committed_claim(client, "charge:o-1")
    assert state.status == "committed"

    again = await rerunner.rerun(live(True))  # the key is committed now (by a sibling): never acted again
    assert again.status == "completed", again.error
    assert modes.CALLS["charge"] == before["charge"] + 1
    assert "act" not in await via_of_commits(client, again.run_id)


@pytest.mark.timeout(RERUN_S + 30)
async def test_counterfactual_prompt_reaches_the_live_model_from_the_fork(
    client: LedgerClient, rerunner: Rerunner
) -> None:
    was = (await record_modes(client, "m-prompt")).output
    before, requests = Counter(modes.CALLS), len(modes.MODEL_REQUESTS)
    result = await rerunner.rerun(RerunRequest(parent_run_id="m-prompt", agent=MODES, mode="counterfactual",
                                               fork_step=3, change={"prompt": "Answer in French."}))  # fmt: skip
    assert result.status == "completed", result.error
    assert calls_since(before) == {"model": 2}
    # The model on the host was sent the new prompt, which the guest read from run.prompt.
    assert modes.MODEL_REQUESTS[requests][0] == {"role": "system", "content": "Answer in French."}
    assert result.output["m1"] == "answer 3 [Answer in French.] to first"
    assert was["m1"] == "answer 1 [Answer briefly.] to first"
    cp = await branch_checkpoint(client, result.run_id)
    assert cp.parent is not None and cp.parent["changed"] == "prompt_hash"
    assert cp.parent["changed_from"] == hashlib.sha256(modes.PROMPT.encode()).hexdigest()
    assert cp.parent["changed_to"] == hashlib.sha256(b"Answer in French.").hexdigest()
    d = await diff(client, "m-prompt", result.run_id)
    assert d.first_difference == 3


@pytest.mark.timeout(RERUN_S + 30)
async def test_counterfactual_code_runs_the_changed_agent_in_the_sandbox(
    client: LedgerClient, rerunner: Rerunner
) -> None:
    await record_modes(client, "m-code")
    before = Counter(modes.CALLS)
    result = await rerunner.rerun(RerunRequest(
        parent_run_id="m-code", agent=MODES, mode="counterfactual", fork_step=3, base_mode="live",
        live_tools=["lookup"], change={"agent": "tests.sandbox_agents.modes.changed.agent:spec"},
    ))  # fmt: skip
    assert result.status == "completed", result.error
    out = result.output
    assert out["code"] == "v2"  # the guest ran the other code
    assert out["b"] == {"q": "b, asked by v2", "served_by_call": before["lookup"] + 1}
    assert calls_since(before) == {"model": 1, "lookup": 1}  # v2 stops after its lookup: no charge
    cp = await branch_checkpoint(client, result.run_id)
    assert cp.parent is not None and cp.parent["changed"] == "agent_version"
    assert cp.parent["changed_from"] == code_hash(modes.probe)
    assert cp.parent["changed_to"] == code_hash(changed_agent.probe_v2) != code_hash(modes.probe)
    assert [cp.steps[s].kind for s in sorted(cp.steps)] == ["clock", "random", "tool", "model", "tool"]


@pytest.mark.timeout(RERUN_S + 60)
async def test_trace_replay_runs_nothing_and_creates_no_branch(
    client: LedgerClient, nats_url: str, docker: Any, rerunner: Rerunner, capsys: pytest.CaptureFixture[str]
) -> None:
    await record_modes(client, "m-replay")
    before, last_seq = Counter(modes.CALLS), (await client.js.stream_info(LEDGER_STREAM)).state.last_seq
    since = time.time()
    args = ["rerun", "m-replay", "--nats", nats_url, "--agent", MODES, "--mode", "replay"]
    assert await asyncio.to_thread(main, args) == 0
    shown = capsys.readouterr().out
    assert "model.called" in shown and "clock.read" in shown
    with pytest.raises(RerunRequestError, match="executes nothing"):
        await rerunner.rerun(RerunRequest(parent_run_id="m-replay", agent=MODES, mode="replay"))
    assert calls_since(before) == {}
    assert (await client.js.stream_info(LEDGER_STREAM)).state.last_seq == last_seq  # not one event: no branch
    assert await asyncio.to_thread(sandboxes_created, docker, since) == 0
    # The witness sees a sandbox when one is made: a re-drive, in the same way.
    since = time.time()
    result = await rerunner.rerun(RerunRequest(parent_run_id="m-replay", agent=MODES, mode="redrive", fork_step=3))
    assert result.status == "completed", result.error
    assert (await client.js.stream_info(LEDGER_STREAM)).state.last_seq > last_seq
    assert await asyncio.to_thread(sandboxes_created, docker, since) == 1


def sandboxes_created(docker: Any, since: float) -> int:
    """Sandbox containers this process created since ``since`` (the engine's event log)."""
    wanted = {"type": "container", "event": "create", "label": f"{LABEL}.owner={OWNER}"}
    events = docker.api.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True, filters=wanted)
    return sum(1 for e in events if e["timeNano"] >= since * 1e9)
