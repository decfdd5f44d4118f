"""The Run API: every non-deterministic thing an agent does is a journaled step.

Each call (``model``, ``tool``, ``effect``, ``approval``, ``child``, ``now``, ``random``)
takes the next step number. If the journal (the checkpoint folded from the run's
events) already holds that step, the recorded result is returned without running
anything, after checking that the kind, name and args digest match; otherwise the
call runs live, its event is published and acknowledged, and only then is the
result returned (write-ahead: a crash loses at most the step in flight). Under
``AgentSpec(durability="output")`` the event is acknowledged later, in a bounded window, but
always before anything leaves the process: ``commit`` is awaited before an effect's claim,
after an approval request, before a child run starts, and after the run's outcome.

Every appended event is also folded into the in-memory checkpoint with the same
``apply`` the readers use, so spend and position are never computed twice.

The effect step (``effect``, its key's claims and outcomes) is runledger.sdk.effect_step's
``EffectStep``, the base of ``RecordedRun``.

The NATS-bound modules (client, publish, effects) are imported for types only, or where an
effect is settled: agent code imports ``Run`` for its annotations, and inside the sandbox
(which runs agents against ``runledger.sandbox.guest.RemoteRun``) that must not load the NATS client.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import random as _random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runledger.errors import (
    ApprovalDeniedError,
    BudgetExhaustedError,
    ChildFailedError,
    ChildSuspendedError,
    ConfigurationError,
    NondeterminismError,
    PayloadUnavailableError,
    SuspendedForApprovalError,
    ToolArgumentsError,
    ToolFailedError,
    VersionMismatchError,
)
from runledger.log.subjects import AGENT_WRITER, WORKER_WRITER, Writer, writer_of
from runledger.protect.capture import (
    PayloadOpener,
    PayloadProtector,
    client_opener,
    is_placeholder,
)
from runledger.record import canonical
from runledger.record.canonical import as_recorded, jsonable, read_back
from runledger.record.digests import KEYED_DIGESTS, PLAIN_DIGESTS, Digester
from runledger.record.events import (
    ApprovalRequested,
    ChildCompleted,
    ChildFailed,
    ChildStarted,
    ClockRead,
    ErrorInfo,
    Event,
    ModelCalled,
    Payload,
    RandomDrawn,
    RunSuspended,
    ToolCalled,
    Usage,
)
from runledger.record.fold import Checkpoint, StepRecord, apply
from runledger.record.records import Recorded
from runledger.sdk.agent import AgentSpec
from runledger.sdk.crashpoints import crash_point
from runledger.sdk.effect_step import EffectStep
from runledger.sdk.errorinfo import error_info as error_info  # also runledger.sdk.run.error_info, as before
from runledger.sdk.models import ModelResponse
from runledger.sdk.retry import NO_RETRY, Retry
from runledger.sdk.tools import Tool, ToolFn

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.log.publish import RetryPolicy, SubjectWriter
    from runledger.sdk.lifecycle import RunResult
    from runledger.sdk.snapshot import JournalSnapshotter

    # Drives a child run to an outcome: (parent, child spec, child run id, input, parent step, resume).
    ChildDriver = Callable[["RecordedRun", AgentSpec, str, Any, int, bool], Awaitable[RunResult]]


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _ToolStep:
    """A read tool's step about to run live: its arguments as recorded, their canonical bytes (what
    is sealed) and their digest."""

    step: int
    name: str
    args: Any
    args_json: bytes
    args_digest: str


def new_digest_scheme(protector: PayloadProtector | None) -> int:
    """The digest scheme a new run records: keyed (2) when it has keys, so that erasing it leaves no
    digest anyone can test a guess against; plain (1) without (its content is in the clear anyway)."""
    return KEYED_DIGESTS if protector is not None and protector.keys is not None else PLAIN_DIGESTS


def run_digester(cp: Checkpoint, protector: PayloadProtector | None) -> Digester:
    """The digests of the run ``cp`` folds: its chain format and digest scheme, with its digest key
    from ``protector``'s keys in scheme 2 (without them the digester raises when used: KeyStoreError)."""
    keys = protector.keys if protector is not None else None
    key = keys.digest_key if keys is not None and cp.digest_scheme == KEYED_DIGESTS else None
    return Digester(cp.chain_format, cp.digest_scheme, key)


