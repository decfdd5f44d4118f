"""The checkpoint fold: one pure function from a run's events to its state.

``fold(events) -> Checkpoint`` does no I/O, reads no clock and draws no random
number. Resume, the DuckDB ``checkpoints`` table, ``runledger checkpoint`` and the
sandbox all call it, so what a resumed run believes and what an analyst sees cannot
differ. It lives in ``ledger`` (not ``projections``) because resume needs it and
``ledger`` imports neither of the other packages.

Spend is folded, never stored: turns and tokens are sums over ``model.called``
(a turn is a model step that ended: an attempt that runledger retries, ``will_retry``, counts
none, so a 429 answered on the next attempt is one turn; the step's last attempt counts one,
whether it succeeded or failed), seconds are the sum of live segments (``run.started``/``run.resumed`` to the last
event of that segment), so time spent crashed does not count and a resume inherits
everything already spent. Limits grow only by recorded ``budget.granted`` events.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from runledger.errors import ChainError
from runledger.record.events import GENESIS, Event, RunForked, upcast
from runledger.record.records import Recorded
from runledger.record.writers import OPERATOR_WRITER, WORKER_WRITER


@dataclass
class StepRecord:
    """What step ``step`` did, as recorded: the journal entry resume replays."""

    step: int
    kind: str  # model | tool | effect | clock | random | approval | child
    name: str
    args_digest: str
    # ok | error | retrying (an attempt failed, another follows) | intended | committed | failed | simulated |
    # pending | approved | denied | started, completed (a child step; failed too)
    status: str
    seq: int
    output: Any = None
    error: dict[str, Any] | None = None
    key: str | None = None
    request_id: str | None = None
    tokens: int = 0
    duration_ms: float = 0.0
    ts: str = ""
    attempts: int = 1  # attempts of a model or tool call recorded for this step (runledger.sdk.retry)
    child_run_id: str | None = None  # a child step's run (child.started)


def _call_status(p: dict[str, Any]) -> str:
    if p.get("will_retry"):
        return "retrying"
    return "error" if p.get("error") else "ok"


@dataclass
class Checkpoint:
    run_id: str = ""
    agent: str = ""
    version: dict[str, Any] | None = None
    status: str = "unknown"  # running | suspended | completed | failed
    input: Any = None
    capture: str = "full"
    chain_format: int = 1  # the canonical JSON of the run's hashes and digests (run.started; absent: 1)
    digest_scheme: int = 1  # how the run digests content (run.started; absent: 1, plain; runledger.record.digests)
    limits: dict[str, float | None] = field(default_factory=lambda: {"turns": None, "tokens": None, "seconds": None})
    spent: dict[str, float] = field(default_factory=lambda: {"turns": 0, "tokens": 0, "seconds": 0.0})
    last_step: int = -1
    next_seq: int = 0
    last_hash: str = GENESIS
    last_stream_seq: int = 0
    writer: str = ""  # who writes the run: "a" its agent, "w" a worker (a branch); "" when not known
    # Messages under the run's id that are not the run's, where and why: refused from their writers
    # (``refusal``), and in the projection also bytes that are no event off the run's own subject.
    refused: list[str] = field(default_factory=list)
    steps: dict[int, StepRecord] = field(default_factory=dict)
    messages: list[dict[str, int]] = field(default_factory=list)  # references: {step, seq}
    pending_approvals: dict[str, dict[str, Any]] = field(default_factory=dict)
    committed_keys: list[str] = field(default_factory=list)
    in_doubt_keys: list[str] = field(default_factory=list)
    simulated_keys: list[str] = field(default_factory=list)
    output: Any = None
    error: dict[str, Any] | None = None
    failure_reason: str | None = None
    failure_retryable: bool = False  # failed on a retryable kind of error: `runledger resume RUN --retry`
    failed_step: int | None = None
    failure_shape: str | None = None  # run.failed's message_shape (runledger.record.failures)
    # A branch's run.forked payload at its current schema version: ``forked_from`` (the run it was
    # forked from, its fork parent), fork_step, mode, changed... (version 1, which named the fork
    # parent ``parent_run_id``, is upcast here and in ``from_dict``). A child's parent: child_of_run_id.
    parent: dict[str, Any] | None = None
    # A child run's run.started: the run and step that started it (``run.child``).
    child_of_run_id: str | None = None
    child_of_step: int | None = None
    attempts: int = 1
    started_at: str | None = None
    ended_at: str | None = None
    erased: dict[str, Any] | None = None  # run.erased: by, reason, ts (content is gone, structure stays)
    holder: str | None = None  # the process driving the run (run.started / run.resumed; runledger.sdk.holder)
    # The listings its tools were declared from (run.started's ``tool_listings``: [{source, listing}]),
    # from which a resume declares them again (runledger.sdk.deferred_tools); [] when none was recorded.
    tool_listings: list[dict[str, Any]] = field(default_factory=list)
    # Live-segment accounting for the seconds budget.
    segment_start: str | None = None
    seconds_closed: float = 0.0
    last_ts: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint as JSON-native data: every field, ``steps`` as a list in step order.

        Shallow: nested values (payload contents, lists of keys) are the checkpoint's own
        objects, not copies (``dataclasses.asdict`` deep-copied them: ~300 us a checkpoint).
        Serialise or read the result; copy before changing it."""
        data = {name: getattr(self, name) for name in _CHECKPOINT_FIELDS}
        data["steps"] = [dict(vars(s)) for _, s in sorted(self.steps.items())]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Checkpoint:
        """Inverse of ``to_dict``: ``Checkpoint.from_dict(cp.to_dict()) == cp``. Unknown keys are ignored."""
        values = {k: v for k, v in data.items() if k in _CHECKPOINT_FIELD_SET and k != "steps"}
        cp = cls(**values)
        if cp.parent is not None and "forked_from" not in cp.parent:  # stored before run.forked 2
            cp.parent = upcast(RunForked.TYPE, 1, dict(cp.parent))
        cp.steps = {
            s["step"]: StepRecord(**{k: v for k, v in s.items() if k in _STEP_FIELDS}) for s in data.get("steps", [])
        }
        return cp

    def remaining(self, budget: str) -> float | None:
        limit = self.limits.get(budget)
        return None if limit is None else limit - self.spent[budget]


