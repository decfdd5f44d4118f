"""Reading a projection: analysts' SQL, Parquet export, the quarantine, checkpoints at a step.

Everything here reads an open DuckDB connection of a projection file and nothing else, so
it answers the same whether the file was just caught up or copied to a laptop.

DuckDB and the event models are imported by the functions that use them: the CLI reads ``FORMATS``
to build ``runledger sql``'s parser, also for ``runledger --help`` (tests/unit/test_cli_imports.py).
"""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runledger.log.private import private_dir, private_umask, tighten
from runledger.projections.errors import ProjectionError, QueryError

if TYPE_CHECKING:
    from runledger.record.fold import Checkpoint
    from runledger.record.records import Recorded

FORMATS = ("table", "csv", "json")


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    types: list[str]
    rows: list[tuple[Any, ...]]


def run_sql(con: Any, sql: str, params: Sequence[Any] | None = None) -> QueryResult:
    """Run one statement and fetch its rows. Raises QueryError with DuckDB's reason."""
    import duckdb

    try:
        cursor = con.execute(sql, params) if params is not None else con.execute(sql)
        description = cursor.description or []
        rows = cursor.fetchall() if description else []
    except duckdb.Error as exc:
        raise QueryError(sql, str(exc).strip()) from exc
    return QueryResult([d[0] for d in description], [str(d[1]) for d in description], rows)


def _jsonable(value: Any, type_name: str) -> Any:
    if value is None:
        return None
    if type_name == "JSON" and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v, "") for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, "") for k, v in value.items()}
    return value


def _cell(value: Any, type_name: str) -> str:
    if value is None:
        return ""
    plain = _jsonable(value, "")
    if isinstance(plain, str):
        return plain
    return json.dumps(plain, ensure_ascii=False, sort_keys=True)


