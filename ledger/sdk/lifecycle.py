"""Starting and resuming runs: the lifecycle around an agent function.

``start`` records ``run.started`` and drives the function live. ``resume`` folds the
run's events into a checkpoint (from its last journal snapshot on: runledger.sdk.snapshot),
refuses a different version tuple, records ``run.resumed`` fenced on the run's last event
(so of two concurrent resumes exactly one proceeds), then drives the function again from
the top with the checkpoint as its journal. Outcomes are recorded as ``run.completed``,
``run.failed`` or ``run.suspended`` (a long run's followed by a journal snapshot); nothing
is recorded when this process lost the right to write (fenced) or the code no longer
matches the record (that is the caller's error, not the run's outcome).
"""

from __future__ import annotations

import difflib
import gc
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from runledger.errors import (
    ApprovalDeniedError,
    BranchOnHostError,
    BudgetExhaustedError,
    ChildSuspendedError,
    ConfigurationError,
    EffectClaimedElsewhereError,
    EffectInDoubtError,
    FencedError,
    LedgerError,
    NondeterminismError,
    PublishError,
    RunIdTakenError,
    RunNotFoundError,
    SuspendedForApprovalError,
    ToolFailedError,
    VersionMismatchError,
)
from runledger.log.append import append_to_run
from runledger.log.client import LedgerClient
from runledger.log.publish import RetryPolicy, SubjectWriter
from runledger.log.reader import RunLog, agents_of, run_id_holders
from runledger.log.subjects import AGENT_WRITER, WORKER_WRITER, Writer, parse_run_subject, run_subject, writer_of
from runledger.log.window import Window, WindowedWriter
from runledger.protect.capture import (
    DataPolicy,
    PayloadOpener,
    PayloadProtector,
    client_opener,
    is_placeholder,
    run_protector,
)
from runledger.protect.loading import load_run
from runledger.record.canonical import CHAIN_FORMAT, as_recorded, jsonable, recorded_chain_format
from runledger.record.digests import KEYED_DIGESTS, recorded_digest_scheme
from runledger.record.events import (
    Budgets,
    Payload,
    RunCompleted,
    RunFailed,
    RunForked,
    RunResumed,
    RunRetried,
    RunStarted,
    ToolListing,
    VersionAccepted,
)
from runledger.record.fold import Checkpoint, fold
from runledger.record.ids import new_id
from runledger.record.records import Recorded
from runledger.record.versions import differing, identity
from runledger.sdk.agent import AgentSpec
from runledger.sdk.context import naming_run
from runledger.sdk.crashpoints import crash_point, pause_point
from runledger.sdk.deferred_tools import declared_for_run
from runledger.sdk.holder import this_holder
from runledger.sdk.run import RecordedRun, error_info, new_digest_scheme
from runledger.sdk.snapshot import SNAPSHOT, JournalLoad, JournalSnapshotter, load_journal


@dataclass
class RunResult:
    """How a drive of a run ended. ``status``: completed | failed | suspended."""

    run_id: str
    status: str
    output: Any = None
    error: str | None = None
    reason: str | None = None
    pending: list[str] = field(default_factory=list)
    resumed: bool = False
    nothing_to_do: bool = False
    retryable: bool = False  # a failed run that ``resume --retry`` may continue (run.failed ``retryable``)


def _writer(
    client: LedgerClient,
    subject: str,
    cp: Checkpoint,
    policy: RetryPolicy,
    protector: PayloadProtector | None = None,
    spec: AgentSpec | None = None,
) -> SubjectWriter:
    """The run's writer, appending to ``subject`` (``ledger.run.<agent>.<run_id>.<writer>``): one
    that acknowledges in windows when ``spec`` asks for output durability (runledger.log.window)."""
    parsed = parse_run_subject(subject)
    assert parsed is not None, subject
    agent, run_id = parsed
    transform = None if protector is None else protector.protect
    if spec is not None and spec.durability == "output":
        return WindowedWriter(
            client.nc, client.js, subject, run_id=run_id, agent=agent, msg_id_prefix=run_id, next_seq=cp.next_seq,
            prev_hash=cp.last_hash, last_stream_seq=cp.last_stream_seq, policy=policy, transform=transform,
            chain_format=cp.chain_format, window=Window(spec.window_events, spec.window_ms),
        )  # fmt: skip
    return SubjectWriter(
        client.js,
        subject,
        run_id=run_id,
        agent=agent,
        msg_id_prefix=run_id,
        next_seq=cp.next_seq,
        prev_hash=cp.last_hash,
        last_stream_seq=cp.last_stream_seq,
        policy=policy,
        transform=transform,
        chain_format=cp.chain_format,
    )