_CHECKPOINT_FIELDS = [f.name for f in fields(Checkpoint)]
_CHECKPOINT_FIELD_SET = frozenset(_CHECKPOINT_FIELDS)
_STEP_FIELDS = frozenset(f.name for f in fields(StepRecord))


@functools.lru_cache(maxsize=4096)
def _ts(text: str) -> dt.datetime:
    # Memoised: a segment's start is parsed again with every event of the segment.
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _seconds_between(start: str, end: str) -> float:
    # ``end`` is a new event's ts at nearly every call: parsed as it is (fromisoformat reads a "Z"
    # since Python 3.11; the same aware datetime), not memoised, where the memo's miss, its
    # insertion and an eviction of the segment starts it holds cost more than the parse.
    stop = dt.datetime.fromisoformat(end)
    return max(0.0, (stop - _ts(start)).total_seconds())


def fold(events: Iterable[Recorded | Event], *, upto_step: int | None = None, check_chain: bool = True) -> Checkpoint:
    """Fold a run's events, in order, into its checkpoint.

    ``upto_step`` stops before the first event that belongs to a later step (the
    checkpoint "at step K"). Raises ChainError on a gap, a reordering or a broken
    hash link when ``check_chain`` is set.
    """
    cp = Checkpoint()
    for item in events:
        rec = item if isinstance(item, Recorded) else Recorded(item)
        step = rec.event.step
        if upto_step is not None and step is not None and step > upto_step:
            break
        apply(cp, rec, check_chain=check_chain)
    return cp


