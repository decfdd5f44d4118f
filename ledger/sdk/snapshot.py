"""Journal snapshots: a resume that reads a snapshot and the events after it, not the whole run.

A snapshot is an event of the run's own chain, ``journal.snapshotted``, appended by the run's
writer on its own subject when the run suspends (if it has ``SNAPSHOT_MIN_EVENTS`` events and
any since its last snapshot) and every ``SNAPSHOT_EVERY`` events while it runs. Its journal is
the checkpoint ``fold`` made of every event before it (``Checkpoint.to_dict``) with its content
opened as the run's key opens it (``opened_journal``: what ``fold`` makes of the events
``load_run`` returns; blob references stay references, ``hash-only`` values stay hashes), as
JSON sealed under the run's data key like any content and stored by reference in the object
store (a blob named by its sha256). Erasing the run destroys the key and deletes the blob: the
snapshot of an erased run is unreadable, as its content is. A replay from it opens nothing per
step: one decryption instead of one a step.

Under output durability (``runledger.log.window``) the live checkpoint's ``last_stream_seq`` lags
by up to a window (an event in the window has no stream sequence yet), so the run's window is
committed before a snapshot is taken: its head is then stored and its stream sequence is the
server's. The snapshot event then waits in the window like any step: a crash that loses it loses
only it and the events after it (windows are stored in order, each whole or as a prefix), never
an event it summarizes, and a resume uses the last snapshot that was stored, or reads the whole
run (tests/integration/test_snapshot_output.py kills such runs at random moments).

Reading (``load_journal``): the last message of the writer's subject (one direct get). When it
is a snapshot (a suspended run: the snapshot follows ``run.suspended``) the run is read from
the snapshot's head on, and the journal its event names is read at the same time; otherwise (a
crash) the run is read from ``TAIL_WINDOW`` stream sequences back, and only the last snapshot
found there and what follows it are decoded. The run's keys are read meanwhile (the resumed
writer needs them too: ``JournalLoad.keys``). The journal's blob is read by ``BlobStore.fetch``
(its metadata by one direct get, its chunks by one subject read, the hash checked). Its steps
are stored as a table (``stored_journal``) and parsed by pydantic-core. Nothing in a snapshot
is believed until:

- it decodes (its hash is that of its bytes) and stands on the writer's subject;
- its blob is the one its event names (sha256 of the bytes read) and, sealed, opens with the
  run's key (AES-GCM authenticates it) under the run's own kid;
- the checkpoint it holds is the run's, and its head (seq, hash, stream sequence) is the one
  the event records, the one the event links to (``seq - 1``, ``prev_hash``) and the one the
  stream holds at that stream sequence (the run's event of that seq and hash);
- the event and every event after it fold onto that checkpoint with the chain checked
  (``apply``): seq, hash link and writer, exactly as a full read checks them.

Anything that does not hold is logged and the whole run is read instead (``None``), so a
missing, corrupt or unreadable snapshot costs time, never correctness. The fence of the resumed
writer is the run's real last stream sequence: the highest of every message read after the
snapshot, quarantined garbage included (``RunLog.last_stream_seq``).

Rejected: a snapshot outside the chain (a key-value entry, a blob under a fixed name): nothing
would tie its content to the events it claims to summarize, and the roles would need new
permissions. A header on every event pointing at the last snapshot: it changes every append
for a hint. Content left sealed value by value inside the snapshot: the replay then unseals and
parses each step's value again, a third of what was left of a 1,000-step resume. The journal
compressed into one chunk: the blob would no longer be JSON to the readers that open content
fields, for a read that is one subject read either way.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import nats
from nats.js.errors import NotFoundError
from pydantic_core import from_json

from runledger.errors import BlobError, LedgerError, PayloadUnavailableError
from runledger.log.reader import RunLog, decode_records, read_raw
from runledger.log.subjects import (
    AGENT_WRITER,
    LEDGER_STREAM,
    WORKER_WRITER,
    run_filter,
    run_subject,
    writer_of,
)
from runledger.protect.blobs import MEDIA_JSON, BlobStore, is_blob_ref
from runledger.protect.capture import PayloadOpener, is_placeholder, is_sealed_text, missing_key_reason
from runledger.protect.keystore import ALG, RunKeys, run_kid
from runledger.record.canonical import canonical_json, read_back
from runledger.record.events import JournalSnapshotted, decode_fast
from runledger.record.fold import Checkpoint, StepRecord, apply
from runledger.record.records import RawRecord, Recorded

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.sdk.run import RecordedRun

logger = logging.getLogger(__name__)

SNAPSHOT = JournalSnapshotted.TYPE
_MARK = f'"type":"{SNAPSHOT}"'.encode()  # in the canonical bytes of a snapshot event (both chain formats)
# A running run is snapshotted every this many events (a bound on what a resume after a crash reads).
SNAPSHOT_EVERY = 512
# A suspended run is snapshotted when it has at least this many events (and any since its last
# snapshot): below that, reading the events is as fast as reading a snapshot.
SNAPSHOT_MIN_EVENTS = 256
# After a crash the last snapshot is looked for this many stream sequences before the run's last
# message (the run's events since it, and whatever other runs wrote meanwhile).
TAIL_WINDOW = 8 * SNAPSHOT_EVERY


class JournalSnapshotter:
    """When a run writes its snapshots. ``since``: the seq right after the run's last snapshot
    (0 when it has none). ``every`` / ``at_least``: ``SNAPSHOT_EVERY`` / ``SNAPSHOT_MIN_EVENTS``."""

    def __init__(self, since: int = 0, *, every: int | None = None, at_least: int | None = None) -> None:
        self.since = since
        self.every = SNAPSHOT_EVERY if every is None else every
        self.at_least = SNAPSHOT_MIN_EVENTS if at_least is None else at_least
        if self.every < 1 or self.at_least < 1:
            raise ValueError(f"snapshot intervals must be positive, got every={self.every}, at_least={self.at_least}")

    async def after_append(self, run: RecordedRun) -> None:
        """Called by the run with its append lock held, after each event: snapshot when due."""
        if run.checkpoint.next_seq - self.since >= self.every:
            await self._write(run)

    async def at_suspension(self, run: RecordedRun) -> None:
        """Snapshot a run that just suspended (its last event is ``run.suspended``), when it has
        ``at_least`` events and any since its last snapshot, so that its resume finds the snapshot
        as the writer's last message. A snapshot that cannot be written is logged, not raised:
        the run is suspended all the same, and a resume reads it whole."""
        cp = run.checkpoint
        if cp.next_seq < self.at_least or cp.next_seq <= self.since:
            return  # a short run (its events read as fast), or nothing since the last snapshot
        async with run._append_lock:
            await self._write(run)

    async def _write(self, run: RecordedRun) -> None:
        # Tried once per interval, written or not: a store that fails is not asked at every step.
        try:
            await write_snapshot(run)
        except BlobError as exc:
            logger.warning("run %s: could not store a journal snapshot (%s); a resume will read the whole run",
                           run.run_id, exc)  # fmt: skip
        self.since = run.checkpoint.next_seq


async def write_snapshot(run: RecordedRun) -> JournalSnapshotted:
    """Append a snapshot of ``run``'s journal: the caller holds the run's append lock, so the
    checkpoint is the fold of exactly the events before the snapshot.

    Raises BlobError when the journal cannot be stored (nothing is appended then), and what an
    append raises (PublishError, FencedError) when the event cannot be: like any append, the
    run's writer may then be behind the subject, so the run stops."""
    commit = getattr(run._writer, "commit", None)
    cp = run.checkpoint
    if commit is not None:
        await commit()  # a writer that acknowledges in windows: the head's stream sequence is known now
        cp.last_stream_seq = max(cp.last_stream_seq, run._writer.last_stream_seq)
    if not cp.writer:  # the live fold does not check writers; a fold of the events says whose the run is
        cp.writer = writer_of(run._writer.subject) or ""
    body = canonical_json(stored_journal(await opened_journal(cp, run._payload_opener())))
    protector = run._protector
    if protector is None or protector.blobs is None:
        raise BlobError(f"run {run.run_id} has no object store to keep its journal snapshot in")
    keys = protector.keys if protector.policy.encrypt else None
    if keys is not None:
        ref = await protector.blobs.put(keys.seal(body), MEDIA_JSON, enc=ALG, kid=keys.kid)
    else:  # content recorded unsealed: the journal is stored as the content is
        ref = await protector.blobs.put(body, MEDIA_JSON)
    snapshot = JournalSnapshotted(
        head_seq=cp.next_seq - 1,
        head_hash=cp.last_hash,
        head_stream_seq=cp.last_stream_seq,
        steps=len(cp.steps),
        journal=ref,
    )
    event = await run._writer.append(snapshot)
    apply(cp, Recorded(event, run._writer.last_stream_seq), check_chain=False)
    return snapshot


