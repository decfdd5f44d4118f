"""Decoding and folding one batch of raw stream records into staged rows. Pure: no I/O.

``PartitionProjector.project(records)`` decodes each message with ``runledger.projections.decoder.decode_record``
(``decode``'s answers, faster), quarantines what does not decode, appends every event to the
``events`` rows, and folds it:

- events on a run subject (``ledger.run.<agent>.<run_id>.<writer>``) with ``runledger.record.fold.apply`` into
  that run's checkpoint, grouped by the subject's run id exactly as ``load_run`` groups
  them for resume (so the checkpoint here is the one resume builds, except that resume
  opens sealed content first and the projection never does: ``runledger.protect.capture``);
- events on an idempotency-key subject (``ledger.effect.<agent>.<digest>.<writer>``) with
  ``runledger.sdk.effects.apply_key`` into that key's state.

A run whose checkpoint says ``erased`` has its content erased from the checkpoint before its rows
are built, and is listed in ``BatchRows.erased`` so the commit rewrites its stored events
(``runledger.projections.erasure``).

It keeps the state of the runs and keys it has seen; the caller (which owns the DuckDB
file) preloads the state of anything else before a batch and tells it what to forget, so
memory stays bounded and the cache never disagrees with what was committed. A failed
commit must discard the whole projector (its state is ahead of the file).

Rejected: re-folding a run from all of its events on every batch (quadratic in a run's
length), and folding in SQL (a second copy of the fold, which the design forbids).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from runledger.errors import EventDecodeError
from runledger.log.subjects import EFFECT_PREFIX, parse_effect_subject, parse_run_subject
from runledger.projections.decoder import decode_record
from runledger.projections.erasure import erase_checkpoint
from runledger.projections.errors import UnprojectableError
from runledger.projections.rows import (
    RunFold,
    TableBuffer,
    add_checkpoint,
    add_effect_key,
    add_event,
    add_quarantined,
    add_run,
    add_steps,
)
from runledger.record.events import Event
from runledger.record.fold import Checkpoint, apply, fold_error, quarantine_error, refusal
from runledger.record.records import RawRecord, Recorded
from runledger.sdk.effects import KeyState, apply_key

_EFFECT_PREFIX = EFFECT_PREFIX + "."
# The ``error`` of a quarantined message that decoded but that its writer may not write.
REFUSED = "RefusedFromWriter"
STAGED_TABLES = ("events", "quarantine", "runs", "steps", "checkpoints", "effect_keys")
# What building rows raises on a value no column can hold (pyarrow's ArrowInvalid and
# ArrowTypeError are a ValueError and a TypeError): the batch is then projected again, event by
# event (``Projector``). Anything else (a KeyError, an AttributeError) is a bug and stops the projector.
ROW_ERRORS = (ValueError, TypeError, OverflowError)


def route_key(subject: str) -> str | None:
    """The state a message on ``subject`` folds into: ``run:<run_id>``, ``key:<key subject>`` (the
    key's subject without its writer token: every writer's messages fold into one key) or None."""
    if subject.startswith(_EFFECT_PREFIX):
        return "key:" + (subject.rpartition(".")[0] if parse_effect_subject(subject) else subject)
    parsed = parse_run_subject(subject)
    if parsed is not None:
        return "run:" + parsed[1]
    return None


class RouteCache:
    """``route_key`` memoised: a run's subject repeats for every one of its events."""

    def __init__(self, limit: int = 200_000) -> None:
        self._known: dict[str, str | None] = {}
        self._limit = limit

    def __call__(self, subject: str) -> str | None:
        try:
            return self._known[subject]
        except KeyError:
            pass
        route = route_key(subject)
        if len(self._known) >= self._limit:
            self._known.clear()
        self._known[subject] = route
        return route


@dataclass
class BatchRows:
    """What one batch adds to or replaces in each table, as Arrow tables."""

    tables: dict[str, pa.Table]
    events: int = 0
    quarantined: int = 0
    first_seq: int = 0
    last_seq: int = 0
    erased: list[str] = field(default_factory=list)  # runs of the batch erased: their stored rows are rewritten