# The status readers show for a run whose record the fold refused (``fold_until_refused``).
BROKEN = "broken"


def fold_error(exc: Exception, rec: Recorded) -> str:
    """Why the fold refused ``rec`` (``exc`` raised by ``apply``), as every reader reports it."""
    if isinstance(exc, ChainError):
        return str(exc)
    return f"event {rec.event.seq} (stream sequence {rec.stream_seq}): {type(exc).__name__}: {exc}"


def quarantine_error(run_id: str, run_subject: str, subject: str, stream_seq: int) -> str | None:
    """Why bytes quarantined on ``subject`` (not a valid event; the reason is the quarantine's) break the run whose own
    writer appends to ``run_subject``, as every reader reports it (the run is then ``broken``, its
    ``fold_error`` this text); None when they do not: on another writer's subject of the run they are
    a stray, reported and stepped over (a worker's garbage never breaks an agent's run). Bytes on its
    own subject break its record even at its end, where they leave no gap: what the run's writer
    wrote there is lost, and nothing can tell whether it was the run's next event."""
    if subject != run_subject:
        return None
    return f"run {run_id}: stream sequence {stream_seq} on its own subject is not a valid event (quarantined)"


def fold_until_refused(events: Iterable[Recorded]) -> tuple[Checkpoint, str | None]:
    """``fold`` with the chain checked, stopping at the first break in it instead of raising (a
    message refused from its writer, ``refusal``, is stepped over and listed in ``cp.refused``).

    Returns the checkpoint as far as the fold got and why it stopped (``fold_error``), or None
    when every event folded. A run whose record is broken so (a gap where an event was
    quarantined, a forked chain, a value the fold cannot use) cannot be resumed; the projection
    (``runs.fold_error``), ``runledger runs`` and ``runledger show`` all fold it this way and call
    it ``broken``, so they agree on its status.
    """
    cp = Checkpoint()
    for rec in events:
        try:
            apply(cp, rec)
        except Exception as exc:  # whatever the fold raises: the record is broken here
            return cp, fold_error(exc, rec)
    return cp, None


# Who may say what (runledger.log.subjects): an operator's decisions travel only on a run's operator
# subject (``...<run_id>.o``), which only operators may publish to, and nothing else travels there.
# A retry of a failed run is one of them: within a run the agent retries a call only as its Retry
# policy and the run's budgets allow (runledger.sdk.retry); once the run has failed, only an operator
# lets it go on (docs/data-protection.md, "Decisions").
OPERATOR_TYPES = frozenset({"approval.resolved", "budget.granted", "version.accepted", "run.erased", "run.retried"})
_RUN_SUBJECT_PREFIX = "ledger.run."


@functools.lru_cache(maxsize=4096)  # asked at every event; a run's subjects repeat
def _run_subject_parts(subject: str) -> tuple[str, str, str] | None:
    """(agent, run_id, writer) of a run subject; None for any other subject."""
    if not subject.startswith(_RUN_SUBJECT_PREFIX):
        return None
    parts = subject.split(".")
    return (parts[2], parts[3], parts[4]) if len(parts) == 5 else None


