"""Events that decode but cannot become rows, and runs whose record is broken.

The projector never wedges: a value Arrow, Python or DuckDB refuses while a batch becomes rows
(``UnprojectableError``) sends the batch through the careful path, which quarantines exactly the
events that fail alone and projects every other one, with the same rows as if the refused events
had never decoded. A bug (any other exception) still stops it. A run whose record is broken is
``broken`` in ``runs`` and ``checkpoints``, with the error ``fold_until_refused`` gives, which is
what ``runledger runs`` and ``show`` print.
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from runledger.errors import EventDecodeError
from runledger.log.reader import RunLog, decode_records
from runledger.ops.trace import record_status, render_run
from runledger.projections import partition, rows
from runledger.projections.errors import UnprojectableError
from runledger.projections.partition import PartitionProjector
from runledger.projections.workers import PartitionWork, ProcessPartitions, _worker_main
from runledger.record.events import Event, RunCompleted, RunStarted, _hash_matches, decode
from runledger.record.fold import BROKEN, fold, fold_until_refused
from runledger.record.records import RawRecord, Recorded
from tests.unit.projections.chains import VERSION, Chain, Stream, full_run, model, raw_event, run_chain, tool
from tests.unit.projections.tables import DERIVED, table_rows
from tests.unit.projections.test_partition import _by_run, _project

REFUSE = {"refuse": "me"}


def lax_decode(raw: bytes) -> Event:
    """A decoder that coerces (as runledger's did before strict decoding): it lets "0" through as a step."""
    try:
        event = Event.model_validate_json(raw)
        event.body  # noqa: B018 - lax validation
    except ValueError as exc:
        raise EventDecodeError(f"invalid: {exc}", raw) from exc
    if not _hash_matches(raw, event):
        raise EventDecodeError("hash does not match", raw)
    return event


def append_raw(stream: Stream, chain: Chain, type_: str, payload: dict[str, Any]) -> int:
    """A hostile writer's event at the chain's next position, correctly hashed; its stream sequence."""
    body = {"id": f"h{len(stream.records)}", "run_id": chain.run_id, "agent": chain.agent, "seq": len(chain.events),
            "type": type_, "schema_version": 1, "ts": "2026-03-01T11:00:00.000000Z", "payload": payload,
            "prev_hash": chain.events[-1].hash if chain.events else "0" * 64}  # fmt: skip
    data = raw_event(body)
    chain.events.append(lax_decode(data))
    return stream.put(chain.subject, data).stream_seq


def hostile_stream(bad: list[tuple[str, dict[str, Any]]]) -> tuple[Stream, list[int]]:
    """Valid runs around runs that each carry one of ``bad`` in the middle of their chain."""
    stream = Stream()
    seqs = []
    for i, (type_, payload) in enumerate(bad):
        full_run(stream, f"before-{i}")
        run = run_chain(stream, f"victim-{i}")
        run.add(RunStarted(agent="support", version=VERSION))
        run.add(model(0))
        seqs.append(append_raw(stream, run, type_, payload))
        full_run(stream, f"between-{i}")
        run.add(tool(2, output={"after": True}))
        run.add(RunCompleted(output="done"))
    full_run(stream, "after")
    return stream, seqs


def without(records: list[RawRecord], seqs: list[int]) -> list[RawRecord]:
    """``records`` with the messages at ``seqs`` replaced by bytes no decoder accepts."""
    return [RawRecord(r.stream_seq, r.subject, b"garbage") if r.stream_seq in seqs else r for r in records]


def assert_as_if_never_decoded(store: Any, reference: Any, seqs: list[int]) -> list[tuple[Any, ...]]:
    """Every table equals the reference projection's (where the same messages did not decode), but
    for why they are quarantined; returns the quarantine rows (stream_seq, error, reason)."""
    for table in DERIVED:
        if table != "quarantine":
            assert table_rows(store.con, table) == table_rows(reference.con, table), table
    found = store.con.execute("SELECT stream_seq, error, reason FROM quarantine ORDER BY stream_seq").fetchall()
    assert [r[0] for r in found] == seqs
    assert {r[1] for r in found} == {"UnprojectableError"}
    assert all(r[2].startswith("cannot become a row: ") for r in found)
    state, expected = store.state(), reference.state()
    assert (state.last_seq, state.events, state.quarantined) == (expected.last_seq, expected.events, len(seqs))
    return found


BAD = [
    ("tool.called", {"step": "1", "name": "t", "args": None, "args_digest": "d"}),  # beside the int step 0
    ("run.resumed", {"attempt": "2.0", "from_step": 1}),  # int("2.0"): ValueError in runs
    ("clock.read", {"step": "1", "value": "2026-01-01T00:00:00Z"}),
]


@pytest.mark.parametrize("sizes", [[10_000], [7, 3, 50], [1] * 200])
def test_a_value_no_column_holds_is_quarantined_and_the_rest_projected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sizes: list[int]
) -> None:
    stream, seqs = hostile_stream(BAD)
    reference = _project(tmp_path / "reference.duckdb", without(stream.records, seqs), sizes)
    monkeypatch.setattr(partition, "decode_record", lax_decode)
    store = _project(tmp_path / "hostile.duckdb", stream.records, sizes)
    found = assert_as_if_never_decoded(store, reference, seqs)
    # A string step beside an integer one cannot be ordered (TypeError); a string attempt is no BIGINT.
    assert "TypeError: '<' not supported" in found[0][2] and "ValueError: invalid literal for int()" in found[1][2]
    statuses = dict(store.con.execute("SELECT run_id, status FROM runs").fetchall())
    assert {statuses[f"victim-{i}"] for i in range(len(BAD))} == {BROKEN}
    assert [run_id for run_id, status in statuses.items() if status == BROKEN and "victim" not in run_id] == []
    store.close()
    reference.close()