def _snapshot(cp: Checkpoint) -> dict[int, tuple[object, ...]]:
    # Identity of each step record's mutable parts: the fold replaces values, never edits them
    # in place, so a changed identity or status marks a step whose row must be rewritten.
    return {n: (id(r), r.status, r.seq, id(r.output), id(r.error)) for n, r in cp.steps.items()}


def _recorded(event: Event, stream_seq: int, subject: str) -> Recorded:
    # Recorded(event, stream_seq, subject) without the frozen dataclass's per-field
    # object.__setattr__: an equal object at half the cost, once an event.
    record = object.__new__(Recorded)
    object.__setattr__(record, "__dict__", {"event": event, "stream_seq": stream_seq, "subject": subject})
    return record


def _decode(data: bytes) -> Event | tuple[str, str]:
    try:
        return decode_record(data)
    except EventDecodeError as exc:
        return exc.reason, type(exc).__name__
    except Exception as exc:  # a reader never crashes on bytes: decode can raise others (NaN)
        return f"the decoder raised {type(exc).__name__}: {exc}", type(exc).__name__


class PartitionProjector:
    """Folds batches of raw records; holds the state of the runs and keys it has seen."""

    def __init__(self) -> None:
        self.runs: dict[str, RunFold] = {}
        self.keys: dict[str, KeyState] = {}
        self._route = RouteCache()

    # -- state the caller manages -------------------------------------------------------------------

    def preload(self, runs: dict[str, RunFold], keys: dict[str, KeyState]) -> None:
        self.runs.update(runs)
        self.keys.update(keys)

    def forget(self, routes: Iterable[str]) -> None:
        for route in routes:
            kind, _, name = route.partition(":")
            (self.runs if kind == "run" else self.keys).pop(name, None)

    # -- the batch --------------------------------------------------------------------------------

    def project(self, records: Sequence[RawRecord]) -> BatchRows:
        """Decode and fold ``records`` (in stream order) and return the rows they change.

        Raises UnprojectableError when a value cannot become a row (``ROW_ERRORS``); the state
        of this partition is then ahead of the file and must be discarded (the projector
        evicts every run and key and projects the batch again from the committed state).
        """
        try:
            return self._project(records)
        except ROW_ERRORS as exc:
            raise UnprojectableError(f"{type(exc).__name__}: {exc}") from exc

    def _project(self, records: Sequence[RawRecord]) -> BatchRows:
        buffers = {name: TableBuffer(name) for name in STAGED_TABLES}
        events, quarantine = buffers["events"], buffers["quarantine"]
        before: dict[str, dict[int, tuple[object, ...]]] = {}
        touched_keys: set[str] = set()
        route_of, runs = self._route, self.runs
        for rec in records:
            decoded = _decode(rec.data)
            if not isinstance(decoded, Event):
                add_quarantined(quarantine, rec, *decoded)
                self._break_run(rec, before)
                continue
            ev = decoded
            route = route_of(rec.subject)
            if route is None:
                add_event(events, rec, ev)
                continue  # not a subject of the ledger's layout: kept in events, folded nowhere
            run_id = route[4:]
            if route[0] == "k":
                refused = self._fold_key(run_id, rec, ev)  # the key's subject, not a run id
                touched_keys.add(run_id)
            else:
                rf = runs.get(run_id)
                if rf is None:
                    rf = runs[run_id] = RunFold(rec.subject, Checkpoint(), rec.stream_seq)
                if run_id not in before:
                    before[run_id] = _snapshot(rf.checkpoint)
                refused = self._fold_run(rf, rec, ev)
            if refused is None:
                add_event(events, rec, ev)
            else:  # a forgery or a stray (runledger.record.fold.refusal): no row of the run or key it names
                add_quarantined(quarantine, rec, refused, REFUSED)
        erased: list[str] = []
        for run_id, snapshot in before.items():
            rf = self.runs[run_id]
            cp = rf.checkpoint
            if cp.erased is not None:
                erase_checkpoint(cp)  # before its rows are built: they, and every later batch's, carry no content
                erased.append(run_id)
            changed = [
                n for n, r in cp.steps.items() if snapshot.get(n) != (id(r), r.status, r.seq, id(r.output), id(r.error))
            ]
            add_steps(buffers["steps"], run_id, cp, sorted(changed))
            add_run(buffers["runs"], run_id, rf)
            add_checkpoint(buffers["checkpoints"], run_id, rf)
        for subject in sorted(touched_keys):
            add_effect_key(buffers["effect_keys"], subject, self.keys[subject])
        return BatchRows(
            tables={name: buf.to_arrow() for name, buf in buffers.items()},
            events=len(events),
            quarantined=len(quarantine),
            first_seq=records[0].stream_seq if records else 0,
            last_seq=records[-1].stream_seq if records else 0,
            erased=erased,
        )

    def quarantined(self, rec: RawRecord, reason: str, error: str) -> BatchRows:
        """The rows of one message quarantined outside a batch (the projector's careful path: it
        decodes but cannot become a row): its ``quarantine`` row, and its run's rows when it breaks
        the run (``_break_run``), as if it had never decoded."""
        buffers = {name: TableBuffer(name) for name in STAGED_TABLES}
        add_quarantined(buffers["quarantine"], rec, reason, error)
        before: dict[str, dict[int, tuple[object, ...]]] = {}
        self._break_run(rec, before)
        for run_id in before:
            add_run(buffers["runs"], run_id, self.runs[run_id])
            add_checkpoint(buffers["checkpoints"], run_id, self.runs[run_id])
        tables = {name: buf.to_arrow() for name, buf in buffers.items()}
        return BatchRows(tables=tables, events=0, quarantined=1, first_seq=rec.stream_seq, last_seq=rec.stream_seq)

    def _break_run(self, rec: RawRecord, before: dict[str, dict[int, tuple[object, ...]]]) -> None:
        """Bytes that are not a valid event on a run's own subject break the run from there
        (``runledger.record.fold.quarantine_error``; ``runledger runs`` and ``show`` say the same):
        its rows say ``broken`` and later events are not folded. On another writer's (or agent's)
        subject under the run's id they are a stray: quarantined, the run as it was, and counted among
        its forgeries (``runs.forgeries``, as ``verify`` names them)."""
        route = self._route(rec.subject)
        if route is None or not route.startswith("run:"):
            return
        run_id = route[4:]
        rf = self.runs.get(run_id)
        if rf is None:
            return  # nothing of the run folded yet: it has no own subject to judge by
        error = quarantine_error(run_id, rf.subject, rec.subject, rec.stream_seq)
        if error is None or rf.fold_error is None:  # the run's row changes
            before.setdefault(run_id, _snapshot(rf.checkpoint))
        if error is None:  # a stray: no break, but a forgery under the run's id all the same (runs.forgeries)
            rf.checkpoint.refused.append(f"stream seq {rec.stream_seq}: not a valid event on {rec.subject}")
        elif rf.fold_error is None:
            rf.fold_error = error

    @staticmethod
    def _fold_run(rf: RunFold, rec: RawRecord, ev: Event) -> str | None:
        """Fold ``ev`` into its run; why it was refused from its writer (None: it was not)."""
        recorded = _recorded(ev, rec.stream_seq, rec.subject)
        if rf.fold_error is not None:  # broken: folded no further, but a forgery is still no row of the run
            return refusal(rf.checkpoint, recorded)
        try:
            return apply(rf.checkpoint, recorded)
        except Exception as exc:  # e.g. a gap, a ts that is not RFC 3339: resume fails on it the same way
            rf.fold_error = fold_error(exc, recorded)  # as fold_until_refused reports it
            return None

    def _fold_key(self, subject: str, rec: RawRecord, ev: Event) -> str | None:
        ks = self.keys.get(subject)
        if ks is None:
            ks = self.keys[subject] = KeyState(key="")
        if not ks.key:
            key = ev.payload.get("key")
            ks.key = key if isinstance(key, str) else ""
        return apply_key(ks, _recorded(ev, rec.stream_seq, rec.subject))
