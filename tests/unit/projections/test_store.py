"""The DuckDB file: one transaction a batch with the position, identity, locking, the swap."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from runledger.projections.erasure import ERASED
from runledger.projections.errors import ProjectionError, ProjectionLockedError, StreamMismatchError
from runledger.projections.partition import PartitionProjector
from runledger.projections.store import ProjectionStore, StreamIdentity, replace_file
from runledger.record.canonical import digest
from runledger.record.events import EffectIntended, EffectResolved, RunErased, RunStarted
from tests.unit.projections.chains import VERSION, Stream, full_run, key_chain, run_chain
from tests.unit.projections.conftest import IDENTITY, projector_for
from tests.unit.projections.tables import table_rows


def _rows(records: list) -> dict[str, list[pa.Table]]:
    batch = PartitionProjector().project(records)
    return {name: [t] for name, t in batch.tables.items()}


def test_commit_writes_rows_and_position_together(store: ProjectionStore) -> None:
    stream = Stream()
    full_run(stream, "r1")
    store.commit(_rows(stream.records), first_seq=1, last_seq=8, events=8, quarantined=0)
    state = store.state()
    assert state is not None and (state.last_seq, state.events, state.batches) == (8, 8, 1)
    assert store.con.execute("SELECT count(*) FROM events").fetchall() == [(8,)]


def test_a_batch_that_does_not_follow_the_position_writes_nothing(store: ProjectionStore) -> None:
    stream = Stream()
    full_run(stream, "r1")
    with pytest.raises(ProjectionError, match="batch starts at stream sequence 3"):
        store.commit(_rows(stream.records[2:]), first_seq=3, last_seq=8, events=6, quarantined=0)
    assert store.con.execute("SELECT count(*) FROM events").fetchall() == [(0,)]
    assert store.state().last_seq == 0  # type: ignore[union-attr]


def test_a_failure_inside_the_transaction_rolls_everything_back(store: ProjectionStore) -> None:
    stream = Stream()
    full_run(stream, "r1")
    rows = _rows(stream.records)
    rows["runs"] = [pa.table({"run_id": ["x"]})]  # misses NOT NULL columns: the insert fails
    with pytest.raises(duckdb.Error):
        store.commit(rows, first_seq=1, last_seq=8, events=8, quarantined=0)
    for table in ("events", "steps", "checkpoints", "effect_keys"):
        assert store.con.execute(f"SELECT count(*) FROM {table}").fetchall() == [(0,)]
    assert store.state().last_seq == 0  # type: ignore[union-attr]


def test_a_file_refuses_another_stream(store: ProjectionStore) -> None:
    other = StreamIdentity(stream="LEDGER", created="2026-04-01T00:00:00Z", server_name="n2")
    with pytest.raises(StreamMismatchError, match="--rebuild") as info:
        store.bind(other, 1)
    assert "2026-03-01" in str(info.value) and "2026-04-01" in str(info.value)
    same_stream_other_server = StreamIdentity(stream="LEDGER", created=IDENTITY.created, server_name="n9")
    assert store.bind(same_stream_other_server, 1).identity == IDENTITY  # a restarted or other node: same history


def test_one_writer_at_a_time(store: ProjectionStore) -> None:
    with pytest.raises(ProjectionLockedError, match="in use by another process"):
        ProjectionStore(store.path)


def test_an_open_duckdb_session_elsewhere_is_reported_as_a_lock(tmp_path: Path) -> None:
    path = tmp_path / "held.duckdb"
    ProjectionStore(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, sys; c = duckdb.connect({str(path)!r}); print('ready', flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(ProjectionLockedError):
            ProjectionStore(path, writer=False)
    finally:
        holder.kill()
        holder.wait()


def test_reading_a_missing_file_says_to_project_first(tmp_path: Path) -> None:
    with pytest.raises(ProjectionError, match="runledger project"):
        ProjectionStore(tmp_path / "none.duckdb", writer=False)


def test_replace_file_drops_the_old_files_log(tmp_path: Path) -> None:
    target, fresh = tmp_path / "t.duckdb", tmp_path / "f.duckdb"
    stream = Stream()
    full_run(stream, "r1")
    with ProjectionStore(fresh) as s:
        s.bind(IDENTITY, 1)
        projector_for(s).project_batch(stream.records)
    target.write_bytes(b"old")
    (tmp_path / "t.duckdb.wal").write_bytes(b"a log of the old file")
    replace_file(fresh, target)
    assert not fresh.exists() and not (tmp_path / "t.duckdb.wal").exists()
    with ProjectionStore(target, writer=False) as s:
        assert len(table_rows(s.con, "events")) == 8


def test_the_file_opens_in_plain_duckdb(store: ProjectionStore) -> None:
    stream = Stream()
    full_run(stream, "r1")
    projector_for(store).project_batch(stream.records)
    store.close()
    code = (
        f"import duckdb; c = duckdb.connect({str(store.path)!r}, read_only=True); "
        "print(c.execute('SELECT count(*) FROM events').fetchall()[0][0], "
        "c.execute('SELECT state FROM effects').fetchall()[0][0])"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["8", "committed"]


def _erased_then_settled() -> tuple[list, list]:
    """Two batches: a run claims a key and is erased (the key in doubt); then an operator settles
    the key with a result, a batch in which the run itself does not appear."""
    stream = Stream()
    run = run_chain(stream, "r-erased")
    run.add(RunStarted(agent="support", version=VERSION))
    claim = EffectIntended(step=0, name="refund", key="k-1", args={"o": 1}, args_digest=digest({"o": 1}))
    run.add(claim)
    key = key_chain(stream, "k-1", "r-erased")
    key.add(claim)
    run.add(RunErased(reason="gdpr", by="ana", kid="kid-1"))
    first = len(stream.records)
    key.add(EffectResolved(key="k-1", outcome="committed", by="ana", result={"refund_id": "personal"}))
    return stream.records[:first], stream.records[first:]


@pytest.mark.parametrize("bulk", [False, True])
def test_a_key_settled_after_its_runs_erasure_is_erased_in_every_file(tmp_path: Path, bulk: bool) -> None:
    """The key's row carries no result in a rebuild's bulk file either, though its run is not in the batch."""
    with ProjectionStore(tmp_path / "p.duckdb", bulk=bulk) as store:
        store.bind(IDENTITY, 1)
        projector = projector_for(store)
        for batch in _erased_then_settled():
            projector.project_batch(batch)
        store.add_keys()
        rows = store.con.execute("SELECT status, result FROM effect_keys WHERE key = 'k-1'").fetchall()
    assert rows == [("committed", json.dumps(ERASED))]
