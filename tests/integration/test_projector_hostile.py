"""A hostile writer against the projector (issue "Trust boundaries", item 7), on a real nats-server.

A third-party writer that computes valid hashes publishes, among valid runs, an event whose step
is the string ``"0"``, one whose step is ``10**30``, and one whose budget DuckDB's BIGINT cannot
take as stored (``"turns": "3.0"``: lax validation read it as 3, the payload kept the string; the
projector of before crashed on it in ``int()``, as it crashed on ``"step": "0"`` in Arrow, and every
later ``project`` and ``sql`` failed with it, since the stream forbids deletion). Each must be
quarantined with its reason, ``project`` and ``sql`` must keep working on later batches, no valid
event may be skipped (every stream sequence is a row of ``events`` or of ``quarantine``), and
``runledger runs``, ``show`` and the ``runs`` table must agree on the status of the runs whose
record is now broken.

The strict decoder refuses the three at decoding. The row path is tested too, with the lax
decoder of before put back (and, separately, with DuckDB refusing a value at commit): what decodes
but cannot become a row is quarantined with the reason, and the batch goes on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from bench.project import publish_raw, workload
from runledger.errors import EventDecodeError
from runledger.log.client import LedgerClient
from runledger.log.subjects import run_subject
from runledger.projections import partition, rows
from runledger.projections.projector import project
from runledger.record.canonical import canonical_json
from runledger.record.events import GENESIS, Event, _hash_matches, utc_now
from runledger.record.events import RunCompleted as _RunCompleted
from runledger.record.ids import new_id
from tests.integration.test_projector import MANUAL_VERSION, manual_run, runledger, stream_messages
from tests.unit.projections.chains import raw_event

pytestmark = pytest.mark.integration

VERSION = MANUAL_VERSION.model_dump()


class HostileWriter:
    """Appends arbitrary payloads to a run's subject, correctly chained and hashed."""

    def __init__(self, client: LedgerClient, run_id: str, agent: str = "intruder") -> None:
        self.client, self.run_id, self.agent = client, run_id, agent
        self.subject = run_subject(agent, run_id)
        self.seq, self.prev = 0, GENESIS

    async def append(self, type_: str, payload: dict[str, Any]) -> int:
        """Publish the next event of the chain; returns its stream sequence."""
        body = {"id": new_id(), "run_id": self.run_id, "agent": self.agent, "seq": self.seq, "type": type_,
                "schema_version": 1, "ts": utc_now(), "payload": payload, "prev_hash": self.prev}  # fmt: skip
        data = raw_event(body)
        ack = await self.client.js.publish(self.subject, data)
        self.seq, self.prev = self.seq + 1, json.loads(data)["hash"]
        return int(ack.seq)

    async def start(self, **payload: Any) -> int:
        return await self.append("run.started", {"agent": self.agent, "version": VERSION, **payload})


def tool(step: Any) -> dict[str, Any]:
    return {"step": step, "name": "lookup", "args": {"q": 1}, "args_digest": "d", "output": {"ok": True}}


def model(step: Any) -> dict[str, Any]:
    return {"step": step, "model": "m", "request": {"messages": []}, "args_digest": "d", "response": {"content": "x"}}


async def publish_hostile_runs(client: LedgerClient) -> dict[str, int]:
    """Three runs, each with one hostile event between valid ones; returns run id -> its stream sequence."""
    hostile: dict[str, int] = {}
    a = HostileWriter(client, "hostile-string-step")
    await a.start()
    hostile[a.run_id] = await a.append("tool.called", tool("0"))
    await a.append("run.completed", {"output": "after the string step"})
    await publish_raw(client, workload(150, start=10_000))
    b = HostileWriter(client, "hostile-huge-step")
    await b.start()
    await b.append("tool.called", tool(0))
    hostile[b.run_id] = await b.append("model.called", model(10**30))
    await b.append("run.completed", {"output": None})
    c = HostileWriter(client, "hostile-budget")
    hostile[c.run_id] = await c.start(budgets={"turns": "3.0"})
    await c.append("tool.called", tool(0))
    await c.append("run.completed", {"output": 1})
    return hostile


REFUSE = {"refuse": "me"}


async def publish_refused_runs(client: LedgerClient) -> dict[str, int]:
    """Three runs of valid events, one of each marked (``REFUSE``) for DuckDB to refuse at commit."""
    refused: dict[str, int] = {}
    a = HostileWriter(client, "refused-middle")
    await a.start()
    refused[a.run_id] = await a.append("tool.called", {**tool(0), "args": REFUSE})
    await a.append("run.completed", {"output": "after"})
    await publish_raw(client, workload(150, start=10_000))
    b = HostileWriter(client, "refused-first")
    refused[b.run_id] = await b.start(input=REFUSE)
    await b.append("tool.called", tool(0))
    await b.append("run.completed", {"output": None})
    c = HostileWriter(client, "refused-last")
    await c.start()
    await c.append("tool.called", tool(0))
    refused[c.run_id] = await c.append("run.completed", {"output": REFUSE})
    return refused


