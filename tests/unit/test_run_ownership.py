"""A run id is its first agent's, and no reader merges two agents' runs under one id (docs/data-protection.md,
"Who may write what"), on the in-memory ledger, which holds the server's fences (runledger.log.memory).

The attacker's side, with each role's own credentials on a real server, is
tests/integration/test_run_ownership.py; here the rules themselves: the claim of a run id
(runledger.log.subjects.fence_for, runledger.sdk.lifecycle.claim_run), verify's one result a run id
with its forgeries named (runledger.ops.verify), `runs`' flag, and the reader of an agent's login.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runledger.cli.exits import Exit, of_error
from runledger.errors import RunIdTakenError, RunOfAnotherAgentError
from runledger.log.client import LedgerClient
from runledger.log.memory import MemoryLedger
from runledger.log.reader import read_run
from runledger.log.subjects import run_subject
from runledger.ops.trace import list_runs
from runledger.ops.verify import verify_runs
from runledger.record.canonical import CHAIN_FORMAT
from runledger.record.events import GENESIS, Payload, RunCompleted, RunStarted, make_event
from runledger.sdk.agent import AgentSpec
from runledger.sdk.lifecycle import open_run, start_run
from runledger.sdk.models import ScriptedModel

VERSION = {"agent_version": "v1", "model": "m", "prompt_hash": "p", "tool_schema_hashes": {}}


def spec(name: str, calls: list[str], durability: str = "step") -> AgentSpec:
    async def agent(run: Any) -> Any:
        calls.append(name)  # what the agent would act on: never reached on a taken id
        return {"paid_by": name}

    return AgentSpec(name, agent, ScriptedModel([]), agent_version="v1", durability=durability)  # type: ignore[arg-type]


@pytest.fixture
async def ledger() -> AsyncIterator[tuple[MemoryLedger, LedgerClient]]:
    memory = MemoryLedger()
    client = await memory.connect()
    try:
        yield memory, client
    finally:
        await client.close()


async def forge(client: LedgerClient, agent: str, run_id: str, bodies: list[Payload]) -> list[int]:
    """What another agent may do on its own subject: raw events under ``run_id``, as a chain of its own."""
    seqs, prev = [], GENESIS
    for seq, body in enumerate(bodies):
        event, data = make_event(body, run_id=run_id, agent=agent, seq=seq, prev_hash=prev, chain_format=CHAIN_FORMAT)
        seqs.append(int((await client.js.publish(run_subject(agent, run_id), data)).seq))
        prev = event.hash
    return seqs


@pytest.mark.parametrize("durability", ["step", "output"])
async def test_a_start_on_a_run_id_another_agent_holds_is_refused_naming_it(
    ledger: tuple[MemoryLedger, LedgerClient], durability: str
) -> None:
    memory, client = ledger
    calls: list[str] = []
    first = await start_run(client, spec("bob", calls, durability), run_id="refund-1")
    assert first.status == "completed" and calls == ["bob"]
    stored = len(memory.messages("ledger.run.>"))
    with pytest.raises(RunIdTakenError) as taken:
        await start_run(client, spec("alice", calls, durability), run_id="refund-1")
    assert "run id 'refund-1' is taken: agent 'bob' claimed it first" in str(taken.value)
    assert "nothing was recorded or done" in str(taken.value) and of_error(taken.value) == Exit.REFUSED
    assert calls == ["bob"] and len(memory.messages("ledger.run.>")) == stored  # alice did nothing, wrote nothing
    # The same agent twice: its own run holds the id.
    with pytest.raises(RunIdTakenError, match="agent 'bob' already has a run under it"):
        await start_run(client, spec("bob", calls, durability), run_id="refund-1")
    # A framework's run opened by id (a LangGraph thread): the same claim.
    with pytest.raises(RunIdTakenError, match="agent 'bob' claimed it first"):
        await open_run(client, spec("alice", calls, durability), "refund-1")
    await client.close()


async def test_whoever_wrote_first_under_an_id_holds_it(ledger: tuple[MemoryLedger, LedgerClient]) -> None:
    """The squat of the report: alice's bare run.started comes first. Bob's run is refused before it
    does anything, naming alice, instead of paying and then reading as alice's."""
    _, client = ledger
    await forge(client, "alice", "refund-2", [RunStarted.model_validate({"agent": "alice", "version": VERSION})])
    calls: list[str] = []
    with pytest.raises(RunIdTakenError, match="agent 'alice' claimed it first"):
        await start_run(client, spec("bob", calls), run_id="refund-2")
    assert calls == []


