"""Forgeries by roles that may publish somewhere near their victim, written as the attacker acts.

Each attacker logs in to a real server started as ``runledger up --secure`` starts it, with its own
role's credentials, and publishes raw bytes (``js.publish``) on a subject its permissions let through:
a worker on an agent's key and run (``.w``), an agent on its own run with another run's id or another
agent's name in the envelope. Each test has a witness the attacked code does not control: the payments
service's own log (a service that ignores idempotency keys, so a second call is a second payment), the
raw stream, the DuckDB projection file.

The rules under test: docs/data-protection.md, "Who may write what" (runledger.record.fold.refusal,
runledger.sdk.effects.key_refusal).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.cli import main
from runledger.cli.exits import Exit
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient, connect
from runledger.log.reader import read_raw, read_run
from runledger.log.server import ServerState
from runledger.log.subjects import WORKER_WRITER, effect_filter, effect_subject, run_filter, run_subject
from runledger.ops.decisions import approve
from runledger.ops.verify import verify_runs
from runledger.projections.projector import Projector
from runledger.projections.store import ProjectionStore
from runledger.record.canonical import CHAIN_FORMAT
from runledger.record.events import (
    BudgetGranted,
    EffectCommitted,
    EffectFailed,
    EffectIntended,
    EffectResolved,
    ErrorInfo,
    Payload,
    RunCompleted,
    RunRetried,
    RunStarted,
    VersionAccepted,
    make_event,
)
from runledger.record.fold import fold
from runledger.sdk.effects import read_key
from runledger.sdk.lifecycle import resume_run, start_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def login(state: ServerState, user: str) -> LedgerClient:
    return await connect(state.url, user_credentials=str(Path(state.creds_dir) / f"{user}.json"))


@pytest.fixture
async def clients(secure_server: ServerState) -> AsyncIterator[dict[str, LedgerClient]]:
    admin = await login(secure_server, "admin")  # creates the streams
    out = {"admin": admin}
    try:
        for user in ("agent-alpha", "agent-beta", "worker", "operator"):
            out[user] = await login(secure_server, user)
        yield out
    finally:
        for c in out.values():
            await c.close()


@pytest.fixture
def payments(tmp_path: Path) -> Iterator[PaymentsService]:
    service = PaymentsService(tmp_path / "payments.log").start()
    try:
        yield service
    finally:
        service.stop()


def refunds(service: PaymentsService, order: str) -> list[dict[str, Any]]:
    """The witness: refunds of ``order`` in the service's own log."""
    return [c for c in service.calls() if c.get("call") == "refund" and c.get("order") == order]