def every_sequence(db: Path) -> tuple[list[int], list[int]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        events = [r[0] for r in con.execute("SELECT stream_seq FROM events ORDER BY 1").fetchall()]
        quarantined = [r[0] for r in con.execute("SELECT stream_seq FROM quarantine ORDER BY 1").fetchall()]
    finally:
        con.close()
    return events, quarantined


def query(db: Path, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


async def test_hostile_values_are_quarantined_and_project_and_sql_keep_working(
    client: LedgerClient, tmp_path: Path
) -> None:
    await publish_raw(client, workload(200))
    good = await manual_run(client, "good-1")
    hostile = await publish_hostile_runs(client)
    await good.append(_RunCompleted(output={"after": "the hostile runs"}))
    total = await stream_messages(client)
    db = tmp_path / "ledger.duckdb"

    # Small batches: each hostile event sits in a batch with valid ones (and the pipeline has
    # several batches in flight around it).
    result = await project(client, db, batch_size=64, workers=0)
    assert (result.events, result.quarantined, result.position) == (total - 3, 3, total)
    events, quarantined = every_sequence(db)
    assert quarantined == sorted(hostile.values())
    assert sorted(events + quarantined) == list(range(1, total + 1))  # no valid event skipped
    reasons = dict(query(db, "SELECT stream_seq, reason FROM quarantine"))
    assert "tool.called payload: step: Input should be a valid integer" in reasons[hostile["hostile-string-step"]]
    assert "step: an integer of 31 digits, beyond 64 bits" in reasons[hostile["hostile-huge-step"]]
    assert "run.started payload: budgets.turns: Input should be a valid integer" in reasons[hostile["hostile-budget"]]
    assert {e for (e,) in query(db, "SELECT DISTINCT error FROM quarantine")} == {"EventDecodeError"}

    # Each hostile run lost an event: its record is broken where its own subject holds what is not a
    # valid event (before the gap it leaves), or, when that was its run.started, at the gap; every
    # reader says so.
    table = {r[0]: (r[1], r[2]) for r in query(db, "SELECT run_id, status, fold_error FROM runs")}
    for run_id, seq in hostile.items():
        status, fold_error = table[run_id]
        if run_id == "hostile-budget":
            assert status == "broken" and "expected seq 0: gap or reorder" in fold_error, fold_error
            continue
        assert (status, fold_error) == (
            "broken",
            f"run {run_id}: stream sequence {seq} on its own subject is not a valid event (quarantined)",
        )
    assert table["good-1"] == ("completed", None)
    assert query(db, "SELECT count(*) FROM runs WHERE status = 'broken'") == [(3,)]
    listed = runledger(client.url, "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    by_id = {r["run_id"]: r for r in json.loads(listed.stdout)}
    assert {run_id: (r["status"], r["fold_error"]) for run_id, r in by_id.items()} == table
    text = runledger(client.url, "runs")
    assert "hostile-string-step" in text.stdout and "broken" in text.stdout and "not a valid event" in text.stdout
    for run_id in hostile:
        shown = runledger(client.url, "show", run_id, "--json")
        assert shown.returncode == 0, shown.stderr
        assert (json.loads(shown.stdout)["status"], json.loads(shown.stdout)["fold_error"]) == table[run_id]
    shown = runledger(client.url, "show", "hostile-string-step")
    assert "status broken" in shown.stdout and "BROKEN" in shown.stdout and "QUARANTINED" in shown.stdout
    verified = runledger(client.url, "verify", "hostile-string-step")
    assert verified.returncode == 1 and "step: Input should be a valid integer" in verified.stdout

    # Later batches: more valid events and another hostile one; project and sql go on.
    again = HostileWriter(client, "hostile-later")
    await again.start()
    later = await again.append("clock.read", {"step": True, "value": "2026-01-01T00:00:00Z"})
    await publish_raw(client, workload(100, start=20_000))
    total = await stream_messages(client)
    cli = runledger(client.url, "project", "--db", str(db), "--batch", "50", "--quiet")
    assert cli.returncode == 0, cli.stderr
    both = "SELECT (SELECT count(*) FROM events) AS events, (SELECT count(*) FROM quarantine) AS q"
    counted = runledger(client.url, "sql", "--db", str(db), "--format", "json", both)
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout) == [{"events": total - 4, "q": 4}]
    events, quarantined = every_sequence(db)
    assert quarantined == sorted([*hostile.values(), later])
    assert sorted(events + quarantined) == list(range(1, total + 1))
    assert query(db, "SELECT last_seq, events, quarantined FROM projector_state") == [(total, total - 4, 4)]


# -- the row path: what decodes but cannot become a row ----------------------------------------------


def lax_decode(raw: bytes) -> Event:
    """The decoder of before: lax validation, which reads "0" as 0 and "3.0" as 3 but keeps the
    payload as stored; here it stands for any hole in decoding that lets such a value through."""
    try:
        event = Event.model_validate_json(raw)
        event.body  # noqa: B018 - validates (lax)
    except ValueError as exc:
        raise EventDecodeError(f"invalid: {exc}", raw) from exc
    if not _hash_matches(raw, event):
        raise EventDecodeError("hash does not match", raw)
    return event


def malformed_payload(real: Any) -> Any:
    """``add_event`` writing payload text DuckDB refuses (malformed JSON) for events marked ``REFUSE``."""

    def add_event(buf: rows.TableBuffer, rec: Any, ev: Event) -> None:
        real(buf, rec, ev)
        if REFUSE in ev.payload.values():
            row = list(buf.rows[-1])
            row[10] = '{"not": json'  # the payload column
            buf.rows[-1] = tuple(row)

    return add_event


@pytest.mark.parametrize("hole", ["rows", "duckdb"])
async def test_what_decodes_but_cannot_become_a_row_is_quarantined_and_the_batch_goes_on(
    client: LedgerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hole: str
) -> None:
    if hole == "rows":  # Arrow (ArrowInvalid) and Python (ValueError in int()) refuse the values
        monkeypatch.setattr(partition, "decode_record", lax_decode)
    else:  # DuckDB refuses the payload text at commit (ConversionException: malformed JSON)
        monkeypatch.setattr(partition, "add_event", malformed_payload(partition.add_event))
    await publish_raw(client, workload(200))
    if hole == "rows":
        hostile = await publish_hostile_runs(client)
        # The lax decoder reads a step of 10**30 as an integer: a BIGINT cannot hold it, so its
        # columns are NULL (docs/tables.md); the strict decoder refuses it (the test above).
        expected = {k: v for k, v in hostile.items() if k != "hostile-huge-step"}
    else:
        expected = await publish_refused_runs(client)
    await publish_raw(client, workload(120, start=30_000))
    if hole == "duckdb":  # the stream's last message: refused in the last batch's commit
        expected["refused-final"] = await HostileWriter(client, "refused-final").start(input=REFUSE)
    total = await stream_messages(client)
    db = tmp_path / "ledger.duckdb"
    result = await project(client, db, batch_size=64, workers=0)
    assert (result.events, result.quarantined, result.position) == (total - len(expected), len(expected), total)
    events, quarantined = every_sequence(db)
    assert quarantined == sorted(expected.values())
    assert sorted(events + quarantined) == list(range(1, total + 1))  # no valid event skipped
    found = query(db, "SELECT stream_seq, error, reason FROM quarantine ORDER BY stream_seq")
    assert {error for _, error, _ in found} == {"UnprojectableError"}
    reasons = {seq: reason for seq, _, reason in found}
    assert all(reason.startswith("cannot become a row: ") for reason in reasons.values())
    if hole == "rows":
        assert "ArrowInvalid" in reasons[expected["hostile-string-step"]]
        assert "ValueError" in reasons[expected["hostile-budget"]]
    else:
        assert all("ConversionException" in r and "Malformed JSON" in r for r in reasons.values())
    statuses = dict(query(db, "SELECT run_id, status FROM runs"))
    # A run that lost an event on its own subject is broken from there, its last event too (nothing can
    # tell what its writer wrote); one that lost its only event has no row.
    special = {"refused-final": None}
    assert {run_id: statuses.get(run_id) for run_id in expected} == {
        run_id: special.get(run_id, "broken") for run_id in expected
    }
    assert [s for run_id, s in statuses.items() if run_id not in expected and s == "broken"] == []
    # A later project (nothing new) and SQL work.
    assert (await project(client, db, workers=0)).position == total
    assert query(db, "SELECT count(*) FROM events") == [(total - len(expected),)]


def test_the_hostile_events_are_hashed_correctly() -> None:
    """They are refused for their values, not for their hashes: the hash matches what was published."""
    body = {"id": "x", "run_id": "r", "agent": "a", "seq": 0, "type": "tool.called", "schema_version": 1,
            "ts": "2026-01-01T00:00:00Z", "payload": tool("0"), "prev_hash": GENESIS}  # fmt: skip
    raw = raw_event(body)
    assert raw == canonical_json(json.loads(raw))
    assert lax_decode(raw).payload["step"] == "0"
