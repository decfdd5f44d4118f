"""A checkpoint storage for Microsoft Agent Framework workflows on the ledger: each superstep's checkpoint is an event.

``RunledgerCheckpointStorage(client)`` implements the framework's ``CheckpointStorage`` protocol
(``save``, ``load``, ``list_checkpoints``, ``list_checkpoint_ids``, ``get_latest``, ``delete``): pass
it to ``WorkflowBuilder(checkpoint_storage=...)`` or to ``workflow.run(..., checkpoint_storage=...)``.
The framework checkpoints a workflow before its first superstep (the entry checkpoint, holding the
input) and after every superstep; each checkpoint is appended, fenced and acknowledged before
``save`` returns (write-ahead), as a ``workflow.checkpointed`` event of the run that records its
lineage, redacted and sealed like every run's content, by reference in the object store when large.

Runs. A checkpoint names its parent (``previous_checkpoint_id``): the framework chains the
checkpoints of one execution, and a workflow resumed from a checkpoint goes on chaining from it. A
checkpoint without a parent (or whose parent this storage never held) opens a new run, ``af-`` and
its checkpoint id, whose ``run.started`` records the version tuple (agent ``agent-framework`` unless
given, its declared ``agent_version``) and a label with the workflow's name; every later checkpoint
of the lineage is appended to the run of its parent. So ``runledger runs``, ``show``, ``verify``,
the projection and the page see one run for one execution, resumes included (``run.resumed`` in
between), and a resume from an older checkpoint is recorded with ``forked: true``. A checkpoint
with no messages left to deliver is the last of an execution: the run is recorded ``completed``
then (``suspended`` when requests wait for responses); a later save on its lineage re-opens it.

Recovery is the framework's own: a new process builds the same workflow, finds the latest checkpoint
(``await storage.get_latest(workflow_name=...)``, read from the log) and runs
``workflow.run(checkpoint_id=..., checkpoint_storage=storage)``. The run is continued fenced
(``open_run``): a second process continuing the same run stops at its next append with
FencedError. (The framework logs a checkpoint that failed to save as a warning and goes on; a
fenced zombie therefore keeps running without checkpoints, and its effects are still refused.)

Side effects. The framework restores a workflow to a superstep boundary: an executor that ran in
the superstep a crash interrupted runs again on resume, side effect included. What makes an
executor's side effect happen once is the effect ledger: ``await storage.effect(name, args,
key=..., fn=...)`` inside the executor claims the key before acting and records the outcome, so
the executor run again after a crash gets the recorded result back instead of acting a second time
(a claim left without an outcome is settled by ``reconcile`` or stops as in doubt). The effect is a
step of the run of the checkpoint this storage saved or loaded last: one workflow execution at a
time per storage instance.

Values. Checkpoints are recorded in the framework's own checkpoint encoding (JSON, with values
JSON cannot hold pickled and base64-encoded), imported from ``agent_framework._workflows``: the one
encoding every storage of the framework shares, whose decoder applies the framework's allow-list of
types (``allowed_checkpoint_types``, ``register_checkpoint_type``) as FileCheckpointStorage does.
Rejected: a pickle of our own (it would bypass that allow-list) and a transcoding into runledger's
JSON as the LangGraph saver does for msgpack (the framework's objects are pickles, opaque either way).
A pickled value is sealed with the rest of the content but redaction cannot read inside it; a
checkpoint read back is the recorded form, with the keys of its dicts in canonical order.

Deleting a checkpoint records a tombstone (``workflow.checkpoint_deleted``): the storage no longer
returns the checkpoint, its event stays in the log; erase the run (``runledger erase``) to make
its content unreadable.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runledger import require_extra

require_extra("agent-framework", "runledger.integrations.agent_framework")

from agent_framework import WorkflowCheckpoint, WorkflowCheckpointException  # noqa: E402

# The framework's checkpoint encoding, shared by its storages (module docstring: why).
from agent_framework._workflows._checkpoint_encoding import (  # noqa: E402
    decode_checkpoint_value,
    encode_checkpoint_value,
)

from runledger import (  # noqa: E402
    AgentSpec,
    ConfigurationError,
    DataPolicy,
    LedgerClient,
    ModelResponse,
    RecordedRun,
    RunCompleted,
    RunNotFoundError,
    RunSuspended,
    WorkflowCheckpointDeleted,
    WorkflowCheckpointed,
    is_subject_token,
    list_runs,
    load_run,
    open_run,
)

DEFAULT_AGENT = "agent-framework"
WORKFLOW_LABEL = "agent_framework.workflow_name"
# The fields of a checkpoint recorded in the clear (structure); the others are its content.
_STRUCTURE = ("workflow_name", "checkpoint_id", "previous_checkpoint_id", "graph_signature_hash",
              "iteration_count", "timestamp", "version")  # fmt: skip


def lineage_run_id(checkpoint_id: str) -> str:
    """The run that records the lineage whose first checkpoint is ``checkpoint_id``: ``af-`` and the id
    when it can stand in a subject, else ``af-`` and a digest of it."""
    ok = is_subject_token(checkpoint_id) and len(checkpoint_id) <= 100
    return "af-" + (checkpoint_id if ok else hashlib.sha256(checkpoint_id.encode()).hexdigest()[:32])


class _WorkflowModel:
    """The version tuple's model of a workflow's run: the framework's agents call their own clients."""

    name = "agent-framework"

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        raise ConfigurationError("a workflow's run records checkpoints and effects, not model calls")