async def test_another_agent_under_a_taken_id_is_a_forgery_of_that_run_never_a_second_run(
    ledger: tuple[MemoryLedger, LedgerClient],
) -> None:
    _, client = ledger
    assert (await start_run(client, spec("bob", []), run_id="refund-3")).status == "completed"
    forged = await forge(client, "alice", "refund-3", [
        RunStarted.model_validate({"agent": "alice", "version": VERSION}), RunCompleted(output="alice's"),
    ])  # fmt: skip
    garbage = int((await client.js.publish(run_subject("alice", "refund-3"), b"not an event")).seq)

    [result] = await verify_runs(client, "refund-3")
    assert result.ok and result.agent == "bob" and result.events == 2 and result.forged
    assert [(f.stream_seq, f.subject, f.writer) for f in result.forgeries] == [
        (seq, run_subject("alice", "refund-3"), "agent-alice") for seq in [*forged, garbage]
    ]
    assert "which is agent 'bob''s" in result.forgeries[0].reason and "not a valid event" in result.forgeries[2].reason
    log = await read_run(client, "refund-3")
    assert log.agent == "bob" and {r.subject for r in log.records} == {run_subject("bob", "refund-3")}
    [listed] = await list_runs(client)
    assert (listed.run_id, listed.agent, listed.status, listed.forgeries) == ("refund-3", "bob", "completed", 3)


def test_verify_exits_7_on_forgeries_and_lists_them_by_subject_writer_and_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import runledger.cli.connect
    from runledger.cli.app import main

    memory = MemoryLedger()

    async def connect(url: str, **options: Any) -> Any:
        return await memory.connect()

    async def setup(forged: bool) -> list[int]:
        client = await memory.connect()
        if not forged:
            for run_id in ("clean", "victim"):
                assert (await start_run(client, spec("bob", []), run_id=run_id)).status == "completed"
            return []
        return await forge(client, "alice", "victim", [RunCompleted(output="forged")])

    monkeypatch.setattr(runledger.cli.connect, "connect", connect)
    asyncio.run(setup(False))
    assert main(["verify", "--nats", "memory://"]) == Exit.OK
    [seq] = asyncio.run(setup(True))
    capsys.readouterr()
    assert main(["verify", "victim", "--nats", "memory://"]) == Exit.FORGED
    out = capsys.readouterr().out
    assert "ok   victim  agent bob" in out
    assert f"FORGED stream seq {seq} by agent-alice on ledger.run.alice.victim.a" in out
    assert main(["verify", "--json", "--nats", "memory://"]) == Exit.FORGED
    results = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert results["clean"]["forgeries"] == [] and not results["clean"]["forged"]
    [forgery] = results["victim"]["forgeries"]
    assert forgery["subject"] == "ledger.run.alice.victim.a" and forgery["writer"] == "agent-alice"
    assert forgery["stream_seq"] == seq and "which is agent 'bob''s" in forgery["reason"]
    assert main(["runs", "--nats", "memory://"]) == Exit.OK
    assert "FORGED: 1 messages under its id" in capsys.readouterr().out


async def test_an_agents_login_reads_its_own_runs_and_is_refused_anothers(
    ledger: tuple[MemoryLedger, LedgerClient],
) -> None:
    """The reader's rule for a client logged in as an agent (the server's permissions are the
    integration test's): its own run by id alone, another agent's run refused, naming the owner."""
    memory, admin = ledger
    assert (await start_run(admin, spec("bob", []), run_id="bobs")).status == "completed"
    assert (await start_run(admin, spec("alice", []), run_id="alices")).status == "completed"
    alice = await memory.connect()
    alice.role, alice.agent = "agent", "alice"
    assert (await read_run(alice, "alices")).agent == "alice"
    [own] = await verify_runs(alice, "alices")
    assert own.ok and not own.forged
    for read in (read_run(alice, "bobs"), verify_runs(alice, "bobs")):
        with pytest.raises(RunOfAnotherAgentError, match="run 'bobs' is agent 'bob''s") as refused:
            await read
        assert of_error(refused.value) == Exit.REFUSED
    assert [r.run_id for r in await list_runs(alice)] == ["alices"]
    assert [r.run_id for r in await verify_runs(alice)] == ["alices"]