async def opened_journal(cp: Checkpoint, opener: PayloadOpener) -> dict[str, Any]:
    """``cp.to_dict()`` with its content opened where ``opener`` can (leniently, blobs left as
    references): what ``fold`` makes of the run's events opened (``load_run``), so a replay from
    it opens nothing per step. ``cp`` itself is not changed."""
    data = cp.to_dict()
    data["input"] = await _open(data["input"], opener)
    data["output"] = await _open(data["output"], opener)
    data["error"] = await _open_error(data["error"], opener)
    data["pending_approvals"] = {
        rid: {**pending, "args": await _open(pending.get("args"), opener)}
        for rid, pending in data["pending_approvals"].items()
    }
    for step in data["steps"]:  # to_dict's copies
        output = step["output"]
        if step["kind"] == "model" and isinstance(output, dict) and "usage" in output:
            # The fold merges the response (content, sealed) with its usage (structure).
            response = {k: v for k, v in output.items() if k != "usage"}
            if is_placeholder(response):
                opened = await _open(response, opener)
                if not is_placeholder(opened):
                    step["output"] = {**opened, "usage": output["usage"]}
        else:
            step["output"] = await _open(output, opener)
        step["error"] = await _open_error(step["error"], opener)
    return data


async def _open(value: Any, opener: PayloadOpener) -> Any:
    return await opener.open_value(value, strict=False, fetch=False) if is_placeholder(value) else value