async def _no_agent_function(run: Any) -> None:
    raise ConfigurationError(
        "a Microsoft Agent Framework workflow's run is driven by the workflow: resume it with "
        "workflow.run(checkpoint_id=..., checkpoint_storage=RunledgerCheckpointStorage(...))"
    )


@dataclass
class _Entry:
    """One checkpoint as recorded: its run, its structure and its content (the framework's encoding)."""

    run_id: str
    position: int  # the event's sequence number in its run
    structure: dict[str, Any]
    content: Any


@dataclass
class _Lineage:
    """One run of this storage: its checkpoints in log order, and its writer once opened."""

    run_id: str
    workflow_name: str
    checkpoints: list[str] = field(default_factory=list)
    run: RecordedRun | None = None
    at_rest: bool = False  # its last outcome is recorded (completed, suspended): the next append re-opens it
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class RunledgerCheckpointStorage:
    """The framework's ``CheckpointStorage`` on the ledger (see the module docstring).

    ``client``: a connected ``LedgerClient``; every method runs on its event loop. ``agent``: the
    agent name the runs are recorded under (a subject token). ``agent_version``: the version the
    runs declare (default ``agent-framework``). ``data_policy``: what the record keeps of content
    (redacted and sealed by default; ``hash-only`` is refused: a storage reads its values back).
    ``allowed_checkpoint_types``: the types beyond the framework's safe set that loading may
    rebuild, ``"module:qualname"`` strings, as for FileCheckpointStorage."""

    def __init__(
        self,
        client: LedgerClient,
        *,
        agent: str = DEFAULT_AGENT,
        agent_version: str | None = None,
        data_policy: DataPolicy | None = None,
        allowed_checkpoint_types: list[str] | None = None,
    ) -> None:
        if not isinstance(client, LedgerClient):
            raise ConfigurationError(
                f"RunledgerCheckpointStorage needs a connected LedgerClient (await runledger.connect(url)), "
                f"not a {type(client).__name__}"
            )
        if not is_subject_token(agent):
            raise ConfigurationError(f"agent {agent!r} cannot be used in a subject: use 1-128 of A-Z a-z 0-9 _ -")
        policy = data_policy or DataPolicy()
        if policy.capture == "hash-only":
            raise ConfigurationError("a checkpoint storage reads its values back: use capture 'redacted' or 'full'")
        self.client = client
        self.agent = agent
        self.spec = AgentSpec(
            agent, _no_agent_function, _WorkflowModel(), agent_version=agent_version or "agent-framework",
            data_policy=policy,
        )  # fmt: skip
        self._allowed = frozenset(allowed_checkpoint_types or [])
        self._entries: dict[str, _Entry] = {}
        self._lineages: dict[str, _Lineage] = {}
        self._current: str | None = None  # the run whose checkpoint this storage saved or loaded last
        self._refreshing = asyncio.Lock()

    # -- the framework's CheckpointStorage ---------------------------------------------------------------------

    async def save(self, checkpoint: WorkflowCheckpoint) -> str:
        """Append ``checkpoint`` to the run of its lineage (a new run for a first checkpoint) and return
        its id once the server acknowledged it. Raises WorkflowCheckpointException for a checkpoint
        that could not be loaded back under this storage's allowed types, FencedError when another
        process holds the run."""
        structure, content = self._encoded(checkpoint)
        parent = checkpoint.previous_checkpoint_id
        if parent is not None and parent not in self._entries:
            await self._refresh()
        lineage = self._lineage_of(parent, checkpoint)
        async with lineage.lock:
            forked = parent is not None and bool(lineage.checkpoints) and parent != lineage.checkpoints[-1]
            run = await self._opened(lineage)
            event = await run.record(WorkflowCheckpointed(**structure, forked=forked, checkpoint=content))
            recorded = run.as_recorded(content)  # what a process reading the log gets: the same here
            self._index(lineage, event.seq, structure, recorded)
            self._current = lineage.run_id
            if not recorded.get("messages"):  # the execution's last superstep: it rests
                await self._rest(lineage, run, recorded)
        return checkpoint.checkpoint_id

    async def load(self, checkpoint_id: str) -> WorkflowCheckpoint:
        """The checkpoint ``checkpoint_id``, read from the log when this process does not hold it.
        Raises WorkflowCheckpointException when no run of this storage's agent records it."""
        if checkpoint_id not in self._entries:
            await self._refresh()
        entry = self._entries.get(checkpoint_id)
        if entry is None:
            raise WorkflowCheckpointException(
                f"No checkpoint found with ID {checkpoint_id} in the runs of agent {self.agent!r}"
            )
        self._current = entry.run_id
        return self._decoded(entry)

    async def list_checkpoints(self, *, workflow_name: str) -> list[WorkflowCheckpoint]:
        """Every checkpoint of ``workflow_name`` that is not deleted, oldest run first, in log order."""
        await self._refresh()
        return [self._decoded(self._entries[cid]) for cid in self._ids_of(workflow_name)]

    async def list_checkpoint_ids(self, *, workflow_name: str) -> list[str]:
        """The ids of ``list_checkpoints``."""
        await self._refresh()
        return self._ids_of(workflow_name)

    async def get_latest(self, *, workflow_name: str) -> WorkflowCheckpoint | None:
        """The latest checkpoint of ``workflow_name`` by the framework's rule (the newest timestamp;
        among equals, one no other names as its parent, then the greatest id), or None."""
        await self._refresh()
        entries = [self._entries[cid] for cid in self._ids_of(workflow_name)]
        if not entries:
            return None
        newest = max(_when(e.structure["timestamp"]) for e in entries)
        candidates = [e for e in entries if _when(e.structure["timestamp"]) == newest]
        superseded = {e.structure["previous_checkpoint_id"] for e in candidates}
        leaves = [e for e in candidates if e.structure["checkpoint_id"] not in superseded] or candidates
        return self._decoded(max(leaves, key=lambda e: str(e.structure["checkpoint_id"])))

    async def delete(self, checkpoint_id: str) -> bool:
        """Record a tombstone for ``checkpoint_id`` on its run (module docstring); False when no run
        of this storage's agent holds it."""
        if checkpoint_id not in self._entries:
            await self._refresh()
        entry = self._entries.get(checkpoint_id)
        if entry is None:
            return False
        lineage = self._lineages[entry.run_id]
        async with lineage.lock:
            was_at_rest = lineage.at_rest or lineage.run is None
            run = await self._opened(lineage)
            tombstone = WorkflowCheckpointDeleted(workflow_name=lineage.workflow_name, checkpoint_id=checkpoint_id)
            await run.record(tombstone)
            self._drop(lineage, checkpoint_id)
            if was_at_rest:
                await self._rest_again(lineage, run)
        return True

    # -- effects of executors ---------------------------------------------------------------------------------

    async def effect(
        self,
        name: str,
        args: Any,
        *,
        key: str,
        fn: Callable[..., Any],
        reconcile: Callable[[str], Any] | None = None,
        lease_s: float | None = None,
    ) -> Any:
        """Perform an executor's side effect at most once per idempotency ``key`` (the business identity
        of the effect: ``ship:order-17``), as a step of the run of the checkpoint this storage saved
        or loaded last (``RecordedRun.effect``): a key already committed returns its recorded result
        without calling ``fn``. Raises ConfigurationError before the workflow's first checkpoint."""
        if self._current is None:
            raise ConfigurationError(
                "no workflow run yet: effects are steps of the run of the storage's latest checkpoint; "
                "run the workflow with checkpoint_storage=this storage"
            )
        lineage = self._lineages[self._current]
        async with lineage.lock:
            run = await self._opened(lineage)
        return await run.effect(name, args, key=key, fn=fn, reconcile=reconcile, lease_s=lease_s)

    @property
    def current_run_id(self) -> str | None:
        """The run of the checkpoint this storage saved or loaded last (None before any)."""
        return self._current

    # -- encoding ----------------------------------------------------------------------------------------------

    def _encoded(self, checkpoint: WorkflowCheckpoint) -> tuple[dict[str, Any], dict[str, Any]]:
        """The checkpoint's structure and its content in the framework's encoding, refused (as the
        framework's own storages refuse it) when loading could not rebuild it under the allowed types."""
        try:
            encoded: dict[str, Any] = encode_checkpoint_value(checkpoint.to_dict())
            decode_checkpoint_value(encoded, allowed_types=self._allowed)
        except WorkflowCheckpointException:
            raise
        except Exception as exc:
            raise WorkflowCheckpointException(
                f"Checkpoint {checkpoint.checkpoint_id} cannot be encoded or restored under this storage's "
                "allowed types (allowed_checkpoint_types=, or agent_framework.register_checkpoint_type): "
                "refusing to save it"
            ) from exc
        structure = {k: encoded.pop(k) for k in _STRUCTURE}
        return structure, encoded

    def _decoded(self, entry: _Entry) -> WorkflowCheckpoint:
        content = entry.content if isinstance(entry.content, Mapping) else {}
        try:
            values = decode_checkpoint_value(dict(content), allowed_types=self._allowed)
        except WorkflowCheckpointException:
            raise
        except Exception as exc:
            raise WorkflowCheckpointException(
                f"Checkpoint {entry.structure['checkpoint_id']} of run {entry.run_id} cannot be decoded: {exc}"
            ) from exc
        return WorkflowCheckpoint.from_dict({**values, **entry.structure})

    # -- runs ----------------------------------------------------------------------------------------------------

    def _lineage_of(self, parent: str | None, checkpoint: WorkflowCheckpoint) -> _Lineage:
        """The run ``checkpoint`` belongs to: its parent's when this storage holds the parent for the same
        workflow, else a new one named after the checkpoint."""
        held = self._entries.get(parent) if parent is not None else None
        if held is not None and self._lineages[held.run_id].workflow_name == checkpoint.workflow_name:
            return self._lineages[held.run_id]
        run_id = lineage_run_id(checkpoint.checkpoint_id)
        lineage = self._lineages.get(run_id)
        if lineage is None:
            lineage = self._lineages[run_id] = _Lineage(run_id, checkpoint.workflow_name)
        return lineage

    async def _opened(self, lineage: _Lineage) -> RecordedRun:
        """The lineage's run, opened for writing: started, or continued fenced (``run.resumed``)."""
        if lineage.run is None or lineage.at_rest:
            lineage.run = await open_run(
                self.client, self.spec, lineage.run_id, {"workflow_name": lineage.workflow_name},
                labels={WORKFLOW_LABEL: lineage.workflow_name},
            )  # fmt: skip
            lineage.at_rest = False
        return lineage.run

    async def _rest(self, lineage: _Lineage, run: RecordedRun, content: Mapping[str, Any]) -> None:
        """Record the end of an execution: completed, or suspended while requests wait for responses."""
        pending = content.get("pending_request_info_events") or {}
        if pending:
            step = run.checkpoint.last_step
            await run.record(RunSuspended(step=step, request_id=min(pending), reason="request_info"))
        else:
            await run.record(RunCompleted())
        lineage.at_rest = True

    async def _rest_again(self, lineage: _Lineage, run: RecordedRun) -> None:
        """After a tombstone on a run that was at rest: the same outcome again, so it stays at rest."""
        last = self._entries.get(lineage.checkpoints[-1]) if lineage.checkpoints else None
        content = last.content if last is not None and isinstance(last.content, Mapping) else {}
        if last is not None and not content.get("messages"):
            await self._rest(lineage, run, content)

    # -- the index, from the log ---------------------------------------------------------------------------------

    def _index(self, lineage: _Lineage, position: int, structure: dict[str, Any], content: Any) -> None:
        cid = str(structure["checkpoint_id"])
        self._entries[cid] = _Entry(lineage.run_id, position, structure, content)
        if cid in lineage.checkpoints:
            lineage.checkpoints.remove(cid)
        lineage.checkpoints.append(cid)

    def _drop(self, lineage: _Lineage, checkpoint_id: str) -> None:
        self._entries.pop(checkpoint_id, None)
        if checkpoint_id in lineage.checkpoints:
            lineage.checkpoints.remove(checkpoint_id)

    def _ids_of(self, workflow_name: str) -> list[str]:
        return [
            cid
            for lineage in self._lineages.values()
            if lineage.workflow_name == workflow_name
            for cid in lineage.checkpoints
        ]

    async def _refresh(self) -> None:
        """Read every run of the agent into the index, in the order the runs started: another process
        may have started or continued any of them (a run this process writes reads as its index)."""
        async with self._refreshing:
            for summary in await list_runs(self.client, agent=self.agent):
                held = self._lineages.get(summary.run_id)
                if held is None:
                    await self._read_run(summary.run_id, None)
                    continue
                async with held.lock:  # not in the middle of this process's own append
                    await self._read_run(summary.run_id, held)

    async def _read_run(self, run_id: str, held: _Lineage | None) -> None:
        try:
            log = await load_run(self.client, run_id, agent=self.agent, fetch=True)
        except RunNotFoundError:
            return
        events = [rec.event for rec in log.records]
        labels = (events[0].payload.get("labels") or {}) if events and events[0].type == "run.started" else {}
        workflow_name = labels.get(WORKFLOW_LABEL)
        if workflow_name is None:
            return  # not a workflow's run (another integration under the same agent name)
        lineage = held or self._lineages.setdefault(run_id, _Lineage(run_id, str(workflow_name)))
        for cid in lineage.checkpoints:
            self._entries.pop(cid, None)
        lineage.checkpoints = []
        for ev in events:
            if ev.type == WorkflowCheckpointed.TYPE:
                p = ev.payload
                self._index(lineage, ev.seq, {k: p.get(k) for k in _STRUCTURE}, p.get("checkpoint"))
            elif ev.type == WorkflowCheckpointDeleted.TYPE:
                self._drop(lineage, str(ev.payload["checkpoint_id"]))


def _when(timestamp: Any) -> datetime:
    """A checkpoint's ISO 8601 timestamp as an aware datetime (naive ones are UTC, as the framework reads them)."""
    parsed = datetime.fromisoformat(str(timestamp))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


__all__ = ["DEFAULT_AGENT", "WORKFLOW_LABEL", "RunledgerCheckpointStorage", "lineage_run_id"]