async def start_run(
    client: LedgerClient,
    spec: AgentSpec,
    input: Any = None,
    *,
    run_id: str | None = None,
    budgets: Budgets | None = None,
    labels: dict[str, str] | None = None,
    fork: RunForked | None = None,
    policy: RetryPolicy = RetryPolicy(),
    data_policy: DataPolicy | None = None,
    parent_run_id: str | None = None,
    parent_step: int | None = None,
    writer: Writer = AGENT_WRITER,
) -> RunResult:
    """Record a new run of ``spec`` and drive it live to an outcome.

    ``writer``: who writes the run (runledger.log.subjects): its agent, or a worker (``"w"``) for
    a run it starts itself (a re-run's branch).

    ``data_policy`` (default: the spec's) says what the record keeps of content (runledger.protect.capture).
    ``parent_run_id`` / ``parent_step``: the run and step this run is a child of (``run.child``
    passes them; recorded in ``run.started``)."""
    run_id = run_id or new_id()
    with naming_run(run_id):
        cp = Checkpoint(chain_format=CHAIN_FORMAT)
        data = data_policy or spec.data_policy
        protector = await run_protector(client, spec.name, run_id, data, worker=writer == WORKER_WRITER)
        cp.digest_scheme = new_digest_scheme(protector)
        appender = _writer(client, run_subject(spec.name, run_id, writer), cp, policy, protector, spec)
        run = RecordedRun(client, spec, appender, cp, policy=policy, protector=protector)
        run._child_driver = _drive_child
        run._snapshots = JournalSnapshotter()
        run._input = as_recorded(jsonable(input), cp.chain_format)  # the agent sees the input as a resume will
        started = RunStarted(
            agent=spec.name,
            version=spec.version(),
            budgets=budgets or spec.budgets,
            input=run._input,
            capture=data.capture,
            labels=labels or {},
            parent_run_id=parent_run_id,
            parent_step=parent_step,
            chain_format=recorded_chain_format(cp.chain_format),
            digest_scheme=recorded_digest_scheme(cp.digest_scheme),
            holder=this_holder() or None,
            tool_listings=_tool_listings(spec),
        )
        # The run id is this process's (its agent's claim, acknowledged) before any work.
        await claim_run(client, run, spec.name, run_id, [started] if fork is None else [started, fork])
        crash_point("run:started")
        return await drive(run, spec)


async def claim_run(client: LedgerClient, run: RecordedRun, agent: str, run_id: str, first: list[Payload]) -> None:
    """Append a new run's first events and wait until they are acknowledged. The first claims the
    run id for ``agent`` (it is fenced on every agent's subjects of the id: runledger.log.subjects.fence_for),
    so nothing of the run is done before the id is its own.

    Raises RunIdTakenError, naming the agents that hold messages under the id, when the id is taken
    (by another agent, or by a run of this agent's: resume that one); nothing was recorded."""
    try:
        for body in first:
            await run._append(body)
        await run.commit()  # a no-op in step durability
    except FencedError as exc:
        if exc.expected != 0 or isinstance(exc, RunIdTakenError):
            raise  # not the claim: something was written to the run after its first message
        try:
            holders = agents_of(await run_id_holders(client, run_id))
        except (TimeoutError, LedgerError):  # the refusal stands; only its naming of the holders is lost
            holders = []
        raise RunIdTakenError(run_id, agent, holders) from exc


def _tool_listings(spec: AgentSpec) -> list[ToolListing] | None:
    """The listings ``spec``'s tools were declared from, as ``run.started`` records them."""
    listings = spec.tool_listings()
    return None if listings is None else [ToolListing.model_validate(entry) for entry in listings]