def test_a_value_duckdb_refuses_at_commit_is_quarantined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = partition.add_event

    def add_event(buf: rows.TableBuffer, rec: RawRecord, ev: Event) -> None:
        real(buf, rec, ev)
        if REFUSE in ev.payload.values():  # payload text DuckDB's JSON refuses: a ConversionException
            buf.rows[-1] = (*buf.rows[-1][:10], '{"not": json', *buf.rows[-1][11:])

    stream, seqs = hostile_stream([("tool.called", {**tool(1).model_dump(), "output": REFUSE})] * 3)
    reference = _project(tmp_path / "reference.duckdb", without(stream.records, seqs), [40, 40])
    monkeypatch.setattr(partition, "add_event", add_event)
    store = _project(tmp_path / "hostile.duckdb", stream.records, [40, 40])
    found = assert_as_if_never_decoded(store, reference, seqs)
    assert all("ConversionException" in reason and "Malformed JSON" in reason for _, _, reason in found)
    store.close()
    reference.close()


def test_a_bug_is_not_mistaken_for_bad_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_code(*args: Any) -> None:
        raise KeyError("a bug in the row code")

    stream, _ = hostile_stream([])
    monkeypatch.setattr(partition, "add_run", broken_code)
    with pytest.raises(KeyError, match="a bug"):
        _project(tmp_path / "bug.duckdb", stream.records, [100])


def test_the_partition_reports_what_cannot_become_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    stream, _ = hostile_stream(BAD[:1])
    monkeypatch.setattr(partition, "decode_record", lax_decode)
    with pytest.raises(UnprojectableError, match=r"TypeError: .<. not supported"):
        PartitionProjector().project(stream.records)