async def _open_error(error: Any, opener: PayloadOpener) -> Any:
    if not isinstance(error, dict):
        return error
    opened = dict(error)
    for name in ("message", "traceback"):
        text = opened.get(name)
        if isinstance(text, str) and is_sealed_text(text):
            opened[name] = await opener.open_text(text, strict=False)
    return opened


_STEP_FIELDS = frozenset(f.name for f in fields(StepRecord))
_STEP_ORDER = [f.name for f in fields(StepRecord)]


def stored_journal(journal: dict[str, Any]) -> dict[str, Any]:
    """``journal`` (``opened_journal``'s) as a snapshot stores it: its steps as a table, the
    field names once and a row of values per step (``{"fields": [...], "rows": [[...], ...]}``):
    a third smaller than a list of objects, and parsed four times faster."""
    rows = [[step.get(name) for name in _STEP_ORDER] for step in journal["steps"]]
    return {**journal, "steps": {"fields": _STEP_ORDER, "rows": rows}}


def checkpoint_of(journal: dict[str, Any]) -> Checkpoint:
    """``Checkpoint.from_dict`` of a journal as a snapshot stores it (``stored_journal``, or a
    list of step objects as earlier snapshots have it). A table whose fields are this version's,
    in order, builds its steps straight from the rows, and a step object that holds exactly a
    StepRecord's fields is set as it is (building the steps was a third of reading a 1,000-step
    snapshot). Raises ValueError or TypeError for steps in neither form."""
    steps = journal.get("steps") or []
    cp = Checkpoint.from_dict({**journal, "steps": []})
    if isinstance(steps, dict):  # the table
        names, rows = steps.get("fields"), steps.get("rows")
        if not isinstance(names, list) or not isinstance(rows, list):
            raise ValueError("its steps are neither a list nor a table")
        if names == _STEP_ORDER:
            width = len(names)
            for row in rows:
                if not isinstance(row, list) or len(row) != width:
                    raise ValueError("a step's row does not match the table's fields")
                rec = StepRecord(*row)
                cp.steps[rec.step] = rec
            return cp
        steps = [dict(zip(names, row, strict=True)) for row in rows]  # strict: a short row raises ValueError
    for step in steps:
        if isinstance(step, dict) and step.keys() == _STEP_FIELDS:
            rec = StepRecord.__new__(StepRecord)
            rec.__dict__.update(step)
            cp.steps[step["step"]] = rec
        else:  # another version's fields: the dataclass fills in or refuses
            cp.steps.update(Checkpoint.from_dict({"steps": [step]}).steps)
    return cp


def _parsed(data: bytes) -> Any:
    """The JSON value of ``data``: pydantic-core's parser (twice as fast as ``json.loads``), and
    ``json.loads`` for what it refuses that the standard library reads (escaped lone surrogates)."""
    try:
        value = from_json(data)
    except ValueError:
        value = json.loads(data)
    return read_back(value, data)


