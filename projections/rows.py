"""From folded state to table rows: pure functions and the Arrow shape of each staged table.

Every derived row is computed from what the shared folds produce (``runledger.record.fold`` for a
run, ``runledger.sdk.effects.fold_key`` for an idempotency key): this module formats, it never
decides. Rows are gathered as tuples in a ``TableBuffer`` and become one Arrow
table per batch, which DuckDB appends in a single statement (never row by row).

JSON columns are serialised with ``pydantic_core.to_json`` (about 4x ``json.dumps``);
timestamps are staged as the recorded RFC 3339 text and cast by DuckDB (``TRY_CAST``), so a
malformed ``ts`` becomes NULL instead of failing a batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pydantic_core import to_json

from runledger.protect.capture import is_placeholder
from runledger.record.events import Event
from runledger.record.failures import failure_signature
from runledger.record.fold import BROKEN, Checkpoint, StepRecord
from runledger.record.records import RawRecord
from runledger.sdk.effects import KeyState

_S = pa.string()
_I64 = pa.int64()
_F64 = pa.float64()
_LIST = pa.list_(pa.string())

SCHEMAS: dict[str, pa.Schema] = {
    "events": pa.schema([
        ("stream_seq", _I64), ("subject", _S), ("id", _S), ("run_id", _S), ("agent", _S), ("seq", _I64),
        ("type", _S), ("schema_version", _I64), ("ts_text", _S), ("step", _I64), ("payload", _S),
        ("prev_hash", _S), ("hash", _S), ("size", _I64),
    ]),
    "quarantine": pa.schema([
        ("stream_seq", _I64), ("subject", _S), ("reason", _S), ("error", _S), ("size", _I64),
        ("preview", _S), ("raw", pa.binary()),
    ]),
    "runs": pa.schema([
        ("run_id", _S), ("agent", _S), ("subject", _S), ("status", _S), ("failure_reason", _S),
        ("error_type", _S), ("error_message", _S), ("agent_version", _S), ("model", _S),
        ("prompt_hash", _S), ("tool_schema_hashes", _S), ("version", _S), ("parent_run_id", _S),
        ("fork_step", _I64), ("fork_mode", _S), ("fork_changed", _S), ("started_at", _S),
        ("ended_at", _S), ("spent_seconds", _F64), ("turns", _I64), ("tokens", _I64),
        ("input_tokens", _I64), ("output_tokens", _I64), ("limit_turns", _I64), ("limit_tokens", _I64),
        ("limit_seconds", _F64), ("attempts", _I64), ("steps", _I64), ("last_step", _I64),
        ("events", _I64), ("pending_approvals", _LIST), ("committed_keys", _LIST),
        ("in_doubt_keys", _LIST), ("simulated_keys", _LIST), ("capture", _S), ("input", _S),
        ("output", _S), ("first_stream_seq", _I64), ("last_stream_seq", _I64), ("fold_error", _S),
        ("child_of_run_id", _S), ("child_of_step", _I64), ("failure_class", _S), ("failure_step", _I64),
        ("failure_step_kind", _S), ("failure_step_name", _S), ("failure_shape", _S), ("forgeries", _I64),
    ]),
    "steps": pa.schema([
        ("run_id", _S), ("step", _I64), ("kind", _S), ("name", _S), ("status", _S), ("input_hash", _S),
        ("output", _S), ("error", _S), ("effect_key", _S), ("request_id", _S), ("tokens", _I64),
        ("input_tokens", _I64), ("output_tokens", _I64), ("duration_ms", _F64), ("started_at", _S),
        ("seq", _I64), ("agent", _S), ("agent_version", _S), ("version", _S), ("child_run_id", _S),
    ]),
    "checkpoints": pa.schema([
        ("run_id", _S), ("status", _S), ("last_step", _I64), ("next_seq", _I64), ("last_stream_seq", _I64),
        ("first_stream_seq", _I64), ("fold_error", _S), ("checkpoint", _S),
    ]),
    "effect_keys": pa.schema([
        ("subject", _S), ("key", _S), ("status", _S), ("run_id", _S), ("step", _I64), ("result", _S),
        ("error", _S), ("via", _S), ("events", _I64), ("last_hash", _S), ("last_stream_seq", _I64), ("writer", _S),
    ]),
}  # fmt: skip


_STRUCTS = {name: pa.struct(list(schema)) for name, schema in SCHEMAS.items()}


class TableBuffer:
    """Rows of one staged table, appended as tuples, turned into Arrow columns once a batch."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.schema = SCHEMAS[name]
        self.rows: list[tuple[Any, ...]] = []
        self._struct = _STRUCTS[name]

    def append(self, *values: Any) -> None:
        """Append one row, values in schema order."""
        self.rows.append(values)

    def __len__(self) -> int:
        return len(self.rows)

    def to_arrow(self) -> pa.Table:
        """The rows as a table of ``schema``. Raises what pyarrow raises for a value its column
        cannot hold (ArrowInvalid, ArrowTypeError, OverflowError: ``partition.ROW_ERRORS``)."""
        if not self.rows:
            return self.schema.empty_table()
        # The tuples go to Arrow as one struct array, in one C pass: half the time of transposing
        # them in Python and converting column by column (measured 3.6 against 7.0 us an events row).
        # A row of the wrong width is refused too (ArrowInvalid).
        return pa.Table.from_struct_array(pa.array(self.rows, type=self._struct))


