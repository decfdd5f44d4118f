"""A branch run: a new run that stands a recorded run back up at step k and drives it on.

Every re-run is a new run whose ``run.forked`` names the parent, the fork step, the mode
and the changed version-tuple element. What each call does, by mode:

| mode           | step < k                       | step >= k                                                   |
|----------------|--------------------------------|-------------------------------------------------------------|
| redrive        | served from the parent's record| model live; tools, effects, clock, random from the record   |
|                |                                | by position; a call the record cannot answer diverges       |
|                |                                | (NondeterminismError, diverged=True)                        |
| live           | served from the parent's record| model and read tools live; effects through dry-run stubs:   |
|                |                                | a committed key returns its recorded result, a new key is   |
|                |                                | simulated (effect.simulated) unless effects are allowed     |
| counterfactual | as redrive or live, with exactly one version-tuple element changed (RunForked.changed) |

Steps served from the parent are recorded again in the branch (same outputs), so a
branch is a complete run: foldable, resumable (a redelivered re-run resumes its branch
with the ordinary journal) and diffable step by step against its parent. Before the
fork, a call that does not match the parent's record is nondeterminism (the code
changed before the fork point), not divergence.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from runledger.errors import ConfigurationError, NondeterminismError, ToolFailedError
from runledger.record.canonical import digest, jsonable
from runledger.record.events import (
    ApprovalRequested,
    ApprovalResolved,
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
from runledger.sdk.effects import read_key
from runledger.sdk.models import ModelResponse
from runledger.sdk.run import RecordedRun
from runledger.sdk.tools import Tool, ToolFn

Mode = Literal["redrive", "live"]


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

    async def tool(self, tool: str | Tool, args: Any = None, *, fn: ToolFn | None = None) -> Any:
        name = tool if isinstance(tool, str) else tool.name
        declared = self._spec.tool_map.get(name) if isinstance(tool, str) else tool
        if declared is not None and declared.effect_class != "read":
            assert declared.key is not None
            return await self.effect(name, args, key=declared.key(args), fn=declared.fn,
                                     reconcile=declared.reconcile, effect_class=declared.effect_class)  # fmt: skip
        step = self._next_step
        if self._own_journal() or not self._from_record(step):
            if self.live_tools is not None and name not in self.live_tools and not self._own_journal():
                raise ConfigurationError(f"tool {name!r} is not marked live for this re-run (--live-tool {name})")
            return await super().tool(tool, args, fn=fn)
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
            raise ToolFailedError(name, step, rec.error["type"], rec.error["message"])
        return output

    # -- effects -------------------------------------------------------------------------------------

    async def effect(
        self, name: str, args: Any, *, key: str, fn: ToolFn | None = None, reconcile: Any = None,
        effect_class: Any = "write",
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
        # Live re-execution: the dry-run stub checks the key against the ledger first.
        state = await read_key(self._client, key)
        if state.status == "committed":
            self._next_step += 1
            await self._append(EffectIntended(step=step, name=name, key=key, args=args, args_digest=args_digest))
            result = await self._open(state.result)
            await self._append(EffectCommitted(step=step, key=key, result=result, via="record"))
            return result
        if self.allow_effects:
            declared = self._spec.tool_map.get(name)
            real_fn = fn if fn is not None else (declared.fn if declared else None)
            if real_fn is None:
                raise ConfigurationError(f"effect {name!r} has no function on the host to run for real")
            return await super().effect(name, args, key=key, fn=real_fn, reconcile=reconcile, effect_class=effect_class)
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