@dataclass(frozen=True)
class RetryRequest:
    """An operator's retry of a run that failed on a retryable error (recorded on resume, on the run's
    operator subject: only operators may retry a failed run, ``runledger.ops.decisions.retry_run``)."""

    by: str
    reason: str = ""


@dataclass(frozen=True)
class VersionAcceptance:
    """An operator's acceptance of a new ``agent_version`` for a recorded run (recorded on resume)."""

    agent_version: str
    by: str
    reason: str = ""


async def resume_run(
    client: LedgerClient,
    spec: AgentSpec,
    run_id: str,
    *,
    policy: RetryPolicy = RetryPolicy(),
    accept_version: VersionAcceptance | None = None,
    retry: RetryRequest | None = None,
    from_snapshot: bool = True,
) -> RunResult:
    """Resume a crashed or suspended run on the same run id, fenced, replaying its journal.

    The journal is read from the run's last journal snapshot and the events after it
    (runledger.sdk.snapshot), or from every event of the run when it has none that verifies (or
    ``from_snapshot`` is False): the same checkpoint either way.

    The code's version tuple must be the recorded one. ``accept_version`` lets an operator
    continue the run with another ``agent_version`` (a hotfix): it must name the version the code
    has, only that element may differ, and the acceptance is recorded (``version.accepted``)
    before the run resumes. Replay still checks every recorded step against the new code.
    ``retry`` continues a run that failed on a retryable error (``run.failed`` ``retryable``):
    recorded as ``run.retried``, and the failed step runs again, live. Both are operator decisions,
    recorded on the run's operator subject (``runledger.ops.decisions``): with credentials that may not
    write there (an agent's), this raises ConfigurationError naming the operator's command, and a
    resume after the operator decided needs neither.

    A branch (a re-run's run, written by a worker) is never driven here: BranchOnHostError, before
    anything is written (it is resumed in a sandbox, ``runledger.sandbox.resume``).

    The cyclic garbage collector is paused from the read to the first live step (or the end of
    the drive): loading and replaying allocates tens of thousands of objects that all stay
    alive, which triggered a full collection in most 1,000-step resumes (~35 ms each, a quarter
    of the resume, bench.resume). Reference counting still frees everything acyclic meanwhile."""
    with naming_run(run_id):
        end_pause = _pause_gc()
        try:
            resumption = await _Resumption.load(client, spec, run_id, policy, from_snapshot)
            refuse_branch(run_id, resumption.log, resumption.cp)
            settled = await resumption.settled_result(retry)
            if settled is not None:
                return settled
            resumption.check_retryable(retry)
            await resumption.record_decisions(accept_version, retry)
            cp = resumption.cp
            if cp.pending_approvals:
                return RunResult(
                    run_id, "suspended", reason="approval", pending=sorted(cp.pending_approvals), nothing_to_do=True
                )
            run = await resumption.fenced_run(end_pause)
            return await resumption.drive(run)
        finally:
            end_pause()


