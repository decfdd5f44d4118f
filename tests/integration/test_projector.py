"""The projector against a real nats-server: 10,000+ events from the example agent and a load
generator; rebuild equals incremental; poison is quarantined; checkpoints equal the fold resume
uses; another stream's file is refused; --follow keeps up and stops cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest

from bench.project import publish_raw, workload
from runledger import Run
from runledger.examples.refund_agent.agent import TICKETS, spec
from runledger.examples.refund_agent.payments import PaymentsService
from runledger.log.client import LedgerClient, connect
from runledger.log.publish import RetryPolicy, SubjectWriter
from runledger.log.reader import decode_records, read_raw
from runledger.log.server import EmbeddedServer
from runledger.log.subjects import LEDGER_STREAM, run_subject
from runledger.ops.decisions import approve
from runledger.projections.errors import StreamMismatchError
from runledger.projections.projector import project, rebuild
from runledger.protect.loading import load_run
from runledger.protect.roles import secure
from runledger.record.canonical import digest
from runledger.record.events import (
    EffectCommitted,
    EffectIntended,
    RunCompleted,
    RunForked,
    RunStarted,
    VersionTuple,
)
from runledger.record.fold import fold
from runledger.record.records import Recorded
from runledger.sdk.agent import AgentSpec
from runledger.sdk.effects import KeyState, append_to_key
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.models import ScriptedModel
from tests.agents import spender_spec
from tests.conftest import eventually
from tests.integration.processes import runledger
from tests.unit.projections.tables import snapshot

# The runledger() helper waits up to 120 s a call and read_raw 120 s: a test makes several.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
MANUAL_VERSION = VersionTuple(agent_version="manual", model="none", prompt_hash="-")


# -- the data set ----------------------------------------------------------------------------------------


async def manual_run(client: LedgerClient, run_id: str, agent: str = "backoffice") -> SubjectWriter:
    writer = SubjectWriter(client.js, run_subject(agent, run_id), run_id=run_id, agent=agent, msg_id_prefix=run_id)
    await writer.append(RunStarted(agent=agent, version=MANUAL_VERSION, input={"ticket": run_id}))
    return writer


async def effect(
    client: LedgerClient, run: SubjectWriter, step: int, key: str, args: dict[str, Any], *, commit: bool
) -> None:
    """An effect as the SDK records it: intent in the run, claim (and outcome) on the key's subject."""
    claim = EffectIntended(step=step, name=key.split(":")[0], key=key, args=args, args_digest=digest(args))
    await run.append(claim)
    policy = RetryPolicy()
    state = await append_to_key(client, KeyState(key), claim, run_id=run.run_id, agent=run.agent, policy=policy)
    if commit:
        done = EffectCommitted(step=step, key=key, result={"refund_id": f"rf-{run.run_id}", **args})
        await append_to_key(client, state, done, run_id=run.run_id, agent=run.agent, policy=policy)
        await run.append(done)


async def build_ledger(client: LedgerClient, tmp_path: Path, load_events: int = 10_000) -> dict[str, str]:
    """The example agent over every ticket (and a few more), odd cases, then synthetic load.

    Returns ticket -> run id for the agent's runs. Deterministic apart from ids and times.
    """
    payments = PaymentsService(tmp_path / "payments.log").start()
    runs: dict[str, str] = {}
    # The refund tool finds its service through the environment: set only while the agent runs.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("REFUND_PAYMENTS_URL", payments.url)
        env.setenv("REFUND_OUTBOX", str(tmp_path / "outbox"))
        try:
            agent = spec()
            big = next(t for t in TICKETS if t["ticket"] == "T-1004")
            tickets = [*TICKETS, {**big, "ticket": "T-2004"}, {**big, "ticket": "T-3004"}]
            for ticket in tickets:
                result = await start_run(client, agent, ticket, labels={"ticket": ticket["ticket"]})
                runs[ticket["ticket"]] = result.run_id
                if result.status == "suspended" and ticket["ticket"] != "T-2004":  # T-2004 waits for a decision
                    denied = ticket["ticket"] == "T-3004"
                    await approve(client, result.run_id, result.pending[0], by="ana", approved=not denied,
                                  reason="too much" if denied else "photos checked")  # fmt: skip
                    await resume_run(client, agent, result.run_id)
        finally:
            payments.stop()
    rogue = await manual_run(client, "rogue-1")  # refunds 700 without asking anyone
    await effect(client, rogue, 0, "refund:order-rogue", {"order": "order-rogue", "amount": 700.0}, commit=True)
    await rogue.append(RunCompleted(output={"refunded": True}))
    doubt = await manual_run(client, "doubt-1")  # claimed, then the process died
    await effect(client, doubt, 0, "refund:order-doubt", {"order": "order-doubt", "amount": 20.0}, commit=False)
    runs["spender"] = (await start_run(client, spender_spec())).run_id  # stopped by its token budget

    async def echo(run: Run) -> str:
        await run.model([{"role": "user", "content": "again"}])
        return "ok"

    fork = RunForked(forked_from=runs["T-1001"], fork_step=2, mode="redrive", changed="model", changed_to="m-2")
    branch = AgentSpec("refund-agent", echo, ScriptedModel(["ok"], name="m-2"), agent_version="branch")
    runs["branch"] = (await start_run(client, branch, {"ticket": "T-1001"}, fork=fork)).run_id
    await publish_raw(client, workload(load_events))
    return runs