def refund_agent(service: PaymentsService, *, approval: bool = False) -> AgentSpec:
    """Refunds an order through the payments service, which it calls WITHOUT an idempotency key (a
    service that ignores keys): only the ledger's key stands between a resume and a second refund."""

    def pay(args: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps({"order": args["order"], "amount": args["amount"]}).encode()
        request = urllib.request.Request(f"{service.url}/refunds", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return dict(json.loads(answer.read()))

    async def agent(run: Run) -> Any:
        order = run.input["order"]
        if approval:
            await run.approval("refund", {"order": order})
        return await run.effect("refund", {"order": order, "amount": 10.0}, key=f"refund:{order}", fn=pay)

    return AgentSpec("alpha", agent, ScriptedModel([]), agent_version="v1")


async def publish_forged(client: LedgerClient, subject: str, body: Payload, *, run_id: str, agent: str,
                         seq: int, prev_hash: str) -> int:  # fmt: skip
    """What the attacker does: a well-formed event, linked to the chain it attacks, raw on ``subject``."""
    _, data = make_event(body, run_id=run_id, agent=agent, seq=seq, prev_hash=prev_hash, chain_format=CHAIN_FORMAT)
    ack = await client.js.publish(subject, data, timeout=5.0)
    return int(ack.seq)


async def project(client: LedgerClient, db: Path) -> None:
    with ProjectionStore(db) as store:
        await Projector(client, store).run()


def sql(db: Path, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with ProjectionStore(db, writer=False) as store:
        return [tuple(row) for row in store.con.execute(query, list(params)).fetchall()]


# -- 1. a worker on an agent's effect key -----------------------------------------------------------------


@pytest.mark.parametrize("attack", ["resolved_not_committed", "failed"])
async def test_a_worker_cannot_make_an_agent_pay_twice(
    clients: dict[str, LedgerClient], payments: PaymentsService, tmp_path: Path, attack: str
) -> None:
    """A worker publishes, on the agent's committed key (its own ``.w`` subject of it, which the server
    lets through), what would free the key: a reconcile's "not committed", or a failure. The agent's
    next run of the order must take the committed refund from the key, not refund again."""
    alpha, worker = clients["agent-alpha"], clients["worker"]
    spec = refund_agent(payments)
    first = await start_run(alpha, spec, {"order": "o-1"}, run_id="pay-first")
    assert first.status == "completed" and len(refunds(payments, "o-1")) == 1
    key = "refund:o-1"
    seen = await read_key(worker, key, "alpha")  # a worker may read every key
    assert seen.status == "committed"
    forged: Payload = (
        EffectResolved(key=key, outcome="not_committed", by="reconcile", reason="no trace at the bank")
        if attack == "resolved_not_committed"
        else EffectFailed(step=0, key=key, error=ErrorInfo(type="HTTPError", message="503"))
    )
    stream_seq = await publish_forged(
        worker, effect_subject("alpha", key, WORKER_WRITER), forged,
        run_id="pay-first", agent="alpha", seq=seen.next_seq, prev_hash=seen.last_hash,
    )  # fmt: skip
    raws = await read_raw(clients["admin"], effect_filter("alpha", key))
    assert raws[-1].stream_seq == stream_seq and raws[-1].subject.endswith(".w")  # it is in the stream

    again = await start_run(alpha, spec, {"order": "o-1"}, run_id="pay-again")
    assert again.status == "completed"
    assert len(refunds(payments, "o-1")) == 1, "the worker's forgery made the agent refund a second time"
    assert again.output == first.output
    state = await read_key(clients["operator"], key, "alpha")
    assert state.status == "committed" and state.writer == "a"
    assert len(state.refused) == 1 and f"stream seq {stream_seq}" in state.refused[0]
    for run_id in ("pay-first", "pay-again"):
        [result] = await verify_runs(clients["operator"], run_id)
        assert result.ok, result.reason
    # The projection: the key as the agent left it, the forgery quarantined and named.
    db = tmp_path / "ledger.duckdb"
    await project(clients["operator"], db)
    [(status, writer)] = sql(db, "SELECT status, writer FROM effect_keys WHERE key = ?", key)
    assert (status, writer) == ("committed", "a")
    [(error, reason)] = sql(db, "SELECT error, reason FROM quarantine WHERE stream_seq = ?", stream_seq)
    assert error == "RefusedFromWriter" and "as 'w', where the key is committed" in reason
    assert sql(db, "SELECT count(*) FROM events WHERE stream_seq = ?", stream_seq) == [(0,)]


@pytest.mark.parametrize("claim_too", [False, True])
async def test_a_worker_cannot_hand_an_agent_a_forged_result(
    clients: dict[str, LedgerClient], payments: PaymentsService, claim_too: bool
) -> None:
    """A worker writes a refund that never happened on a key the agent has not used yet: a bare
    ``effect.committed``, or a whole claim and commit as a branch would write them. The agent must
    not return the forged result: it refunds, once, and returns what the service answered."""
    alpha, worker = clients["agent-alpha"], clients["worker"]
    key = "refund:o-2"
    subject = effect_subject("alpha", key, WORKER_WRITER)
    forged_result = {"refund_id": "forged", "order": "o-2", "amount": 10.0}
    bodies: list[Payload] = [EffectCommitted(step=0, key=key, result=forged_result)]
    if claim_too:
        bodies.insert(0, EffectIntended(step=0, name="refund", key=key, args={"order": "o-2", "amount": 10.0},
                                        args_digest="0" * 64, lease_s=0.0))  # fmt: skip
    for body in bodies:
        seen = await read_key(worker, key, "alpha")
        await publish_forged(worker, subject, body, run_id="pay-victim", agent="alpha",
                             seq=seen.next_seq, prev_hash=seen.last_hash)  # fmt: skip

    result = await start_run(alpha, refund_agent(payments), {"order": "o-2"}, run_id="pay-victim")
    assert result.status == "completed"
    assert result.output["refund_id"] != "forged", "the agent returned a result the worker forged"
    [refund] = refunds(payments, "o-2")  # paid once, for real
    assert result.output["refund_id"] == refund["refund_id"]
    state = await read_key(clients["operator"], key, "alpha")
    assert state.status == "committed" and state.writer == "a" and state.run_id == "pay-victim"
    [verified] = await verify_runs(clients["operator"], "pay-victim")
    assert verified.ok


# -- 5. a worker on an agent's run --------------------------------------------------------------------------


async def test_a_worker_cannot_break_an_agents_run(
    clients: dict[str, LedgerClient], payments: PaymentsService, secure_server: ServerState, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """A worker publishes on the ``.w`` subject of an agent's suspended run (which the server lets
    through: workers write branch runs there): a completion with its own output, and the decisions
    only operators make (budget, version, retry, approval). Each is quarantined and named; the run
    verifies, shows, is approved by the operator and resumes to its real end, paying once."""
    alpha, worker, operator = clients["agent-alpha"], clients["worker"], clients["operator"]
    spec = refund_agent(payments, approval=True)
    started = await start_run(alpha, spec, {"order": "o-5"}, run_id="victim-5")
    assert started.status == "suspended"
    [request] = started.pending
    subject = run_subject("alpha", "victim-5", WORKER_WRITER)
    head = fold((await read_run(worker, "victim-5")).records)  # each forgery links to the genuine head
    forged_seqs = []
    for body in (
        RunCompleted(output={"refund_id": "forged"}),
        BudgetGranted(tokens=10**9, by="worker"),
        VersionAccepted(agent_version="evil", previous="v1", by="worker"),
        RunRetried(step=0, by="worker"),
    ):
        forged_seqs.append(await publish_forged(worker, subject, body, run_id="victim-5", agent="alpha",
                                                seq=head.next_seq, prev_hash=head.last_hash))  # fmt: skip

    [result] = await verify_runs(operator, "victim-5")
    assert result.ok, result.reason
    assert [q.split(":")[0] for q in result.quarantined] == [f"stream seq {s}" for s in forged_seqs]
    assert all("written as 'w' in a run written by 'a'" in q for q in result.quarantined)
    log = await read_run(operator, "victim-5")
    assert [q.stream_seq for q in log.quarantined] == forged_seqs
    assert not any(r.subject.endswith(".w") for r in log.records)
    cp = fold(log.records)
    assert cp.status == "suspended" and cp.version is not None and cp.version["agent_version"] == "v1"

    as_operator = ["--nats", secure_server.url, "--creds", str(Path(secure_server.creds_dir) / "operator.json")]
    code = await asyncio.to_thread(main, ["show", "victim-5", *as_operator])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"QUARANTINED stream seq {forged_seqs[0]}" in out and "forged" not in out.split("QUARANTINED")[0]
    code = await asyncio.to_thread(main, ["verify", "victim-5", *as_operator])
    out = capsys.readouterr().out
    assert code == Exit.FORGED and "ok   victim-5  agent alpha" in out and "1 of 1 runs verified" in out, out
    assert f"FORGED stream seq {forged_seqs[0]} by worker on {subject}: run.completed written as 'w'" in out

    await approve(operator, "victim-5", request, by="op")
    resumed = await resume_run(alpha, spec, "victim-5")
    assert resumed.status == "completed" and resumed.output["refund_id"] != "forged"
    assert len(refunds(payments, "o-5")) == 1
    [after] = await verify_runs(operator, "victim-5")
    assert after.ok and len(after.quarantined) == len(forged_seqs)

    db = tmp_path / "ledger.duckdb"
    await project(operator, db)
    [(status,)] = sql(db, "SELECT status FROM runs WHERE run_id = 'victim-5'")
    assert status == "completed"
    assert sql(db, "SELECT count(*) FROM events WHERE run_id = 'victim-5' AND subject LIKE '%.w'") == [(0,)]
    quarantined = sql(db, "SELECT stream_seq FROM quarantine WHERE error = 'RefusedFromWriter' ORDER BY 1")
    assert [s for (s,) in quarantined] == forged_seqs


# -- 6. forged envelopes ---------------------------------------------------------------------------------------


async def test_a_forged_envelope_changes_no_row_of_its_victim(
    clients: dict[str, LedgerClient], payments: PaymentsService, tmp_path: Path
) -> None:
    """Agent beta, on its own subjects (where the server lets it write anything), publishes events
    whose envelope names alpha's run, or alpha as their agent. Alpha's rows in the projection stay
    exactly as they were; the forgeries are quarantined and named by verify."""
    alpha, beta, operator = clients["agent-alpha"], clients["agent-beta"], clients["operator"]
    victim = await start_run(alpha, refund_agent(payments), {"order": "o-6"}, run_id="victim-6")
    assert victim.status == "completed"
    db = tmp_path / "ledger.duckdb"
    await project(operator, db)
    queries = [
        "SELECT stream_seq, subject, id, agent, seq, type FROM events WHERE run_id = 'victim-6' ORDER BY 1",
        "SELECT run_id, agent, status FROM runs WHERE run_id = 'victim-6' OR agent = 'alpha' ORDER BY 1",
        "SELECT run_id, step, kind, status FROM steps WHERE run_id = 'victim-6' ORDER BY 2",
        "SELECT run_id, status, next_seq FROM checkpoints WHERE run_id = 'victim-6'",
    ]
    before = [sql(db, q) for q in queries]
    assert before[0] and before[1] and before[2]

    own = run_subject("beta", "beta-own", "a")
    version = {"agent_version": "v1", "model": "m", "prompt_hash": "p", "tool_schema_hashes": {}}
    forged: list[int] = []
    # beta's own run, whose events say they are victim-6's ...
    started = RunStarted.model_validate({"agent": "beta", "version": version})
    forged.append(await publish_forged(beta, own, started, run_id="victim-6", agent="beta", seq=0, prev_hash="0" * 64))
    # ... or alpha's: a run that beta starts under alpha's name, and a completion in it.
    other = run_subject("beta", "beta-as-alpha", "a")
    as_alpha = RunStarted.model_validate({"agent": "alpha", "version": version})
    forged.append(await publish_forged(beta, other, as_alpha, run_id="beta-as-alpha", agent="alpha", seq=0,
                                       prev_hash="0" * 64))  # fmt: skip
    forged.append(await publish_forged(beta, other, RunCompleted(output="x"), run_id="beta-as-alpha", agent="alpha",
                                       seq=1, prev_hash="0" * 64))  # fmt: skip
    # and beta's subject with alpha's run id (an agent may write any run id under its own name).
    squat = run_subject("beta", "victim-6", "a")
    forged.append(await publish_forged(beta, squat, RunCompleted(output="forged"), run_id="victim-6", agent="beta",
                                       seq=5, prev_hash="0" * 64))  # fmt: skip

    await project(operator, db)
    assert [sql(db, q) for q in queries] == before, "a forged envelope changed the victim's rows"
    rows = sql(db, "SELECT stream_seq, error FROM quarantine WHERE stream_seq IN (SELECT unnest(?::BIGINT[]))"
               " ORDER BY 1", forged)  # fmt: skip
    assert rows == [(s, "RefusedFromWriter") for s in forged]
    results = {r.run_id: r for r in await verify_runs(operator)}
    assert all(r.ok for r in results.values())
    named = {f.stream_seq: f for r in results.values() for f in r.forgeries}
    assert sorted(named) == sorted(forged)
    assert any("forged envelope" in f.reason for f in named.values())
    # Under beta's own name, alpha's run id is no second run: a forgery of alpha's run, named as beta's.
    victim_result = results["victim-6"]
    assert victim_result.agent == "alpha" and [f.stream_seq for f in victim_result.forgeries] == [forged[-1]]
    assert (named[forged[-1]].subject, named[forged[-1]].writer) == (squat, "agent-beta")
    # Read by its id alone (as `show` and resume read it), the victim is its own events only.
    log = await read_run(operator, "victim-6")
    assert {r.subject for r in log.records} == {run_subject("alpha", "victim-6", "a")}
    assert [q.stream_seq for q in log.quarantined] == [forged[-1]]
    assert fold(log.records).status == "completed"
    assert await read_raw(operator, run_filter("beta", "beta-own"))  # the raw stream holds them all