@dataclass
class JournalLoad:
    """A run as a resume needs it: the checkpoint and what was read to make it. ``log.records``
    are the snapshot event and the events after it (not the whole run). ``keys``: the run's keys
    (read with the snapshot; the resumed writer needs them), None when it has none."""

    log: RunLog
    checkpoint: Checkpoint
    snapshot_seq: int  # the seq of the snapshot read
    keys: RunKeys | None = None


async def load_journal(client: LedgerClient, run_id: str, agent: str, opener: PayloadOpener) -> JournalLoad | None:
    """The run's checkpoint from its last snapshot and the events after it, chain checked.

    None when the run has no snapshot to use (then read the whole run): none was written, none
    is near the end of the run, or one does not verify or cannot be opened (logged, with why).
    Errors of the server (the run cannot be read at all) are left to the full read to report."""
    for writer in (AGENT_WRITER, WORKER_WRITER):
        subject = run_subject(agent, run_id, writer)
        try:
            last = await client.js.get_last_msg(LEDGER_STREAM, subject, direct=True)
        except NotFoundError:
            continue
        except (TimeoutError, nats.errors.Error) as exc:
            logger.debug("run %s: no snapshot lookup (%s)", run_id, exc)
            return None
        return await _from_last(client, run_id, agent, subject, last.seq or 0, last.data or b"", opener)
    return None


async def _from_last(
    client: LedgerClient, run_id: str, agent: str, subject: str, last_seq: int, data: bytes, opener: PayloadOpener
) -> JournalLoad | None:
    try:
        last = decode_fast(data)
        snapshot, short = last.type == SNAPSHOT, last.seq < SNAPSHOT_MIN_EVENTS
    except LedgerError:
        snapshot, short = False, False  # garbage on the subject: the events before it may hold one
    if short and not snapshot:
        return None  # too short to have been snapshotted
    # What is read besides the run's events, while they are read: the run's keys (named by its id
    # and writer), and for a suspended run (the snapshot is the writer's last message) the journal
    # its event names, once the event is checked. Nothing read is believed before it is checked.
    kid = run_kid(agent, run_id, worker=subject.endswith(f".{WORKER_WRITER}"))
    keys = asyncio.ensure_future(opener.key(kid))
    journal: asyncio.Future[Any] | None = None
    found: Recorded | None = None
    try:
        if snapshot:
            found = Recorded(last, last_seq, subject)
            snap = _snapshot_of(run_id, agent, found)
            journal = asyncio.ensure_future(_journal(client, snap.journal, keys, opener))
            start = snap.head_stream_seq  # from its head on: the stream must hold the head it records
        else:
            start = last_seq - TAIL_WINDOW
        raws = await read_raw(client, run_filter(agent, run_id), start_seq=max(1, start))
        located = _located(raws, subject)
        if located is None:
            return None
        at, records, quarantined = located
        if found is None or records[0].stream_seq != found.stream_seq:  # a crash, or a newer snapshot
            found = records[0]
            snap = _snapshot_of(run_id, agent, found)
            if journal is not None:
                journal.cancel()
            journal = asyncio.ensure_future(_journal(client, snap.journal, keys, opener))
        head = next((raw for raw in raws[:at] if raw.stream_seq == snap.head_stream_seq), None)
        if head is None:  # before the window read after a crash
            head = next(
                (r for r in await read_raw(client, run_filter(agent, run_id), start_seq=max(1, snap.head_stream_seq))
                 if r.stream_seq == snap.head_stream_seq), None,
            )  # fmt: skip
        _check_head(run_id, snap, head)
        assert journal is not None
        cp = _verified(run_id, agent, found, snap, records[1:], await journal)
        run_keys = await keys
    except (LedgerError, ValueError, TypeError, KeyError) as exc:
        where = "" if found is None else f" at seq {found.event.seq} (stream sequence {found.stream_seq})"
        logger.warning("run %s: the journal snapshot%s is not usable (%s); reading the whole run", run_id, where, exc)
        return None
    finally:
        for task in (keys, journal):
            if task is not None and not task.done():
                task.cancel()
            elif task is not None and not task.cancelled():
                task.exception()  # retrieved: a failure that made the snapshot unusable is logged above
    log = RunLog(run_id=run_id, agent=agent, subject=subject, records=records, quarantined=quarantined)
    return JournalLoad(log, cp, found.event.seq, run_keys)


