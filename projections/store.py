"""The DuckDB file of a projection: schema, identity, position, and one transaction a batch.

Guarantees:

- **Exactly once.** A batch's rows in every table and the new stream position are written
  in one transaction (``commit``). A crash before COMMIT leaves the previous batch's
  state and position; a crash after leaves this one's. The next run resumes from the
  stored position, so no row is lost or doubled.
- **One history.** The file records the stream it projects (name and creation time, plus
  server and cluster for the message); pointed at another stream it refuses
  (``StreamMismatchError``) instead of mixing two histories.
- **One writer.** A writer holds an exclusive ``flock`` on ``<file>.lock`` for its whole
  life (DuckDB's own lock covers other DuckDB clients), so ``--rebuild`` can swap the file
  without another projector writing to the old one.
- **Private.** A writer creates the file, its WAL and its lock mode 0600 and missing
  directories 0700, whatever the umask: DuckDB creates its files itself, so a writer holds
  ``runledger.log.private.private_umask`` while it is open, and sets an existing file (an
  older version's) to 0600 when it opens it.

The file is plain DuckDB: tables, views and built-in functions only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import duckdb
import pyarrow as pa

from runledger.log.private import (
    FILE_MODE,
    acquire_private_umask,
    private_dir,
    release_private_umask,
    tighten,
)
from runledger.log.subjects import EFFECT_PREFIX
from runledger.projections import crashpoints
from runledger.projections.erasure import erased_error_json, erased_json, erased_value_json
from runledger.projections.errors import (
    ProjectionError,
    ProjectionFileError,
    ProjectionLockedError,
    StreamMismatchError,
    UnprojectableError,
)
from runledger.projections.migrations import migrate
from runledger.projections.rows import RunFold, checkpoint_from_json, key_state_from_row
from runledger.record import failures as ledger_failures
from runledger.record import fold as ledger_fold
from runledger.sdk import effects as ledger_effects
from runledger.sdk.effects import KeyState

# WAL size that triggers a DuckDB checkpoint (``close`` always does one). Larger: less work in
# all (measured 26.7 -> 20.8 us an event at 1 GB), but the final checkpoint runs after the last
# batch, with nothing to overlap it; 64 MB keeps that tail under a second.
CHECKPOINT_WAL = "64MB"

# What DuckDB does with each staged table. Timestamps arrive as recorded text and are cast
# here (TRY_CAST: a malformed ts is NULL, never a failed batch).
_WRITE_SQL = {
    "events": (
        "INSERT INTO events BY NAME SELECT *, TRY_CAST(ts_text AS TIMESTAMPTZ) AS ts FROM {t} ORDER BY stream_seq"
    ),
    "quarantine": "INSERT INTO quarantine BY NAME SELECT * FROM {t} ORDER BY stream_seq",
    "runs": (
        "{insert} INTO runs BY NAME SELECT * REPLACE ("
        "TRY_CAST(started_at AS TIMESTAMPTZ) AS started_at, TRY_CAST(ended_at AS TIMESTAMPTZ) AS ended_at), "
        "epoch(TRY_CAST(ended_at AS TIMESTAMPTZ)) - epoch(TRY_CAST(started_at AS TIMESTAMPTZ)) AS duration_s "
        "FROM {t}"
    ),
    "steps": (
        "{insert} INTO steps BY NAME SELECT * REPLACE (TRY_CAST(started_at AS TIMESTAMPTZ) AS started_at) FROM {t}"
    ),
    "checkpoints": "{insert} INTO checkpoints BY NAME SELECT * FROM {t}",
    "effect_keys": "{insert} INTO effect_keys BY NAME SELECT * FROM {t}",
}

# The tables whose rows a batch replaces by primary key. In a bulk file (a rebuild's fresh file,
# which nothing reads before its swap) they are filled without their keys: each batch deletes the
# rows it replaces itself, and the keys are added once, at the end (``ProjectionStore.add_keys``),
# which also proves them unique before the file is swapped in. Maintaining the ART indexes of
# ``INSERT OR REPLACE`` batch by batch cost more than the rows themselves (measured on a
# rebuild's batches, one DuckDB thread, CPU an event: 19.4 us upserted, 11.4 + 1.1 for the keys
# at the end).
KEYED_TABLES = ("runs", "steps", "checkpoints", "effect_keys")

# What DuckDB raises for a value it cannot take (a failed cast, a number out of range, input it
# refuses, a violated constraint), and Arrow for columns it cannot stage: ``commit`` rolls back and
# raises UnprojectableError, and the projector projects the batch again, event by event. Anything
# else (I/O, a full disk, a lock) is not the data's fault and stops the projector.
DATA_ERRORS = (
    duckdb.DataError,
    duckdb.ConstraintException,
    duckdb.InvalidInputException,
    pa.ArrowInvalid,
    pa.ArrowTypeError,
)


def fold_fingerprint() -> str:
    """A digest of the code that derives rows: when it changes, a rebuild may change them."""
    h = hashlib.sha256()
    from runledger.projections import erasure, partition, rows

    for module in (ledger_fold, ledger_failures, ledger_effects, rows, partition, erasure):
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class StreamIdentity:
    """Which history a file projects. Two streams are the same history iff name and creation time match."""

    stream: str
    created: str
    server_name: str | None = None
    server_id: str | None = None
    cluster: str | None = None
    url: str | None = None

    def same_history(self, other: StreamIdentity) -> bool:
        return self.stream == other.stream and self.created == other.created

    def describe(self) -> str:
        where = f"server {self.server_name or self.server_id or '?'}"
        if self.cluster:
            where += f", cluster {self.cluster}"
        if self.url:
            where += f", {self.url}"
        return f"stream {self.stream} created {self.created} ({where})"


@dataclass(frozen=True)
class ProjectorState:
    """The row of ``projector_state``: what the file projects and how far."""

    identity: StreamIdentity
    first_seq: int
    last_seq: int
    events: int
    quarantined: int
    batches: int
    fold_fingerprint: str


class ProjectionStore:
    """An open projection file. ``writer=False`` opens it read-only (no lock, no migration).

    ``bulk=True`` (a writer of a new, empty file that will be put in place whole, as ``rebuild``
    does) fills ``KEYED_TABLES`` without their primary keys; ``add_keys`` must be called once the
    file is complete, before anyone else reads it. A bulk file that was never completed has no
    keys and must be thrown away (``rebuild`` deletes it). Raises ProjectionError when the file
    already holds a projection.

    ``threads``: DuckDB's worker threads for this connection (default: one per core). A rebuild
    leaves the cores its fold workers use to them: on a busy core, DuckDB's threads only add CPU
    (measured on 2 cores, a rebuild's batches: 40 against 59-74 us of CPU an event at 1 and 2 threads,
    for the same wall time).
    """

    def __init__(self, path: Path, *, writer: bool = True, bulk: bool = False, threads: int | None = None) -> None:
        self.path = Path(path)
        self.writer = writer
        self._keys: dict[str, list[str]] | None = None  # table -> primary key columns, while bulk
        # Whether the file may hold an erased run (see ``commit``): a bulk file starts empty, so it
        # holds one only once a batch listed one; any other file may.
        self._may_hold_erased = not bulk
        self._lock: IO[str] | None = None
        self._reads: Any = None
        self._private = writer
        if writer:
            acquire_private_umask()  # DuckDB's file, WAL and temp files: 0600, whatever the umask
            try:
                self._lock = take_lock(self.path)
            except BaseException:
                self._release()
                raise
        try:
            if writer and not self.path.parent.exists():
                private_dir(self.path.parent)
            if not writer and not self.path.exists():
                raise ProjectionFileError(str(self.path), "does not exist yet: run `runledger project` first")
            self.con = _connect(self.path, read_only=not writer)
            if writer:
                # DuckDB checkpoints (compresses and rewrites what the WAL holds) once the WAL
                # passes 16 MB by default: after every ~20 MB batch, 60% of a commit's cost, and
                # a file a third larger. Every COMMIT still writes and syncs the WAL first, so
                # this changes when data is compressed, not what a crash keeps.
                self.con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_WAL}'")
                for made in (self.path, self.path.with_name(self.path.name + ".wal")):
                    tighten(made)  # a file an older version made with the umask's modes
                migrate(self.con, str(self.path))
                if bulk:
                    self._keys = _drop_keys(self.con, self.path)
            if threads is not None:
                self.con.execute(f"SET threads = {max(1, int(threads))}")
        except BaseException:
            self._release()
            raise

    # -- lifecycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        if self._reads is not None:
            self._reads.close()
            self._reads = None
        con = getattr(self, "con", None)
        if con is not None:
            with contextlib.suppress(duckdb.Error):
                if self.writer:
                    con.execute("CHECKPOINT")  # fold the WAL in, so the file alone is complete
            con.close()
            self.con = None
        self._release()

    def _release(self) -> None:
        if self._private:
            self._private = False
            release_private_umask()
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def __enter__(self) -> ProjectionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- identity and position -----------------------------------------------------------------------

    def state(self) -> ProjectorState | None:
        rows = self.con.execute(
            "SELECT stream, stream_created, server_name, server_id, cluster, nats_url, first_seq, last_seq, "
            "events, quarantined, batches, fold_fingerprint FROM projector_state"
        ).fetchall()
        if not rows:
            return None
        row = rows[0]
        identity = StreamIdentity(row[0], row[1], row[2], row[3], row[4], row[5])
        return ProjectorState(identity, *row[6:])

    def bind(self, identity: StreamIdentity, first_seq: int) -> ProjectorState:
        """Record ``identity`` in a new file, or check that an existing file projects it.

        Raises StreamMismatchError when the file holds another stream's history.
        """
        state = self.state()
        if state is not None:
            if not state.identity.same_history(identity):
                raise StreamMismatchError(str(self.path), state.identity.describe(), identity.describe())
            return state
        self.con.execute(
            "INSERT INTO projector_state (stream, stream_created, server_name, server_id, cluster, nats_url, "
            "first_seq, last_seq, events, quarantined, batches, fold_fingerprint) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, 0, 0, ?)",
            [identity.stream, identity.created, identity.server_name, identity.server_id, identity.cluster,
             identity.url, first_seq, first_seq - 1, fold_fingerprint()],
        )  # fmt: skip
        new = self.state()
        assert new is not None
        return new

    # -- state the projector needs back ----------------------------------------------------------------

    def _reader(self) -> Any:
        # Reads on a connection of their own: they may run while another thread commits, and see
        # committed data only (the projector never needs the batch in flight, see Projector).
        if self._reads is None:
            self._reads = self.con.cursor()
        return self._reads

    def load_runs(self, run_ids: set[str]) -> dict[str, RunFold]:
        if not run_ids:
            return {}
        rows = (
            self._reader()
            .execute(
                "SELECT c.run_id, r.subject, c.first_stream_seq, c.fold_error, c.checkpoint FROM checkpoints c "
                "JOIN runs r USING (run_id) WHERE c.run_id IN (SELECT unnest(?::VARCHAR[]))",
                [sorted(run_ids)],
            )
            .fetchall()
        )
        return {
            run_id: RunFold(subject, checkpoint_from_json(text), first, error)
            for run_id, subject, first, error, text in rows
        }

    def load_keys(self, subjects: set[str]) -> dict[str, KeyState]:
        if not subjects:
            return {}
        rows = (
            self._reader()
            .execute(
                "SELECT subject, key, status, run_id, step, result, error, via, events, last_hash, last_stream_seq, "
                "writer FROM effect_keys WHERE subject IN (SELECT unnest(?::VARCHAR[]))",
                [sorted(subjects)],
            )
            .fetchall()
        )
        return {row[0]: key_state_from_row(row) for row in rows}

    # -- the batch -----------------------------------------------------------------------------------

    def commit(
        self,
        tables: dict[str, list[pa.Table]],
        *,
        first_seq: int,
        last_seq: int,
        events: int,
        quarantined: int,
        erased: Sequence[str] = (),
    ) -> None:
        """Append/replace every table's rows and move the position to ``last_seq``, atomically.

        ``erased``: runs the batch found erased; their stored events and effect keys are
        rewritten without content in the same transaction (``runledger.projections.erasure``),
        as are those of erased runs whose idempotency keys the batch touched.

        ``first_seq`` must follow the stored position: anything else means two projectors
        or a reader bug, and nothing is written. A value DuckDB refuses (``DATA_ERRORS``) rolls
        the batch back and raises UnprojectableError.
        """
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            rows = con.execute("SELECT last_seq FROM projector_state").fetchall()
            if not rows or rows[0][0] != first_seq - 1:
                raise ProjectionError(
                    f"{self.path}: batch starts at stream sequence {first_seq} but the file is at "
                    f"{rows[0][0] if rows else 'no position'}; nothing was written. Run `runledger project` again"
                )
            for name, parts in tables.items():
                table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
                if table.num_rows == 0:
                    continue
                staged = f"staged_{name}"
                con.register(staged, table)
                try:
                    keys = None if self._keys is None else self._keys.get(name)
                    if keys is not None:  # a bulk file: replace by hand what INSERT OR REPLACE replaces
                        on = " AND ".join(f'k."{c}" = s."{c}"' for c in keys)
                        con.execute(f"DELETE FROM {name} k USING {staged} s WHERE {on}")
                    con.execute(_WRITE_SQL[name].format(
                        t=staged, insert="INSERT" if keys is not None else "INSERT OR REPLACE"
                    ))  # fmt: skip
                finally:
                    con.unregister(staged)
            if erased:
                self._may_hold_erased = True  # before the rows are in: a rolled-back batch only costs a query
            # Owners of the batch's key events can only be erased runs the file holds: none in a bulk
            # file until a batch erased one (the partition lists every erased run it touches, the
            # batch that erases it first), which spares a rebuild a join a batch (~13% of its commits).
            owners = _erased_key_owners(con, first_seq, last_seq) if self._may_hold_erased else set()
            _rewrite_erased(con, {*erased, *owners})
            con.execute(
                "UPDATE projector_state SET last_seq = ?, events = events + ?, quarantined = quarantined + ?, "
                "batches = batches + 1, updated_at = current_timestamp",
                [last_seq, events, quarantined],
            )
            crashpoints.crash_point("after_insert_before_commit")
            con.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            if isinstance(exc, DATA_ERRORS):
                raise UnprojectableError(f"{type(exc).__name__}: {exc}") from exc
            raise
        crashpoints.crash_point("after_commit")

    def add_keys(self) -> None:
        """Give a bulk file's ``KEYED_TABLES`` their primary keys (one transaction): the file is
        then the schema ``migrate`` makes, row for row what upserts would have left.

        Raises ProjectionError when a key is not unique (a projector bug: the file must not be
        swapped in); nothing is changed then.
        """
        if self._keys is None:
            return
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            for table, columns in self._keys.items():
                for column in columns:  # the key makes them NOT NULL itself, as in the migrated schema
                    con.execute(f'ALTER TABLE {table} ALTER "{column}" DROP NOT NULL')
                con.execute(f"ALTER TABLE {table} ADD PRIMARY KEY ({', '.join(map(_quoted, columns))})")
            con.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            if isinstance(exc, duckdb.ConstraintException):
                raise ProjectionError(f"{self.path}: the rebuilt rows are not unique by key ({exc}); "
                                      "the file was not put in place. Report this bug") from exc  # fmt: skip
            raise
        self._keys = None

    def set_fingerprint(self, value: str) -> None:
        self.con.execute("UPDATE projector_state SET fold_fingerprint = ?", [value])


def _drop_keys(con: Any, path: Path) -> dict[str, list[str]]:
    """Re-create the empty ``KEYED_TABLES`` of a just-migrated file without their primary keys
    (same columns, types and NOT NULLs; views bind tables by name, so they still read them).
    Returns each table's key columns, for ``add_keys``."""
    if con.execute("SELECT count(*) FROM projector_state").fetchall()[0][0]:
        raise ProjectionError(f"{path} already holds a projection: a bulk load needs a new file")
    keys: dict[str, list[str]] = {}
    con.execute("BEGIN TRANSACTION")
    try:
        for table in KEYED_TABLES:
            found = con.execute(
                "SELECT constraint_column_names FROM duckdb_constraints() WHERE schema_name = 'main' "
                "AND table_name = ? AND constraint_type = 'PRIMARY KEY'", [table]
            ).fetchall()  # fmt: skip
            columns = con.execute(
                "SELECT column_name, data_type, is_nullable, column_default FROM duckdb_columns() "
                "WHERE schema_name = 'main' AND table_name = ? ORDER BY column_index", [table]
            ).fetchall()  # fmt: skip
            if con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]:
                raise ProjectionError(f"{path}: table {table} is not empty: a bulk load needs a new file")
            keys[table] = list(found[0][0])
            ddl = ", ".join(
                f"{_quoted(name)} {type_}{'' if nullable else ' NOT NULL'}"
                + ("" if default is None else f" DEFAULT {default}")
                for name, type_, nullable, default in columns
            )
            con.execute(f"DROP TABLE {table}")
            con.execute(f"CREATE TABLE {table} ({ddl})")
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    return keys


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _connect(path: Path, *, read_only: bool) -> Any:
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        text = str(exc)
        if "lock" in text.lower():
            raise ProjectionLockedError(str(path), _lock_holder(text)) from exc
        raise ProjectionFileError(str(path), f"cannot be opened ({text})") from exc
    except duckdb.Error as exc:
        raise ProjectionFileError(str(path), f"is not a usable DuckDB file ({exc})") from exc
    # UTC sessions, so timestamps print the same on every machine. Without the ICU extension
    # DuckDB has no time zones and is UTC already (and refuses the setting).
    with contextlib.suppress(duckdb.Error):
        con.execute("SET TimeZone = 'UTC'")
    return con