def json_text(value: Any) -> str | None:
    """Compact JSON text of a JSON-native value; None stays None (SQL NULL)."""
    return None if value is None else to_json(value).decode("utf-8")


# -- checkpoints: (de)serialisation ------------------------------------------------------------------


def checkpoint_json(cp: Checkpoint) -> str:
    """``cp.to_dict()`` as compact JSON text (the ``checkpoints.checkpoint`` column)."""
    return to_json(cp.to_dict()).decode("utf-8")


def checkpoint_from_json(text: str) -> Checkpoint:
    return Checkpoint.from_dict(json.loads(text))


# -- per-run fold state --------------------------------------------------------------------------------


@dataclass
class RunFold:
    """A run's checkpoint as the projector keeps it between batches.

    ``fold_error`` is set when the fold refused an event (a broken hash chain, a gap, a
    timestamp it cannot read): the checkpoint stays as it was before that event, exactly as
    far as ``fold`` gets before raising, and later events are not folded (they are still
    in ``events``). Resume refuses such a run too, and its ``runs`` and ``checkpoints`` rows
    say ``broken`` (``status``), as ``runledger runs`` and ``show`` do (``fold_until_refused``).
    """

    subject: str
    checkpoint: Checkpoint
    first_stream_seq: int
    fold_error: str | None = None


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def i64(value: Any) -> int | None:
    """``value`` as a BIGINT, or None (SQL NULL) when absent or out of range.

    Payload integers are unbounded in JSON; a hostile or buggy event must not make a
    whole batch unwritable, so what a BIGINT cannot hold becomes NULL.
    """
    if value is None or isinstance(value, bool):
        return None
    number = int(value)
    return number if _I64_MIN <= number <= _I64_MAX else None


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _usage(rec: StepRecord) -> tuple[int, int]:
    if rec.kind != "model" or not isinstance(rec.output, dict):
        return 0, 0
    usage = rec.output.get("usage") or {}
    return int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))


def run_status(rf: RunFold) -> str:
    """The status of a run's rows: ``broken`` once the fold refused an event, else the checkpoint's."""
    return BROKEN if rf.fold_error is not None else rf.checkpoint.status


def add_run(buf: TableBuffer, run_id: str, rf: RunFold) -> None:
    cp = rf.checkpoint
    version = cp.version or {}
    parent = cp.parent or {}
    error = cp.error or {}
    input_tokens = output_tokens = 0
    for rec in cp.steps.values():
        i, o = _usage(rec)
        input_tokens += i
        output_tokens += o
    message = error.get("message")
    failure = failure_signature(cp, message if isinstance(message, str) and not is_placeholder(message) else None)
    buf.append(
        run_id, cp.agent or None, rf.subject, run_status(rf), cp.failure_reason, error.get("type"),
        error.get("message"), version.get("agent_version"), version.get("model"), version.get("prompt_hash"),
        json_text(version.get("tool_schema_hashes")), json_text(cp.version), parent.get("forked_from"),
        i64(parent.get("fork_step")), parent.get("mode"), parent.get("changed"), cp.started_at,
        cp.ended_at, float(cp.spent["seconds"]), i64(cp.spent["turns"]), i64(cp.spent["tokens"]),
        i64(input_tokens), i64(output_tokens), i64(cp.limits.get("turns")), i64(cp.limits.get("tokens")),
        _float_or_none(cp.limits.get("seconds")), i64(cp.attempts), len(cp.steps), i64(cp.last_step),
        i64(cp.next_seq),
        sorted(cp.pending_approvals), list(cp.committed_keys), list(cp.in_doubt_keys),
        list(cp.simulated_keys), cp.capture, json_text(cp.input), json_text(cp.output), rf.first_stream_seq,
        cp.last_stream_seq, rf.fold_error, cp.child_of_run_id, i64(cp.child_of_step),
        *(_NO_FAILURE if failure is None else (failure.class_id, i64(failure.step), failure.step_kind or None,
                                                failure.step_name or None, failure.shape or None)),
        len(cp.refused),
    )  # fmt: skip