def _located(raws: list[RawRecord], subject: str) -> tuple[int, list[Recorded], list[Any]] | None:
    """The last snapshot on ``subject`` in ``raws``: its index, it and the events after it decoded
    (only those: a window read after a crash may hold hundreds of events before it), and what did
    not decode. None when there is none."""
    at = len(raws)
    while True:
        at = next((i for i in range(at - 1, -1, -1) if raws[i].subject == subject and _MARK in raws[i].data), -1)
        if at < 0:
            return None
        records, quarantined = decode_records(raws[at:])
        if records and records[0].stream_seq == raws[at].stream_seq and records[0].event.type == SNAPSHOT:
            return at, records, quarantined
        # else the mark was inside content recorded in the clear: look further back


def _snapshot_of(run_id: str, agent: str, found: Recorded) -> JournalSnapshotted:
    """The body of ``found`` (a snapshot event, its hash checked), after what the event alone says
    is checked: it follows its head, and its journal is a blob sealed under the run's key."""
    event = found.event
    snap = event.body_as(JournalSnapshotted)
    if snap.head_seq != event.seq - 1 or snap.head_hash != event.prev_hash:
        raise LedgerError("its head is not the event it follows")
    if snap.head_stream_seq >= found.stream_seq:
        raise LedgerError("its head was stored after it")
    ref = snap.journal
    if not is_blob_ref(ref):
        raise LedgerError("its journal is not a blob reference")
    kid = ref.get("kid") if ref.get("enc") else None
    if kid is not None and kid != run_kid(agent, run_id, worker=found.subject.endswith(f".{WORKER_WRITER}")):
        raise LedgerError(f"it is sealed under {kid}, not under the run's key")
    return snap


def _check_head(run_id: str, snap: JournalSnapshotted, head: RawRecord | None) -> None:
    """The stream holds the snapshot's head where the snapshot says (``head_stream_seq``): the
    event of the run at ``head_seq`` with ``head_hash`` (its hash checked over its bytes)."""
    if head is None:
        raise LedgerError(f"the run has no event at its head's stream sequence {snap.head_stream_seq}")
    event = decode_fast(head.data)
    if (event.run_id, event.seq, event.hash) != (run_id, snap.head_seq, snap.head_hash):
        raise LedgerError(f"the run's event at stream sequence {snap.head_stream_seq} is not its head")


async def _journal(
    client: LedgerClient, ref: dict[str, Any], keys: asyncio.Future[RunKeys | None], opener: PayloadOpener
) -> Any:
    """The journal ``ref`` names (a checked snapshot's: a blob, sealed under the run's key
    ``keys`` when it has ``enc``), hash checked (``BlobStore.fetch``), opened and parsed. Raises
    LedgerError."""
    data = await BlobStore(client).fetch(ref)
    if ref.get("enc"):
        run_keys = await keys
        if run_keys is None:
            raise PayloadUnavailableError(f"blob {ref['sha256']}", missing_key_reason(str(ref.get("kid"))))
        data = run_keys.unseal(data)
    value = _parsed(data)
    return await opener.open_value(value, strict=True, fetch=True) if is_placeholder(value) else value


def _verified(
    run_id: str, agent: str, found: Recorded, snap: JournalSnapshotted, tail: list[Recorded], journal: Any
) -> Checkpoint:
    """The checkpoint after ``found`` (a snapshot, ``snap`` its body as ``_snapshot_of`` checked it)
    and ``tail``, from the ``journal`` it holds. Raises LedgerError saying why the snapshot is not
    usable (ChainError for the tail), which the caller logs before reading the whole run."""
    if not isinstance(journal, dict):
        raise LedgerError("its journal is not a checkpoint")
    cp = checkpoint_of(journal)
    if cp.run_id != run_id or cp.agent != agent:
        raise LedgerError(f"it holds the journal of run {cp.run_id!r} of {cp.agent!r}")
    if (cp.next_seq - 1, cp.last_hash, cp.last_stream_seq) != (snap.head_seq, snap.head_hash, snap.head_stream_seq):
        raise LedgerError("its journal does not end at the head it records")
    apply(cp, found)  # links to the head, on the writer's subject
    for rec in tail:
        apply(cp, rec)
    return cp