def _lock_holder(text: str) -> str | None:
    marker = "PID "
    at = text.find(marker)
    if at < 0:
        return None
    digits = "".join(ch for ch in text[at + len(marker) : at + len(marker) + 12] if ch.isdigit())
    return digits or None


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def take_lock(path: Path) -> IO[str]:
    """An exclusive, non-blocking ``flock`` on ``<path>.lock``, held until the handle is closed.

    Raises ProjectionLockedError naming the holder's pid.
    """
    if not path.parent.exists():
        private_dir(path.parent)
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    handle = os.fdopen(fd, "r+")  # held for the store's lifetime
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        handle.seek(0)
        holder = handle.read().strip() or None
        handle.close()
        raise ProjectionLockedError(str(path), holder) from exc
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def replace_file(fresh: Path, target: Path) -> None:
    """Atomically put the complete file ``fresh`` at ``target`` (both closed; WAL folded in).

    A stale ``target.wal`` (left by a crashed writer of the old file) is removed first: DuckDB
    would otherwise replay the old file's log onto the new one.
    """
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target.with_name(target.name + ".wal"))
    os.replace(fresh, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _erased_key_owners(con: Any, first_seq: int, last_seq: int) -> set[str]:
    """Erased runs whose idempotency-key events are in the batch ``first_seq..last_seq`` (an
    operator settling a key of an erased run: the run itself is not in the batch).

    Only the owners' checkpoints are parsed: the JSON is read after the join, and filtered here.
    With the filter in SQL, DuckDB pushed it into the scan of ``checkpoints`` and parsed every
    checkpoint at every batch (measured 0.17 s a batch at 10,000 runs: quadratic in a rebuild).
    """
    rows = con.execute(
        "SELECT c.run_id, json_extract_string(c.checkpoint, '$.erased') FROM ("
        "SELECT DISTINCT run_id FROM events WHERE stream_seq BETWEEN ? AND ? AND starts_with(subject, ?)"
        ") owners JOIN checkpoints c USING (run_id)",
        [first_seq, last_seq, EFFECT_PREFIX + "."],
    ).fetchall()
    return {run_id for run_id, erased in rows if erased is not None}


def _rewrite_erased(con: Any, run_ids: set[str]) -> None:
    """Rewrite the stored events and effect keys of ``run_ids`` without content (inside the
    batch's transaction). Their runs, steps and checkpoints rows came erased from the partition."""
    if not run_ids:
        return
    ids = [sorted(run_ids)]
    rows = con.execute(
        "SELECT stream_seq, type, payload FROM events WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", ids
    ).fetchall()
    changed = [(seq, text) for seq, type_, payload in rows if (text := erased_json(type_, payload)) is not None]
    if changed:
        seqs, payloads = zip(*changed, strict=True)
        staged = pa.table({"stream_seq": pa.array(seqs, pa.int64()), "payload": pa.array(payloads, pa.string())})
        con.register("erased_events", staged)
        try:
            con.execute(
                "UPDATE events SET payload = erased_events.payload FROM erased_events "
                "WHERE events.stream_seq = erased_events.stream_seq"
            )
        finally:
            con.unregister("erased_events")
    keys = con.execute(
        "SELECT subject, result, error FROM effect_keys WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", ids
    ).fetchall()
    for subject, result, error in keys:
        new_result, new_error = erased_value_json(result), erased_error_json(error)
        if (new_result, new_error) != (result, error):
            con.execute(
                "UPDATE effect_keys SET result = ?, error = ? WHERE subject = ?", [new_result, new_error, subject]
            )