@dataclass
class _Resumption:
    """One resume between its phases: load the journal, settle what needs no drive, record the
    operator's decisions, open the run fenced, drive it.

    ``log`` holds every event of the run when ``whole``, else the journal snapshot and the events
    after it (``journal``); ``cp`` is their checkpoint. Recording a decision reads the whole run again."""

    client: LedgerClient
    spec: AgentSpec
    run_id: str
    policy: RetryPolicy
    # Content stays sealed while loading: the journal opens each recorded value only when its
    # step is replayed (opening 1,000 steps eagerly tripled the resume time).
    opener: PayloadOpener
    log: RunLog
    cp: Checkpoint
    whole: bool
    journal: JournalLoad | None

    @classmethod
    async def load(
        cls, client: LedgerClient, spec: AgentSpec, run_id: str, policy: RetryPolicy, from_snapshot: bool
    ) -> _Resumption:
        """Read the run from its last journal snapshot and the events after it
        (runledger.sdk.snapshot), else (none verifies, or not ``from_snapshot``) every event."""
        opener = client_opener(client)
        journal = await load_journal(client, run_id, spec.name, opener) if from_snapshot else None
        # The run's tools listed from outside the code are declared from its record (AgentSpec.from_record):
        # their sources are listed only before a live call of one of them.
        if journal is not None:
            cp = journal.checkpoint
            return cls(client, spec.from_record(cp.tool_listings), run_id, policy, opener, journal.log, cp, False,
                       journal)  # fmt: skip
        log = await _read_whole(client, run_id, spec.name)
        cp = fold(log.records)
        return cls(client, spec.from_record(cp.tool_listings), run_id, policy, opener, log, cp, True, None)

    async def settled_result(self, retry: RetryRequest | None) -> RunResult | None:
        """The result of a run with nothing to resume: completed, or failed and not being retried."""
        cp, opener = self.cp, self.opener
        if cp.status == "completed":
            output = await opener.open_value(cp.output, strict=False)
            return RunResult(self.run_id, "completed", output=output, nothing_to_do=True)
        if cp.status == "failed" and retry is None:
            error = await opener.open_value(cp.error, strict=False)
            message = error.get("message") if isinstance(error, dict) else None
            if isinstance(message, str):
                message = await opener.open_text(message, strict=False)  # a sealed error text reads as written
            return RunResult(
                self.run_id, "failed", error=message, reason=cp.failure_reason, nothing_to_do=True,
                retryable=cp.failure_retryable,
            )  # fmt: skip
        return None

    def check_retryable(self, retry: RetryRequest | None) -> None:
        """Raise ConfigurationError when ``retry`` asks to continue a run that did not fail retryably."""
        cp = self.cp
        if retry is not None and not (cp.status == "failed" and cp.failure_retryable):
            raise ConfigurationError(
                f"run {self.run_id} is {cp.status}"
                + (f" ({cp.failure_reason}, a final failure)" if cp.status == "failed" else "")
                + ": --retry continues only a run that failed on a retryable error (a rate limit, a timeout); "
                "fork a branch to try something else"
            )

    async def record_decisions(self, accept_version: VersionAcceptance | None, retry: RetryRequest | None) -> None:
        """Check the code's version tuple against the recorded one (raises when they differ and no
        acceptance covers it), then record the acceptance and the retry, each an operator's decision
        on the run's operator subject, reading the run again after each."""
        run_id = self.run_id
        # Compared by the rule the run was recorded under (runledger.sdk.agent.AgentSpec.version_like).
        current = self.spec.version_like(self.cp.version).model_dump()
        accepted = _acceptance(run_id, self.cp.version or {}, current, accept_version)
        if accepted is not None:
            await self._record_decision(
                accepted,
                f"accepting version {accepted.agent_version!r} for run {run_id}",
                f"runledger accept-version {run_id} {accepted.agent_version} --by NAME --reason ...",
                "--accept-version",
            )
        if retry is not None:
            # An operator's decision too (runledger.record.fold.OPERATOR_TYPES): on the operator's subject.
            await self._record_decision(
                RunRetried(step=self.cp.failed_step, by=retry.by, reason=retry.reason),
                f"retrying run {run_id}",
                f"runledger retry {run_id} --by NAME --reason ...",
                "--retry",
            )

    async def _record_decision(
        self, decision: VersionAccepted | RunRetried, what: str, command: str, flag: str
    ) -> None:
        """Append ``decision`` on the run's operator subject, which only operators may write, and read
        the whole run again. A refused write raises ConfigurationError naming the operator's ``command``."""
        try:
            await append_to_run(self.client, self.run_id, decision, self.policy, log=self.log if self.whole else None)
        except PublishError as exc:
            raise ConfigurationError(
                f"{what} was refused ({exc}): it is an operator's decision. With operator credentials run "
                f"`{command}`, then resume without {flag}"
            ) from exc
        self.log = await load_run(self.client, self.run_id, agent=self.log.agent or None, open_content=False)
        self.cp, self.whole, self.journal = fold(self.log.records), True, None

    async def fenced_run(self, end_pause: Callable[[], None]) -> RecordedRun:
        """The RecordedRun that goes on from the checkpoint, fenced on the last event the server has,
        with ``run.resumed`` committed: of two resumes, the fenced-out one stops here."""
        client, spec, log, cp, journal, opener = self.client, self.spec, self.log, self.cp, self.journal, self.opener
        _refuse_quarantined_break(log, cp)  # garbage on the run's own subject: broken from there, as readers say
        cp.last_stream_seq = log.last_stream_seq  # fence on what the server has, garbage included
        pause_point("resume:loaded")
        # The run keeps the capture mode it was started with, whatever the code now says.
        data = replace(spec.data_policy, capture=cp.capture)  # type: ignore[arg-type]
        worker = writer_of(log.subject) == WORKER_WRITER
        # The run's keys were read with its snapshot: not read (nor created and refused) a second time.
        known = None if journal is None else journal.keys
        protector = await run_protector(client, log.agent or spec.name, self.run_id, data, worker=worker, known=known,
                                        digests=cp.digest_scheme == KEYED_DIGESTS)  # fmt: skip
        writer = _writer(client, log.subject, cp, self.policy, protector, spec)
        run = RecordedRun(client, spec, writer, cp, policy=self.policy, protector=protector)
        run._child_driver = _drive_child
        run._snapshots = JournalSnapshotter(journal.snapshot_seq + 1 if journal else _after_snapshot(log.records))
        if protector.keys is not None:
            opener.remember(protector.keys)  # the run's keys are at hand: no second fetch from the key store
        run._opener = opener  # one opener (and key cache) for the input and every replayed step
        run._input = await opener.open_value(cp.input, strict=False)
        await run._append(
            RunResumed(
                attempt=cp.attempts + 1,
                from_step=cp.last_step,
                worker=f"{socket.gethostname()}:{os.getpid()}",
                holder=this_holder() or None,
            )
        )
        await run.commit()  # of two resumes, the fenced-out one stops before any live work
        run._segment_wall = time.time()
        run._seconds_at_segment = cp.spent["seconds"]
        run._on_live = end_pause  # the agent's own live work runs with the collector on
        return run

    async def drive(self, run: RecordedRun) -> RunResult:
        """Drive the agent over the replayed journal into live steps. A step that differs from its
        record raises NondeterminismError with both side by side."""
        try:
            result = await drive(run, self.spec)
        except NondeterminismError as exc:
            if exc.run_id != self.run_id:
                raise  # a child's (run.child), already side by side with the child's own record
            whole = self.log if self.whole else await _read_whole(self.client, self.run_id, self.spec.name)
            raise exc.with_detail(await side_by_side(whole.records, exc, self.opener)) from None
        result.resumed = True
        return result


