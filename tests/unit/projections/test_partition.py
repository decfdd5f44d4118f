"""Decoding and folding batches: derived rows equal the shared folds, however the stream is cut."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from runledger.errors import EventDecodeError
from runledger.log.reader import decode_records
from runledger.projections.errors import ProjectionError
from runledger.projections.store import ProjectionStore
from runledger.record.canonical import digest
from runledger.record.events import (
    EffectCommitted,
    EffectFailed,
    EffectIntended,
    EffectResolved,
    EffectSimulated,
    ErrorInfo,
    RunStarted,
    ToolListing,
    decode,
)
from runledger.record.fold import fold
from runledger.record.records import Recorded
from runledger.sdk.effects import fold_key
from tests.unit.projections.chains import (
    VERSION,
    Stream,
    approval_run,
    failed_run,
    forked_run,
    full_run,
    key_chain,
    model,
    run_chain,
    tool,
)
from tests.unit.projections.conftest import IDENTITY, projector_for
from tests.unit.projections.tables import DERIVED, table_rows


def _workload() -> Stream:
    """Interleaved runs of every shape, published to one stream."""
    stream = Stream()
    rng = random.Random(4)
    builders = [
        lambda i: full_run(stream, f"full-{i}"),
        lambda i: approval_run(stream, f"appr-{i}", resolve=i % 2 == 0, approved=i % 4 == 0),
        lambda i: failed_run(stream, f"fail-{i}"),
        lambda i: forked_run(stream, f"fork-{i}", f"full-{i}"),
    ]
    for i in range(12):
        rng.choice(builders)(i)
    # A long run interleaved with the others' tails, its tools declared from a listing it records.
    long = run_chain(stream, "long")
    listed = {"tools": [{"name": "lookup", "inputSchema": {"type": "object"}}]}
    long.add(RunStarted(agent="support", version=VERSION, tool_listings=[ToolListing(source="mcp", listing=listed)]))
    for step in range(30):
        long.add(model(step) if step % 2 == 0 else tool(step, output={"i": step}))
        if step % 10 == 0:
            full_run(stream, f"between-{step}")
    return stream


def _project(
    path: Path, records: list, sizes: list[int], cache_limit: int = 20_000, *, bulk: bool = False
) -> ProjectionStore:
    store = ProjectionStore(path, bulk=bulk)
    store.bind(IDENTITY, 1)
    projector = projector_for(store, cache_limit=cache_limit)
    at = 0
    for size in sizes:
        if at >= len(records):
            break
        projector.project_batch(records[at : at + size])
        at += size
    if at < len(records):
        projector.project_batch(records[at:])
    return store


def _by_run(records: list) -> dict[str, list[Recorded]]:
    """What resume folds for each run: the run subject's records that decode (``load_run``).

    ``decode_records`` itself would stop at a message whose ``decode`` raises something other
    than EventDecodeError (a NaN in a payload raises ValueError): those are left out first.
    """
    good, _bad = decode_records([r for r in records if _decodes_or_says_why(r.data)])
    out: dict[str, list[Recorded]] = {}
    for rec in good:
        if rec.subject.startswith("ledger.run."):
            out.setdefault(rec.subject.split(".")[3], []).append(rec)
    return out


def test_checkpoints_equal_the_fold_of_each_run(tmp_path: Path) -> None:
    records = _workload().records
    store = _project(tmp_path / "a.duckdb", records, [len(records)])
    rows = {r[0]: json.loads(r[1]) for r in store.con.execute("SELECT run_id, checkpoint FROM checkpoints").fetchall()}
    runs = _by_run(records)
    assert set(rows) == set(runs)
    for run_id, recs in runs.items():
        assert rows[run_id] == fold(recs).to_dict(), run_id
    assert rows["long"]["tool_listings"][0]["source"] == "mcp"  # carried into the projection's checkpoint
    steps = store.con.execute("SELECT run_id, step, kind, status, seq FROM steps ORDER BY ALL").fetchall()
    expected = sorted(
        (run_id, s.step, s.kind, s.status, s.seq) for run_id, recs in runs.items() for s in fold(recs).steps.values()
    )
    assert steps == expected
    store.close()


def test_effect_keys_equal_the_key_fold(tmp_path: Path) -> None:
    records = _workload().records
    store = _project(tmp_path / "a.duckdb", records, [len(records)])
    by_subject: dict[str, list[Recorded]] = {}
    for rec in records:
        if rec.subject.startswith("ledger.effect."):  # a key's messages, whoever wrote them (its writer token)
            key_subject = rec.subject.rpartition(".")[0]
            by_subject.setdefault(key_subject, []).append(Recorded(decode(rec.data), rec.stream_seq, rec.subject))
    rows = store.con.execute(
        "SELECT subject, key, status, run_id, step, result, via, events FROM effect_keys"
    ).fetchall()
    assert len(rows) == len(by_subject) > 0
    for subject, key, status, run_id, step, result, via, events in rows:
        state = fold_key(key, by_subject[subject])
        assert (status, run_id, step, json.loads(result), via, events) == (
            state.status, state.run_id, state.step, state.result, state.via, state.next_seq,
        )  # fmt: skip
    store.close()


def _decodes_or_says_why(data: bytes) -> bool:
    try:
        decode(data)
    except EventDecodeError:
        return True
    except Exception:
        return False
    return True


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_any_batching_and_cache_size_gives_the_same_tables(tmp_path: Path, seed: int) -> None:
    records = _workload().records
    whole = _project(tmp_path / "whole.duckdb", records, [len(records)])
    rng = random.Random(seed)
    sizes = [rng.randint(1, 25) for _ in range(len(records))]
    # A cache of 3 runs/keys forces most runs to be reloaded from the checkpoints table.
    pieces = _project(tmp_path / "pieces.duckdb", records, sizes, cache_limit=3)
    for table in DERIVED:
        assert table_rows(pieces.con, table) == table_rows(whole.con, table), table
    assert pieces.state().last_seq == whole.state().last_seq == len(records)  # type: ignore[union-attr]
    whole.close()
    pieces.close()


def _schema(con: Any) -> dict[str, list[tuple[Any, ...]]]:
    return {
        "columns": sorted(con.execute(
            "SELECT table_name, column_index, column_name, data_type, is_nullable, column_default "
            "FROM duckdb_columns() WHERE schema_name = 'main'"
        ).fetchall()),
        "constraints": sorted(con.execute(
            "SELECT table_name, constraint_type, constraint_column_names FROM duckdb_constraints() "
            "WHERE schema_name = 'main'"
        ).fetchall()),
        "views": sorted(con.execute("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall()),
    }  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2])
def test_a_bulk_file_with_its_keys_added_equals_an_upserted_one(tmp_path: Path, seed: int) -> None:
    """A rebuild's file fills its keyed tables without primary keys (each batch replacing its own
    rows): in small batches, with runs reloaded from those tables, it ends equal to an upserted
    file, row for row, and once its keys are added its schema is the migrated one."""
    records = _workload().records
    rng = random.Random(seed)
    sizes = [rng.randint(1, 25) for _ in range(len(records))]
    upserted = _project(tmp_path / "upserted.duckdb", records, sizes, cache_limit=3)
    bulk = _project(tmp_path / "bulk.duckdb", records, sizes, cache_limit=3, bulk=True)
    assert not bulk.con.execute("SELECT * FROM duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY' "
                                "AND table_name IN ('runs', 'steps')").fetchall()  # fmt: skip
    bulk.add_keys()
    for table in DERIVED:
        assert table_rows(bulk.con, table) == table_rows(upserted.con, table), table
    assert _schema(bulk.con) == _schema(upserted.con)
    upserted.close()
    bulk.close()


def test_add_keys_refuses_rows_that_are_not_unique(tmp_path: Path) -> None:
    stream = Stream()
    full_run(stream, "r1")
    store = _project(tmp_path / "bulk.duckdb", stream.records, [len(stream.records)], bulk=True)
    store.con.execute("INSERT INTO checkpoints SELECT * FROM checkpoints")
    with pytest.raises(ProjectionError, match="not unique"):
        store.add_keys()
    assert store.con.execute("SELECT count(*) FROM checkpoints").fetchall() == [(2,)]
    store.close()
    with pytest.raises(ProjectionError, match="bulk load needs a new file"):
        ProjectionStore(tmp_path / "bulk.duckdb", bulk=True)


def test_poison_is_quarantined_and_the_rest_projected(tmp_path: Path) -> None:
    stream = Stream()
    good = full_run(stream, "good-1")
    subject = good.subject
    stream.put(subject, b"\xff\xfe not even utf-8")
    stream.put(subject, b"[1, 2, 3]")
    stream.put(subject, b'{"hello": "world"}')
    event = json.loads(stream.records[0].data)
    wrong = {**event, "payload": {"agent": 5}}  # valid envelope, payload of the wrong shape
    from tests.unit.projections.chains import raw_event

    stream.put(subject, raw_event(wrong))
    future = {**event, "schema_version": 99}
    stream.put(subject, raw_event(future))
    tampered = {**event, "run_id": "someone-else"}  # hash no longer matches
    stream.put(subject, json.dumps(tampered).encode())
    middle = full_run(stream, "good-2")  # a valid run after the garbage
    stream.put(subject, b"")
    # NaN parses but has no canonical JSON: ledger's decode refuses it like any other poison.
    stream.put(subject, stream.records[0].data.replace(b'"input":{', b'"input":{"x":NaN,'))
    records = stream.records
    store = _project(tmp_path / "q.duckdb", records, [5, 5, 5, 100])
    reasons = store.con.execute("SELECT stream_seq, error, reason FROM quarantine ORDER BY stream_seq").fetchall()
    assert [r[0] for r in reasons] == [9, 10, 11, 12, 13, 14, 23, 24]
    assert "not JSON" in reasons[0][2]
    assert "not a JSON object" in reasons[1][2]
    assert "envelope" in reasons[2][2]
    assert "invalid run.started payload" in reasons[3][2]
    assert reasons[4][1] == "UnknownSchemaVersionError" and "99" in reasons[4][2]
    assert "hash does not match" in reasons[5][2]
    assert reasons[7][1] == "EventDecodeError" and "not canonical JSON" in reasons[7][2]
    raw = store.con.execute("SELECT raw FROM quarantine WHERE stream_seq = 9").fetchall()[0][0]
    assert raw == b"\xff\xfe not even utf-8"
    assert store.con.execute("SELECT count(*) FROM events").fetchall()[0][0] == len(records) - 8
    checkpoints = dict(store.con.execute("SELECT run_id, checkpoint FROM checkpoints").fetchall())
    runs = _by_run(records)
    assert json.loads(checkpoints["good-2"]) == fold(runs["good-2"]).to_dict()
    assert json.loads(checkpoints["good-1"]) == fold(runs["good-1"]).to_dict()
    assert [r.event for r in runs["good-1"]] == good.events and [r.event for r in runs["good-2"]] == middle.events
    state = store.state()
    assert state is not None and (state.events, state.quarantined, state.last_seq) == (16, 8, 24)
    store.close()


def test_a_broken_chain_freezes_the_checkpoint_where_the_fold_stops(tmp_path: Path) -> None:
    stream = Stream()
    run = run_chain(stream, "r1")
    run.add(RunStarted(agent="support", version=VERSION))
    run.add(model(0))
    run.events.pop()  # the next event links to the first again: a fork in the chain
    run.add(model(1))
    run.add(model(2))
    store = _project(tmp_path / "c.duckdb", stream.records, [2, 2])
    error, text = store.con.execute("SELECT fold_error, checkpoint FROM checkpoints").fetchall()[0]
    assert "expected seq 2" in error
    first_two = [Recorded(decode(r.data), r.stream_seq, r.subject) for r in stream.records[:2]]
    assert json.loads(text) == fold(first_two).to_dict()
    assert store.con.execute("SELECT fold_error IS NOT NULL FROM runs").fetchall() == [(True,)]
    assert store.con.execute("SELECT count(*) FROM events").fetchall()[0][0] == 4  # still all in events
    store.close()


def test_a_timestamp_that_is_not_rfc3339_is_quarantined(tmp_path: Path) -> None:
    stream = Stream()
    run = run_chain(stream, "r1")
    run.add(RunStarted(agent="support", version=VERSION), ts="yesterday")
    store = _project(tmp_path / "t.duckdb", stream.records, [10])
    assert store.con.execute("SELECT count(*) FROM events").fetchall() == [(0,)]
    (reason,) = store.con.execute("SELECT reason FROM quarantine").fetchall()[0]
    assert "ts" in reason
    store.close()


def test_effects_view_states(tmp_path: Path) -> None:
    stream = Stream()
    full_run(stream, "act", key="refund:o1")  # committed by acting
    reuse = run_chain(stream, "reuse")  # the same key, served from the record
    reuse.add(RunStarted(agent="support", version=VERSION))
    args = {"o": "act"}
    reuse.add(EffectIntended(step=0, name="refund", key="refund:o1", args=args, args_digest=digest(args)))
    reuse.add(EffectCommitted(step=0, key="refund:o1", result={"refund_id": "act"}, via="record"))
    doubt = run_chain(stream, "doubt")  # claimed, then the process died
    doubt.add(RunStarted(agent="support", version=VERSION))
    claim = EffectIntended(step=0, name="charge", key="charge:1", args={}, args_digest=digest({}))
    doubt.add(claim)
    key_chain(stream, "charge:1", "doubt").add(claim)
    early = run_chain(stream, "early")  # died before claiming
    early.add(RunStarted(agent="support", version=VERSION))
    early.add(EffectIntended(step=0, name="charge", key="charge:2", args={}, args_digest=digest({})))
    failing = run_chain(stream, "failing")
    failing.add(RunStarted(agent="support", version=VERSION))
    claim3 = EffectIntended(step=0, name="charge", key="charge:3", args={}, args_digest=digest({}))
    failing.add(claim3)
    k3 = key_chain(stream, "charge:3", "failing")
    k3.add(claim3)
    err = ErrorInfo(type="ValueError", message="card declined")
    k3.add(EffectFailed(step=0, key="charge:3", error=err))
    failing.add(EffectFailed(step=0, key="charge:3", error=err))
    resolved = run_chain(stream, "resolved")  # in doubt, then an operator said it happened
    resolved.add(RunStarted(agent="support", version=VERSION))
    claim4 = EffectIntended(step=0, name="charge", key="charge:4", args={}, args_digest=digest({}))
    resolved.add(claim4)
    k4 = key_chain(stream, "charge:4", "resolved")
    k4.add(claim4)
    k4.add(EffectResolved(key="charge:4", outcome="committed", by="ana", result={"ok": True}))
    branch = run_chain(stream, "branch")
    branch.add(RunStarted(agent="support", version=VERSION))
    branch.add(EffectSimulated(step=0, name="charge", key="charge:5", args={}, result={"simulated": True}))
    store = _project(tmp_path / "e.duckdb", stream.records, [7, 7, 7, 7, 7, 7])
    got = store.con.execute("SELECT run_id, key, state, via FROM effects ORDER BY run_id").fetchall()
    assert got == [
        ("act", "refund:o1", "committed", "act"),
        ("branch", "charge:5", "simulated", None),
        ("doubt", "charge:1", "in_doubt", None),
        ("early", "charge:2", "intended", None),
        ("failing", "charge:3", "failed", None),
        ("resolved", "charge:4", "committed", "ana"),
        ("reuse", "refund:o1", "committed", "record"),
    ]
    assert store.con.execute("SELECT key, run_id FROM effects_in_doubt").fetchall() == [("charge:1", "doubt")]
    store.close()


def test_approvals_view(tmp_path: Path) -> None:
    stream = Stream()
    approval_run(stream, "waiting", resolve=False)
    approval_run(stream, "yes", resolve=True, approved=True)
    approval_run(stream, "no", resolve=True, approved=False)
    store = _project(tmp_path / "ap.duckdb", stream.records, [3, 100])
    rows = store.con.execute(
        "SELECT run_id, request_id, status, args->>'amount', decided_by, decided_at IS NOT NULL FROM approvals "
        "ORDER BY run_id"
    ).fetchall()
    assert rows == [
        ("no", "q-no", "denied", "950", "ana", True),
        ("waiting", "q-waiting", "pending", "950", None, False),
        ("yes", "q-yes", "approved", "950", "ana", True),
    ]
    assert store.con.execute("SELECT run_id FROM pending_approvals").fetchall() == [("waiting",)]
    store.close()