def format_result(result: QueryResult, fmt: str, *, max_width: int = 60) -> str:
    """``table`` (aligned, cells cut at ``max_width``), ``csv`` (RFC 4180) or ``json`` (an array of objects)."""
    if fmt == "json":
        records = [
            {c: _jsonable(v, t) for c, t, v in zip(result.columns, result.types, row, strict=True)}
            for row in result.rows
        ]
        return json.dumps(records, ensure_ascii=False, indent=2, sort_keys=False)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(result.columns)
        for row in result.rows:
            writer.writerow([_cell(v, t) for v, t in zip(row, result.types, strict=True)])
        return out.getvalue().rstrip("\n")
    if fmt != "table":
        raise ProjectionError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    cells = [[_short(_cell(v, t), max_width) for v, t in zip(row, result.types, strict=True)] for row in result.rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(result.columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(result.columns, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.append(f"({len(result.rows)} row{'s' if len(result.rows) != 1 else ''})")
    return "\n".join(lines)


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# -- Parquet export ----------------------------------------------------------------------------------

# (table or view, partition columns, the SELECT that adds them)
EXPORTS: list[tuple[str, list[str], str]] = [
    ("events", ["agent", "date"], "SELECT *, CAST(timezone('UTC', ts) AS DATE) AS date FROM events"),
    ("runs", ["agent", "date"], "SELECT *, CAST(timezone('UTC', started_at) AS DATE) AS date FROM runs"),
    ("steps", ["agent", "date"], "SELECT *, CAST(timezone('UTC', started_at) AS DATE) AS date FROM steps"),
    ("effects", [], "SELECT * FROM effects"),
    ("approvals", [], "SELECT * FROM approvals"),
    ("checkpoints", [], "SELECT * FROM checkpoints"),
    ("effect_keys", [], "SELECT * FROM effect_keys"),
    ("quarantine", [], "SELECT * FROM quarantine"),
]


def export_parquet(con: Any, directory: Path) -> dict[str, int]:
    """Write every table as Parquet under ``directory/<table>/`` (Hive-partitioned by agent and
    UTC date where it has them), replacing an earlier export. Returns rows per table.

    Private whatever the umask: files 0600, the table directories (and ``directory`` when it is
    created here) 0700; DuckDB writes them under ``private_umask`` (runledger.log.private)."""
    directory = Path(directory)
    if not directory.exists():
        private_dir(directory)
    with private_umask():
        counts = _export(con, directory)
    for name, _, _ in EXPORTS:
        tighten(directory / name)  # files an earlier export left with wider modes
    return counts


def _export(con: Any, directory: Path) -> dict[str, int]:
    import duckdb

    counts: dict[str, int] = {}
    for name, partitions, select in EXPORTS:
        target = directory / name
        rows = con.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0]
        counts[name] = int(rows)
        options = "FORMAT parquet, OVERWRITE"
        if partitions:
            options += f", PARTITION_BY ({', '.join(partitions)})"
        else:
            target.mkdir(mode=0o700, parents=True, exist_ok=True)
            for old in target.glob("*.parquet"):
                old.unlink()
            target = target / "data.parquet"
        try:
            con.execute(f"COPY ({select}) TO '{_sql_string(str(target))}' ({options})")
        except duckdb.Error as exc:
            raise ProjectionError(f"exporting {name} to {target} failed: {exc}") from exc
    return counts


def _sql_string(text: str) -> str:
    return text.replace("'", "''")


# -- quarantine ---------------------------------------------------------------------------------------


def quarantined(con: Any, limit: int | None = None) -> QueryResult:
    sql = "SELECT stream_seq, subject, error, reason, size, preview FROM quarantine ORDER BY stream_seq"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return run_sql(con, sql)


# -- checkpoints at a step ------------------------------------------------------------------------------

_EVENT_FIELDS = ("id", "run_id", "agent", "seq", "type", "schema_version", "ts", "payload", "prev_hash", "hash")


def run_records(con: Any, run_id: str, *, upto_step: int | None = None) -> list[Recorded]:
    """The events of ``run_id``'s run subject(s), in stream order, as ``load_run`` returns them.

    Rows of ``events`` were validated by ``decode`` when projected, so they are rebuilt
    with ``model_construct`` (no second validation). With ``upto_step``, stops where
    ``fold(..., upto_step=K)`` would stop anyway.
    """
    from runledger.record.events import Event
    from runledger.record.records import Recorded

    bounds = con.execute("SELECT first_stream_seq, last_stream_seq FROM runs WHERE run_id = ?", [run_id]).fetchall()
    if not bounds:
        raise ProjectionError(
            f"no run {run_id!r} in the projection: check the id, or catch up with `runledger project`"
        )
    first, _ = bounds[0]
    where = "stream_seq >= ? AND run_id = ? AND starts_with(subject, 'ledger.run.') AND split_part(subject, '.', 4) = ?"
    params: list[Any] = [first, run_id, run_id]
    if upto_step is not None:
        stop = con.execute(
            f"SELECT min(stream_seq) FROM events WHERE {where} AND step > ?", [*params, upto_step]
        ).fetchall()[0][0]
        if stop is not None:
            where += " AND stream_seq < ?"
            params.append(stop)
    rows = con.execute(
        "SELECT stream_seq, subject, id, run_id, agent, seq, type, schema_version, ts_text, payload, prev_hash, hash "
        f"FROM events WHERE {where} ORDER BY stream_seq",
        params,
    ).fetchall()
    out = []
    for stream_seq, subject, *values in rows:
        data = dict(zip(_EVENT_FIELDS, values, strict=True))
        data["payload"] = json.loads(data["payload"])
        out.append(Recorded(Event.model_construct(**data), stream_seq, subject))
    return out


def checkpoint_at(con: Any, run_id: str, step: int | None = None) -> Checkpoint:
    """``fold`` of the run's projected events up to ``step``: the same fold resume uses."""
    from runledger.record.fold import fold

    return fold(run_records(con, run_id, upto_step=step), upto_step=step)