def refuse_branch(run_id: str, log: RunLog, cp: Checkpoint) -> None:
    """Raise BranchOnHostError when the run is a branch: forked from another run (``run.forked``) or
    written by a worker. Its tools and effects would run here for real, whatever its mode said."""
    if cp.parent is not None or writer_of(log.subject) == WORKER_WRITER:
        parent = cp.parent or {}
        raise BranchOnHostError(run_id, str(parent.get("forked_from") or ""), str(parent.get("mode") or ""))


async def _read_whole(client: LedgerClient, run_id: str, agent: str) -> RunLog:
    """Every event of the run, content sealed. Raises RunNotFoundError."""
    try:
        # The agent's own subject first: the only one an agent role may read (runledger.protect.roles).
        return await load_run(client, run_id, agent=agent, open_content=False)
    except RunNotFoundError:
        return await load_run(client, run_id, open_content=False)


def _refuse_quarantined_break(log: RunLog, cp: Checkpoint) -> None:
    """Raise ChainError when the run's own subject holds bytes that are not a valid event after its
    first event (runledger.record.fold.quarantine_error): its record is broken from there, as
    ``runs``, ``show`` and the projection say, and a resume would write past what nobody can read."""
    from runledger.errors import ChainError, EventDecodeError
    from runledger.record.events import decode_fast

    first = log.records[0].stream_seq if log.records else 0
    for q in log.quarantined:
        if q.subject != log.subject or q.stream_seq < first:
            continue
        try:
            decode_fast(q.raw)  # a valid event refused from its writer: a stray, never a break
        except EventDecodeError:
            raise ChainError(
                log.run_id, cp.next_seq, q.stream_seq,
                "bytes on the run's own subject that are not a valid event (quarantined: `runledger show RUN` "
                "lists them): its record is broken from there and it cannot be resumed",
            ) from None  # fmt: skip


