"""Roles against a real server started with --secure: each forbidden action refused, each allowed one working.

A JetStream permission violation surfaces in nats-py as a timeout (the reason only reaches error_cb), so every
refusal is also checked in the server's log, where nats-server names the violation:
a refusal is a refusal, not a slow server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from runledger import AgentSpec, Run, ScriptedModel
from runledger.cli import main
from runledger.errors import (
    EffectWriteRefusedError,
    LedgerError,
    PermissionDeniedError,
    PublishError,
    RunOfAnotherAgentError,
)
from runledger.log.append import append_to_run
from runledger.log.client import LedgerClient, connect
from runledger.log.credentials import RoleCredentials
from runledger.log.publish import RetryPolicy, SubjectWriter
from runledger.log.reader import read_raw
from runledger.log.server import ServerState
from runledger.log.subjects import (
    AGENT_WRITER,
    CMD_STREAM,
    KEY_BUCKET,
    LEDGER_STREAM,
    OPERATOR_WRITER,
    RERUN_CONSUMER,
    WORKER_WRITER,
    any_agent_run_subject,
    effect_subject,
    run_filter,
    run_subject,
)
from runledger.ops.decisions import accept_version, approve, grant_budget
from runledger.ops.verify import verify_runs
from runledger.protect.blobs import BlobStore
from runledger.protect.capture import DataPolicy, client_opener
from runledger.protect.erasure import erase_run
from runledger.protect.loading import load_run
from runledger.record.events import ApprovalResolved, BudgetGranted, EffectIntended, EffectResolved, VersionAccepted
from runledger.record.fold import fold, fold_until_refused
from runledger.sdk.effects import append_to_key, read_key, resolve_key
from runledger.sdk.lifecycle import resume_run, start_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FAST = RetryPolicy(deadline_s=1.5, ack_timeout_s=0.5)


def creds(state: ServerState, user: str) -> str:
    return str(Path(state.creds_dir) / f"{user}.json")


@pytest.fixture
async def admin(secure_server: ServerState) -> AsyncIterator[LedgerClient]:
    c = await connect(secure_server.url, user_credentials=creds(secure_server, "admin"))  # creates the streams
    try:
        yield c
    finally:
        await c.close()


async def login(state: ServerState, user: str) -> LedgerClient:
    return await connect(state.url, user_credentials=creds(state, user))


async def last_seq_on(client: LedgerClient, subject: str) -> int:
    """The stream sequence of the last message on ``subject`` as the server holds it (0: none)."""
    try:
        return (await client.js.get_last_msg(LEDGER_STREAM, subject)).seq or 0
    except nats.js.errors.NotFoundError:
        return 0


async def logged_after(state: ServerState, start: int, *needles: str) -> None:
    """Wait (bounded) until the server's log, from byte ``start`` on, has a line with every needle."""
    deadline = asyncio.get_running_loop().time() + 5.0
    while asyncio.get_running_loop().time() < deadline:
        written = Path(state.log).read_bytes()[start:].decode(errors="replace")
        if any(all(n in line for n in needles) for line in written.splitlines()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the server logged no line with {needles} after the action")


async def refused(state: ServerState, action: Any, subject: str) -> None:
    """``action`` fails (as a timeout or a translated error) and the server logs a violation on ``subject``
    in what it wrote after the action began (an older violation of the same subject does not count)."""
    start = len(Path(state.log).read_bytes())
    with pytest.raises((TimeoutError, nats.errors.Error, LedgerError)):
        await action
    await logged_after(state, start, "Violation", subject)


def agent_spec(name: str) -> AgentSpec:
    async def agent(run: Run) -> Any:
        doc = await run.tool("read", {"id": 1}, fn=lambda a: "z" * 5000)  # a blob (threshold below)
        await run.effect("charge", {"amount": 5}, key=f"charge:{run.run_id}", fn=lambda a: {"ok": True})
        await run.approval("ship", {"n": len(doc)})
        return "shipped"

    return AgentSpec(name, agent, ScriptedModel([]), agent_version="v1", data_policy=DataPolicy(blob_threshold=1024))


def test_secure_up_writes_credentials_files_with_tight_modes(secure_server: ServerState) -> None:
    files = sorted(p.name for p in Path(secure_server.creds_dir).iterdir())
    assert files == [
        "admin.json",
        "agent-alpha.json",
        "agent-beta.json",
        "analyst.json",
        "auth.conf",
        "operator.json",
        "worker.json",
    ]
    for path in Path(secure_server.creds_dir).iterdir():
        assert path.stat().st_mode & 0o077 == 0, path
    alpha = RoleCredentials.read(creds(secure_server, "agent-alpha"))
    assert alpha.role == "agent" and alpha.agent == "alpha" and alpha.inbox_prefix == "_INBOX_agent_alpha"
    assert alpha.url == secure_server.url


async def test_no_login_no_access(secure_server: ServerState) -> None:
    with pytest.raises(LedgerError, match=r"no NATS server reachable|[Aa]uthorization"):
        await connect(secure_server.url)


async def test_an_agent_works_on_its_own_runs_and_nothing_else(admin: LedgerClient, secure_server: ServerState) -> None:
    beta = await login(secure_server, "agent-beta")
    alpha = await login(secure_server, "agent-alpha")
    operator = await login(secure_server, "operator")
    try:
        # Allowed: record a run (events, an effect claim, a blob, its key), be approved, resume it.
        await start_run(beta, agent_spec("beta"), None, run_id="beta-run")
        first = await start_run(alpha, agent_spec("alpha"), None, run_id="alpha-run")
        assert first.status == "suspended"
        await approve(operator, "alpha-run", first.pending[0], by="op")
        resumed = await resume_run(alpha, agent_spec("alpha"), "alpha-run")
        assert resumed.status == "completed" and resumed.output == "shipped"
        assert (await load_run(alpha, "alpha-run", agent="alpha")).records[-1].event.type == "run.completed"

        short = alpha.nc.jetstream(timeout=1.0)
        # Forbidden: publishing into another agent's run.
        await refused(
            secure_server, short.publish("ledger.run.beta.beta-run.a", b"{}", timeout=1.0), "ledger.run.beta.beta-run.a"
        )
        with pytest.raises(LedgerError, match=r"permission denied: the agent 'alpha' credentials may not publish to "
                           r"\$KV\.LEDGER_KEYS\.beta\.as-beta"):  # fmt: skip
            await start_run(alpha, agent_spec("beta"), None, run_id="as-beta", policy=FAST)
        plain = DataPolicy("full", encrypt=False)
        no_keys = AgentSpec("beta", agent_spec("beta").fn, ScriptedModel([]), data_policy=plain)
        with pytest.raises(PublishError):
            await start_run(alpha, no_keys, None, run_id="as-beta", policy=FAST)
        # Forbidden: another agent's idempotency keys (claiming, resolving or reading them).
        await refused(
            secure_server, short.publish("ledger.effect.beta.0123abcd.a", b"{}", timeout=1.0),
            "ledger.effect.beta.0123abcd.a",
        )  # fmt: skip
        await refused(
            secure_server, short.get_last_msg(LEDGER_STREAM, "ledger.effect.beta.0123abcd.a", direct=True),
            "$JS.API.DIRECT.GET.LEDGER.ledger.effect.beta.0123abcd.a",
        )  # fmt: skip
        # Forbidden: reading another agent's run (consumer, direct get, its key).
        await refused(secure_server, read_raw(alpha, run_filter("beta", "beta-run")), "$JS.API.CONSUMER.CREATE.LEDGER")
        await refused(secure_server, read_raw(alpha, any_agent_run_subject("beta-run")), "ledger.run.*.beta-run")
        for agent in ("beta", None):  # the library refuses before it asks, naming whose run it is
            with pytest.raises(RunOfAnotherAgentError, match="run 'beta-run' is agent 'beta''s"):
                await load_run(alpha, "beta-run", agent=agent)
        await refused(
            secure_server,
            short.get_last_msg(LEDGER_STREAM, "ledger.run.beta.beta-run.a", direct=True),
            "$JS.API.DIRECT.GET.LEDGER.ledger.run.beta.beta-run.a",
        )
        await refused(secure_server, short.get_msg(LEDGER_STREAM, seq=1), "$JS.API.STREAM.MSG.GET.LEDGER")
        kv = await short.key_value(KEY_BUCKET)
        await refused(secure_server, kv.get("beta.beta-run"), f"$KV.{KEY_BUCKET}.beta.beta-run")
        # Forbidden: deleting or purging the stream, publishing a re-run command.
        await refused(secure_server, short.delete_stream(LEDGER_STREAM), "$JS.API.STREAM.DELETE.LEDGER")
        await refused(secure_server, short.purge_stream(LEDGER_STREAM), "$JS.API.STREAM.PURGE.LEDGER")
        await refused(secure_server, short.publish("ledger.cmd.rerun", b"{}", timeout=1.0), "ledger.cmd.rerun")
        # Forbidden: listening on another user's inbox.
        start = len(Path(secure_server.log).read_bytes())
        sub = await alpha.nc.subscribe("_INBOX_agent_beta.>")
        await logged_after(secure_server, start, "Subscription Violation", "_INBOX_agent_beta.>")
        await sub.unsubscribe()
    finally:
        for c in (alpha, beta, operator):
            await c.close()


async def test_an_analyst_reads_everything_and_publishes_nothing(
    admin: LedgerClient, secure_server: ServerState, capsys: pytest.CaptureFixture[str]
) -> None:
    beta = await login(secure_server, "agent-beta")
    await start_run(beta, agent_spec("beta"), None, run_id="beta-run")
    await beta.close()
    analyst = await login(secure_server, "analyst")
    try:
        log = await load_run(analyst, "beta-run")
        assert log.records[0].event.type == "run.started"
        tool = next(r.event.payload for r in log.records if r.event.type == "tool.called")
        assert tool["output"]["$ref"] == "blob"  # the body by reference
        # Not granted content (runledger up --secure --grant-content analyst): the run keys are out of reach.
        assert tool["args"]["$enc"] == "A256GCM"
        assert all(r.ok for r in await verify_runs(analyst))
        short = analyst.nc.jetstream(timeout=1.0)
        await refused(secure_server, short.publish("ledger.run.beta.x", b"{}", timeout=1.0), "ledger.run.beta.x")
        await refused(secure_server, short.publish("ledger.cmd.rerun", b"{}", timeout=1.0), "ledger.cmd.rerun")
        await refused(secure_server, short.publish("ledger.effect.abc", b"{}", timeout=1.0), "ledger.effect.abc")
        kv = await short.key_value(KEY_BUCKET)
        await refused(secure_server, kv.put("beta.x", b"k"), f"$KV.{KEY_BUCKET}.beta.x")
        await refused(secure_server, short.delete_stream(LEDGER_STREAM), "$JS.API.STREAM.DELETE.LEDGER")
        # The re-run work queue is the workers': an analyst can neither take a request nor remove their consumer.
        await refused(
            secure_server, short.delete_consumer(CMD_STREAM, "rerun-workers"),
            f"$JS.API.CONSUMER.DELETE.{CMD_STREAM}.rerun-workers",
        )  # fmt: skip
        await refused(
            secure_server, short.add_consumer(CMD_STREAM, durable_name="thief"),
            f"$JS.API.CONSUMER.DURABLE.CREATE.{CMD_STREAM}.thief",
        )  # fmt: skip

        async def take_a_request() -> None:
            sub = await short.pull_subscribe("ledger.cmd.rerun", durable=RERUN_CONSUMER, stream=CMD_STREAM)
            await sub.fetch(1, timeout=1.0)

        await refused(secure_server, take_a_request(), f"$JS.API.CONSUMER.MSG.NEXT.{CMD_STREAM}.{RERUN_CONSUMER}")
    finally:
        await analyst.close()
    # The CLI connects with a credentials file.
    code = await asyncio.to_thread(
        main, ["show", "beta-run", "--nats", secure_server.url, "--creds", creds(secure_server, "analyst")]
    )
    assert code == 0 and "tool.called" in capsys.readouterr().out


async def test_operator_and_worker(admin: LedgerClient, secure_server: ServerState) -> None:
    operator = await login(secure_server, "operator")
    worker = await login(secure_server, "worker")
    try:
        # Operator: re-run commands are allowed; deleting the stream is not.
        ack = await operator.js.publish("ledger.cmd.rerun", json.dumps({"parent": "x"}).encode())
        assert ack.stream == CMD_STREAM
        await refused(
            secure_server, operator.nc.jetstream(timeout=1.0).delete_stream(LEDGER_STREAM), "STREAM.DELETE.LEDGER"
        )
        # Worker: consumes commands, publishes branch runs, may not issue commands.
        sub = await worker.js.pull_subscribe("ledger.cmd.rerun", durable=RERUN_CONSUMER, stream=CMD_STREAM)
        [msg] = await sub.fetch(1, timeout=5)
        assert json.loads(msg.data) == {"parent": "x"}
        await msg.ack_sync()
        branch = await start_run(worker, agent_spec("alpha"), None, run_id="branch-1", writer=WORKER_WRITER)
        assert branch.status == "suspended"
        short = worker.nc.jetstream(timeout=1.0)
        await refused(secure_server, short.publish("ledger.cmd.rerun", b"{}", timeout=1.0), "ledger.cmd.rerun")
        await refused(secure_server, short.purge_stream(LEDGER_STREAM), "$JS.API.STREAM.PURGE.LEDGER")
        # Its branches' keys are its own (=w.<agent>.<run>); an agent's run's key is not, to purge or to write.
        worker_kv = await short.key_value(KEY_BUCKET)
        assert await worker_kv.get("=w.alpha.branch-1")
        await refused(secure_server, worker_kv.purge("alpha.some-run"), f"$KV.{KEY_BUCKET}.alpha.some-run")
        await refused(secure_server, worker_kv.put("alpha.some-run", b"k"), f"$KV.{KEY_BUCKET}.alpha.some-run")
        # Erasure is the operator's: the key is destroyed, a blob deleted, the fact recorded.
        erased = await erase_run(operator, "branch-1", reason="test", by="op")
        assert erased.keys_destroyed and erased.blobs_deleted == 1 and erased.recorded
        await refused(
            secure_server,
            worker.nc.jetstream(timeout=1.0).delete_msg("KV_LEDGER_KEYS", 1),
            "$JS.API.STREAM.MSG.DELETE.KV_LEDGER_KEYS",
        )
    finally:
        await operator.close()
        await worker.close()


async def test_decisions_are_made_only_by_operators(admin: LedgerClient, secure_server: ServerState) -> None:
    """Who may say what is decided by the subject: an agent cannot approve its own approval, grant
    itself budget or accept a version, a worker cannot decide at all, and a decision written on a
    subject where NATS lets it through (the agent's own) is refused by the fold and by verify."""
    alpha = await login(secure_server, "agent-alpha")
    worker = await login(secure_server, "worker")
    operator = await login(secure_server, "operator")
    try:
        first = await start_run(alpha, agent_spec("alpha"), None, run_id="decide-run")
        assert first.status == "suspended"
        [request] = first.pending
        decision_subject = run_subject("alpha", "decide-run", OPERATOR_WRITER)
        for client in (alpha, worker):
            await refused(
                secure_server, client.nc.jetstream(timeout=1.0).publish(decision_subject, b"{}", timeout=1.0),
                decision_subject,
            )  # fmt: skip
        # Through the library: each refusal exactly, and nothing new on the operator's subject after it,
        # as the server holds it (a refusal raised after the decision landed would be no refusal).
        decisions = (
            lambda c: approve(c, "decide-run", request, by="self"),
            lambda c: grant_budget(c, "decide-run", tokens=10**6, by="self"),
            lambda c: accept_version(c, "decide-run", "v2", by="self"),
        )
        assert await last_seq_on(admin, decision_subject) == 0  # no decision yet
        # A worker reads the run and is refused at the publish; so is the agent, which reads its own run
        # (by its id alone too: runledger.log.reader.own_run_filter).
        operator_only = (
            "approvals, budget grants, accepted versions and retries are an operator's decisions: connect with "
            f"the operator's credentials, --creds {secure_server.creds_dir}/operator.json (or RUNLEDGER_CREDS)"
        )
        own_log = await load_run(alpha, "decide-run", agent="alpha", open_content=False)
        digest = fold(own_log.records).pending_approvals[request]["digest"]
        bodies = (
            ApprovalResolved(request_id=request, digest=digest, approved=True, by="self"),
            BudgetGranted(tokens=10**6, by="self"),
            VersionAccepted(agent_version="v2", previous="v1", by="self"),
        )
        readers = ((worker, "the worker credentials"), (alpha, "the agent 'alpha' credentials"))
        attempts = [(c, who, decide) for c, who in readers for decide in decisions] + [
            (alpha, "the agent 'alpha' credentials", lambda c, b=body: append_to_run(c, "decide-run", b, log=own_log))
            for body in bodies
        ]
        for client, who, decide in attempts:
            with pytest.raises(PermissionDeniedError) as denied:
                await asyncio.wait_for(decide(client), 10)
            assert type(denied.value) is PermissionDeniedError
            assert str(denied.value) == (
                f"permission denied: {who} may not publish to {decision_subject}, and nothing was recorded; "
                + operator_only
            )
            assert (denied.value.subject, denied.value.who) == (decision_subject, who)
            assert await last_seq_on(admin, decision_subject) == 0
        # A worker writes branch runs ("w"), never an agent's run.
        agent_subject = run_subject("alpha", "decide-run", AGENT_WRITER)
        await refused(
            secure_server, worker.nc.jetstream(timeout=1.0).publish(agent_subject, b"{}", timeout=1.0), agent_subject
        )
        branch = await start_run(worker, agent_spec("alpha"), None, run_id="branch-w", writer=WORKER_WRITER)
        assert branch.status == "suspended"
        # An agent may publish on its own subject; a decision there is a forgery the fold refuses.
        log = await load_run(alpha, "decide-run", agent="alpha", open_content=False)
        cp = fold(log.records)
        forger = SubjectWriter(
            alpha.js, agent_subject, run_id="decide-run", agent="alpha", msg_id_prefix="decide-run",
            next_seq=cp.next_seq, prev_hash=cp.last_hash, last_stream_seq=log.last_stream_seq,
        )  # fmt: skip
        pending = cp.pending_approvals[request]
        await forger.append(ApprovalResolved(request_id=request, digest=pending["digest"], approved=True, by="alpha"))
        # Quarantined and named by every reader, never folded: the run stays readable and waits on.
        forged = await load_run(alpha, "decide-run", agent="alpha", open_content=False)
        [quarantined] = forged.quarantined
        assert "forged decision" in quarantined.reason
        still, error = fold_until_refused(forged.records)
        assert error is None and request in still.pending_approvals
        waiting = await resume_run(alpha, agent_spec("alpha"), "decide-run")
        assert waiting.status == "suspended" and waiting.pending == [request]
        [result] = await verify_runs(operator, "decide-run")
        assert result.ok and len(result.quarantined) == 1 and "operator's decision" in result.quarantined[0]
        # Effect resolutions: an in-doubt claim on alpha's key (a claim with no outcome, as a crash leaves it).
        key = "pay:decide"
        state = await read_key(alpha, key, "alpha")
        claim = EffectIntended(step=9, name="pay", key=key, args={}, args_digest="0" * 64, lease_s=0.0)
        state = await append_to_key(alpha, state, claim, run_id="decide-run", agent="alpha", policy=FAST)
        resolution_subject = effect_subject("alpha", key, OPERATOR_WRITER)
        for client in (alpha, worker):
            await refused(
                secure_server, client.nc.jetstream(timeout=1.0).publish(resolution_subject, b"{}", timeout=1.0),
                resolution_subject,
            )  # fmt: skip
        forged_resolution = EffectResolved(key=key, outcome="committed", by="alpha", result={"paid": True})
        with pytest.raises(EffectWriteRefusedError, match="forged resolution"):  # stored, and does not count
            await append_to_key(alpha, state, forged_resolution, run_id="decide-run", agent="alpha", policy=FAST)
        assert (await read_key(operator, key, "alpha")).status == "claimed"  # stepped over: not the operator's
        settled = await resolve_key(operator, key, committed=False, by="op", reason="not in the bank's log")
        assert settled.status == "free" and (await read_key(alpha, key, "alpha")).status == "free"
        # The operator decides, on its own subject, and the run goes on (another run: this one is forged).
        second = await start_run(alpha, agent_spec("alpha"), None, run_id="decide-ok")
        event = await approve(operator, "decide-ok", second.pending[0], by="op")
        grant = await grant_budget(operator, "decide-ok", tokens=100, by="op")
        assert event.type == "approval.resolved" and grant.type == "budget.granted"
        raws = await read_raw(operator, run_filter("alpha", "decide-ok"))
        assert [r.subject.rpartition(".")[2] for r in raws if r.stream_seq >= 0][-2:] == ["o", "o"]
        resumed = await resume_run(alpha, agent_spec("alpha"), "decide-ok")
        assert resumed.status == "completed" and resumed.output == "shipped"
        assert all(r.ok for r in await verify_runs(operator, "decide-ok"))
    finally:
        for c in (alpha, worker, operator):
            await c.close()


async def test_a_delete_marker_from_an_agent_deletes_nothing(admin: LedgerClient, secure_server: ServerState) -> None:
    """Storing blobs lets an agent write any blob's delete marker (one subject for put and delete),
    but not purge its chunks: the body stays readable to its run; an operator's erasure removes it."""
    alpha = await login(secure_server, "agent-alpha")
    beta = await login(secure_server, "agent-beta")
    operator = await login(secure_server, "operator")
    try:
        await start_run(alpha, agent_spec("alpha"), None, run_id="blob-run")
        log = await load_run(alpha, "blob-run", agent="alpha", open_content=False)
        tool = next(r.event.payload for r in log.records if r.event.type == "tool.called")
        ref = tool["output"]
        assert ref["$ref"] == "blob"
        store = await beta.nc.jetstream(timeout=1.0).object_store("LEDGER_BLOBS")
        start = len(Path(secure_server.log).read_bytes())
        with pytest.raises((TimeoutError, nats.errors.Error)):
            await store.delete(ref["sha256"])  # the marker is stored; the purge of the chunks is refused
        await logged_after(secure_server, start, "Violation", "$JS.API.STREAM.PURGE.OBJ_LEDGER_BLOBS")
        assert await client_opener(alpha).open_value(ref) == "z" * 5000
        erased = await erase_run(operator, "blob-run", reason="test", by="op")
        assert erased.keys_destroyed
        with pytest.raises(LedgerError):
            await BlobStore(operator).fetch(ref)
    finally:
        for c in (alpha, beta, operator):
            await c.close()