async def stream_messages(client: LedgerClient) -> int:
    return int((await client.js.stream_info(LEDGER_STREAM)).state.messages)


def structure(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint without its content fields (runledger.protect.capture.CONTENT_FIELDS and error texts).

    The projection folds events as stored, so content sealed under a run's key stays sealed
    in DuckDB (analysts do not get plaintext; erasing a run's key erases it there too). Resume
    folds the same events with content opened: the two checkpoints agree on everything else.
    """
    out = {k: v for k, v in checkpoint.items() if k not in ("input", "output", "error")}
    out["steps"] = [{k: v for k, v in step.items() if k not in ("output", "error")} for step in checkpoint["steps"]]
    out["pending_approvals"] = {
        r: {k: v for k, v in a.items() if k != "args"} for r, a in checkpoint["pending_approvals"].items()
    }
    return out


async def assert_checkpoints_equal_resume_fold(client: LedgerClient, db: Path, resumed: list[str]) -> int:
    """Every run's checkpoints row == the fold over the stream; for ``resumed`` runs, also ==
    what resume folds (``load_run`` with content opened) in everything but the sealed content."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        stored = {r[0]: json.loads(r[1]) for r in con.execute("SELECT run_id, checkpoint FROM checkpoints").fetchall()}
    finally:
        con.close()
    good, bad = decode_records(await read_raw(client, "ledger.run.>", timeout=120))
    by_run: dict[str, list[Recorded]] = {}
    for rec in good:
        by_run.setdefault(rec.subject.split(".")[3], []).append(rec)
    assert set(stored) == set(by_run)
    for run_id, records in by_run.items():
        # Bytes that are no event on the run's own subject break it there: its state is the fold up to them.
        own = next((r.subject for r in records if r.event.type == "run.started"), None)
        broken_at = min((q.stream_seq for q in bad if q.subject == own), default=None)
        upto = [r for r in records if broken_at is None or r.stream_seq < broken_at]
        assert stored[run_id] == fold(upto).to_dict(), run_id
    for run_id in resumed:
        log = await load_run(client, run_id)  # exactly what resume_run folds
        assert structure(stored[run_id]) == structure(fold(log.records).to_dict()), run_id
    return len(by_run)


# -- the tests -------------------------------------------------------------------------------------------


async def test_ten_thousand_events_project_and_checkpoints_equal_the_fold(client: LedgerClient, tmp_path: Path) -> None:
    runs = await build_ledger(client, tmp_path)
    total = await stream_messages(client)
    assert total >= 10_000
    db = tmp_path / "ledger.duckdb"
    result = await project(client, db)
    assert (result.events, result.quarantined, result.position) == (total, 0, total)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), max(stream_seq) FROM events").fetchall() == [(total, total)]
    status = dict(con.execute("SELECT run_id, status FROM runs").fetchall())
    expected = {"T-1001": "completed", "T-1002": "completed", "T-1003": "failed", "T-1004": "completed",
                "T-1005": "completed", "T-2004": "suspended", "T-3004": "failed"}  # fmt: skip
    assert {ticket: status[runs[ticket]] for ticket in expected} == expected
    assert con.execute("SELECT failure_reason FROM runs WHERE run_id = ?", [runs["spender"]]).fetchall() == [
        ("budget_exhausted",)
    ]
    assert con.execute("SELECT key FROM effects_in_doubt").fetchall() == [("refund:order-doubt",)]
    assert con.execute("SELECT parent_run_id FROM forks").fetchall() == [(runs["T-1001"],)]
    con.close()
    assert await assert_checkpoints_equal_resume_fold(client, db, list(runs.values())) > 1000
    again = await project(client, db)  # nothing new: nothing done
    assert (again.events, again.position) == (0, total)


async def test_rebuild_equals_incremental_across_restarts(
    client: LedgerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payments = PaymentsService(tmp_path / "payments.log").start()
    monkeypatch.setenv("REFUND_PAYMENTS_URL", payments.url)
    monkeypatch.setenv("REFUND_OUTBOX", str(tmp_path / "outbox"))
    db = tmp_path / "incremental.duckdb"
    try:
        agent = spec()
        big = next(t for t in TICKETS if t["ticket"] == "T-1004")
        suspended = await start_run(client, agent, big)
        await publish_raw(client, workload(3000))
        await project(client, db, batch_size=700)  # the suspended run is in the file, half done
        await approve(client, suspended.run_id, suspended.pending[0], by="ana")
        await publish_raw(client, workload(3000, start=10_000))
        await resume_run(client, agent, suspended.run_id)  # its second half arrives after a restart
        await project(client, db, batch_size=333)
    finally:
        payments.stop()
    rebuilt = await rebuild(client, tmp_path / "rebuilt.duckdb")
    assert rebuilt.rebuilt and rebuilt.position == await stream_messages(client)
    incremental, fresh = snapshot(db), snapshot(tmp_path / "rebuilt.duckdb")
    for table in incremental:
        assert incremental[table] == fresh[table], table
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT status FROM runs WHERE run_id = ?", [suspended.run_id]).fetchall() == [("completed",)]
    con.close()
    await assert_checkpoints_equal_resume_fold(client, db, [suspended.run_id])


async def test_rebuild_replaces_the_file_and_keeps_model_prices(client: LedgerClient, tmp_path: Path) -> None:
    await publish_raw(client, workload(500))
    db = tmp_path / "ledger.duckdb"
    await project(client, db)
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO model_prices VALUES ('bench-model-1', 3.0, 15.0)")
    con.execute("DELETE FROM runs")  # damage a derived table: a rebuild must not care
    con.close()
    await publish_raw(client, workload(500, start=1000))
    result = await rebuild(client, db)
    assert result.position == await stream_messages(client)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchall()[0][0] > 50
    assert con.execute("SELECT count(*) FROM model_prices").fetchall() == [(1,)]
    assert con.execute("SELECT bool_and(priced) AND sum(cost_usd) > 0 FROM run_costs").fetchall() == [(True,)]
    con.close()
    assert not any(p.name.startswith(".ledger.duckdb.rebuild") for p in tmp_path.iterdir())


async def test_poison_messages_are_quarantined_and_every_valid_event_projected(
    client: LedgerClient, tmp_path: Path
) -> None:
    good = await manual_run(client, "good-1")
    subject = good.subject
    valid = json.loads((await client.js.get_msg(LEDGER_STREAM, 1)).data)
    unknown_version = {**valid, "schema_version": 99}
    wrong_schema = {**valid, "payload": {"agent": ["not", "a", "string"]}}

    def hashed(body: dict[str, Any]) -> bytes:
        from tests.unit.projections.chains import raw_event

        return raw_event(body)

    garbage = [
        (subject, b"\x00\xff\xfe raw bytes"),
        (subject, b'{"not": "an event"}'),
        (subject, hashed(wrong_schema)),
        ("ledger.effect.0123", hashed(unknown_version)),
        (subject, json.dumps({**valid, "agent": "forged"}).encode()),  # the hash no longer matches
    ]

    async def publish(target: str, data: bytes) -> None:
        ack = await client.js.publish(target, data)
        if target == subject:
            good.last_stream_seq = ack.seq  # garbage moves the subject's last sequence: the writer fences on it

    for target, data in garbage[:3]:
        await publish(target, data)
    await good.append(RunCompleted(output={"between": "garbage"}))  # a valid event in the middle of garbage
    for target, data in garbage[3:]:
        await publish(target, data)
    other = await manual_run(client, "good-2")
    await other.append(RunCompleted(output=None))
    total = await stream_messages(client)
    db = tmp_path / "ledger.duckdb"
    result = await project(client, db, batch_size=2)
    assert (result.events, result.quarantined) == (total - 5, 5)
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT subject, error, reason, raw FROM quarantine ORDER BY stream_seq").fetchall()
    assert [r[3] for r in rows] == [data for _, data in garbage]
    assert [r[1] for r in rows] == ["EventDecodeError"] * 3 + ["UnknownSchemaVersionError", "EventDecodeError"]
    assert "not JSON" in rows[0][2] and "envelope" in rows[1][2] and "payload" in rows[2][2]
    assert "hash does not match" in rows[4][2]
    assert con.execute("SELECT count(*) FROM events").fetchall() == [(total - 5,)]
    # Bytes on good-1's own subject that are not a valid event mark it broken from there (as every reader
    # sees it: docs/wire.md); its later run.completed is an event of the table, not of its state.
    assert con.execute("SELECT run_id, status, events FROM runs ORDER BY run_id").fetchall() == [
        ("good-1", "broken", 1),
        ("good-2", "completed", 2),
    ]
    con.close()
    # good-1 is broken: resume refuses it (a ChainError naming the bad message), so only good-2 has a resume fold.
    await assert_checkpoints_equal_resume_fold(client, db, ["good-2"])
    listed = runledger(client.url, "quarantine", "--db", str(db), "--json")
    assert listed.returncode == 0, listed.stderr
    assert [q["error"] for q in json.loads(listed.stdout)][3] == "UnknownSchemaVersionError"


async def test_a_file_of_another_stream_is_refused(client: LedgerClient, tmp_path: Path) -> None:
    await publish_raw(client, workload(200))
    db = tmp_path / "ledger.duckdb"
    await project(client, db)
    other = EmbeddedServer(home=tmp_path / "other-home")
    state = other.start(data_dir=tmp_path / "other-data")
    try:
        second = await connect(state.url)
        try:
            await publish_raw(second, workload(100))
            with pytest.raises(StreamMismatchError, match="different history"):
                await project(second, db)
            cli = runledger(state.url, "project", "--db", str(db))
            assert cli.returncode == 4 and "--rebuild" in cli.stderr  # Exit.ERROR
            rebuilt = runledger(state.url, "project", "--db", str(db), "--rebuild", "--quiet")
            assert rebuilt.returncode == 0, rebuilt.stderr
            assert (await project(second, db)).position == await stream_messages(second)
        finally:
            await second.close()
    finally:
        other.stop()


async def test_the_ordered_consumer_reader_projects_the_same(client: LedgerClient, tmp_path: Path) -> None:
    await build_ledger(client, tmp_path, load_events=3000)
    await project(client, tmp_path / "pull.duckdb", reader="pull", batch_size=1000)
    await project(client, tmp_path / "ordered.duckdb", reader="ordered", batch_size=1000)
    assert snapshot(tmp_path / "pull.duckdb") == snapshot(tmp_path / "ordered.duckdb")


async def test_follow_keeps_up_and_stops_cleanly_on_sigterm(client: LedgerClient, tmp_path: Path) -> None:
    db = tmp_path / "ledger.duckdb"
    await publish_raw(client, workload(1000))
    follower = subprocess.Popen(
        [sys.executable, "-m", "runledger", "project", "--follow", "--db", str(db), "--batch", "500"],
        cwd=ROOT, env={**os.environ, "RUNLEDGER_NATS_URL": client.url},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []

    def read_progress() -> None:
        assert follower.stderr is not None
        for line in follower.stderr:  # not a terminal: a progress line every few seconds
            lines.append(line)

    reader = threading.Thread(target=read_progress, daemon=True)
    reader.start()
    try:
        await publish_raw(client, workload(2000, start=5000))
        total = await stream_messages(client)
        # The follower holds the file, so its own progress line says how far it has committed.
        await eventually(lambda: any(f"position {total:,}, lag 0" in line for line in lines), timeout=60)
        follower.send_signal(signal.SIGTERM)
        await asyncio.to_thread(follower.wait, 60)
        reader.join(10)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, "".join(lines)
    assert f"position {total:,} of" in lines[-1]
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), max(stream_seq) FROM events").fetchall() == [(total, total)]
    con.close()


async def test_worker_processes_fold_the_same_and_exit(
    client: LedgerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import runledger.projections.projector as projector_module

    monkeypatch.setattr(projector_module, "WORKERS_FROM", 1)  # use the workers for a small backlog too
    runs = await build_ledger(client, tmp_path, load_events=4000)
    await project(client, tmp_path / "here.duckdb", workers=0, batch_size=900)
    await project(client, tmp_path / "workers.duckdb", workers=3, batch_size=900)
    assert snapshot(tmp_path / "here.duckdb") == snapshot(tmp_path / "workers.duckdb")
    await publish_raw(client, workload(2000, start=50_000))
    await project(client, tmp_path / "workers.duckdb", workers=2, batch_size=700)  # reloads state into workers
    await project(client, tmp_path / "here.duckdb", workers=0, batch_size=700)
    assert snapshot(tmp_path / "here.duckdb") == snapshot(tmp_path / "workers.duckdb")
    await assert_checkpoints_equal_resume_fold(client, tmp_path / "workers.duckdb", list(runs.values()))
    assert worker_processes() == []


def worker_processes() -> list[int]:
    """Pids of live projection workers (any left behind would show up here)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                status = (entry / "stat").read_text().split(")")[-1].split()[0]
            except OSError:
                continue
            if b"_worker_main" in cmdline and status != "Z":
                pids.append(int(entry.name))
    return pids


async def test_export_writes_partitioned_parquet_that_reads_back(client: LedgerClient, tmp_path: Path) -> None:
    await build_ledger(client, tmp_path, load_events=1500)
    db, lake = tmp_path / "ledger.duckdb", tmp_path / "lake"
    for _ in range(2):  # a second export replaces the first
        out = runledger(client.url, "export", "--parquet", str(lake), "--db", str(db))
        assert out.returncode == 0, out.stderr
    agents = sorted(p.name for p in (lake / "events").iterdir())
    assert "agent=refund-agent" in agents and "agent=agent-0" in agents
    assert all(p.name.startswith("date=") for p in (lake / "events" / "agent=refund-agent").iterdir())
    con = duckdb.connect(str(db), read_only=True)
    for table in ("events", "runs", "steps", "effects", "approvals", "checkpoints", "effect_keys", "quarantine"):
        expected = con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
        got = duckdb.sql(
            f"SELECT count(*) FROM read_parquet('{lake / table}/**/*.parquet', hive_partitioning = true)"
        ).fetchall()[0][0]
        assert got == expected, table
    con.close()


async def test_follow_survives_a_server_restart(tmp_path: Path) -> None:
    server = EmbeddedServer(home=tmp_path / "home")
    state = server.start(data_dir=tmp_path / "data")
    db = tmp_path / "ledger.duckdb"
    follower: subprocess.Popen[str] | None = None
    try:
        client = await connect(state.url)
        await publish_raw(client, workload(500))
        follower = subprocess.Popen(
            [sys.executable, "-m", "runledger", "project", "--follow", "--db", str(db)],
            cwd=ROOT, env={**os.environ, "RUNLEDGER_NATS_URL": state.url},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(follower.stderr or []), daemon=True).start()
        first = await stream_messages(client)
        await eventually(lambda: any(f"position {first:,}, lag 0" in line for line in lines), timeout=60)
        await client.close()
        server.stop()
        state = server.start(data_dir=tmp_path / "data", port=state.port)  # same store, same stream
        client = await connect(state.url)
        await publish_raw(client, workload(700, start=9000))
        total = await stream_messages(client)
        await eventually(lambda: any(f"position {total:,}, lag 0" in line for line in lines), timeout=90)
        await client.close()
        follower.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(follower.wait, 60) == 0, "".join(lines)
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait()
        server.stop()
    assert any("following again" in line for line in lines)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*), max(stream_seq) FROM events").fetchall() == [(total, total)]
    con.close()


async def test_an_analyst_role_projects_with_the_fast_reader(tmp_path: Path) -> None:
    """On a server started with --secure: the analyst's login and inbox prefix, read-only."""
    server = EmbeddedServer(home=tmp_path / "home")
    state = server.start(data_dir=tmp_path / "data", auth=secure(["alpha"]))
    try:
        admin = await connect(state.url, user_credentials=str(Path(state.creds_dir) / "admin.json"))
        await publish_raw(admin, workload(1500))
        total = await stream_messages(admin)
        await admin.close()
        analyst = await connect(state.url, user_credentials=str(Path(state.creds_dir) / "analyst.json"))
        try:
            fast = await project(analyst, tmp_path / "fast.duckdb")
            slow = await project(analyst, tmp_path / "slow.duckdb", reader="ordered")
        finally:
            await analyst.close()
    finally:
        server.stop()
    assert (fast.reader, fast.events, slow.reader, slow.events) == ("pull", total, "ordered", total)
    assert snapshot(tmp_path / "fast.duckdb") == snapshot(tmp_path / "slow.duckdb")
    assert "Permissions Violation" not in Path(state.log).read_text(errors="replace")