def _after_snapshot(records: list[Recorded]) -> int:
    """The seq right after the run's last journal snapshot in ``records`` (0 when there is none)."""
    for rec in reversed(records):
        if rec.event.type == SNAPSHOT:
            return rec.event.seq + 1
    return 0


async def open_run(
    client: LedgerClient,
    spec: AgentSpec,
    run_id: str,
    input: Any = None,
    *,
    labels: dict[str, str] | None = None,
    policy: RetryPolicy = RetryPolicy(),
) -> RecordedRun:
    """Open ``run_id`` for a framework that recovers by its own means (a LangGraph thread resumes
    from its checkpoints, runledger.integrations.langgraph) and return its ``RecordedRun``.

    A run without events is started (``run.started`` with ``input`` and ``labels``); one that has
    events is continued on the same id, fenced like ``resume_run``, recording ``run.resumed`` (a
    completed run is re-opened: the fold shows it running again until its next outcome). Unlike
    ``resume_run`` nothing is driven and nothing is replayed: the caller's Run calls take step
    numbers after the last recorded one and run live (effects still go through the effect ledger,
    so a key committed before a crash is never acted on twice, and an effect an earlier attempt left
    intended is settled on its own step: waited for, reconciled or claimed anew), and ``RecordedRun.record`` appends
    the framework's own events. The version tuple is recorded at the start and not checked after.
    Raises FencedError (through the first append) when another process holds the run."""
    try:
        log = await load_run(client, run_id, agent=spec.name, open_content=False)
    except RunNotFoundError:
        cp = Checkpoint(chain_format=CHAIN_FORMAT)
        protector = await run_protector(client, spec.name, run_id, spec.data_policy)
        cp.digest_scheme = new_digest_scheme(protector)
        writer = _writer(client, run_subject(spec.name, run_id), cp, policy, protector, spec)
        run = RecordedRun(client, spec, writer, cp, policy=policy, protector=protector)
        run._child_driver = _drive_child
        run._snapshots = JournalSnapshotter()
        run._input = as_recorded(jsonable(input), cp.chain_format)
        started = RunStarted(
            agent=spec.name, version=spec.version(), budgets=spec.budgets, input=run._input,
            capture=spec.data_policy.capture, labels=labels or {}, chain_format=recorded_chain_format(cp.chain_format),
            digest_scheme=recorded_digest_scheme(cp.digest_scheme), holder=this_holder() or None,
            tool_listings=_tool_listings(spec),
        )  # fmt: skip
        await claim_run(client, run, spec.name, run_id, [started])
        return run
    cp = fold(log.records)
    refuse_branch(run_id, log, cp)  # a branch goes on only in a sandbox
    cp.last_stream_seq = log.last_stream_seq
    data = replace(spec.data_policy, capture=cp.capture)  # type: ignore[arg-type]
    keyed = cp.digest_scheme == KEYED_DIGESTS
    protector = await run_protector(client, log.agent or spec.name, run_id, data, digests=keyed)
    writer = _writer(client, log.subject, cp, policy, protector, spec)
    run = RecordedRun(client, spec, writer, cp, policy=policy, protector=protector)
    run._child_driver = _drive_child
    run._snapshots = JournalSnapshotter(_after_snapshot(log.records))
    run._next_step = cp.last_step + 1  # continue after the journal: nothing is replayed
    run._continuing = True
    await run._append(
        RunResumed(
            attempt=cp.attempts + 1,
            from_step=cp.last_step,
            worker=f"{socket.gethostname()}:{os.getpid()}",
            holder=this_holder() or None,
        )
    )
    await run.commit()
    run._segment_wall = time.time()
    run._seconds_at_segment = cp.spent["seconds"]
    return run