_NO_FAILURE = (None, None, None, None, None)


def add_steps(buf: TableBuffer, run_id: str, cp: Checkpoint, step_nos: list[int]) -> None:
    version = json_text(cp.version)
    agent_version = (cp.version or {}).get("agent_version")
    agent = cp.agent or None
    for step_no in step_nos:
        rec = cp.steps[step_no]
        if i64(rec.step) is None:
            continue  # a step number no BIGINT holds cannot be a key; the checkpoint keeps it
        input_tokens, output_tokens = _usage(rec)
        buf.append(
            run_id, rec.step, rec.kind, rec.name, rec.status, rec.args_digest, json_text(rec.output),
            json_text(rec.error), rec.key, rec.request_id, i64(rec.tokens), i64(input_tokens),
            i64(output_tokens), float(rec.duration_ms), rec.ts or None, i64(rec.seq), agent, agent_version, version,
            rec.child_run_id,
        )  # fmt: skip


def add_checkpoint(buf: TableBuffer, run_id: str, rf: RunFold) -> None:
    cp = rf.checkpoint
    buf.append(
        run_id,
        run_status(rf),
        i64(cp.last_step),
        i64(cp.next_seq),
        cp.last_stream_seq,
        rf.first_stream_seq,
        rf.fold_error,
        checkpoint_json(cp),
    )


def add_effect_key(buf: TableBuffer, subject: str, ks: KeyState) -> None:
    buf.append(
        subject,
        ks.key,
        ks.status,
        ks.run_id,
        i64(ks.step),
        json_text(ks.result),
        json_text(ks.error),
        ks.via,
        i64(ks.next_seq),
        ks.last_hash,
        ks.last_stream_seq,
        ks.writer,
    )


def key_state_from_row(row: tuple[Any, ...]) -> KeyState:
    """Inverse of ``add_effect_key`` for a row of ``effect_keys`` (subject first)."""
    _subject, key, status, run_id, step, result, error, via, events, last_hash, last_stream_seq, writer = row
    return KeyState(
        key=key, status=status, run_id=run_id, step=step,
        result=None if result is None else json.loads(result),
        error=None if error is None else json.loads(error),
        via=via, next_seq=events, last_hash=last_hash, last_stream_seq=last_stream_seq, writer=writer or "",
    )  # fmt: skip


# -- events and quarantine ---------------------------------------------------------------------------


def add_event(buf: TableBuffer, rec: RawRecord, ev: Event) -> None:
    # seq and schema_version are validated non-negative ints; only their size needs checking.
    seq, version, step = ev.seq, ev.schema_version, ev.payload.get("step")
    buf.rows.append((
        rec.stream_seq, rec.subject, ev.id, ev.run_id, ev.agent, seq if seq <= _I64_MAX else None, ev.type,
        version if version <= _I64_MAX else None, ev.ts,
        step if type(step) is int and _I64_MIN <= step <= _I64_MAX else i64(step) if isinstance(step, int) else None,
        to_json(ev.payload).decode("utf-8"), ev.prev_hash, ev.hash, len(rec.data),
    ))  # fmt: skip


PREVIEW_CHARS = 200


def add_quarantined(buf: TableBuffer, rec: RawRecord, reason: str, error: str) -> None:
    preview = rec.data[: PREVIEW_CHARS * 4].decode("utf-8", "replace")[:PREVIEW_CHARS]
    buf.append(rec.stream_seq, rec.subject, reason, error, len(rec.data), preview, rec.data)
