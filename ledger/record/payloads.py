"""Payloads: the typed, frozen, versioned body of every event type, their registry and upcasters.

Each event type is one ``Payload`` subclass with a stable ``TYPE`` string and a ``VERSION``
(the envelope's ``schema_version``); ``PAYLOADS`` registers them by type. Old schema versions are
lifted by upcasters ``(type, from_version) -> fn(payload) -> payload`` before validation.

This module owns the payload models; ``runledger.record.events`` owns the envelope (``Event``),
the hash chain, ``make_event`` and ``decode``, and re-exports these names for its importers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from runledger.errors import EventDecodeError
from runledger.record.budgets import Budgets as Budgets
from runledger.record.failures import message_shape
from runledger.record.versions import VersionTuple as VersionTuple

# VersionTuple and Budgets, which RunStarted embeds, are defined in runledger.record.versions and
# runledger.record.budgets (an AgentSpec needs them, not the models below) and are importable from here.


class Payload(BaseModel):
    """Base of every event payload. Subclasses set TYPE and VERSION and are registered."""

    # defer_build: a model's validator and serializer are built at its first use, not at import (a
    # command that reads five event types builds five of the thirty): 3% of `runledger runs`' start.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1


class ErrorInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    type: str
    message: str
    traceback: str | None = None
    retryable: bool = False  # of a kind a retry may cure (runledger.sdk.retry): a 429, a timeout


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    input_tokens: int = 0
    output_tokens: int = 0


class Server(BaseModel):
    """Where a call went over the network: the host and port only (``server.address`` /
    ``server.port`` of OpenTelemetry's conventions), never a path, a query or credentials
    (``server_of`` builds one from a URL)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    address: str
    port: int | None = None


def _absent(data: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """``data`` without the optional ``names`` that have no value: a payload that does not use a field
    added later records exactly the bytes it recorded before the field existed."""
    for name in names:
        if name in data and data[name] is None:
            del data[name]
    return data


class ToolListing(BaseModel):
    """One listing of tools made outside the code (an MCP server's ``tools/list``), as the run's
    tools were declared from it: ``source`` names its kind (``"mcp"``), ``listing`` is the listing
    as JSON, in the form its declarer reads back (runledger.sdk.deferred_tools)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    source: str
    listing: Any = None


class RunStarted(Payload):
    """``parent_run_id`` / ``parent_step``: for a child run (``await run.child(spec, input)``), the
    run and step that started it (the step's ``child.started``); absent from the payload of every
    other run, so a run that is not a child records exactly what it recorded before children existed.

    ``chain_format``: the canonical JSON every hash and digest of this run is computed over
    (runledger.record.canonical: 2 is RFC 8785); absent means 1, the form of runs recorded before
    chain formats existed. ``digest_scheme``: how the run digests content (runledger.record.digests:
    2 is HMAC-SHA256 under the run's digest key, which erasure destroys); absent means 1, plain sha256,
    the digests of runs recorded before keyed digests and of runs without keys.

    ``tool_listings``: the listings the run's tools were declared from, when some were listed from
    outside the code (``DeferredTools``: an MCP server's), in the spec's order, so that a resume
    declares the same tools from the record instead of listing their source again (it lists the
    source only before the first live call of one of them). Structure, not content: tool names,
    descriptions and schemas, like the hashes of the version tuple they back. Absent when there is
    none, so every other run records exactly what it recorded before listings were."""

    TYPE = "run.started"
    agent: str
    version: VersionTuple
    budgets: Budgets = Budgets()
    input: Any = None
    capture: Literal["full", "redacted", "hash-only"] = "full"
    labels: dict[str, str] = Field(default_factory=dict)
    parent_run_id: str | None = None
    parent_step: int | None = None
    chain_format: int | None = Field(default=None, ge=2, le=2)
    digest_scheme: int | None = Field(default=None, ge=2, le=2)
    # The process that drives the run from here (runledger.sdk.holder): `runs` shows a running run
    # whose holder is certainly gone as stalled. Absent from runs recorded before it was.
    holder: str | None = None
    tool_listings: list[ToolListing] | None = None

    @model_serializer(mode="wrap")
    def _without_absent_parent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in ("parent_run_id", "parent_step", "chain_format", "digest_scheme", "holder", "tool_listings"):
            if data.get(name, 0) is None:
                del data[name]
        return data


class RunForked(Payload):
    """Recorded right after run.started in a branch: where it came from and what changed.

    ``request``: the re-run request that opened the branch (``runledger.sandbox.rerun.RerunRequest``
    as JSON: the agent named, mode and base mode, the change, ``allow_effects``, live tools, time
    limit, request id), so that resuming the branch re-drives it in a sandbox under its own rules
    (``runledger.sandbox.resume``). Absent from the payload of branches recorded before it existed,
    which therefore record exactly what they recorded then.

    ``forked_from``: the run this branch was forked from (its fork parent). Schema version 1 named
    it ``parent_run_id``, the name ``run.started`` gives a child's parent; the upcaster below lifts
    a version-1 payload by renaming the key (the stored bytes, which the hash chain covers, keep it)."""

    TYPE = "run.forked"
    VERSION = 2
    forked_from: str
    fork_step: int
    mode: Literal["replay", "redrive", "live", "counterfactual"]
    changed: str | None = None
    changed_from: Any = None
    changed_to: Any = None
    request: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _without_absent_request(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("request", 0) is None:
            del data["request"]
        return data


class RunResumed(Payload):
    """``holder``: the process that drives the run from here (as in ``run.started``; absent before it was)."""

    TYPE = "run.resumed"
    attempt: int
    from_step: int
    worker: str = ""
    holder: str | None = None

    @model_serializer(mode="wrap")
    def _without_absent_holder(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("holder", 0) is None:
            del data["holder"]
        return data


class RunSuspended(Payload):
    TYPE = "run.suspended"
    step: int
    request_id: str
    reason: str = "approval"


class RunCompleted(Payload):
    """The run finished; ``output`` is what the agent returned."""

    TYPE = "run.completed"
    output: Any = None


class RunFailed(Payload):
    """``message_shape``: sha256 hex of the error message with its numbers, ids, hex digests and quoted
    values masked (runledger.record.failures: the message's part of the run's class of failure), computed
    from the plain message before it is sealed; structure, like an ``args_digest``. Absent from the
    payload of runs recorded before it existed (and of writers that do not compute it), which therefore
    record exactly what they recorded then. ``RunFailed.of`` computes it."""

    TYPE = "run.failed"
    reason: Literal[
        "exception", "budget_exhausted", "approval_denied", "nondeterminism", "effect_in_doubt", "diverged", "sandbox"
    ]
    error: ErrorInfo
    step: int | None = None
    retryable: bool = False  # the failure was of a retryable kind: `runledger resume RUN --retry` continues it
    message_shape: str | None = None

    @classmethod
    def of(cls, reason: Any, error: ErrorInfo, step: int | None = None, *, retryable: bool = False) -> RunFailed:
        """The ``run.failed`` of ``error``, its ``message_shape`` computed from the plain message."""
        return cls(reason=reason, error=error, step=step, retryable=retryable,
                   message_shape=message_shape(error.message))  # fmt: skip

    @model_serializer(mode="wrap")
    def _without_absent_shape(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("message_shape", 0) is None:
            del data["message_shape"]
        return data


class RunRetried(Payload):
    """An operator retries a run that failed retryably: its failed step runs again, live."""

    TYPE = "run.retried"
    step: int | None = None
    by: str
    reason: str = ""


class ModelCalled(Payload):
    """``server``: the host and port the adapter sent the call to, when it called one over HTTP
    (absent otherwise, and from calls recorded before it was)."""

    TYPE = "model.called"
    step: int
    model: str
    request: dict[str, Any]
    args_digest: str
    response: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    usage: Usage = Usage()
    duration_ms: float = 0.0
    attempt: int = 1  # attempts of one step are events of the same step (runledger.sdk.retry)
    will_retry: bool = False  # this attempt failed and another one follows
    server: Server | None = None

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _absent(handler(self), ("server",))


class ToolCalled(Payload):
    """``description``: the tool's description as declared (``Tool.description``, else its function's
    docstring), structure like its name. ``via``: how the tool was reached when it is another
    process's (an MCP server's ``tools/call``: ``protocol``, ``method``, ``transport``, ``session_id``,
    ``protocol_version``, ``request_id``, ``server``). Both absent when unknown, and from calls
    recorded before they were."""

    TYPE = "tool.called"
    step: int
    name: str
    args: Any
    args_digest: str
    output: Any = None
    error: ErrorInfo | None = None
    duration_ms: float = 0.0
    attempt: int = 1
    will_retry: bool = False
    description: str | None = None
    via: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _absent(handler(self), ("description", "via"))


class ClockRead(Payload):
    TYPE = "clock.read"
    step: int
    value: str


class RandomDrawn(Payload):
    TYPE = "random.drawn"
    step: int
    value: float


class EffectIntended(Payload):
    """The run's intent (on the run's subject) and the claim of the key (on the key's subject).

    ``lease_s``: how long, from this event's ``ts``, the claimant may take to record an outcome;
    until then a resume or an operator waits before settling the claim (None: a claim recorded
    before leases existed, settled without waiting). ``tool_call_id``: the model's id of the tool
    call this effect answers, when there is one. ``description``, ``via``: as ``tool.called``'s
    (absent when unknown)."""

    TYPE = "effect.intended"
    step: int
    name: str
    key: str
    args: Any
    args_digest: str
    effect_class: Literal["read", "write", "irreversible"] = "write"
    lease_s: float | None = None
    tool_call_id: str | None = None
    holder: str | None = None  # the claiming process (runledger.sdk.holder): a dead one is not waited for
    description: str | None = None
    via: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _without_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _absent(handler(self), ("description", "via"))


class EffectCommitted(Payload):
    """``fencing_token``: the stream sequence of the claim this outcome belongs to (the attempt
    that acted), when it was recorded by the claimant (None for an outcome taken from the record or
    from a resolution, and in events recorded before fencing tokens)."""

    TYPE = "effect.committed"
    step: int
    key: str
    result: Any = None
    duration_ms: float = 0.0
    via: Literal["act", "reconcile", "operator", "record"] = "act"
    fencing_token: int | None = None


class EffectFailed(Payload):
    TYPE = "effect.failed"
    step: int
    key: str
    error: ErrorInfo
    fencing_token: int | None = None  # as in effect.committed


class EffectResolved(Payload):
    """An in-doubt effect settled by an operator or a reconcile function.

    ``forced``: settled while the claim's lease had not expired (``runledger effects resolve
    --force``): its holder may still be alive, and is fenced out by this event."""

    TYPE = "effect.resolved"
    key: str
    outcome: Literal["committed", "not_committed"]
    by: str
    reason: str = ""
    result: Any = None
    forced: bool = False


class EffectSimulated(Payload):
    TYPE = "effect.simulated"
    step: int
    name: str
    key: str
    args: Any
    result: Any = None


class ChildStarted(Payload):
    """A child run is about to start (or be resumed) as step ``step``: recorded before the child's
    own ``run.started`` (which names this run and step), so a resume finds the child by ``run_id``
    (derived from this run's id and the step) whatever moment a crash came at. ``args_digest``: of
    the child's input (the input itself is recorded, as content, in the child's ``run.started``)."""

    TYPE = "child.started"
    step: int
    run_id: str
    agent: str
    args_digest: str


class ChildCompleted(Payload):
    """The child run ``run_id`` completed; its output is step ``step``'s result."""

    TYPE = "child.completed"
    step: int
    run_id: str
    output: Any = None


class ChildFailed(Payload):
    """The child run ``run_id`` failed (``reason``: its ``run.failed`` reason); the step raises
    ``ChildFailedError`` in the parent, live and on every replay."""

    TYPE = "child.failed"
    step: int
    run_id: str
    reason: str
    error: ErrorInfo


class ApprovalRequested(Payload):
    TYPE = "approval.requested"
    step: int
    request_id: str
    action: str
    args: Any
    digest: str


class ApprovalResolved(Payload):
    TYPE = "approval.resolved"
    request_id: str
    digest: str
    approved: bool
    by: str
    reason: str = ""


class BudgetGranted(Payload):
    TYPE = "budget.granted"
    turns: int = 0
    tokens: int = 0
    seconds: float = 0.0
    by: str
    reason: str = ""


class VersionAccepted(Payload):
    """An operator accepted a new ``agent_version`` for a recorded run (a hotfix to continue it).

    Resume compares the code's version tuple with the accepted one from here on; journal replay
    still checks every recorded step, so an incompatible change stops at its first divergent step."""

    TYPE = "version.accepted"
    agent_version: str
    previous: str
    by: str
    reason: str = ""


class RunErased(Payload):
    """A run's content was erased: its data key destroyed (content sealed under it is unreadable
    everywhere) and its blobs deleted. The events themselves stay, so the hash chain verifies.

    ``because_of`` / ``derived_from`` / ``relation``: for a run erased because a run it derives
    from was (a branch, ``run.forked``, or a child, ``run.child``, at any depth: the erasure
    cascades), the run whose erasure was asked for, the run this one was branched or started
    from, and which of the two it is. Absent from the payload of a run erased for itself, so
    such an erasure records exactly what it recorded before erasure cascaded."""

    TYPE = "run.erased"
    reason: str
    by: str
    kid: str
    keys_destroyed: bool = True
    blobs_deleted: int = 0
    plaintext_events: int = 0  # events whose content was recorded unsealed: erasure cannot reach them
    because_of: str | None = None
    derived_from: str | None = None
    relation: Literal["branch", "child"] | None = None

    @model_serializer(mode="wrap")
    def _without_absent_cause(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for name in ("because_of", "derived_from", "relation"):
            if data.get(name, 0) is None:
                del data[name]
        return data


class JournalSnapshotted(Payload):
    """A snapshot of the run's journal, so a resume reads it and the events after it instead of
    the whole run (runledger.sdk.snapshot). Structure only: it changes no state of the fold.

    The journal is the checkpoint folded from every event before this one, its content opened as
    the run's key opens it, as JSON sealed under the run's data key like any content and stored
    by reference in the object store (``journal``: a blob reference, named by the sha256 of the
    stored bytes). ``head_seq`` / ``head_hash`` /
    ``head_stream_seq``: the last event it summarizes (this event's ``seq - 1`` and ``prev_hash``)
    and where the stream stored it; ``steps``: how many steps the journal holds."""

    TYPE = "journal.snapshotted"
    head_seq: int
    head_hash: str
    head_stream_seq: int
    steps: int
    journal: dict[str, Any]


class GraphCheckpointed(Payload):
    """A LangGraph checkpoint of the thread this run records (runledger.integrations.langgraph).

    Structure, in the clear: the thread, the checkpoint namespace (``""`` for the root graph, a
    subgraph's otherwise), the checkpoint's id and its parent's, its ``source`` and graph step
    ``graph_step`` (from its metadata), ``forked`` when the parent is not the latest checkpoint of
    its namespace (time travel: a run from a past checkpoint, or a state update on one), its
    ``header`` (format, id, time, channel versions, versions seen, updated channels: what LangGraph
    schedules with, which no redaction may touch; and ``metadata.run_id``, the LangGraph run id of the
    metadata, an id), the ``new_versions`` it stores values for and the
    ``channels`` of those values. Content: ``values`` (one serialized value a channel, in
    ``channels`` order), ``metadata``, and ``checkpoint`` (any other field of the checkpoint)."""

    TYPE = "graph.checkpointed"
    thread_id: str
    checkpoint_ns: str = ""
    checkpoint_id: str
    parent_checkpoint_id: str | None = None
    source: str | None = None
    graph_step: int | None = None
    forked: bool = False
    header: dict[str, Any] = Field(default_factory=dict)
    new_versions: dict[str, Any] = Field(default_factory=dict)
    channels: list[str] = Field(default_factory=list)
    values: Any = None
    metadata: Any = None
    checkpoint: Any = None


class GraphWritesSaved(Payload):
    """Pending writes of one LangGraph task against a checkpoint (runledger.integrations.langgraph):
    what a task wrote before the next checkpoint, so a resumed graph does not run it again.
    ``channels`` (structure) names the channel of each write; ``writes`` (content) holds the values."""

    TYPE = "graph.writes_saved"
    thread_id: str
    checkpoint_ns: str = ""
    checkpoint_id: str
    task_id: str
    task_path: str = ""
    channels: list[str] = Field(default_factory=list)
    writes: Any = None


class GraphCheckpointsDeleted(Payload):
    """LangGraph checkpoints of the thread this run records, deleted (``delete_for_runs``, ``prune``
    of runledger.integrations.langgraph): a tombstone. The log is append-only, so the checkpoints'
    events stay, readable as before by whoever may read the run; a saver reading the thread back
    honours the tombstone and no longer returns them or their pending writes. ``checkpoints`` maps
    each namespace to the ids deleted from it; ``reason`` names the call (``delete_for_runs``,
    ``prune``), ``run_ids`` the LangGraph run ids a ``delete_for_runs`` was given."""

    TYPE = "graph.checkpoints_deleted"
    thread_id: str
    checkpoints: dict[str, list[str]] = Field(default_factory=dict)
    reason: str
    run_ids: list[str] = Field(default_factory=list)


class WorkflowCheckpointed(Payload):
    """A checkpoint of a Microsoft Agent Framework workflow, taken at a superstep boundary, on the
    run that records its lineage (runledger.integrations.agent_framework).

    Structure, in the clear: the workflow's name, the checkpoint's id and its parent's
    (``previous_checkpoint_id``: the lineage the framework chains), the hash of the workflow's
    graph (the framework refuses to restore a checkpoint into another graph), the superstep it
    sits on (``iteration_count``), the framework's own timestamp and format ``version``, and
    ``forked`` when the parent is not the latest checkpoint of the run (a resume from an older
    checkpoint). Content: ``checkpoint``, the rest of the checkpoint (messages between executors,
    committed state, pending requests, metadata) in the framework's checkpoint encoding."""

    TYPE = "workflow.checkpointed"
    workflow_name: str
    checkpoint_id: str
    previous_checkpoint_id: str | None = None
    graph_signature_hash: str
    iteration_count: int = 0
    timestamp: str
    version: str = "1.0"
    forked: bool = False
    checkpoint: Any = None


class WorkflowCheckpointDeleted(Payload):
    """A Microsoft Agent Framework checkpoint of this run, deleted (``CheckpointStorage.delete``): a
    tombstone. The log is append-only: the checkpoint's event stays, readable by whoever may read
    the run; the storage reading the run back honours the tombstone and no longer returns it."""

    TYPE = "workflow.checkpoint_deleted"
    workflow_name: str
    checkpoint_id: str


PAYLOADS: dict[str, type[Payload]] = {
    cls.TYPE: cls
    for cls in (
        RunStarted,
        RunForked,
        RunResumed,
        RunSuspended,
        RunCompleted,
        RunFailed,
        RunRetried,
        ModelCalled,
        ToolCalled,
        ClockRead,
        RandomDrawn,
        EffectIntended,
        EffectCommitted,
        EffectFailed,
        EffectResolved,
        EffectSimulated,
        ChildStarted,
        ChildCompleted,
        ChildFailed,
        ApprovalRequested,
        ApprovalResolved,
        BudgetGranted,
        VersionAccepted,
        RunErased,
        JournalSnapshotted,
        GraphCheckpointed,
        GraphWritesSaved,
        GraphCheckpointsDeleted,
        WorkflowCheckpointed,
        WorkflowCheckpointDeleted,
    )
}

# (type, from_version) -> function lifting a payload dict to from_version + 1.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcaster(type_: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register ``fn`` as the upcaster of ``type_`` payloads from ``from_version`` to the next."""

    def register(fn: Upcaster) -> Upcaster:
        UPCASTERS[(type_, from_version)] = fn
        return fn

    return register


def upcast(type_: str, version: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Lift ``payload`` from ``version`` to the current version of ``type_``."""
    current = PAYLOADS[type_].VERSION
    while version < current:
        step = UPCASTERS.get((type_, version))
        if step is None:
            raise EventDecodeError(f"no upcaster for {type_!r} from schema_version {version}")
        payload = step(payload)
        version += 1
    return payload


@upcaster("run.forked", 1)
def _run_forked_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """run.forked 1 -> 2: the fork parent's ``parent_run_id`` is ``forked_from``."""
    return {("forked_from" if k == "parent_run_id" else k): v for k, v in payload.items()}