def refusal(cp: Checkpoint, rec: Recorded) -> str | None:
    """Why ``rec`` may not be folded into the run ``cp`` holds (None: it may), judged by its subject.

    A refused message is a forgery or a stray, never a break in the run's history: readers quarantine
    it and report it (``Checkpoint.refused``, ``verify``, the projection's ``quarantine``, ``show``) and
    fold the run on without it, so nobody who may publish on some subject of a run can make it
    unreadable. The rules (docs/data-protection.md, "Who may write what"):

    - the envelope matches its subject: the run id, and the agent (``run.started``'s ``agent`` too);
    - one agent a run id: the first accepted message fixes the run's agent, whose run id it is (writers
      claim an id with their run.started, fenced on every agent's subjects of it:
      runledger.log.subjects.fence_for); whatever another agent writes under the id is refused, named;
    - the run's writer is the writer of its ``run.started`` (``a`` its agent, ``w`` a worker's branch);
      a run never starts on the operator's subject (a message before any ``run.started`` is judged by
      the chain: the fold breaks the run there, as a gap);
    - an operator's decision (``OPERATOR_TYPES``) only on the operator's subject (``o``), which carries
      nothing else; everything else only from the run's own writer. A branch's worker may copy its
      parent's recorded approvals into the branch (``approval.resolved`` on ``w``).

    Accepting a ``run.started`` records the run's writer in ``cp`` (its agent, the subject's, is
    ``cp.agent`` once it is folded); nothing else changes."""
    parts = _run_subject_parts(rec.subject)
    if parts is None:
        return None
    agent, run_id, writer = parts
    ev = rec.event
    if ev.run_id != run_id:
        return f"{ev.type} names run {ev.run_id!r} on the subject of run {run_id!r} (a forged envelope)"
    if ev.agent != agent:
        return f"{ev.type} names agent {ev.agent!r} on a subject of agent {agent!r} (a forged envelope)"
    if not cp.writer:
        if ev.type == "run.started":
            if writer == OPERATOR_WRITER:
                return "a run cannot start on the operator's subject"
            if ev.payload.get("agent") != agent:
                return f"run.started names agent {ev.payload.get('agent')!r} on a subject of agent {agent!r} (forged)"
            cp.writer, cp.agent = writer, agent  # the agent as run.started's own handler sets it
            return None
        if not (cp.next_seq and writer != OPERATOR_WRITER and agent == cp.agent):
            # No run.started yet (it was quarantined, or never written): no writer to judge by. Not a
            # forgery to step over but a run that does not start: the fold's chain check breaks it.
            return None
        cp.writer = writer  # a checkpoint folded without subjects (a live run's) learns whose the run is
    if agent != cp.agent:
        return (f"{ev.type} by agent {agent!r} under run id {run_id!r}, which is agent {cp.agent!r}'s (its first "
                "run.started): a run id is its first agent's, and no other agent writes under it")  # fmt: skip
    if writer == OPERATOR_WRITER:
        if ev.type not in OPERATOR_TYPES:
            return f"{ev.type} on the operator's subject, which carries only operator decisions"
        return None
    if writer != cp.writer:
        return f"{ev.type} written as {writer!r} in a run written by {cp.writer!r}"
    if ev.type in OPERATOR_TYPES and not (ev.type == "approval.resolved" and writer == WORKER_WRITER):
        return (f"{ev.type} is an operator's decision: it is valid only on the run's operator subject, "
                "where only operators may write (a forged decision)")  # fmt: skip
    return None


def check_writer(cp: Checkpoint, rec: Recorded) -> None:
    """``refusal`` as an error: ChainError when ``rec`` may not be folded into ``cp``."""
    reason = refusal(cp, rec)
    if reason is not None:
        ev = rec.event
        raise ChainError(ev.run_id, ev.seq, rec.stream_seq, reason)


def split_refused(records: Iterable[Recorded]) -> tuple[list[Recorded], list[tuple[Recorded, str]]]:
    """A run's records as a reader finds them: those the fold accepts from their writers, and those it
    refuses (``refusal``) with why, in stream order. Chain breaks are not judged here (the fold's)."""
    writers = Checkpoint()
    accepted: list[Recorded] = []
    refused: list[tuple[Recorded, str]] = []
    for rec in records:
        reason = refusal(writers, rec)
        if reason is None:
            accepted.append(rec)
        else:
            refused.append((rec, reason))
    return accepted, refused