class RecordedRun(EffectStep):
    """The ``Run`` of a live or resumed run, recording every step to the log.

    Calls may overlap (tasks of one event loop; not threads): step numbers are taken in call
    order, so the same code makes the same numbering on replay, and appends are serialized."""

    def __init__(
        self,
        client: LedgerClient,
        spec: AgentSpec,
        writer: SubjectWriter,
        checkpoint: Checkpoint,
        *,
        policy: RetryPolicy,
        protector: PayloadProtector | None = None,
    ) -> None:
        self._client = client
        self._spec = spec
        self._writer = writer
        # The run's keys are written by the run's own writer (the agent; a worker for a branch).
        self._key_writer: Writer = WORKER_WRITER if writer_of(writer.subject) == WORKER_WRITER else AGENT_WRITER
        self._cp = checkpoint
        self._policy = policy
        # Content protection (runledger.protect.capture): what is recorded is redacted/sealed; the agent
        # gets the real values live, and recorded ones (opened on demand) on replay.
        self._protector = protector
        # How this run digests its steps' arguments (and hash-only content): the scheme its run.started
        # records, keyed under its digest key in scheme 2 (runledger.record.digests).
        self._digests = run_digester(checkpoint, protector)
        if protector is not None:
            protector.hashes = self._digests
        self._opener: PayloadOpener | None = None
        self._input: Any = _UNSET
        self._next_step = 0
        self._append_lock = asyncio.Lock()
        # Effect outcomes on their way to the run's subject (``_mirror``), and what stopped one.
        self._mirroring: set[asyncio.Task[None]] = set()
        self._unmirrored: BaseException | None = None
        self._on_live: Callable[[], None] | None = None  # called once, when the first live step is taken
        # Continued without replay (lifecycle.open_run): new calls take new steps, and an effect left
        # intended by an earlier attempt is settled on its own step.
        self._continuing = False
        # A resumed run (its record has steps): its first live effects read their key first (effect_step).
        self._keys_first = bool(checkpoint.steps)
        # How child runs are started and resumed: set by runledger.sdk.lifecycle (start_run,
        # resume_run), which this module cannot import (it imports this one).
        self._child_driver: ChildDriver | None = None
        # When journal snapshots are written (runledger.sdk.snapshot): set by the lifecycle; None writes none.
        self._snapshots: JournalSnapshotter | None = None
        self._segment_wall = time.time()
        self._seconds_at_segment = checkpoint.spent["seconds"]
        # Why a live call was refused before anything of it was recorded (``_before_live``): the drive
        # raises it instead of recording an outcome, even when the agent's code caught it.
        self._live_refusal: VersionMismatchError | ConfigurationError | None = None

    # -- identity ------------------------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self._writer.run_id

    @property
    def agent(self) -> str:
        return self._writer.agent

    @property
    def input(self) -> Any:
        """The run's input: the real one live, the recorded (opened) one on resume."""
        value = self._cp.input if self._input is _UNSET else self._input
        if is_placeholder(value):
            raise PayloadUnavailableError("the run's input", "it was not recorded in a readable form")
        return value

    @property
    def prompt(self) -> str:
        """The agent's prompt (part of the version tuple; a counterfactual branch may change it)."""
        return self._spec.prompt

    @property
    def checkpoint(self) -> Checkpoint:
        return self._cp

    @property
    def replaying(self) -> bool:
        """True while the next step is answered from the record."""
        return self._next_step in self._cp.steps

    def as_recorded(self, value: Any) -> Any:
        """``value`` as this run's record gives it back: its canonical JSON in the run's chain format,
        read back (keys in the record's order; in format 2 a whole-number float is an integer).
        What every step hands the agent live; an integration that keeps a value it recorded in the
        clear (runledger.integrations.langgraph's checkpoint header) keeps this form, so a process
        that reads it from the log finds the same."""
        return as_recorded(jsonable(value), self._cp.chain_format)

    # -- plumbing ------------------------------------------------------------------------------------

    async def _open(self, value: Any) -> Any:
        """A recorded value as the agent saw it: unsealed, blob fetched and verified (strict).

        Called once per replayed step, when the step returns the value: never before (an
        output the agent's code does not reach is never decrypted) and never twice."""
        if not is_placeholder(value):
            return value
        return await self._payload_opener().open_value(value)

    def _payload_opener(self) -> PayloadOpener:
        opener = self._opener
        if opener is None:
            opener = self._opener = client_opener(self._client)
            if self._protector is not None and self._protector.keys is not None:
                opener.remember(self._protector.keys)
        return opener

    async def _recorded_failure(
        self, name: str, step: int, error: dict[str, Any], kind: str = "tool"
    ) -> ToolFailedError:
        """The error a recorded failed step raises on replay, with its message as the agent saw it
        live (error texts are recorded sealed)."""
        message = error["message"]
        if isinstance(message, str) and is_placeholder(message):
            message = await self._payload_opener().open_text(message)
        return ToolFailedError(name, step, error["type"], message, retryable=bool(error.get("retryable")), kind=kind)

    async def _open_model_output(self, output: Any) -> Any:
        # The fold merges usage (structure) into the recorded response (content).
        if not output:
            return output
        usage = output.get("usage")
        data = {k: v for k, v in output.items() if k != "usage"} if "usage" in output else output
        if not is_placeholder(data):
            return output
        return {**(await self._open(data)), "usage": usage or {}}

    def _resolve(self, args: Any) -> Any:
        """``args`` for the tool itself: ``secret://NAME`` references resolved (never recorded)."""
        return args if self._protector is None else self._protector.resolve_secrets(args)

    async def _append(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> Event:
        # Steps may be in flight together (asyncio.gather of tool calls): the run's one writer
        # appends them one at a time, each fenced on the one before, and folds each before the
        # next is appended, so the chain, the fence and the checkpoint never see two at once.
        # ``encoded``: content fields' canonical JSON the step made already (SubjectWriter.append).
        async with self._append_lock:
            return await self._append_held(body, encoded)

    async def _append_held(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> Event:
        """``_append`` with the append lock taken by the caller (an effect's mirror: effect_step)."""
        if self._unmirrored is not None:
            raise self._unmirrored  # an effect's outcome could not be mirrored: nothing is written after it
        event = await self._writer.append(body, encoded)
        apply(self._cp, Recorded(event, self._writer.last_stream_seq), check_chain=False)
        if self._snapshots is not None:
            await self._snapshots.after_append(self)
        return event

    async def record(self, body: Payload) -> Event:
        """Append ``body``, an event that is not a step (a framework integration's own facts, such
        as runledger.integrations.langgraph's checkpoints), after the steps in flight: protected
        like every event (its content fields redacted, sealed, stored by reference when large),
        fenced, acknowledged before this returns (under output durability: by the next
        ``commit``), and folded (an event type without a fold handler changes no state)."""
        return await self._append(body)

    async def commit(self) -> None:
        """Return once every step recorded so far is acknowledged by the server.

        Under step durability only the outcome of the last effect can still be on its way to the
        run's subject (its key holds it already: ``effect``); every other step is. Under output durability
        (``AgentSpec(durability="output")``) the run commits by itself before anything leaves the
        process; call this before the agent shows a partial result to a person. Raises
        FencedError when another process owns the run."""
        await self._mirrored()
        await self._writer.commit()

    def _take_step(self) -> tuple[int, StepRecord | None]:
        step = self._next_step
        self._next_step += 1
        rec = self._cp.steps.get(step)
        if rec is None and self._on_live is not None:
            on_live, self._on_live = self._on_live, None
            on_live()
        return step, rec

    def _check(
        self, step: int, rec: StepRecord, kind: str, name: str, args_digest: str | None, args: Any = None
    ) -> None:
        same = rec.kind == kind and rec.name == name and (args_digest is None or rec.args_digest == args_digest)
        if not same:
            raise NondeterminismError(
                self.run_id,
                step,
                recorded=f"{rec.kind} {rec.name!r} (args {rec.args_digest[:12] or '-'})",
                attempted=f"{kind} {name!r} (args {(args_digest or '')[:12] or '-'})",
                attempted_args=args,
            )

    def _live_seconds(self) -> float:
        return self._seconds_at_segment + (time.time() - self._segment_wall)

    async def _check_budgets(self, step: int, *, model_call: bool) -> None:
        limits, spent = self._cp.limits, self._cp.spent
        checks = [("seconds", self._live_seconds())]
        if model_call:
            checks += [("turns", spent["turns"]), ("tokens", spent["tokens"])]
        for budget, used in checks:
            limit = limits.get(budget)
            if limit is not None and used >= limit:
                raise BudgetExhaustedError(self.run_id, budget, used, limit)

    def _after_step(self, step: int) -> None:
        crash_point(f"step:{step}:recorded")

    async def _before_live(self, name: str) -> None:
        """Called before the tool or effect ``name`` runs live, before anything of the call is
        recorded: a tool a resume declared from the run's record is checked against its source first
        (``AgentSpec.before_live``), and a refusal there is the run's ``_live_refusal``."""
        try:
            await self._spec.before_live(name, self.run_id, self._cp.version)
        except (VersionMismatchError, ConfigurationError) as exc:
            self._live_refusal = exc
            raise

    # -- model ---------------------------------------------------------------------------------------

    async def model(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        """Call the agent's model. Live: the call, its response and token usage are recorded."""
        request = jsonable({"messages": messages, "params": params})  # one conversion of both
        messages, params = request["messages"], request["params"]
        name = self._spec.model.name
        # Encoded once: its digest is the step's, and the same bytes are what is sealed.
        request_json, args_digest = self._digests.encoded(request)
        step, rec = self._take_step()
        if rec is not None:
            self._check(step, rec, "model", name, args_digest, request)
            if rec.status != "retrying":
                if rec.error:
                    raise await self._recorded_failure(name, step, rec.error, "model")
                response_type = getattr(self._spec.model, "response_type", ModelResponse)
                return response_from_record(await self._open_model_output(rec.output), response_type)
        # Live, or the next attempt of a step whose last recorded attempt failed and was to be retried.
        retry: Retry = getattr(self._spec.model, "retry", None) or NO_RETRY
        attempt = 1 if rec is None else rec.attempts + 1
        first = time.monotonic()
        while True:
            await self._check_budgets(step, model_call=True)
            started = time.perf_counter()
            try:
                response = await self._spec.model.complete(messages, **params)
                break
            except Exception as exc:
                wait = retry.wait_s(attempt)
                again = retry.another(attempt, exc, time.monotonic() - first, wait)
                info = error_info(exc, False, retryable=retry.retryable(exc))
                await self._append(
                    ModelCalled(
                        step=step,
                        model=name,
                        request=request,
                        args_digest=args_digest,
                        error=info,
                        duration_ms=(time.perf_counter() - started) * 1000,
                        attempt=attempt,
                        will_retry=again,
                    ),
                    {"request": request_json},
                )
                if not again:
                    # What a replay of this step raises, raised live too.
                    raise ToolFailedError(
                        name, step, info.type, info.message, retryable=info.retryable, kind="model"
                    ) from exc
                logger.info("model %s (step %d) attempt %d failed (%s); retrying in %.1fs", name, step, attempt,
                            info.type, wait)  # fmt: skip
                await asyncio.sleep(wait)
                attempt += 1
        # An adapter's ModelResponse subclass adds fields (the SDK's own response, for
        # runledger.integrations.openai; Pydantic AI's, for runledger.integrations.pydantic_ai): recorded
        # with the rest, and returned live as a replay returns them (below).
        recorded = response_record(response)
        usage = Usage(input_tokens=response.input_tokens, output_tokens=response.output_tokens)
        response_json = canonical.canonical_json(recorded, self._cp.chain_format)
        await self._append(
            ModelCalled(
                step=step,
                model=name,
                request=request,
                args_digest=args_digest,
                response=recorded,
                usage=usage,
                duration_ms=(time.perf_counter() - started) * 1000,
                attempt=attempt,
                server=response.server,
            ),
            {"request": request_json, "response": response_json},
        )
        self._after_step(step)
        limit = self._cp.limits.get("tokens")
        if limit is not None and self._cp.spent["tokens"] > limit:
            raise BudgetExhaustedError(self.run_id, "tokens", self._cp.spent["tokens"], limit)
        # The whole response as a replay rebuilds it from the record (key order, integral floats, nested
        # framework objects): one rule for every path back to the agent (record/canonical.as_recorded).
        response_type = getattr(self._spec.model, "response_type", ModelResponse)
        recorded = read_back(json.loads(response_json), response_json)
        return response_from_record({**recorded, "usage": usage.model_dump()}, response_type)

    # -- tools ---------------------------------------------------------------------------------------

    def _resolve_tool(self, tool: str | Tool, fn: ToolFn | None) -> tuple[str, Tool | None]:
        """The tool's name and declaration; None for a read tool given by name and ``fn``, whose
        ``Tool`` is built only if the step runs live (a replayed step needs only its name)."""
        if isinstance(tool, Tool):
            return tool.name, tool
        declared = self._spec.tool_map.get(tool)
        if declared is not None:
            return declared.name, declared
        if fn is None:
            raise ConfigurationError(f"tool {tool!r} is not declared on agent {self._spec.name} and no fn= was given")
        return tool, None

    async def tool(
        self, tool: str | Tool, args: Any = None, *, fn: ToolFn | None = None, tool_call_id: str | None = None
    ) -> Any:
        """Call a tool. Read tools are recorded as tool.called; write/irreversible ones go
        through the effect ledger with the key their declaration builds from ``args``.

        ``args`` (the JSON value recorded and digested) is checked against the tool's signature
        first (runledger.sdk.tools): arguments it refuses are recorded as the tool's failed
        ``tool.called`` step (ToolArgumentsError; an effect tool then builds and claims no key) and
        raise ToolFailedError, as a replay of the step does. The function runs through
        ``Tool.call``: sync ones in a worker thread, async ones awaited."""
        name, declared = self._resolve_tool(tool, fn)
        invalid = None
        if declared is not None and declared.effect_class != "read":
            native = jsonable(args)  # once, for the check, the key and the step
            invalid = declared.argument_error(native)
            if invalid is None:
                assert declared.key is not None
                return await self._native_effect(
                    name,
                    native,
                    key=self._effect_key(declared.key, native, tool_call_id=tool_call_id),
                    fn=declared.call,
                    reconcile=declared.reconcile,
                    effect_class=declared.effect_class,
                    tool_call_id=tool_call_id,
                    lease_s=declared.lease_s,
                    about=declared.recorded_facts(),
                )
        args = jsonable(args)
        args_json, args_digest = self._digests.encoded(args)  # the bytes sealed too
        step, rec = self._take_step()
        if rec is not None:
            self._check(step, rec, "tool", name, args_digest, args)
            if rec.status != "retrying":
                if rec.error:
                    raise await self._recorded_failure(name, step, rec.error)
                return await self._open(rec.output)
        # Live, or the next attempt of a step whose last recorded attempt failed and was to be retried.
        await self._before_live(name)
        if declared is None:
            assert fn is not None  # _resolve_tool refuses a name without fn
            declared = Tool(name, fn)
        call = _ToolStep(step, name, args, args_json, args_digest)
        return await self._call_tool(call, declared, invalid, 1 if rec is None else rec.attempts + 1)

    async def _call_tool(
        self, call: _ToolStep, declared: Tool, invalid: ToolArgumentsError | None, attempt: int
    ) -> Any:
        """Call the tool live from ``attempt`` on, recording each attempt as ``tool.called`` and
        retrying as its ``Retry`` says (never arguments it refused: ``invalid``). Returns the output
        as a replay returns it; raises ToolFailedError after the last failed attempt."""
        step, name, args = call.step, call.name, call.args
        retry = declared.retry or NO_RETRY
        first = time.monotonic()
        while True:
            await self._check_budgets(step, model_call=False)
            started = time.perf_counter()
            output: Any = None
            failure: Exception | None = None
            try:
                # Validity is decided on the args as recorded (never on resolved secrets), so the
                # record and any replay agree; the call validates the resolved ones for its values.
                if invalid is None:
                    invalid = declared.argument_error(args)
                if invalid is not None:
                    raise invalid
                output = jsonable(await declared.call(self._resolve(args)))
            except Exception as exc:
                failure = exc
            again, wait, info = False, 0.0, None
            encoded = {"args": call.args_json}
            if failure is not None:
                wait = retry.wait_s(attempt)
                again = invalid is None and retry.another(attempt, failure, time.monotonic() - first, wait)
                info = error_info(failure, False, retryable=invalid is None and retry.retryable(failure))
            else:
                # Encoded once: sealed as the record's content, and decoded as what the agent gets.
                encoded["output"] = output_json = canonical.canonical_json(output, self._cp.chain_format)
            await self._append(
                ToolCalled(
                    step=step,
                    name=name,
                    args=args,
                    args_digest=call.args_digest,
                    output=output,
                    error=info,
                    duration_ms=(time.perf_counter() - started) * 1000,
                    attempt=attempt,
                    will_retry=again,
                    **declared.recorded_facts(),
                ),
                encoded,
            )
            if not again:
                break
            logger.info("tool %s (step %d) attempt %d failed (%s); retrying in %.1fs", name, step,
                        attempt, info.type if info else "?", wait)  # fmt: skip
            await asyncio.sleep(wait)
            attempt += 1
        self._after_step(step)
        if info is not None:
            raise ToolFailedError(name, step, info.type, info.message, retryable=info.retryable) from failure
        return read_back(json.loads(output_json), output_json)  # as_recorded(output): the value a replay returns

    # -- effects: runledger.sdk.effect_step (EffectStep, this class's base) --------------------------

    # -- approvals -----------------------------------------------------------------------------------

    async def approval(self, action: str, args: Any = None) -> dict[str, Any]:
        """Ask an operator to approve ``action`` with ``args``. Returns the decision when approved.

        The first time, records ``approval.requested`` and ``run.suspended`` and raises
        SuspendedForApprovalError (the runner ends the process cleanly). After
        ``runledger approve``, a resume returns the decision here; a denial raises
        ApprovalDeniedError. An approval is bound to the digest of (action, args): if the
        code now asks for something different, a new request is made.
        """
        args = jsonable(args)
        approval_digest = self._digests.digest({"action": action, "args": args})
        step, rec = self._take_step()
        if rec is not None:
            if rec.kind != "approval" or rec.name != action:
                self._check(step, rec, "approval", action, None)
            if rec.args_digest == approval_digest:
                if rec.status == "approved":
                    return dict(rec.output or {})
                if rec.status == "denied":
                    raise ApprovalDeniedError(self.run_id, rec.request_id or "", (rec.output or {}).get("reason"))
                assert rec.request_id is not None
                raise SuspendedForApprovalError(self.run_id, rec.request_id, action)
        request_id = uuid.uuid4().hex[:12]
        await self._mirrored()  # an effect's record on its way lands before the run suspends
        await self._append(
            ApprovalRequested(step=step, request_id=request_id, action=action, args=args, digest=approval_digest)
        )
        await self._append(RunSuspended(step=step, request_id=request_id, reason="approval"))
        await self.commit()  # the request is what an operator sees: acknowledged before it is raised
        self._after_step(step)
        raise SuspendedForApprovalError(self.run_id, request_id, action)

    # -- child runs ----------------------------------------------------------------------------------

    async def child(self, spec: AgentSpec, input: Any = None) -> Any:
        """Run ``spec`` as a child run of this one; the child's output is this step's result.

        The child is an ordinary run on its own subject (its own version tuple, journal, data
        policy and budgets) whose ``run.started`` names this run and step (``parent_run_id``,
        ``parent_step``). Its id is ``child_run_id(self.run_id, step)``: derived, so a resume finds
        the same child. This run records ``child.started`` (child id, agent, input digest) before
        the child starts, and ``child.completed`` (its output) or ``child.failed`` after it ended.

        On replay a completed child returns its recorded output and a failed one raises
        ChildFailedError, running nothing (after the kind, agent name and input digest are checked
        against the record, like any step). A child started but without a recorded outcome (a
        crash inside it, or after it ended) is resumed (``resume_run``, fenced, replaying its own
        journal; a child that finished meanwhile just reports its outcome) or, if it never got to
        record its ``run.started``, started with that id; then its outcome is recorded here.

        A child that suspends (an approval, an effect in doubt, a suspended grandchild) suspends
        this run too: ``run.suspended`` (reason ``child``, request id: the child's run id) is
        recorded and ChildSuspendedError raised (the runner ends cleanly; ``pending`` lists the
        child's approval requests). Approve or settle in the child, then resume this run: it
        resumes the child. A failed child raises ChildFailedError, which the agent may catch.

        Budgets are separate: the child spends its own (``spec.budgets``), and its turns, tokens and
        seconds do not count against this run's; this run's wall-clock seconds include the time it
        waits for the child, and its budgets are checked before a child starts. Children in
        parallel (``asyncio.gather``) take step numbers in call order, like any step.
        """
        input = jsonable(input)
        args_digest = self._digests.digest(input)
        step, rec = self._take_step()
        if rec is not None:
            self._check(step, rec, "child", spec.name, args_digest, input)
            if rec.status == "completed":
                return await self._open(rec.output)
            if rec.status == "failed":
                raise await self._recorded_child_failure(step, rec)
            # Started, no outcome: the rest of the child is live work (the collector may run again).
            if self._on_live is not None:
                on_live, self._on_live = self._on_live, None
                on_live()
            child_id = rec.child_run_id or child_run_id(self.run_id, step)
            return await self._child_outcome(step, child_id, await self._run_child(spec, child_id, input, step, True))
        await self._check_budgets(step, model_call=False)
        child_id = child_run_id(self.run_id, step)
        await self._append(ChildStarted(step=step, run_id=child_id, agent=spec.name, args_digest=args_digest))
        await self.commit()  # the child is another run: its parent's log holds everything before it
        crash_point(f"child:{step}:started")
        return await self._child_outcome(step, child_id, await self._run_child(spec, child_id, input, step, False))

    async def _run_child(self, spec: AgentSpec, child_id: str, input: Any, step: int, resume: bool) -> RunResult:
        if self._child_driver is None:
            raise ConfigurationError(
                f"run {self.run_id} cannot start child runs: it was not built by start_run or resume_run"
            )
        return await self._child_driver(self, spec, child_id, input, step, resume)

    async def _child_outcome(self, step: int, child_id: str, result: RunResult) -> Any:
        """Record how the child ``child_id`` of ``step`` ended and answer the agent accordingly."""
        if result.status == "completed":
            output = jsonable(result.output)
            await self._append(ChildCompleted(step=step, run_id=child_id, output=output))
            self._after_step(step)
            return as_recorded(output, self._cp.chain_format)
        if result.status == "failed":
            reason, message = result.reason or "exception", result.error or ""
            error = ErrorInfo(type=ChildFailedError.__name__, message=message)
            await self._append(ChildFailed(step=step, run_id=child_id, reason=reason, error=error))
            self._after_step(step)
            raise ChildFailedError(self.run_id, step, child_id, reason, message)
        await self._append(RunSuspended(step=step, request_id=child_id, reason="child"))
        suspended = ChildSuspendedError(self.run_id, step, child_id, result.reason or "suspended", result.error or "")
        suspended.pending = list(result.pending)
        raise suspended

    async def _recorded_child_failure(self, step: int, rec: StepRecord) -> ChildFailedError:
        """What a recorded ``child.failed`` raises on replay, its message opened (error texts are sealed)."""
        error = rec.error or {}
        message = error.get("message", "")
        if isinstance(message, str) and is_placeholder(message):
            message = await self._payload_opener().open_text(message)
        child_id = rec.child_run_id or child_run_id(self.run_id, step)
        return ChildFailedError(self.run_id, step, child_id, str(error.get("reason") or "exception"), str(message))

    # -- clock and randomness ------------------------------------------------------------------------

    async def now(self) -> dt.datetime:
        """The current time, recorded, so a replay sees the same instant."""
        step, rec = self._take_step()
        if rec is not None:
            self._check(step, rec, "clock", "clock", None)
            return dt.datetime.fromisoformat(str(rec.output))
        value = dt.datetime.now(dt.UTC)
        await self._append(ClockRead(step=step, value=value.isoformat()))
        self._after_step(step)
        return value

    async def random(self) -> float:
        """A random float in [0, 1), recorded, so a replay draws the same number."""
        step, rec = self._take_step()
        if rec is not None:
            self._check(step, rec, "random", "random", None)
            return float(rec.output)
        value = _random.random()
        await self._append(RandomDrawn(step=step, value=value))
        self._after_step(step)
        return value


_UNSET: Any = object()


def child_run_id(parent_run_id: str, step: int) -> str:
    """The id of the child run a run starts at ``step``: derived, so a resume finds the same child."""
    return f"{parent_run_id}-c{step}"


def response_record(response: ModelResponse) -> dict[str, Any]:
    """A model's response as the record keeps it (JSON, without the usage the event holds apart).
    Where the call went is the event's (``model.called``'s ``server``: structure, kept under every
    capture policy), not the response's; the model's own finish reason is kept only when the adapter
    saw one, so a response without it records the bytes it recorded before the field existed."""
    recorded: dict[str, Any] = jsonable(response.model_dump(exclude={"input_tokens", "output_tokens", "server"}))
    if recorded.get("model_finish_reason", "") is None:
        del recorded["model_finish_reason"]
    return recorded


def response_from_record(output: Any, response_type: type[ModelResponse] = ModelResponse) -> ModelResponse:
    """The model's response as the record keeps it (its JSON, with the fold's ``usage``), rebuilt as the
    adapter's ``response_type``: what every path hands the agent, live included (``RecordedRun.model``)."""
    data = dict(output or {})
    usage = data.pop("usage", {}) or {}
    return response_type.model_validate(
        {
            **data,
            "content": data.get("content", ""),
            "tool_calls": data.get("tool_calls", []),
            "finish_reason": data.get("finish_reason", "stop"),
            "input_tokens": usage.get("input_tokens", 0),
            "output_tokens": usage.get("output_tokens", 0),
        }
    )


if TYPE_CHECKING:  # mypy checks that RecordedRun is a Run (runledger.sdk.protocol); nothing runs here
    from runledger.sdk.protocol import Run

    def _is_a_run(run: RecordedRun) -> Run:
        return run
