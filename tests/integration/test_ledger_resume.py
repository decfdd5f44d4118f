"""Resume refuses what it cannot replay faithfully, and approvals bind to what they approved."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runledger import (
    AgentSpec,
    ConfigurationError,
    LedgerError,
    NondeterminismError,
    Run,
    ScriptedModel,
    VersionMismatchError,
)
from runledger.log.client import LedgerClient
from runledger.ops.decisions import accept_version, approve
from runledger.protect.capture import DataPolicy
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import VersionAcceptance, resume_run, start_run

pytestmark = pytest.mark.integration


def make_spec(fn: Any, *, prompt: str = "p1", name: str = "resumer") -> AgentSpec:
    return AgentSpec(name, fn, ScriptedModel(["ok"] * 10), prompt=prompt, agent_version="v1")


async def checkpoint(client: LedgerClient, run_id: str) -> Any:
    return fold((await load_run(client, run_id)).records)


async def test_an_approval_does_not_apply_to_a_changed_request(client: LedgerClient) -> None:
    amount = {"value": 900}
    refunds: list[int] = []

    async def agent(run: Run) -> str:
        await run.approval("refund", {"amount": amount["value"]})
        await run.effect(
            "refund", {"amount": amount["value"]}, key="refund:o-9", fn=lambda a: refunds.append(a["amount"])
        )
        return "done"

    spec = make_spec(agent)
    first = await start_run(client, spec, run_id="appr-change")
    assert first.status == "suspended"
    await approve(client, "appr-change", first.pending[0], by="alice")
    amount["value"] = 5000  # the code now asks for something else than what was approved
    second = await resume_run(client, spec, "appr-change")
    assert second.status == "suspended" and second.pending != first.pending
    assert refunds == []
    cp = await checkpoint(client, "appr-change")
    assert list(cp.pending_approvals) == second.pending
    assert cp.pending_approvals[second.pending[0]]["args"] == {"amount": 5000}
    await approve(client, "appr-change", second.pending[0], by="alice")
    third = await resume_run(client, spec, "appr-change")
    assert third.status == "completed" and refunds == [5000]


async def test_a_denied_approval_fails_the_run(client: LedgerClient) -> None:
    async def agent(run: Run) -> str:
        await run.approval("delete_account", {"user": "u1"})
        return "deleted"

    spec = make_spec(agent)
    first = await start_run(client, spec, run_id="deny")
    await approve(client, "deny", first.pending[0], by="alice", approved=False, reason="no ticket")
    result = await resume_run(client, spec, "deny")
    assert result.status == "failed" and result.reason == "approval_denied" and "no ticket" in (result.error or "")


async def test_resume_with_a_changed_prompt_hash_is_refused(client: LedgerClient) -> None:
    async def agent(run: Run) -> str:
        await run.approval("x", None)
        return "ok"

    await start_run(client, make_spec(agent, prompt="v1 prompt"), run_id="prompt")
    with pytest.raises(VersionMismatchError) as info:
        await resume_run(client, make_spec(agent, prompt="v2 prompt"), "prompt")
    assert info.value.differs == ["prompt_hash"]
    assert "prompt_hash: recorded" in str(info.value)
    assert (await checkpoint(client, "prompt")).attempts == 1  # nothing was written


async def test_a_code_change_before_the_frontier_names_the_step(client: LedgerClient) -> None:
    async def v1(run: Run) -> str:
        await run.tool("search", {"q": "a"}, fn=lambda a: ["r1"])
        await run.tool("fetch", {"url": "u"}, fn=lambda a: "page")
        await run.approval("publish", None)
        return "ok"

    async def v2(run: Run) -> str:
        await run.tool("search", {"q": "a"}, fn=lambda a: ["r1"])
        await run.tool("fetch", {"url": "DIFFERENT"}, fn=lambda a: "page")
        return "ok"

    first = await start_run(client, make_spec(v1), run_id="nondet")
    await approve(client, "nondet", first.pending[0], by="op")
    with pytest.raises(NondeterminismError) as info:
        await resume_run(client, make_spec(v2), "nondet")
    assert info.value.step == 1
    assert "fetch" in info.value.recorded and "fetch" in info.value.attempted
    assert "step 1" in str(info.value)


async def test_recorded_steps_are_not_run_again_on_resume(client: LedgerClient) -> None:
    ran: list[str] = []

    async def agent(run: Run) -> Any:
        a = await run.tool("a", 1, fn=lambda x: ran.append("a") or 10)
        t = await run.now()
        r = await run.random()
        await run.approval("go", None)
        return [a, t.isoformat(), r]

    spec = make_spec(agent)
    first = await start_run(client, spec, run_id="journal")
    await approve(client, "journal", first.pending[0], by="op")
    result = await resume_run(client, spec, "journal")
    assert ran == ["a"]
    cp = await checkpoint(client, "journal")
    assert result.output == [10, cp.steps[1].output, cp.steps[2].output]


async def test_a_divergence_with_an_unchanged_tuple_shows_both_calls_and_the_causes(client: LedgerClient) -> None:
    """Non-determinism in the agent (a value read outside the Run API), not a code change."""
    outside = iter(["Monday", "Tuesday"])  # e.g. the wall clock read directly

    async def agent(run: Run) -> str:
        reply = await run.model([{"role": "user", "content": f"today is {next(outside)}", "lang": "en"}])
        await run.approval("send", {"text": reply.content})
        return reply.content

    first = await start_run(client, make_spec(agent), run_id="nondet-tuple")
    await approve(client, "nondet-tuple", first.pending[0], by="op")
    with pytest.raises(NondeterminismError) as info:
        await resume_run(client, make_spec(agent), "nondet-tuple")
    text = str(info.value)
    assert "step 0" in text and "version tuple is the recorded one" in text
    assert "The agent code changed" not in text
    # Both calls side by side: the recorded argument and the new one, as diff lines.
    assert '-   "content": "today is Monday"' in text and '+   "content": "today is Tuesday"' in text
    assert "outside the Run API" in text and "forged" in text


async def test_an_operator_accepts_a_hotfix_version_and_the_run_continues(client: LedgerClient) -> None:
    ran: list[str] = []

    async def agent(run: Run) -> str:
        found = await run.tool("search", {"q": "a"}, fn=lambda a: ran.append("search") or ["r1"])
        await run.approval("publish", {"found": found})
        return await run.tool("publish", {"n": len(found)}, fn=lambda a: ran.append("publish") or "done")

    def versioned(version: str, fn: Any = agent) -> AgentSpec:
        return AgentSpec("hotfix", fn, ScriptedModel([]), agent_version=version)

    first = await start_run(client, versioned("1.0.0"), run_id="hotfix-1")
    await approve(client, "hotfix-1", first.pending[0], by="op")
    with pytest.raises(VersionMismatchError) as refused:
        await resume_run(client, versioned("1.0.1"), "hotfix-1")
    assert "--accept-version 1.0.1" in str(refused.value)
    with pytest.raises(ConfigurationError):  # the acceptance must name the version being run
        await resume_run(client, versioned("1.0.1"), "hotfix-1", accept_version=VersionAcceptance("9.9", by="alice"))
    result = await resume_run(
        client, versioned("1.0.1"), "hotfix-1", accept_version=VersionAcceptance("1.0.1", by="alice", reason="fix")
    )
    assert result.status == "completed" and result.output == "done"
    assert ran == ["search", "publish"]  # the recorded search was replayed, not run again
    log = await load_run(client, "hotfix-1")
    accepted = [e.payload for e in log.events if e.type == "version.accepted"]
    assert accepted == [{"agent_version": "1.0.1", "previous": "1.0.0", "by": "alice", "reason": "fix"}]
    assert fold(log.records).version["agent_version"] == "1.0.1"  # type: ignore[index]
    # The decision travels on the run's operator subject, which only operators may write.
    [stored] = [r for r in log.records if r.event.type == "version.accepted"]
    assert stored.subject == "ledger.run.hotfix.hotfix-1.o"


async def test_an_operator_accepts_a_version_then_the_agent_resumes(client: LedgerClient) -> None:
    """Two steps, as under --secure: the operator's decision (runledger accept-version), then a plain resume."""

    async def agent(run: Run) -> str:
        await run.approval("publish", None)
        return "ok"

    first = await start_run(client, AgentSpec("hotfix3", agent, ScriptedModel([]), agent_version="1"), run_id="hf-3")
    await approve(client, "hf-3", first.pending[0], by="op")
    with pytest.raises(LedgerError, match="already runs version"):
        await accept_version(client, "hf-3", "1", by="alice")
    event = await accept_version(client, "hf-3", "2", by="alice", reason="hotfix")
    assert event.payload == {"agent_version": "2", "previous": "1", "by": "alice", "reason": "hotfix"}
    result = await resume_run(client, AgentSpec("hotfix3", agent, ScriptedModel([]), agent_version="2"), "hf-3")
    assert result.status == "completed" and result.output == "ok"


