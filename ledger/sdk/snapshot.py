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
there; otherwise (a crash) from ``TAIL_WINDOW`` stream sequences back, and only the last
snapshot found there and what follows it are decoded. Nothing in a snapshot is believed until:

- it decodes (its hash is that of its bytes) and stands on the writer's subject;
- its blob is the one its event names (sha256, checked by the blob store) and, sealed, opens
  with the run's key (AES-GCM authenticates it) under the run's own kid;
- the checkpoint it holds is the run's, and its head (seq, hash, stream sequence) is the one
  the event records and the one the event links to (``seq - 1``, ``prev_hash``);
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
parses each step's value again, a third of what was left of a 1,000-step resume.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import nats
from nats.js.errors import NotFoundError

from runledger.errors import BlobError, LedgerError
from runledger.log.reader import RunLog, decode_records, read_raw
from runledger.log.subjects import AGENT_WRITER, LEDGER_STREAM, WORKER_WRITER, run_filter, run_subject, writer_of
from runledger.protect.blobs import MEDIA_JSON
from runledger.protect.capture import PayloadOpener, is_marker, is_sealed_text
from runledger.protect.keystore import ALG, run_kid
from runledger.record.canonical import canonical_json
from runledger.record.events import JournalSnapshotted, decode_fast
from runledger.record.fold import Checkpoint, StepRecord, apply
from runledger.record.records import Recorded

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
    body = canonical_json(await opened_journal(cp, run._payload_opener()))
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
            if is_marker(response):
                opened = await _open(response, opener)
                if not is_marker(opened):
                    step["output"] = {**opened, "usage": output["usage"]}
        else:
            step["output"] = await _open(output, opener)
        step["error"] = await _open_error(step["error"], opener)
    return data


async def _open(value: Any, opener: PayloadOpener) -> Any:
    return await opener.open_value(value, strict=False, fetch=False) if is_marker(value) else value


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


def checkpoint_of(journal: dict[str, Any]) -> Checkpoint:
    """``Checkpoint.from_dict(journal)``, with each step that holds exactly a StepRecord's fields
    set as it is (a third of reading a 1,000-step snapshot went into building its steps)."""
    steps = journal.get("steps") or []
    cp = Checkpoint.from_dict({**journal, "steps": []})
    for step in steps:
        if isinstance(step, dict) and step.keys() == _STEP_FIELDS:
            rec = StepRecord.__new__(StepRecord)
            rec.__dict__.update(step)
            cp.steps[step["step"]] = rec
        else:  # another version's fields: the dataclass fills in or refuses
            cp.steps.update(Checkpoint.from_dict({"steps": [step]}).steps)
    return cp


@dataclass
class JournalLoad:
    """A run as a resume needs it: the checkpoint and what was read to make it. ``log.records``
    are the snapshot event and the events after it (not the whole run)."""

    log: RunLog
    checkpoint: Checkpoint
    snapshot_seq: int  # the seq of the snapshot read


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
    if snapshot:
        start = last_seq
    elif not short:
        start = max(1, last_seq - TAIL_WINDOW)
    else:
        return None  # too short to have been snapshotted
    raws = await read_raw(client, run_filter(agent, run_id), start_seq=start)
    # Only the snapshot and what follows it are decoded: the window may hold hundreds of events before it.
    at = len(raws)
    while True:
        at = next((i for i in range(at - 1, -1, -1) if raws[i].subject == subject and _MARK in raws[i].data), -1)
        if at < 0:
            return None
        records, quarantined = decode_records(raws[at:])
        if records and records[0].stream_seq == raws[at].stream_seq and records[0].event.type == SNAPSHOT:
            break  # else the mark was inside content recorded in the clear: look further back
    found = records[0]
    try:
        cp = await _verified(run_id, agent, found, records[1:], opener)
    except (LedgerError, ValueError, TypeError, KeyError) as exc:
        logger.warning("run %s: the journal snapshot at seq %d (stream sequence %d) is not usable (%s); "
                       "reading the whole run", run_id, found.event.seq, found.stream_seq, exc)  # fmt: skip
        return None
    log = RunLog(run_id=run_id, agent=agent, subject=subject, records=records, quarantined=quarantined)
    return JournalLoad(log, cp, found.event.seq)


async def _verified(
    run_id: str, agent: str, found: Recorded, tail: list[Recorded], opener: PayloadOpener
) -> Checkpoint:
    """The checkpoint after ``found`` (a snapshot) and ``tail``. Raises LedgerError saying why the
    snapshot is not usable (ChainError for the tail), which the caller logs before reading the whole run."""
    event = found.event
    snap = event.body_as(JournalSnapshotted)
    if snap.head_seq != event.seq - 1 or snap.head_hash != event.prev_hash:
        raise LedgerError("its head is not the event it follows")
    if snap.head_stream_seq >= found.stream_seq:
        raise LedgerError("its head was stored after it")
    ref = snap.journal
    kid = ref.get("kid") if ref.get("enc") else None
    worker = found.subject.endswith(f".{WORKER_WRITER}")
    if kid is not None and kid != run_kid(agent, run_id, worker=worker):
        raise LedgerError(f"it is sealed under {kid}, not under the run's key")
    journal: Any = await opener.open_value(ref, strict=True, fetch=True)
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