async def _drive_child(
    parent: RecordedRun, spec: AgentSpec, child_id: str, input: Any, step: int, resume: bool
) -> RunResult:
    """Drive the child run ``child_id`` of ``parent``'s step ``step`` to an outcome (``RecordedRun.child``).

    ``resume``: the parent recorded the step's ``child.started`` in an earlier attempt, so the child
    may exist: it is resumed (fenced; a child that already ended just reports its outcome), and
    started with that id only when it never recorded its ``run.started``. The child runs in this
    process and event loop, on the parent's connection and retry policy, with its own spec's
    budgets and data policy. A child whose code no longer matches its record raises (not the
    parent's outcome: ``drive`` leaves the parent as recorded)."""
    if resume:
        try:
            return await resume_run(parent._client, spec, child_id, policy=parent._policy)
        except RunNotFoundError:
            pass  # the parent stopped between its child.started and the child's run.started
    return await start_run(
        parent._client, spec, input, run_id=child_id, policy=parent._policy, parent_run_id=parent.run_id,
        parent_step=step,
    )  # fmt: skip


def _acceptance(
    run_id: str, recorded: dict[str, Any], current: dict[str, Any], accept: VersionAcceptance | None
) -> VersionAccepted | None:
    """The ``version.accepted`` event to record, or None when the tuples agree; raises when they
    differ in a way no acceptance covers."""
    differs = differing(recorded, current)  # like with like: the code hash beside a declared version is not compared
    if not differs:
        return None
    if accept is None or differs != ["agent_version"]:  # only the code's version can be accepted
        raise VersionMismatchError(run_id, identity(recorded), identity(current))
    if accept.agent_version != current["agent_version"]:
        raise ConfigurationError(
            f"--accept-version {accept.agent_version!r} is not the version of the code given "
            f"({current['agent_version']!r}): accept the version you are resuming with"
        )
    return VersionAccepted(
        agent_version=accept.agent_version, previous=str(recorded.get("agent_version")), by=accept.by,
        reason=accept.reason,
    )  # fmt: skip


# Where each kind of step records the arguments its digest covers.
_ARGS_OF: dict[str, Callable[[dict[str, Any]], Any]] = {
    "model.called": lambda p: p.get("request"),
    "tool.called": lambda p: p.get("args"),
    "effect.intended": lambda p: p.get("args"),
    "effect.simulated": lambda p: p.get("args"),
}
_DIFF_LINES = 40


async def side_by_side(records: list[Recorded], exc: NondeterminismError, opener: PayloadOpener) -> str:
    """The recorded call's arguments against the new ones, as a unified diff (bounded)."""
    recorded: Any = None
    for rec in records:
        payload = rec.event.payload
        if payload.get("step") == exc.step and rec.event.type in _ARGS_OF:
            recorded = await opener.open_value(_ARGS_OF[rec.event.type](payload), strict=False)
            break
    if recorded is None and exc.attempted_args is None:
        return ""
    if is_placeholder(recorded):
        return "the recorded arguments are not readable with these credentials (sealed or erased)"
    lines = list(
        difflib.unified_diff(
            json.dumps(recorded, indent=1, sort_keys=True, default=str).splitlines(),
            json.dumps(exc.attempted_args, indent=1, sort_keys=True, default=str).splitlines(),
            fromfile=f"recorded step {exc.step}",
            tofile="this replay",
            lineterm="",
        )
    )
    if len(lines) > _DIFF_LINES:
        lines = [*lines[:_DIFF_LINES], f"... {len(lines) - _DIFF_LINES} more lines"]
    return "\n".join(lines) if lines else "the arguments are equal: the kind or the name differs"


_gc_pauses = 0
_gc_was_enabled = False


def _pause_gc() -> Callable[[], None]:
    """Disable the cyclic collector until every pause taken in this process has ended.

    Returns the function that ends this pause (idempotent). The collector is turned back on
    only if it was on when the first pause began."""
    global _gc_pauses, _gc_was_enabled
    if _gc_pauses == 0:
        _gc_was_enabled = gc.isenabled()
        gc.disable()
    _gc_pauses += 1
    ended = False

    def end() -> None:
        global _gc_pauses
        nonlocal ended
        if ended:
            return
        ended = True
        _gc_pauses -= 1
        if _gc_pauses == 0 and _gc_was_enabled:
            gc.enable()

    return end