def apply(cp: Checkpoint, rec: Recorded, *, check_chain: bool = True) -> str | None:
    """Fold one more event into ``cp`` (in place: the building block of ``fold``).

    Returns why the event was refused (``refusal``: recorded in ``cp.refused``, nothing else folded
    but the stream position, which a writer fences on), or None when it was folded. Raises
    ChainError, when ``check_chain``, on a gap, a reordering or a broken hash link."""
    ev = rec.event
    if rec.subject:
        reason = refusal(cp, rec)
        if reason is not None:
            cp.refused.append(f"stream seq {rec.stream_seq}: {reason}")
            if rec.stream_seq > cp.last_stream_seq:
                cp.last_stream_seq = rec.stream_seq
            return reason
    if check_chain:
        if ev.seq != cp.next_seq:
            raise ChainError(ev.run_id, ev.seq, rec.stream_seq, f"expected seq {cp.next_seq}: gap or reorder")
        if ev.prev_hash != cp.last_hash:
            raise ChainError(ev.run_id, ev.seq, rec.stream_seq, "prev_hash does not link to the previous event")
        if not cp.writer and ev.type != "run.started" and rec.subject.startswith(_RUN_SUBJECT_PREFIX):
            raise ChainError(ev.run_id, ev.seq, rec.stream_seq, f"{ev.type} before the run's run.started")
    cp.next_seq = ev.seq + 1
    cp.last_hash = ev.hash
    if rec.stream_seq:
        cp.last_stream_seq = rec.stream_seq
    cp.last_ts = ev.ts
    p = ev.payload
    handler = _HANDLERS.get(ev.type)
    if handler is not None:
        handler(cp, ev, p)
    step = p.get("step")
    if isinstance(step, int) and step > cp.last_step:
        cp.last_step = step
    if cp.segment_start is not None:
        cp.spent["seconds"] = cp.seconds_closed + _seconds_between(cp.segment_start, ev.ts)
    return None


