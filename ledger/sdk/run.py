"""The Run API: every non-deterministic thing an agent does is a journaled step.

Each call (``model``, ``tool``, ``effect``, ``approval``, ``now``, ``random``) takes
the next step number. If the journal (the checkpoint folded from the run's
events) already holds that step, the recorded result is returned without running
anything, after checking that the kind, name and args digest match; otherwise the
call runs live, its event is published and acknowledged, and only then is the
result returned (write-ahead: a crash loses at most the step in flight).

Every appended event is also folded into the in-memory checkpoint with the same
``apply`` the readers use, so spend and position are never computed twice.

The NATS-bound modules (client, publish, effects) are imported for types only, or where an
effect is settled: agent code imports ``Run`` for its annotations, and inside the sandbox
(which runs agents against ``runledger.sandbox.guest.RemoteRun``) that must not load the NATS client.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random as _random
import time
import traceback
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runledger.errors import (
    ApprovalDeniedError,
    BudgetExhaustedError,
    ConfigurationError,
    EffectClaimedElsewhereError,
    EffectFailedError,
    EffectInDoubtError,
    FencedError,
    NondeterminismError,
    PayloadUnavailableError,
    SuspendedForApproval,
    ToolFailedError,
)
from runledger.protect.capture import (
    PayloadOpener,
    PayloadProtector,
    client_opener,
    is_marker,
)
from runledger.record.canonical import as_recorded, digest, jsonable
from runledger.record.events import (
    ApprovalRequested,
    ClockRead,
    EffectCommitted,
    EffectFailed,
    EffectIntended,
    EffectResolved,
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
from runledger.sdk.models import ModelResponse
from runledger.sdk.tools import NOT_FOUND, EffectClass, Tool, ToolFn, call_maybe_async

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.log.publish import RetryPolicy, SubjectWriter
    from runledger.sdk.effects import KeyState


def error_info(exc: BaseException, with_traceback: bool = True) -> ErrorInfo:
    """The recorded form of an exception. An error reported from elsewhere (a sandboxed
    agent) keeps its own type name and traceback via ``remote_type`` / ``remote_traceback``."""
    tb = getattr(exc, "remote_traceback", None)
    if tb is None and with_traceback:
        tb = "".join(traceback.format_exception(exc))
    return ErrorInfo(type=getattr(exc, "remote_type", type(exc).__name__), message=str(exc), traceback=tb)


class RecordedRun:
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
        self._cp = checkpoint
        self._policy = policy
        # Content protection (runledger.protect.capture): what is recorded is redacted/sealed; the agent
        # gets the real values live, and recorded ones (opened on demand) on replay.
        self._protector = protector
        self._opener: PayloadOpener | None = None
        self._input: Any = _UNSET
        self._next_step = 0
        self._append_lock = asyncio.Lock()
        self._on_live: Callable[[], None] | None = None  # called once, when the first live step is taken
        self._segment_wall = time.time()
        self._seconds_at_segment = checkpoint.spent["seconds"]

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
        if is_marker(value):
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

    # -- plumbing ------------------------------------------------------------------------------------

    async def _open(self, value: Any) -> Any:
        """A recorded value as the agent saw it: unsealed, blob fetched and verified (strict).

        Called once per replayed step, when the step returns the value: never before (an
        output the agent's code does not reach is never decrypted) and never twice."""
        if not is_marker(value):
            return value
        opener = self._opener
        if opener is None:
            opener = self._opener = client_opener(self._client)
            if self._protector is not None and self._protector.keys is not None:
                opener.remember(self._protector.keys)
        return await opener.open_value(value)

    async def _open_model_output(self, output: Any) -> Any:
        # The fold merges usage (structure) into the recorded response (content).
        if not output:
            return output
        usage = output.get("usage")
        data = {k: v for k, v in output.items() if k != "usage"} if "usage" in output else output
        if not is_marker(data):
            return output
        return {**(await self._open(data)), "usage": usage or {}}

    def _resolve(self, args: Any) -> Any:
        """``args`` for the tool itself: ``secret://NAME`` references resolved (never recorded)."""
        return args if self._protector is None else self._protector.resolve_secrets(args)

    async def _append(self, body: Payload) -> Event:
        # Steps may be in flight together (asyncio.gather of tool calls): the run's one writer
        # appends them one at a time, each fenced on the one before, and folds each before the
        # next is appended, so the chain, the fence and the checkpoint never see two at once.
        async with self._append_lock:
            event = await self._writer.append(body)
            apply(self._cp, Recorded(event, self._writer.last_stream_seq), check_chain=False)
        return event

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

    # -- model ---------------------------------------------------------------------------------------

    async def model(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        """Call the agent's model. Live: the call, its response and token usage are recorded."""
        messages = jsonable(messages)
        params = jsonable(params)
        name = self._spec.model.name
        args_digest = digest({"messages": messages, "params": params})
        step, rec = self._take_step()
        if rec is not None:
            self._check(step, rec, "model", name, args_digest, {"messages": messages, "params": params})
            if rec.error:
                raise ToolFailedError(name, step, rec.error["type"], rec.error["message"])
            return _response_from_record(await self._open_model_output(rec.output))
        await self._check_budgets(step, model_call=True)
        started = time.perf_counter()
        try:
            response = await self._spec.model.complete(messages, **params)
        except Exception as exc:
            await self._append(
                ModelCalled(
                    step=step,
                    model=name,
                    request={"messages": messages, "params": params},
                    args_digest=args_digest,
                    error=error_info(exc, False),
                    duration_ms=(time.perf_counter() - started) * 1000,
                )
            )
            raise
        await self._append(
            ModelCalled(
                step=step,
                model=name,
                request={"messages": messages, "params": params},
                args_digest=args_digest,
                response={
                    "content": response.content,
                    "tool_calls": response.tool_calls,
                    "finish_reason": response.finish_reason,
                },
                usage=Usage(input_tokens=response.input_tokens, output_tokens=response.output_tokens),
                duration_ms=(time.perf_counter() - started) * 1000,
            )
        )
        self._after_step(step)
        limit = self._cp.limits.get("tokens")
        if limit is not None and self._cp.spent["tokens"] > limit:
            raise BudgetExhaustedError(self.run_id, "tokens", self._cp.spent["tokens"], limit)
        return response.model_copy(update={"tool_calls": as_recorded(response.tool_calls)})

    # -- tools ---------------------------------------------------------------------------------------

    def _resolve_tool(self, tool: str | Tool, fn: ToolFn | None) -> Tool:
        if isinstance(tool, Tool):
            return tool
        declared = self._spec.tool_map.get(tool)
        if declared is not None:
            return declared
        if fn is None:
            raise ConfigurationError(f"tool {tool!r} is not declared on agent {self._spec.name} and no fn= was given")
        return Tool(tool, fn)

    async def tool(self, tool: str | Tool, args: Any = None, *, fn: ToolFn | None = None) -> Any:
        """Call a tool. Read tools are recorded as tool.called; write/irreversible ones go
        through the effect ledger with the key their declaration builds from ``args``."""
        declared = self._resolve_tool(tool, fn)
        if declared.effect_class != "read":
            assert declared.key is not None
            return await self.effect(
                declared.name,
                args,
                key=declared.key(args),
                fn=declared.fn,
                reconcile=declared.reconcile,
                effect_class=declared.effect_class,
            )
        args = jsonable(args)
        args_digest = digest(args)
        step, rec = self._take_step()
        if rec is not None:
            self._check(step, rec, "tool", declared.name, args_digest, args)
            if rec.error:
                raise ToolFailedError(declared.name, step, rec.error["type"], rec.error["message"])
            return await self._open(rec.output)
        await self._check_budgets(step, model_call=False)
        started = time.perf_counter()
        output: Any = None
        failure: Exception | None = None
        try:
            output = jsonable(await call_maybe_async(declared.fn, self._resolve(args)))
        except Exception as exc:
            failure = exc
        info = None if failure is None else error_info(failure, False)
        await self._append(
            ToolCalled(
                step=step,
                name=declared.name,
                args=args,
                args_digest=args_digest,
                output=output,
                error=info,
                duration_ms=(time.perf_counter() - started) * 1000,
            )
        )
        self._after_step(step)
        if info is not None:
            raise ToolFailedError(declared.name, step, info.type, info.message) from failure
        return as_recorded(output)

    # -- effects -------------------------------------------------------------------------------------

    async def effect(
        self,
        name: str,
        args: Any,
        *,
        key: str,
        fn: ToolFn,
        reconcile: Any = None,
        effect_class: EffectClass = "write",
    ) -> Any:
        """Perform a side effect at most once per idempotency ``key``, across processes.

        Claims the key on its own subject (first claim wins, server-side), calls ``fn(args)``,
        records the outcome. A key already committed returns its recorded result without
        acting. A claim with no outcome is in doubt: ``reconcile(key)`` decides (it returns the
        result, or NOT_FOUND when the external system has no trace), else EffectInDoubtError.
        """
        if not key:
            raise ConfigurationError(f"effect {name!r} needs a non-empty idempotency key")
        args = jsonable(args)
        args_digest = digest(args)
        step, rec = self._take_step()
        if rec is not None:
            self._check(step, rec, "effect", name, args_digest, args)
            if rec.key != key:
                raise NondeterminismError(self.run_id, step, f"effect key {rec.key!r}", f"effect key {key!r}")
            if rec.status == "committed":
                return await self._open(rec.output)
            if rec.status == "failed":
                raise EffectFailedError(key, (rec.error or {}).get("message", "failed"))
            # Recorded as intended only: the process died somewhere inside the effect.
            return await self._settle(step, name, args, key, fn, reconcile)
        await self._check_budgets(step, model_call=False)
        # Write-ahead, both before acting and published together: the run's intent, and the claim
        # of the key, optimistically as its first event (fenced on "the subject is empty"). A key
        # with a history refuses that claim; then _settle reads the key and decides. Either order
        # of the two writes is a state a crash between them could leave, and resume handles both.
        claim = asyncio.ensure_future(self._claim_new_key(step, name, args, args_digest, key))
        try:
            await self._append(
                EffectIntended(
                    step=step, name=name, key=key, args=args, args_digest=args_digest, effect_class=effect_class
                )
            )
        except BaseException:
            await asyncio.gather(claim, return_exceptions=True)  # never act, never leave it running
            raise
        claimed = await claim
        if claimed is None:
            return await self._settle(step, name, args, key, fn, reconcile)
        return await self._act(step, args, key, fn, claimed)

    async def _claim_new_key(self, step: int, name: str, args: Any, args_digest: str, key: str) -> KeyState | None:
        """Claim a key that has never been used; None when it has a history (the fence refused)."""
        from runledger.sdk.effects import KeyState, append_to_key

        try:
            return await append_to_key(
                self._client,
                KeyState(key),
                EffectIntended(step=step, name=name, key=key, args=args, args_digest=args_digest),
                run_id=self.run_id,
                agent=self.agent,
                policy=self._policy,
                transform=self._writer.transform,
            )
        except FencedError:
            return None

    async def _settle(self, step: int, name: str, args: Any, key: str, fn: ToolFn, reconcile: Any) -> Any:
        """Bring the key to an outcome for this step: reuse, reconcile, or claim and act."""
        from runledger.sdk.effects import read_key

        state = await read_key(self._client, key)
        if state.status == "claimed":
            if state.run_id != self.run_id or state.step != step:
                raise EffectClaimedElsewhereError(key, state.run_id or "?", state.step or -1)
            if reconcile is None:
                await self._append(RunSuspended(step=step, request_id=key, reason="effect_in_doubt"))
                raise EffectInDoubtError(self.run_id, step, key)
            found = await call_maybe_async(reconcile, key)
            resolution = EffectResolved(
                key=key,
                by="reconcile",
                outcome="not_committed" if found is NOT_FOUND else "committed",
                result=None if found is NOT_FOUND else jsonable(found),
            )
            state = await self._append_key(state, resolution)
        if state.status == "committed":
            await self._append(
                EffectCommitted(
                    step=step,
                    key=key,
                    result=state.result,
                    via="reconcile" if state.via == "reconcile" else "record",
                )
            )
            self._after_step(step)
            return await self._open(state.result)
        # free (never claimed, released, or an earlier attempt failed): claim, act, record.
        state = await self._append_key(
            state, EffectIntended(step=step, name=name, key=key, args=args, args_digest=digest(args))
        )
        return await self._act(step, args, key, fn, state)

    async def _act(self, step: int, args: Any, key: str, fn: ToolFn, state: KeyState) -> Any:
        """The key is claimed by this step: call the function, record the outcome (key first, then run)."""
        crash_point(f"effect:{key}:claimed")
        started = time.perf_counter()
        try:
            result = jsonable(await call_maybe_async(fn, self._resolve(args)))
        except Exception as exc:
            info = error_info(exc, False)
            await self._append_key(state, EffectFailed(step=step, key=key, error=info))
            await self._append(EffectFailed(step=step, key=key, error=info))
            self._after_step(step)
            raise EffectFailedError(key, f"{info.type}: {info.message}") from exc
        duration = (time.perf_counter() - started) * 1000
        crash_point(f"effect:{key}:acted")
        await self._append_key(state, EffectCommitted(step=step, key=key, result=result, duration_ms=duration))
        crash_point(f"effect:{key}:recorded")
        await self._append(EffectCommitted(step=step, key=key, result=result, duration_ms=duration))
        self._after_step(step)
        return as_recorded(result)

    async def _append_key(self, state: KeyState, body: Payload) -> KeyState:
        from runledger.sdk.effects import append_to_key, read_key

        try:
            return await append_to_key(
                self._client,
                state,
                body,
                run_id=self.run_id,
                agent=self.agent,
                policy=self._policy,
                transform=self._writer.transform,
            )
        except FencedError:
            # Someone else wrote to the key between our read and our write: re-read and report.
            fresh = await read_key(self._client, state.key)
            if fresh.status == "committed":
                return fresh
            raise EffectClaimedElsewhereError(state.key, fresh.run_id or "?", fresh.step or -1) from None

    # -- approvals -----------------------------------------------------------------------------------

    async def approval(self, action: str, args: Any = None) -> dict[str, Any]:
        """Ask an operator to approve ``action`` with ``args``. Returns the decision when approved.

        The first time, records ``approval.requested`` and ``run.suspended`` and raises
        SuspendedForApproval (the runner ends the process cleanly). After
        ``runledger approve``, a resume returns the decision here; a denial raises
        ApprovalDeniedError. An approval is bound to the digest of (action, args): if the
        code now asks for something different, a new request is made.
        """
        args = jsonable(args)
        approval_digest = digest({"action": action, "args": args})
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
                raise SuspendedForApproval(self.run_id, rec.request_id, action)
        request_id = uuid.uuid4().hex[:12]
        await self._append(
            ApprovalRequested(step=step, request_id=request_id, action=action, args=args, digest=approval_digest)
        )
        await self._append(RunSuspended(step=step, request_id=request_id, reason="approval"))
        self._after_step(step)
        raise SuspendedForApproval(self.run_id, request_id, action)

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


def _response_from_record(output: Any) -> ModelResponse:
    data = dict(output or {})
    usage = data.pop("usage", {}) or {}
    return ModelResponse(
        content=data.get("content", ""),
        tool_calls=data.get("tool_calls", []),
        finish_reason=data.get("finish_reason", "stop"),
        input_tokens=usage.get("input_tokens", 0),
        output_tokens=usage.get("output_tokens", 0),
    )


if TYPE_CHECKING:  # mypy checks that RecordedRun is a Run (runledger.sdk.api); nothing runs here
    from runledger.sdk.api import Run

    def _is_a_run(run: RecordedRun) -> Run:
        return run