async def drive(run: RecordedRun, spec: AgentSpec, *, record_nondeterminism: bool = False) -> RunResult:
    """Call the agent function with ``run`` and record how it ended (acknowledged before this
    returns, in either durability: the outcome is what leaves the process).

    An exception may carry ``failure_reason`` (e.g. the sandbox's "sandbox") to name the
    reason recorded in ``run.failed``. A NondeterminismError (reason "nondeterminism", or
    "diverged" for a re-drive past its fork point) is recorded only when
    ``record_nondeterminism`` (a branch, whose code is the point of the experiment); on resume
    it is the caller's error and leaves the run as it was. A suspended child run (``run.child``,
    ChildSuspendedError) suspends the run (reason ``child``); a child's VersionMismatchError is
    the caller's error too.
    """
    with declared_for_run(spec.restored):  # an integration's tools as this run declared them (deferred_tools)
        result = await _drive(run, spec, record_nondeterminism)
    if result.status == "suspended" and run._snapshots is not None:
        await run._snapshots.at_suspension(run)  # so that its resume reads the snapshot and the tail
    await run.commit()
    return result


async def _call_agent(run: RecordedRun, spec: AgentSpec) -> Any:
    """The agent's output, unless the run refused a live call (``RecordedRun._live_refusal``: its tools'
    source changed or cannot be listed): that refusal is raised, whatever the agent's code did with it."""
    try:
        output = await spec.fn(run)
    except Exception:
        if run._live_refusal is not None:
            raise run._live_refusal from None
        raise
    if run._live_refusal is not None:
        raise run._live_refusal
    return output


async def _drive(run: RecordedRun, spec: AgentSpec, record_nondeterminism: bool) -> RunResult:
    try:
        output = await _call_agent(run, spec)
    except SuspendedForApprovalError as exc:
        return RunResult(run.run_id, "suspended", reason="approval", error=str(exc), pending=[exc.request_id])
    except ChildSuspendedError as exc:
        return RunResult(run.run_id, "suspended", reason="child", error=str(exc), pending=list(exc.pending))
    except VersionMismatchError:
        # A child's code does not match its record (run.child), or a resumed run's tools' source changed
        # before a live call to it (deferred_tools): the caller's error, as on resume.
        raise
    except (EffectInDoubtError, EffectClaimedElsewhereError) as exc:
        return RunResult(run.run_id, "suspended", reason="effect_in_doubt", error=str(exc))
    except PublishError:
        raise  # this process may not write: the run stays as recorded
    except NondeterminismError as exc:
        if not record_nondeterminism:
            raise
        return await _fail(run, exc.failure_reason, exc, with_traceback=False)
    except BudgetExhaustedError as exc:
        return await _fail(run, "budget_exhausted", exc, with_traceback=False)
    except ApprovalDeniedError as exc:
        return await _fail(run, "approval_denied", exc, with_traceback=False)
    except Exception as exc:
        if exc is run._live_refusal:
            raise  # a live call refused before anything of it was recorded (its tools' source is down)
        return await _fail(run, getattr(exc, "failure_reason", "exception"), exc, with_traceback=True)
    output = jsonable(output)
    await run._mirrored()  # an effect's record on its way (output durability) lands before the run's end
    await run._append(RunCompleted(output=output))
    return RunResult(run.run_id, "completed", output=output)


async def _fail(run: RecordedRun, reason: str, exc: Exception, *, with_traceback: bool) -> RunResult:
    # A call that failed on a retryable kind of error (after its own retries) fails the run
    # retryably: `runledger resume RUN --retry` runs that step again.
    retryable = bool(getattr(exc, "retryable", False))
    failed_step = exc.step if isinstance(exc, ToolFailedError) else run.checkpoint.last_step
    await run._mirrored()  # an effect's record on its way (output durability) lands before the run's end
    await run._append(
        RunFailed.of(reason, error_info(exc, with_traceback, retryable=retryable), failed_step, retryable=retryable)
    )
    message = str(exc) if reason != "exception" else f"{type(exc).__name__}: {exc}"
    return RunResult(run.run_id, "failed", error=message, reason=reason)