async def test_an_accepted_version_still_stops_at_its_first_divergent_step(client: LedgerClient) -> None:
    async def v1(run: Run) -> str:
        await run.tool("search", {"q": "a"}, fn=lambda a: ["r1"])
        await run.approval("publish", None)
        return "ok"

    async def v2(run: Run) -> str:
        await run.tool("search", {"q": "b"}, fn=lambda a: ["r1"])  # incompatible: other arguments
        return "ok"

    first = await start_run(client, AgentSpec("hotfix2", v1, ScriptedModel([]), agent_version="1"), run_id="hf-2")
    await approve(client, "hf-2", first.pending[0], by="op")
    spec = AgentSpec("hotfix2", v2, ScriptedModel([]), agent_version="2")
    with pytest.raises(NondeterminismError) as info:
        await resume_run(client, spec, "hf-2", accept_version=VersionAcceptance("2", by="alice"))
    assert info.value.step == 0


@pytest.mark.parametrize("policy", ["sealed", "blob", "full"])
async def test_a_float_reads_back_the_same_live_and_on_resume(client: LedgerClient, policy: str) -> None:
    """A value the agent got live equals its replay in every way content is recorded (sealed,
    by reference, in the clear): ``950.0`` is written ``950`` by the chain's canonical JSON."""
    seen: list[str] = []

    async def agent(run: Run) -> str:
        order = await run.tool("lookup", {"id": 7}, fn=lambda a: {"amount": 950.0, "pad": "p" * pad})
        text = json.dumps(order["amount"])
        seen.append(text)
        await run.approval("refund", {"amount": order["amount"]})
        return text

    pad = 70_000 if policy == "blob" else 1
    data = DataPolicy("full", encrypt=False) if policy == "full" else DataPolicy()
    spec = AgentSpec("floats", agent, ScriptedModel([]), agent_version="1", data_policy=data)
    first = await start_run(client, spec, run_id=f"float-{policy}")
    await approve(client, f"float-{policy}", first.pending[0], by="op")
    resumed = await resume_run(client, spec, f"float-{policy}")
    assert resumed.status == "completed" and seen[0] == seen[1] == resumed.output