def test_a_worker_reports_it_and_the_partitions_raise_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The worker's loop, run in a thread of this process so that the lax decoder applies to it.
    monkeypatch.setattr(gc, "set_threshold", lambda *args: None)  # the worker's, not this process's
    stream, _ = hostile_stream(BAD[:1])
    monkeypatch.setattr(partition, "decode_record", lax_decode)
    ours, theirs = socket.socketpair()
    worker = threading.Thread(target=_worker_main, args=(Connection(theirs.detach()),), daemon=True)
    worker.start()
    partitions = ProcessPartitions(1)
    conn = Connection(ours.detach())
    assert conn.recv()[0] == "ready"
    partitions._conns = [conn]
    partitions.submit([PartitionWork(records=list(stream.records))])

    async def results() -> None:
        await partitions.results()

    with pytest.raises(UnprojectableError, match=r"TypeError: .<. not supported"):
        asyncio.run(results())
    partitions.submit([PartitionWork(records=list(stream.records[:3]))])  # the worker goes on
    assert len(asyncio.run(partitions.results())) == 1
    partitions.close()
    worker.join(5)
    assert not worker.is_alive()


# -- broken records: one status everywhere ---------------------------------------------------------------


def broken_stream() -> Stream:
    stream = Stream()
    full_run(stream, "whole")
    run = run_chain(stream, "forked-chain")
    run.add(RunStarted(agent="support", version=VERSION))
    run.add(model(0))
    run.events.pop()  # the next event links to the first again: a fork in the chain
    run.add(tool(1))
    run.add(RunCompleted(output="done"))
    gap = run_chain(stream, "gap")
    gap.add(RunStarted(agent="support", version=VERSION))
    append_raw(stream, gap, "tool.called", {"step": "0", "name": "t", "args": None, "args_digest": "d"})
    gap.add(RunCompleted(output="done"))
    return stream


def test_a_broken_record_is_broken_in_runs_and_checkpoints_as_readers_say(tmp_path: Path) -> None:
    stream = broken_stream()
    store = _project(tmp_path / "b.duckdb", stream.records, [3, 4, 100])
    by_run = _by_run(stream.records)
    found = {
        r[0]: r[1:]
        for r in store.con.execute(
            "SELECT r.run_id, r.status, r.fold_error, c.status, c.fold_error, c.checkpoint "
            "FROM runs r JOIN checkpoints c USING (run_id)"
        ).fetchall()
    }
    assert set(found) == {"whole", "forked-chain", "gap"}
    _good, bad = decode_records(stream.records)  # what a reader quarantines: it reads them too
    for run_id, records in by_run.items():
        cp, _ = fold_until_refused(records)
        quarantined = [q for q in bad if q.subject == records[0].subject]
        log = RunLog(run_id, "support", records[0].subject, records, quarantined=quarantined)
        status, error = record_status(log, fold(records, check_chain=False))
        assert found[run_id][:4] == (status, error, status, error), run_id
        assert json.loads(found[run_id][4]) == cp.to_dict(), run_id  # the state as far as the fold got
    assert found["whole"][0] == "completed" and found["whole"][1] is None
    assert "expected seq 2: gap or reorder" in found["forked-chain"][1]
    # Broken where the run's own subject holds what is not a valid event, before the gap it leaves.
    assert found["gap"][:2] == ("broken", f"run gap: stream sequence {bad[0].stream_seq} on its own subject is not a "
                                          "valid event (quarantined)")  # fmt: skip
    store.close()


def test_show_says_broken_with_the_fold_error() -> None:
    stream = broken_stream()
    records = _by_run(stream.records)["gap"]
    log = RunLog("gap", "support", records[0].subject, records)
    text = render_run(log, fold(records, check_chain=False))  # show folds without the chain check
    assert "status broken" in text and "status completed" not in text
    error = fold_until_refused(records)[1]
    assert f"BROKEN  {error}" in text
    whole = _by_run(stream.records)["whole"]
    assert "status completed" in render_run(RunLog("whole", "support", whole[0].subject, whole), fold(whole))


def test_fold_until_refused_is_fold_when_nothing_is_refused() -> None:
    stream = Stream()
    full_run(stream, "r")
    records = [Recorded(decode(r.data), r.stream_seq, r.subject) for r in stream.records if ".run." in r.subject]
    assert fold_until_refused(records) == (fold(records), None)