def _run_started(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    cp.run_id, cp.agent = ev.run_id, p["agent"]
    cp.version = p["version"]
    cp.status = "running"
    cp.input = p.get("input")
    cp.capture = p.get("capture", "full")
    cp.chain_format = p.get("chain_format") or 1
    cp.digest_scheme = p.get("digest_scheme") or 1
    budgets = p.get("budgets") or {}
    cp.limits = {k: budgets.get(k) for k in ("turns", "tokens", "seconds")}
    cp.started_at = cp.segment_start = ev.ts
    cp.child_of_run_id, cp.child_of_step = p.get("parent_run_id"), p.get("parent_step")
    cp.holder = p.get("holder")
    cp.tool_listings = list(p.get("tool_listings") or [])


def _run_forked(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    # The fold reads stored payloads: a version-1 run.forked is lifted here (its bytes stay as stored).
    cp.parent = dict(p) if ev.schema_version >= RunForked.VERSION else upcast(ev.type, ev.schema_version, dict(p))


def _close_segment(cp: Checkpoint, at: str | None = None) -> None:
    """End the live segment, at ``at`` (the run's own closing event) or at its last event so far."""
    if cp.segment_start is not None:
        if at is not None:
            cp.spent["seconds"] = cp.seconds_closed + _seconds_between(cp.segment_start, at)
        cp.seconds_closed = cp.spent["seconds"]
        cp.segment_start = None


def _operator_event(handler: Any) -> Any:
    """Wrap the handler of an event an operator records (possibly hours later): it is not the run's time."""

    def handle(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
        _close_segment(cp)
        handler(cp, ev, p)

    return handle


def _run_resumed(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    # Close the previous live segment at its last event: downtime is not spend.
    _close_segment(cp)
    cp.segment_start = ev.ts
    cp.attempts = p["attempt"]
    cp.status = "running"
    cp.holder = p.get("holder")


def _run_suspended(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    cp.status = "suspended"
    _close_segment(cp, ev.ts)  # waiting for an operator is not the run's time


def _run_completed(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    cp.status, cp.output, cp.ended_at = "completed", p.get("output"), ev.ts
    _close_segment(cp, ev.ts)


def _run_failed(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    cp.status, cp.error, cp.failure_reason, cp.ended_at = "failed", p["error"], p["reason"], ev.ts
    cp.failure_retryable, cp.failed_step, cp.failure_shape = (
        bool(p.get("retryable")),
        p.get("step"),
        p.get("message_shape"),
    )
    _close_segment(cp, ev.ts)


def _run_retried(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    """An operator's retry (only from the operator's subject, ``OPERATOR_TYPES``): the run goes on from
    its failed step, and a failed call there is run again, live, on resume."""
    cp.status, cp.error, cp.failure_reason, cp.failure_retryable, cp.ended_at = "running", None, None, False, None
    cp.failure_shape = None
    rec = cp.steps.get(p["step"]) if p.get("step") is not None else None
    if rec is not None and rec.kind in ("model", "tool") and rec.status == "error":
        rec.status = "retrying"


def _model_called(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    usage = p.get("usage") or {}
    tokens = int(usage.get("input_tokens", 0)) + int(usage.get("output_tokens", 0))
    if not p.get("will_retry"):  # a retried attempt is not a turn: the step's last attempt is
        cp.spent["turns"] += 1
    cp.spent["tokens"] += tokens
    cp.steps[p["step"]] = StepRecord(
        step=p["step"],
        kind="model",
        name=p["model"],
        args_digest=p["args_digest"],
        status=_call_status(p),
        seq=ev.seq,
        output=None if p.get("response") is None else {**p["response"], "usage": usage},
        error=p.get("error"),
        tokens=tokens,
        duration_ms=p.get("duration_ms", 0.0),
        ts=ev.ts,
        attempts=p.get("attempt", 1),
    )
    if not p.get("will_retry"):
        cp.messages.append({"step": p["step"], "seq": ev.seq})


def _tool_called(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    cp.steps[p["step"]] = StepRecord(
        step=p["step"],
        kind="tool",
        name=p["name"],
        args_digest=p["args_digest"],
        status=_call_status(p),
        seq=ev.seq,
        output=p.get("output"),
        error=p.get("error"),
        duration_ms=p.get("duration_ms", 0.0),
        ts=ev.ts,
        attempts=p.get("attempt", 1),
    )


def _value(kind: str) -> Any:
    def handle(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
        cp.steps[p["step"]] = StepRecord(
            step=p["step"],
            kind=kind,
            name=kind,
            args_digest="",
            status="ok",
            seq=ev.seq,
            output=p["value"],
            ts=ev.ts,
        )

    return handle


def _effect_intended(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    cp.steps[p["step"]] = StepRecord(
        step=p["step"],
        kind="effect",
        name=p["name"],
        args_digest=p["args_digest"],
        status="intended",
        seq=ev.seq,
        key=p["key"],
        ts=ev.ts,
    )
    if p["key"] not in cp.in_doubt_keys:
        cp.in_doubt_keys.append(p["key"])


def _effect_outcome(status: str) -> Any:
    def handle(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
        key = p["key"]
        rec = cp.steps.get(p["step"])
        if rec is not None and rec.key == key:
            rec.status = status
            rec.seq = ev.seq
            rec.output = p.get("result")
            rec.error = p.get("error")
            rec.duration_ms = p.get("duration_ms", 0.0)
        if key in cp.in_doubt_keys:
            cp.in_doubt_keys.remove(key)
        if status == "committed" and key not in cp.committed_keys:
            cp.committed_keys.append(key)

    return handle


def _effect_simulated(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    cp.steps[p["step"]] = StepRecord(
        step=p["step"],
        kind="effect",
        name=p["name"],
        args_digest="",
        status="simulated",
        seq=ev.seq,
        output=p.get("result"),
        key=p["key"],
        ts=ev.ts,
    )
    cp.simulated_keys.append(p["key"])


def _child_started(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    cp.steps[p["step"]] = StepRecord(
        step=p["step"],
        kind="child",
        name=p["agent"],
        args_digest=p["args_digest"],
        status="started",
        seq=ev.seq,
        child_run_id=p["run_id"],
        ts=ev.ts,
    )


def _child_outcome(status: str) -> Any:
    def handle(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
        rec = cp.steps.get(p["step"])
        if rec is None or rec.kind != "child" or rec.child_run_id != p["run_id"]:
            return  # an outcome of no child this run started at that step changes nothing
        rec.status = status
        rec.seq = ev.seq
        rec.output = p.get("output")
        rec.error = None if p.get("error") is None else {**p["error"], "reason": p.get("reason")}
        rec.duration_ms = _seconds_between(rec.ts, ev.ts) * 1000 if rec.ts else 0.0

    return handle


def _approval_requested(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    step = p["step"]
    previous = cp.steps.get(step)
    if previous is not None and previous.request_id in cp.pending_approvals:
        del cp.pending_approvals[previous.request_id]  # superseded by a changed request
    cp.steps[step] = StepRecord(
        step=step,
        kind="approval",
        name=p["action"],
        args_digest=p["digest"],
        status="pending",
        seq=ev.seq,
        request_id=p["request_id"],
        ts=ev.ts,
    )
    cp.pending_approvals[p["request_id"]] = {
        "request_id": p["request_id"],
        "step": step,
        "action": p["action"],
        "args": p["args"],
        "digest": p["digest"],
    }


def _approval_resolved(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    pending = cp.pending_approvals.get(p["request_id"])
    if pending is None or pending["digest"] != p["digest"]:
        return  # a decision about another request (or another digest) approves nothing
    del cp.pending_approvals[p["request_id"]]
    rec = cp.steps.get(pending["step"])
    if rec is not None:
        rec.status = "approved" if p["approved"] else "denied"
        rec.output = {"approved": p["approved"], "by": p["by"], "reason": p.get("reason", "")}


def _budget_granted(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    for budget in ("turns", "tokens", "seconds"):
        extra = p.get(budget) or 0
        if extra and cp.limits.get(budget) is not None:
            cp.limits[budget] = (cp.limits[budget] or 0) + extra
    if cp.status == "failed" and cp.failure_reason == "budget_exhausted":
        cp.status = "running"  # a grant re-opens a run stopped by its budget; resume continues it


def _version_accepted(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    if cp.version is not None:
        cp.version = {**cp.version, "agent_version": p["agent_version"]}


def _run_erased(cp: Checkpoint, ev: Event, p: dict[str, Any]) -> None:
    cp.erased = {"by": p["by"], "reason": p["reason"], "ts": ev.ts}
    if p.get("because_of") is not None:  # erased because a run it derives from was (a cascade)
        cp.erased["because_of"] = p["because_of"]


_HANDLERS: dict[str, Any] = {
    "run.started": _run_started,
    "run.forked": _run_forked,
    "run.resumed": _run_resumed,
    "run.suspended": _run_suspended,
    "run.completed": _run_completed,
    "run.failed": _run_failed,
    "run.retried": _operator_event(_run_retried),
    "model.called": _model_called,
    "tool.called": _tool_called,
    "clock.read": _value("clock"),
    "random.drawn": _value("random"),
    "effect.intended": _effect_intended,
    "effect.committed": _effect_outcome("committed"),
    "effect.failed": _effect_outcome("failed"),
    "effect.simulated": _effect_simulated,
    "child.started": _child_started,
    "child.completed": _child_outcome("completed"),
    "child.failed": _child_outcome("failed"),
    "approval.requested": _approval_requested,
    "approval.resolved": _operator_event(_approval_resolved),
    "budget.granted": _operator_event(_budget_granted),
    "version.accepted": _operator_event(_version_accepted),
    "run.erased": _operator_event(_run_erased),
}
