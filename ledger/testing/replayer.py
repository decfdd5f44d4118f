"""The in-process replayer: recorded runs replayed against the current agent code, in this process.

``Replayer(spec).replay(recording)`` folds the recording's events into the run's checkpoint and
drives the agent function with it as its journal, as a resume does, and returns a
``ReplayResult``: the run id, ``ok``, and the first divergence (the step, what the record has,
what the code did). Nothing is printed and nothing is raised for a divergence: it is a value, like
Temporal's ``WorkflowReplayResult``. No NATS, no key store, no Docker: a recording carries its
content opened (runledger.testing.recording).

**Not a sandbox.** The agent code runs in this process, with its rights, on recorded content. Replay
only recordings you trust (your own runs, exported by your own operators); a live re-run of anything
else goes through ``runledger rerun``, in a container (docs/sandbox.md). Nothing the record cannot
answer is ever run: no model is called, no tool, no effect, no approval asked.

Design (approaches rejected, and why):

- *A second replay engine that reads the file.* Rejected: two journal rules would drift. The replay
  here is ``RecordedRun``'s own: the checkpoint comes from the one ``fold``, and every call is served
  and checked by the same code that serves a resume (kind, name, args digest, an effect's key; a
  recorded failure raised again), so a divergence found here is the one a resume would raise. The seam
  is where the journal comes from (a file instead of the log) and where outcomes go (``MemoryWriter``,
  a list instead of a subject); ``ReplayRun`` only adds "the record cannot answer this: stop".
- *An in-memory JetStream* so that ``resume_run`` runs unchanged. Rejected: resume also fences,
  records ``run.resumed``, reads keys and effect subjects; faking the log's protocol is large and
  would test the fake.
- *Going live past the end of the record* (as a resume does). Rejected: a replay must never act. A
  call at a step the record does not have, or has without an outcome (a retry in flight, an effect in
  doubt, a child without outcome), ends the replay before anything runs.
- *Checking the version tuple first* (as a resume does). Rejected: replaying new code against old
  records is the point; the steps are checked one by one instead, and the differences of the tuple
  are reported (``ReplayResult.version_changes``), not refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from runledger.errors import (
    ConfigurationError,
    NondeterminismError,
    PayloadUnavailableError,
    ToolFailedError,
)
from runledger.log.publish import RetryPolicy, SubjectWriter
from runledger.protect.capture import PayloadOpener
from runledger.record.canonical import as_recorded as canonical_as_recorded
from runledger.record.canonical import canonical_json, digest, jsonable
from runledger.record.digests import KEYED_DIGESTS, Digester
from runledger.record.events import Event, Payload, Usage
from runledger.record.failures import decision_step
from runledger.record.fold import Checkpoint, StepRecord, fold
from runledger.record.records import Recorded
from runledger.sdk.agent import AgentSpec, load_agent
from runledger.sdk.errorinfo import error_info
from runledger.sdk.lifecycle import RunResult, drive, side_by_side
from runledger.sdk.models import ModelAdapter, ModelResponse
from runledger.sdk.run import RecordedRun, response_from_record, response_record
from runledger.sdk.tools import Tool, ToolFn
from runledger.testing.recording import Recording, read_recordings, recording_files

if TYPE_CHECKING:
    import datetime as dt

    from runledger.log.client import LedgerClient
    from runledger.sdk.protocol import Run

# A step recorded without an outcome: live, a resume would act (retry the call, settle the effect,
# resume the child). A replay cannot: the record ends inside that step.
# (An effect a branch simulated is answered: its result is what the branch's code was handed, and
# a replay of the branch hands it again, ``ReplayRun._native_effect``.)
_UNANSWERED = frozenset({"retrying", "intended", "started"})
# What a replay may record (in memory): the outcome of the run. Anything else would be a new step.
_OUTCOMES = frozenset({"run.completed", "run.failed"})
# Failures the agent's code decides (so a replay must reproduce them); other reasons stop a run from
# outside (a budget, a sandbox, a re-run's divergence, an effect in doubt) and end the record open.
_CODE_FAILURES = frozenset({"exception", "approval_denied"})


@dataclass(frozen=True)
class Divergence:
    """Where a replay first parted from the record.

    ``step``: the step (None when every step matched and the outcome differs). ``expected``: what the
    record has there; ``got``: what the code did. ``detail``: the recorded and new arguments side by
    side (a unified diff), when they differ."""

    step: int | None
    expected: str
    got: str
    detail: str = ""

    def __str__(self) -> str:
        where = "the outcome" if self.step is None else f"step {self.step}"
        text = f"{where}: expected {self.expected}; got {self.got}"
        return text + (f"\n{self.detail}" if self.detail else "")


@dataclass(frozen=True)
class ReplayResult:
    """The replay of one recorded run against the current code.

    ``ok``: the code made every recorded call with the same arguments and ended as the run did (or,
    for a run whose record ends open, crashed, suspended or stopped from outside, reached its end).
    ``divergence``: the first difference, else None. ``recorded`` and ``replayed``: how the run ended
    in the record and in the replay (``completed``, ``failed: REASON``, ``suspended: REASON``,
    ``running`` for a record without an outcome; ``end of record`` when the replay stopped where the
    record ends). ``steps``: recorded steps the code took. ``version_changes``: the version-tuple
    elements whose current value differs from the recorded one (element -> (recorded, current))."""

    run_id: str
    agent: str
    divergence: Divergence | None
    recorded: str
    replayed: str
    steps: int
    version_changes: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    source: str = ""
    live_from: int | None = None
    live_calls: int = 0
    output: Any = None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def __str__(self) -> str:
        live = "" if self.live_from is None else f" with the model live from step {self.live_from}"
        if self.divergence is None:
            if self.live_from is not None:
                return f"run {self.run_id} re-driven{live}: {self.replayed} ({self.live_calls} live model calls)"
            return f"run {self.run_id} replayed: {self.steps} steps, {self.replayed} as recorded"
        text = (
            f"run {self.run_id} ({self.agent}) re-driven{live}: {self.divergence}"
            if live
            else (f"run {self.run_id} ({self.agent}) diverged at {self.divergence}")
        )
        if self.version_changes:
            changed = ", ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in sorted(self.version_changes.items()))
            text += f"\n(version tuple changed since the recording: {changed})"
        return text + (f"\n(recording: {self.source})" if self.source else "")


class MemoryWriter(SubjectWriter):
    """A run's writer that keeps its events in ``events`` instead of publishing them (no log)."""

    def __init__(self, run_id: str, agent: str, cp: Checkpoint) -> None:
        super().__init__(
            cast(Any, None), f"ledger.run.{agent}.{run_id}.a", run_id=run_id, agent=agent, msg_id_prefix=run_id,
            next_seq=cp.next_seq, prev_hash=cp.last_hash, chain_format=cp.chain_format,
        )  # fmt: skip
        self.events: list[Event] = []

    async def append(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> Event:
        event, _ = await self._next_event(body, encoded)
        self.events.append(event)
        self.next_seq += 1
        self.prev_hash = event.hash
        return event


def _describe(rec: StepRecord | None) -> str:
    if rec is None:
        return "nothing (the record ends before this step)"
    return f"{rec.kind} {rec.name!r} (args {rec.args_digest[:12] or '-'})"


@dataclass(frozen=True)
class LiveModel:
    """A replay's live model: ``adapter`` answers every model call from step ``from_step`` on."""

    adapter: ModelAdapter
    from_step: int


class ReplayRun(RecordedRun):
    """``RecordedRun`` over a recording: every call is answered by the record or stops the replay.

    Each Run call is checked first against the record at the step it is about to take (calls made
    together take their steps in call order, as in a live run, and nothing awaits before a step is
    taken): a step the record does not have, or has without an outcome, raises NondeterminismError
    before anything runs. The first divergence is kept in ``first`` even when agent code catches it.

    ``simulated``: the args digest of each effect step a branch simulated (``effect.simulated`` records
    the arguments, not their digest), so that step is judged like any other. Model calls before
    ``by_position`` (a counterfactual branch's fork, or the live model's first step) are answered by
    their position, as the branch answered them: the change shapes their request. ``live``: the model
    called live from its step on (the deterministic re-drive); ``needs_live`` keeps the first call past
    it that the record cannot answer. ``unjudged``: steps whose arguments a keyed recording cannot show
    (``redigested``), judged by kind and name alone."""

    def __init__(
        self, spec: AgentSpec, cp: Checkpoint, writer: MemoryWriter, *,
        simulated: Mapping[int, str] | None = None, live: LiveModel | None = None,
        unjudged: frozenset[int] = frozenset(),
    ) -> None:  # fmt: skip
        super().__init__(cast("LedgerClient", None), spec, writer, cp, policy=RetryPolicy())
        if cp.digest_scheme == KEYED_DIGESTS:
            # No key here: the recording's digests were computed again from its content (``redigested``).
            self._digests = Digester(cp.chain_format)
        self._unjudged = unjudged  # steps whose arguments the recording cannot show (a keyed run's children)
        self._input = cp.input
        self.first: NondeterminismError | None = None
        self.record_ends_at: int | None = None  # the step the code asked for beyond the record
        self._simulated = dict(simulated or {})
        fork = cp.parent or {}
        self._by_position = int(fork.get("fork_step") or 0) if fork.get("changed") else 0
        self._live = live
        if live is not None:
            self._by_position = max(self._by_position, live.from_step)
        self.live_calls = 0
        self.needs_live: NondeterminismError | None = None

    # -- what stops a replay -------------------------------------------------------------------------

    def _diverged(self, exc: NondeterminismError) -> NondeterminismError:
        if self.first is None:
            self.first = exc
            if self._live is not None and exc.step >= self._live.from_step:
                self.needs_live = exc  # past the live model's first step only a model call may be new
        return exc

    @contextlib.contextmanager
    def _kept(self) -> Iterator[None]:
        try:
            yield
        except NondeterminismError as exc:
            self._diverged(exc)
            raise

    def _ends(self, step: int, rec: StepRecord | None, attempted: str) -> NondeterminismError:
        if self.record_ends_at is None:
            self.record_ends_at = step
        recorded = _describe(rec)
        if rec is not None:
            recorded += f" without an outcome ({rec.status}: the record ends inside this step)"
        return self._diverged(NondeterminismError(self.run_id, step, recorded, attempted))

    def _guard(self, kind: str, name: str) -> None:
        """Stop before the next step when the record cannot answer a ``kind`` call named ``name``."""
        step = self._next_step
        rec = self._cp.steps.get(step)
        if rec is None or (rec.status in _UNANSWERED and rec.kind == kind and rec.name == name):
            raise self._ends(step, rec, f"{kind} {name!r}")

    def _take_step(self) -> tuple[int, StepRecord | None]:
        step, rec = super()._take_step()
        if rec is None:  # every call is guarded first; this is the backstop: never live
            raise self._ends(step, None, "a call")
        return step, rec

    def _check(
        self, step: int, rec: StepRecord, kind: str, name: str, args_digest: str | None, args: Any = None
    ) -> None:
        with self._kept():
            super()._check(step, rec, kind, name, None if step in self._unjudged else args_digest, args)

    async def _append(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> Event:
        if body.TYPE not in _OUTCOMES:
            # A step the record does not answer was about to be recorded (an approval asked with
            # other arguments): a new decision.
            step = getattr(body, "step", None)
            step = step if isinstance(step, int) else self._next_step
            what = next((str(getattr(body, a)) for a in ("action", "name", "model") if getattr(body, a, None)), "")
            digest = str(getattr(body, "digest", "") or getattr(body, "args_digest", "") or "")
            attempted = f"{body.TYPE} {what!r}" + (f" (args {digest[:12]})" if digest else "")
            raise self._diverged(NondeterminismError(self.run_id, step, _describe(self._cp.steps.get(step)), attempted))
        return await super()._append(body, encoded)

    def _payload_opener(self) -> PayloadOpener:
        raise PayloadUnavailableError(
            "recorded content", "a recording carries its content opened (runledger.testing.recording); this is not one"
        )

    # -- the Run API, guarded ------------------------------------------------------------------------

    async def model(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        step = self._next_step
        if self._live is not None and step >= self._live.from_step:
            return await self._live_model(self._live.adapter, messages, params)
        if step < self._by_position:
            return await self._model_by_position(messages)
        self._guard("model", self._spec.model.name)
        with self._kept():
            return await super().model(messages, **params)

    async def _model_by_position(self, messages: list[dict[str, Any]]) -> ModelResponse:
        """The recorded model step at this position, whatever the request (the prefix is the record)."""
        step = self._next_step
        rec = self._cp.steps.get(step)
        attempted = f"model {self._spec.model.name!r}"
        if rec is None or (rec.kind == "model" and rec.status in _UNANSWERED):
            raise self._ends(step, rec, attempted)
        if rec.kind != "model":
            raise self._diverged(NondeterminismError(self.run_id, step, _describe(rec), attempted))
        self._next_step += 1
        if rec.error:
            raise await self._recorded_failure(rec.name, step, rec.error, "model")
        response_type = getattr(self._spec.model, "response_type", ModelResponse)
        return response_from_record(await self._open_model_output(rec.output), response_type)

    async def _live_model(
        self, adapter: ModelAdapter, messages: list[dict[str, Any]], params: dict[str, Any]
    ) -> ModelResponse:
        """A live model call at the next step, recorded nowhere: the response handed to the agent as a
        live run hands it (the record's round trip: runledger.sdk.run.RecordedRun.model)."""
        step = self._next_step
        self._next_step += 1
        request = jsonable({"messages": messages, "params": params})
        self.live_calls += 1
        try:
            response = await adapter.complete(request["messages"], **request["params"])
        except Exception as exc:  # what a live run raises for a model that failed (after its retries)
            info = error_info(exc, False)
            raise ToolFailedError(str(getattr(adapter, "name", "model")), step, info.type, info.message,
                                  kind="model") from exc  # fmt: skip
        recorded = response_record(response)
        usage = Usage(input_tokens=response.input_tokens, output_tokens=response.output_tokens)
        as_recorded = canonical_as_recorded(recorded, self._cp.chain_format)
        response_type = getattr(adapter, "response_type", getattr(self._spec.model, "response_type", ModelResponse))
        return response_from_record({**as_recorded, "usage": usage.model_dump()}, response_type)

    async def tool(
        self, tool: str | Tool, args: Any = None, *, fn: ToolFn | None = None, tool_call_id: str | None = None
    ) -> Any:
        self._guard("tool", tool if isinstance(tool, str) else tool.name)
        with self._kept():
            return await super().tool(tool, args, fn=fn, tool_call_id=tool_call_id)

    async def effect(self, name: str, args: Any, *, key: str, fn: ToolFn, **options: Any) -> Any:
        self._guard("effect", name)
        with self._kept():
            return await super().effect(name, args, key=key, fn=fn, **options)

    async def _native_effect(self, name: str, args: Any, *, key: str, fn: ToolFn, **options: Any) -> Any:
        """An effect a branch simulated is answered with the result the branch handed its code (a replay
        of the branch hands it again); any other effect step is answered as a resume answers it."""
        step = self._next_step
        rec = self._cp.steps.get(step)
        if rec is None or rec.kind != "effect" or rec.status != "simulated":
            return await super()._native_effect(name, args, key=key, fn=fn, **options)
        self._next_step += 1
        args_digest = digest(args, self._cp.chain_format)
        with self._kept():
            recorded = dataclasses.replace(rec, args_digest=self._simulated.get(step, ""))
            self._check(step, recorded, "effect", name, args_digest, args)
            if rec.key != key:
                raise NondeterminismError(self.run_id, step, f"effect key {rec.key!r}", f"effect key {key!r}")
        return await self._open(rec.output)

    async def approval(self, action: str, args: Any = None) -> dict[str, Any]:
        self._guard("approval", action)
        with self._kept():
            return await super().approval(action, args)

    async def child(self, spec: AgentSpec, input: Any = None) -> Any:
        self._guard("child", spec.name)
        with self._kept():
            return await super().child(spec, input)

    async def now(self) -> dt.datetime:
        self._guard("clock", "clock")
        with self._kept():
            return await super().now()

    async def random(self) -> float:
        self._guard("random", "random")
        with self._kept():
            return await super().random()


def redigested(cp: Checkpoint, records: list[Recorded]) -> frozenset[int]:
    """Give the steps of a keyed run (digest scheme 2, runledger.record.digests) digests this process can
    compute: the plain digest of the arguments the recording holds opened (a model request, a tool's or
    an effect's arguments, an approval's action and arguments), in place of the HMAC under the run's key,
    which a recording never carries. Returns the steps whose arguments it does not hold (a child's input
    is in the child's run): their arguments are not judged, only their kind and name.

    The recording holds the arguments as recorded (redacted by the run's capture policy), the digest was
    of the arguments as the code made them: a secret the code put in an argument itself, redacted in the
    record, makes that step differ; one that came from a replayed value (a redacted input or output) does
    not, since the replay hands the code the recorded value."""
    plain = Digester(cp.chain_format)
    unjudged: set[int] = set()
    for rec in records:
        ev, p = rec.event, rec.event.payload
        step = cp.steps.get(p["step"]) if isinstance(p.get("step"), int) else None
        if step is None:
            continue
        if ev.type == "model.called":
            value: Any = p.get("request")
        elif ev.type in ("tool.called", "effect.intended"):
            value = p.get("args")
        elif ev.type == "approval.requested":
            value = {"action": p.get("action"), "args": p.get("args")}
            pending = cp.pending_approvals.get(str(p.get("request_id")))
        elif ev.type == "child.started":
            unjudged.add(step.step)
            continue
        else:
            continue
        try:
            step.args_digest = plain.digest(value)
        except (TypeError, ValueError):
            unjudged.add(step.step)
            continue
        if ev.type == "approval.requested" and pending is not None:
            pending["digest"] = step.args_digest
    return frozenset(unjudged)


def _ending(status: str, reason: str | None) -> str:
    return f"{status}: {reason}" if reason and status in ("failed", "suspended") else status


def _suspension_reason(records: list[Any]) -> str | None:
    for rec in reversed(records):
        if rec.event.type == "run.suspended":
            return str(rec.event.payload.get("reason") or "approval")
    return None


def _same(a: Any, b: Any, chain_format: int) -> bool:
    """Whether two outputs are one value in the run's chain format (the form the record keeps:
    in format 2 ``210.0`` is ``210``), as every comparison of a recorded value is made."""
    try:
        return canonical_json(a, chain_format) == canonical_json(b, chain_format)
    except (TypeError, ValueError):
        return bool(a == b)


def _short(value: Any, chain_format: int, limit: int = 200) -> str:
    try:
        text = canonical_json(value, chain_format).decode("utf-8")
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


class Replayer:
    """Replays recordings against one agent (an ``AgentSpec``, or ``"module:attribute"`` naming one).

    A replay never acts and never reads the log: see the module's docstring, and docs/testing.md.
    Not a sandbox: the agent's code runs in this process.

    With ``live_model_from`` (a step, or ``"decision"``: the run's decision, the last model call at or
    before its failing step, runledger.record.failures.decision_step) or ``model``, each replay is the
    deterministic re-drive of a fix: every call before that step and every tool, effect, approval,
    clock and random call after it come from the record, and the model (``model``, else the agent's
    own) answers live from that step on. Such a replay is ``ok`` when the run completes; a call the
    record cannot answer past that step is refused (the candidate needs a live tool: a sandbox's
    ``runledger rerun`` runs it), never made."""

    def __init__(
        self, agent: AgentSpec | str, *, model: ModelAdapter | None = None, live_model_from: int | str | None = None
    ) -> None:
        self.spec = load_agent(agent) if isinstance(agent, str) else agent
        self._version: dict[str, Any] | None = None
        if model is not None and live_model_from is None:
            live_model_from = "decision"
        if live_model_from is not None and live_model_from != "decision":
            if not (isinstance(live_model_from, int) or str(live_model_from).isdigit()) or int(live_model_from) < 0:
                raise ConfigurationError(
                    f"live_model_from={live_model_from!r}: give a step number (0, 1, ...) or 'decision'"
                )
            live_model_from = int(live_model_from)
        self.live_model_from = live_model_from
        self.model = model

    def _live(self, cp: Checkpoint) -> LiveModel | None:
        """The live model of a replay of ``cp`` (None: a plain replay)."""
        if self.live_model_from is None:
            return None
        step = decision_step(cp) if self.live_model_from == "decision" else int(self.live_model_from)
        if step is None:
            raise ConfigurationError(
                f"run {cp.run_id} has no model call to take live from (its decision: the last model call at or "
                "before its failing step): replay it without a live model, or give live_model_from=STEP"
            )
        return LiveModel(self.model or self.spec.model, step)

    def _current_version(self, spec: AgentSpec) -> dict[str, Any]:
        if spec is not self.spec:  # its listed tools declared from the recording's listings: this recording's
            return spec.version().model_dump()
        if self._version is None:
            self._version = self.spec.version().model_dump()
        return self._version

    async def replay(self, recording: Recording) -> ReplayResult:
        """Replay one recorded run; the result says whether the code still makes its decisions.

        Raises ConfigurationError when the recording is of another agent, ChainError when its
        events do not link (an edited file)."""
        spec = self.spec
        if recording.agent != spec.name:
            raise ConfigurationError(
                f"run {recording.run_id} was recorded by agent {recording.agent!r}, not {spec.name!r}: replay it with "
                "that agent's spec"
            )
        records = recording.events()
        cp = fold(records)
        # Tools listed from outside the code (an MCP server's) are declared from the listings the run
        # recorded, as a resume declares them: a replay never lists their source (it never calls it).
        spec = spec.from_record(cp.tool_listings)
        unjudged = redigested(cp, records) if cp.digest_scheme == KEYED_DIGESTS else frozenset()
        recorded_status, recorded_reason = cp.status, cp.failure_reason
        if cp.status == "suspended":
            recorded_reason = _suspension_reason(records)
        recorded = _ending(recorded_status, recorded_reason)
        final = cp.status == "completed" or (cp.status == "failed" and cp.failure_reason in _CODE_FAILURES)
        # Waiting for an approval is an outcome of the code; once the approval is resolved (and the run not
        # yet resumed) the record ends open: the code goes on past it.
        final = final or (cp.status == "suspended" and recorded_reason == "approval" and bool(cp.pending_approvals))
        outcome = {"output": cp.output, "error": dict(cp.error or {}), "pending": sorted(cp.pending_approvals)}
        current = self._current_version(spec)
        changes = {k: (v, current.get(k)) for k, v in (cp.version or {}).items() if current.get(k) != v}

        live = self._live(cp)
        simulated = {
            int(r.event.payload["step"]): digest(r.event.payload.get("args"), cp.chain_format)
            for r in records
            if r.event.type == "effect.simulated" and isinstance(r.event.payload.get("step"), int)
        }
        run = ReplayRun(spec, cp, MemoryWriter(recording.run_id, recording.agent, cp), simulated=simulated, live=live,
                        unjudged=unjudged)  # fmt: skip

        def result(divergence: Divergence | None, replayed: str, output: Any = None) -> ReplayResult:
            return ReplayResult(
                recording.run_id, recording.agent, divergence, recorded, replayed, min(run._next_step, len(cp.steps)),
                changes, recording.source, None if live is None else live.from_step, run.live_calls, output,
            )  # fmt: skip

        try:
            ended: RunResult | None = await drive(run, spec)
        except NondeterminismError:
            ended = None
        if live is not None:
            return await _redriven(run, live, ended, records, result)
        first = run.first
        if first is not None:
            at_end = run.record_ends_at == first.step
            if at_end and not final:
                return result(None, "end of record")  # a record that ends open, replayed to its end
            expected = first.recorded
            if at_end and first.step not in cp.steps:
                expected = f"no step {first.step}: the run {recorded} after step {cp.last_step}"
            detail = ""
            if first.attempted_args is not None:
                detail = await side_by_side(records, first, PayloadOpener(None))
            return result(Divergence(first.step, expected, first.attempted, detail), "diverged")
        assert ended is not None
        replayed = _ending(ended.status, ended.reason)
        left = sorted(s for s in cp.steps if s >= run._next_step)
        if left:
            rec = cp.steps[left[0]]
            got = f"the end of the run ({replayed}" + (f": {ended.error})" if ended.error else ")")
            return result(Divergence(rec.step, _describe(rec), got), replayed)
        if not final:
            return result(None, replayed, ended.output)
        divergence = _outcome_divergence(recorded_status, recorded, outcome, ended, replayed, cp.chain_format)
        return result(divergence, replayed, ended.output)

    async def replay_all(self, recordings: Iterable[Recording]) -> list[ReplayResult]:
        """Replay each recording in turn (one result each, in order)."""
        return [await self.replay(r) for r in recordings]

    def replay_paths(self, *paths: Path | str) -> list[ReplayResult]:
        """Replay every run of the recording files ``paths`` (a directory: its ``*.jsonl``), in a new
        event loop (call ``replay_all`` from async code)."""
        recordings = [r for p in paths for f in recording_files(Path(p)) for r in read_recordings(f)]
        return asyncio.run(self.replay_all(recordings))


async def _redriven(
    run: ReplayRun, live: LiveModel, ended: RunResult | None, records: list[Any],
    result: Callable[..., ReplayResult],
) -> ReplayResult:  # fmt: skip
    """The result of a replay with a live model: ok when the run completed with nothing past the live
    model's first step that the record could not answer."""
    first = run.first
    if first is not None:
        detail = ""
        if first.attempted_args is not None:
            detail = await side_by_side(records, first, PayloadOpener(None))
        if run.needs_live is first:
            kind = first.attempted.split(" ", 1)[0]
            got = (
                f"{first.attempted}, which the record cannot answer: from step {live.from_step} only the model is "
                f"live and every other call comes from the record, so this candidate needs a live {kind}; re-run it "
                "in a sandbox instead (`runledger rerun RUN --mode counterfactual --base-mode live`)"
            )
            return result(Divergence(first.step, first.recorded, got, detail), "refused: needs a live call")
        return result(Divergence(first.step, first.recorded, first.attempted, detail), "diverged")
    assert ended is not None
    replayed = _ending(ended.status, ended.reason)
    if ended.status == "completed":
        return result(None, replayed, ended.output)
    got = f"the run {replayed}" + (f" ({ended.error})" if ended.error else "")
    return result(Divergence(None, "the run to complete", got), replayed, ended.output)


def _outcome_divergence(
    status: str, recorded: str, outcome: dict[str, Any], ended: RunResult, replayed: str, chain_format: int
) -> Divergence | None:
    """How the replay's outcome differs from a recorded final one (None: it does not)."""
    if replayed != recorded:
        return Divergence(
            None, f"the run {recorded}", f"the run {replayed}" + (f" ({ended.error})" if ended.error else "")
        )
    if status == "completed" and not _same(outcome["output"], ended.output, chain_format):
        expected, got = _short(outcome["output"], chain_format), _short(ended.output, chain_format)
        return Divergence(None, f"the output {expected}", f"the output {got}")
    if status == "failed":
        error = outcome["error"]
        message = f"{error.get('type')}: {error.get('message')}" if error.get("type") else str(error.get("message"))
        got = ended.error or ""
        if ended.reason != "exception":  # RunResult has the message alone; run.failed the type too
            message = str(error.get("message"))
        if got != message:
            return Divergence(None, f"the run failing with {message!r}", f"a failure with {got!r}")
    if status == "suspended" and outcome["pending"] != sorted(ended.pending):
        return Divergence(None, f"approvals pending {outcome['pending']}", f"approvals pending {sorted(ended.pending)}")
    return None


if TYPE_CHECKING:  # mypy checks that ReplayRun is a Run (runledger.sdk.protocol); nothing runs here

    def _is_a_run(run: ReplayRun) -> Run:
        return run
