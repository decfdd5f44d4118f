"""A branch run: a new run that stands a recorded run back up at step k and drives it on.

Every re-run is a new run whose ``run.forked`` names the parent, the fork step, the mode
and the changed version-tuple element. What each call does, by mode:

| mode           | step < k                       | step >= k                                                   |
|----------------|--------------------------------|-------------------------------------------------------------|
| redrive        | served from the parent's record| model live; tools, effects, clock, random from the record   |
|                |                                | by position; a call the record cannot answer diverges       |
|                |                                | (NondeterminismError, diverged=True)                        |
| live           | served from the parent's record| model and read tools live; effects through dry-run stubs:   |
|                |                                | a key committed with the same args digest returns its       |
|                |                                | recorded result; a key committed with other arguments is    |
|                |                                | simulated and marked (reason args_differ, both digests);    |
|                |                                | a new key is simulated unless effects are allowed           |
| counterfactual | as redrive or live, with exactly one version-tuple element changed (RunForked.changed) |

A committed key is judged by its arguments, never by its name alone: the branch's args
digest is compared with the one the key's committing claim recorded (its ``effect.intended``
on the key's subject). Only an equal digest gets the recorded result (``effect.committed``,
``via="record"``). A different one is neither acted nor served as committed, whatever
``allow_effects`` says (the key is taken): it is recorded as ``effect.simulated`` whose
result says so (``ARGS_DIFFER``; see ``args_differ_marker``), and ``runledger diff`` and
sweeps report it (docs/sandbox.md, "Live re-runs judge keys by their arguments").

A child run (``run.child``) is never started by a re-run (its code would run on the host):
it is served from the parent's record before the fork and, in redrive, after it; a live
re-run refuses it past the fork (``served_child``).

Steps served from the parent are recorded again in the branch (same outputs), so a
branch is a complete run: foldable, resumable (a redelivered re-run resumes its branch
with the ordinary journal) and diffable step by step against its parent. Before the
fork, a call that does not match the parent's record is nondeterminism (the code
changed before the fork point), not divergence.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from runledger.errors import ChildFailedError, ConfigurationError, NondeterminismError
from runledger.log.client import LedgerClient
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import effect_subject
from runledger.record.canonical import digest, jsonable
from runledger.record.events import (
    ApprovalRequested,
    ApprovalResolved,
    ChildCompleted,
    ChildFailed,
    ChildStarted,
    ClockRead,
    EffectCommitted,
    EffectIntended,
    EffectSimulated,
    ErrorInfo,
    ModelCalled,
    RandomDrawn,
    ToolCalled,
    Usage,
)
from runledger.record.fold import Checkpoint, StepRecord
from runledger.sdk.agent import AgentSpec
from runledger.sdk.effects import KeyState, apply_key
from runledger.sdk.models import ModelResponse
from runledger.sdk.run import RecordedRun
from runledger.sdk.tools import Tool, ToolFn

Mode = Literal["redrive", "live"]

# The ``reason`` of a simulated effect whose key was committed with other arguments.
ARGS_DIFFER = "args_differ"


def args_differ_marker(result: Any) -> dict[str, Any] | None:
    """The marker of an effect simulated because its key was committed with other arguments.

    It is the simulated result itself (``effect.simulated`` has no field for it):
    ``{"simulated": true, "effect", "key", "reason": "args_differ", "args_digest": the branch's,
    "committed_args_digest": the committing claim's (None if that claim could not be read)}``.
    None for anything else."""
    if isinstance(result, dict) and result.get("simulated") is True and result.get("reason") == ARGS_DIFFER:
        return result
    return None


async def read_committed_claim(client: LedgerClient, key: str) -> tuple[KeyState, str | None]:
    """The key's state and, when it is committed, the args digest of the claim that committed it.

    ``KeyState`` does not keep the claim's digest, so the key's subject is read and folded
    here (what ``read_key`` does) while the digest of the latest ``effect.intended`` is kept:
    a key is claimed only while free, so the claim before the commit is the committing one."""
    raws = await read_raw(client, effect_subject(key))
    good, _bad = decode_records(raws)
    state = KeyState(key)
    claim: str | None = None
    committed: str | None = None
    for rec in good:
        apply_key(state, rec)
        if rec.event.type == "effect.intended":
            claim = rec.event.payload.get("args_digest")
        if state.status == "committed" and committed is None:
            committed = claim
    if raws:
        state.last_stream_seq = max(r.stream_seq for r in raws)
    return state, committed if state.status == "committed" else None


class BranchRun(RecordedRun):
    """The host-side Run of a re-run: applies the mode's rules to every call."""

    def __init__(
        self,
        *args: Any,
        parent: Checkpoint,
        fork_step: int,
        mode: Mode,
        allow_effects: bool = False,
        live_tools: frozenset[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.parent = parent
        self.fork_step = fork_step
        self.mode = mode
        self.allow_effects = allow_effects
        self.live_tools = live_tools

    # -- helpers -------------------------------------------------------------------------------------

    def _own_journal(self) -> bool:
        """The branch's own record answers this step (a redelivered re-run resuming)."""
        return self._next_step in self._cp.steps

    def _recorded(self, kind: str, name: str | None, args_digest: str | None) -> tuple[int, StepRecord | None]:
        """The parent's record at the next step, if it answers this call (kind, name, args)."""
        step = self._next_step
        rec = self.parent.steps.get(step)
        if rec is None or rec.kind != kind:
            return step, None
        if name is not None and rec.name != name:
            return step, None
        if args_digest is not None and rec.args_digest != args_digest:
            return step, None
        return step, rec

    def _unanswerable(self, step: int, attempted: str) -> Exception:
        rec = self.parent.steps.get(step)
        recorded = "nothing (the parent ended before this step)" if rec is None else f"{rec.kind} {rec.name!r}"
        if step < self.fork_step:
            return NondeterminismError(self.run_id, step, recorded, attempted)
        return NondeterminismError(self.parent.run_id, step, recorded, attempted, diverged=True)

    def _from_record(self, step: int) -> bool:
        return step < self.fork_step or self.mode == "redrive"

    # -- model ---------------------------------------------------------------------------------------

    async def model(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        if self._own_journal() or self._next_step >= self.fork_step:
            return await super().model(messages, **params)  # live from the fork on, in every mode
        messages, params = jsonable(messages), jsonable(params)
        args_digest = digest({"messages": messages, "params": params})
        step, rec = self._recorded("model", None, args_digest)
        if rec is None:
            raise self._unanswerable(step, f"model (args {args_digest[:12]})")
        self._next_step += 1
        output = dict(await self._open_model_output(rec.output) or {})
        usage = Usage(**(output.pop("usage", None) or {}))
        await self._append(
            ModelCalled(
                step=step, model=rec.name, request={"messages": messages, "params": params},
                args_digest=args_digest, response=output, usage=usage,
            )
        )  # fmt: skip
        return ModelResponse(**output, input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)

    # -- tools ---------------------------------------------------------------------------------------

    async def tool(
        self, tool: str | Tool, args: Any = None, *, fn: ToolFn | None = None, tool_call_id: str | None = None
    ) -> Any:
        name = tool if isinstance(tool, str) else tool.name
        declared = self._spec.tool_map.get(name) if isinstance(tool, str) else tool
        # An effect tool whose arguments its signature refuses is a failed tool step (as in RecordedRun.tool).
        if declared is not None and declared.effect_class != "read" and declared.argument_error(jsonable(args)) is None:
            assert declared.key is not None
            key = self._effect_key(declared.key, jsonable(args), tool_call_id=tool_call_id)
            return await self.effect(name, args, key=key, fn=declared.call, reconcile=declared.reconcile,
                                     effect_class=declared.effect_class, tool_call_id=tool_call_id,
                                     lease_s=declared.lease_s)  # fmt: skip
        step = self._next_step
        if self._own_journal() or not self._from_record(step):
            if self.live_tools is not None and name not in self.live_tools and not self._own_journal():
                raise ConfigurationError(f"tool {name!r} is not marked live for this re-run (--live-tool {name})")
            return await super().tool(tool, args, fn=fn, tool_call_id=tool_call_id)
        args = jsonable(args)
        args_digest = digest(args)
        step, rec = self._recorded("tool", name, args_digest)
        if rec is None:
            raise self._unanswerable(step, f"tool {name!r} (args {args_digest[:12]})")
        self._next_step += 1
        output = await self._open(rec.output)  # unsealed and fetched: the branch seals it anew
        await self._append(
            ToolCalled(
                step=step,
                name=name,
                args=args,
                args_digest=args_digest,
                output=output,
                error=ErrorInfo(**rec.error) if rec.error else None,
            )
        )
        if rec.error:
            raise await self._recorded_failure(name, step, rec.error)
        return output

    # -- effects -------------------------------------------------------------------------------------

    async def effect(
        self, name: str, args: Any, *, key: str, fn: ToolFn | None = None, reconcile: Any = None,
        effect_class: Any = "write", tool_call_id: str | None = None, lease_s: float | None = None,
    ) -> Any:  # fmt: skip
        step = self._next_step
        if self._own_journal():
            return await self._replay_own_effect(name, args, key=key, fn=fn, reconcile=reconcile)
        args = jsonable(args)
        args_digest = digest(args)
        if self._from_record(step):
            step, rec = self._recorded("effect", name, args_digest)
            if rec is None or rec.key != key or rec.status not in ("committed", "simulated"):
                raise self._unanswerable(step, f"effect {name!r} key {key!r}")
            self._next_step += 1
            result = await self._open(rec.output)
            await self._append(EffectIntended(step=step, name=name, key=key, args=args, args_digest=args_digest))
            await self._append(EffectCommitted(step=step, key=key, result=result, via="record"))
            return result
        # Live re-execution: the dry-run stub checks the key, and the arguments it was committed
        # with, against the ledger first.
        state, committed_digest = await read_committed_claim(self._client, key)
        if state.status == "committed" and committed_digest == args_digest:
            self._next_step += 1
            await self._append(EffectIntended(step=step, name=name, key=key, args=args, args_digest=args_digest))
            result = await self._open(state.result)
            await self._append(EffectCommitted(step=step, key=key, result=result, via="record"))
            return result
        if state.status == "committed":
            # The key is taken by another body: acting is impossible and serving the committed
            # result would report an effect that never happened with these arguments.
            self._next_step += 1
            marked = {"simulated": True, "effect": name, "key": key, "reason": ARGS_DIFFER,
                      "args_digest": args_digest, "committed_args_digest": committed_digest}  # fmt: skip
            await self._append(EffectSimulated(step=step, name=name, key=key, args=args, result=marked))
            return marked
        if self.allow_effects:
            declared = self._spec.tool_map.get(name)
            real_fn = fn if fn is not None else (declared.call if declared else None)
            if real_fn is None:
                raise ConfigurationError(f"effect {name!r} has no function on the host to run for real")
            return await super().effect(name, args, key=key, fn=real_fn, reconcile=reconcile, effect_class=effect_class,
                                        tool_call_id=tool_call_id, lease_s=lease_s)  # fmt: skip
        self._next_step += 1
        result = {"simulated": True, "effect": name, "key": key}
        await self._append(EffectSimulated(step=step, name=name, key=key, args=args, result=result))
        return result

    async def _replay_own_effect(self, name: str, args: Any, *, key: str, fn: ToolFn | None, reconcile: Any) -> Any:
        rec = self._cp.steps[self._next_step]
        if rec.status == "simulated":
            self._next_step += 1
            return await self._open(rec.output)
        if rec.status == "committed":
            return await super().effect(name, args, key=key, fn=fn or _never, reconcile=reconcile)
        raise self._unanswerable(self._next_step, f"effect {name!r} key {key!r} (in doubt in the branch)")

    # -- child runs ----------------------------------------------------------------------------------

    async def child(self, spec: AgentSpec, input: Any = None) -> Any:
        return await self.served_child(spec.name, input)

    async def served_child(self, agent: str, input: Any = None) -> Any:
        """A child step (``run.child``) of the re-run, answered from the parent's record; the broker's
        ``child`` op (the guest names the child's agent, never code for the host to load).

        A re-run never starts a child run: the child's agent code would run on the host, outside
        the sandbox. Before the fork (every mode), and from the fork on in ``redrive`` mode (by
        position, like a tool), the parent's child step answers it when the agent name and input
        digest match and it has an outcome: the branch records ``child.started`` naming the
        parent's child run (whose output it serves) and ``child.completed``, or ``child.failed``
        (raised as ChildFailedError). A call the record cannot answer is nondeterminism (diverged
        past the fork). From the fork on in ``live`` mode a child is refused (ConfigurationError):
        fork after the child's step, re-drive, or re-run the child run itself."""
        input = jsonable(input)
        args_digest = digest(input)
        step = self._next_step
        own = self._cp.steps.get(step)  # the branch's own journal (a redelivered re-run resuming)
        if own is not None:
            self._check(step, own, "child", agent, args_digest, input)
            if own.status in ("completed", "failed"):
                self._next_step += 1
                if own.status == "completed":
                    return await self._open(own.output)
                raise await self._recorded_child_failure(step, own)
        elif not self._from_record(step):
            raise ConfigurationError(
                f"child run of agent {agent!r} at step {step}: a live re-run does not start child runs (their code "
                "would run on the host, outside the sandbox); fork after this step, re-drive, or re-run the child"
            )
        step, rec = self._recorded("child", agent, args_digest)
        if rec is None or rec.status not in ("completed", "failed"):
            raise self._unanswerable(step, f"child {agent!r} (input {args_digest[:12]})")
        self._next_step += 1
        child_id = rec.child_run_id or ""
        if own is None:
            await self._append(ChildStarted(step=step, run_id=child_id, agent=agent, args_digest=args_digest))
        if rec.status == "completed":
            output = await self._open(rec.output)  # unsealed: the branch seals it anew
            await self._append(ChildCompleted(step=step, run_id=child_id, output=output))
            return output
        failure = await self._recorded_child_failure(step, rec)
        error = ErrorInfo(type=ChildFailedError.__name__, message=failure.message)
        await self._append(ChildFailed(step=step, run_id=child_id, reason=failure.reason, error=error))
        raise ChildFailedError(self.run_id, step, child_id, failure.reason, failure.message)

    # -- approvals, clock, randomness ----------------------------------------------------------------

    async def approval(self, action: str, args: Any = None) -> dict[str, Any]:
        step = self._next_step
        if self._own_journal() or not self._from_record(step):
            return await super().approval(action, args)
        args = jsonable(args)
        approval_digest = digest({"action": action, "args": args})
        step, rec = self._recorded("approval", action, approval_digest)
        if rec is None or rec.status != "approved":
            # Not answered by the record (or not approved there): ask, as a live run would.
            return await super().approval(action, args)
        self._next_step += 1
        request_id = rec.request_id or f"copy-{step}"
        await self._append(
            ApprovalRequested(step=step, request_id=request_id, action=action, args=args, digest=approval_digest)
        )
        decision = dict(rec.output or {})
        await self._append(
            ApprovalResolved(request_id=request_id, digest=approval_digest, approved=True,
                             by=str(decision.get("by", "record")), reason="approved in the parent run")
        )  # fmt: skip
        return decision

    async def now(self) -> Any:
        step = self._next_step
        if self._own_journal() or not self._from_record(step):
            return await super().now()
        step, rec = self._recorded("clock", "clock", None)
        if rec is None:
            raise self._unanswerable(step, "now()")
        self._next_step += 1
        await self._append(ClockRead(step=step, value=str(rec.output)))
        return dt.datetime.fromisoformat(str(rec.output))

    async def random(self) -> float:
        step = self._next_step
        if self._own_journal() or not self._from_record(step):
            return await super().random()
        step, rec = self._recorded("random", "random", None)
        if rec is None:
            raise self._unanswerable(step, "random()")
        self._next_step += 1
        await self._append(RandomDrawn(step=step, value=float(rec.output)))
        return float(rec.output)


def _never(args: Any) -> Any:
    raise AssertionError("a committed effect is never acted again")
