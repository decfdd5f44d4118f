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

In a counterfactual the prefix is the record whatever changed: a model call before the fork is
answered by its position, not its request (the change shapes the request: a new prompt, a
candidate's messages); every other call before the fork is still judged by kind, name and args.
A tools counterfactual (``tool_schemas``) puts the candidate descriptions into the ``tools``
parameter of the model calls from the fork on (``with_tool_schemas``). A step that a mode's rule
refuses raises an error tagged with its ``Refusal`` class, kept as ``BranchRun.refusal``.

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

**The guest proposes, the host decides** (docs/sandbox.md, "What the broker decides"). A branch is
driven by untrusted code in a sandbox, so the host, not the request, decides:

- effect keys: computed here from the declared tool's key function over the branch's arguments
  (``served_effect``; a guest never names one), or taken from the lineage's own record before the
  fork; a tool-call id that would change a key must be one a model response of this run handed out;
- whose record serves a key: only a key whose every claim comes from the run's lineage (the
  branch, its parent and the parent's ancestors by ``run.forked``) is served or acted; a key
  claimed by any other run is neither (``effect.simulated``, reason ``other_lineage``, no
  content of the other run);
- secrets: a ``secret://NAME`` resolves only when the tool declares NAME (``@tool(secrets=[...])``)
  and the operator allows it for re-runs (``SandboxPolicy.secrets``); otherwise the call fails
  with ``SecretNotAllowedError`` and nothing is looked up. ``scrub`` takes every resolved value
  out of what goes back to the guest;
- model parameters of a live call: only ``MODEL_PARAMS``, ``max_tokens`` capped at
  ``SandboxPolicy.max_tokens``; the model called is always the branch's;
- how much a re-run may record: ``check_limits`` (events, bytes with blob bodies, blobs).

Steps served from the parent are recorded again in the branch (same outputs), so a
branch is a complete run: foldable, resumable (a redelivered re-run resumes its branch
with the ordinary journal) and diffable step by step against its parent. Before the
fork, a call that does not match the parent's record is nondeterminism (the code
changed before the fork point), not divergence.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from runledger.errors import ChildFailedError, ConfigurationError, KeyStoreError, NondeterminismError, RunNotFoundError
from runledger.log.client import LedgerClient
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import WORKER_WRITER, effect_filter
from runledger.protect.blobs import is_blob_ref
from runledger.protect.capture import content_values
from runledger.protect.keystore import run_kid
from runledger.protect.loading import load_run
from runledger.protect.redaction import SecretResolver
from runledger.record.canonical import canonical_json, jsonable
from runledger.record.digests import KEYED_DIGESTS, Digester
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
    Event,
    ModelCalled,
    Payload,
    RandomDrawn,
    ToolCalled,
    Usage,
)
from runledger.record.fold import Checkpoint, StepRecord, fold
from runledger.sandbox.containers import SandboxPolicy
from runledger.sandbox.errors import Refusal, SandboxViolationError, SecretNotAllowedError, tagged
from runledger.sdk.agent import AgentSpec
from runledger.sdk.effects import KeyState, apply_key, key_agent
from runledger.sdk.models import ModelResponse
from runledger.sdk.run import RecordedRun, response_from_record
from runledger.sdk.tools import Tool, ToolFn

# The rule a branch applies to the calls from the fork on: a re-run's mode (sandbox.rerun.Mode, four
# members) comes down to one of these two (a trace replay runs no branch; a counterfactual
# builds on its base mode).
CallRule = Literal["redrive", "live"]

# The ``reason`` of a simulated effect whose key was committed with other arguments.
ARGS_DIFFER = "args_differ"
# The ``reason`` of a simulated effect whose key was claimed by a run outside the branch's lineage.
OTHER_LINEAGE = "other_lineage"
# How many ancestors (by run.forked) a lineage is followed up: a branch of a branch of ... a run.
MAX_LINEAGE = 32

# The model parameters a sandboxed agent may set on a live call, each with its check (the value is
# refused unless it passes); max_tokens and max_completion_tokens are capped by the policy, not refused.
# Never ``model`` (the model called is the branch's), ``n`` or anything else that multiplies spend or
# points the host's credentials elsewhere (a base URL, a user, streaming).
_NUMBER = (int, float)


def _between(low: float, high: float) -> Any:
    return lambda v: isinstance(v, _NUMBER) and not isinstance(v, bool) and low <= v <= high


def _stop(v: Any) -> bool:
    texts = [v] if isinstance(v, str) else v
    return isinstance(texts, list) and len(texts) <= 4 and all(isinstance(t, str) and len(t) <= 256 for t in texts)


MODEL_PARAMS: dict[str, Any] = {
    "temperature": _between(0, 2),
    "top_p": _between(0, 1),
    "presence_penalty": _between(-2, 2),
    "frequency_penalty": _between(-2, 2),
    "seed": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "stop": _stop,
    "max_tokens": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
    "max_completion_tokens": lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
    "tools": lambda v: isinstance(v, list) and len(v) <= 128 and all(isinstance(t, dict) for t in v),
    "tool_choice": lambda v: isinstance(v, str | dict),
    "parallel_tool_calls": lambda v: isinstance(v, bool),
    "response_format": lambda v: isinstance(v, dict),
    # A framework's own form of the request, which its adapter on the host validates and makes
    # (runledger.integrations.pydantic_ai_request): the message history (content, as ``messages`` is)
    # and the shape of the output (output tools, a JSON schema).
    "history": lambda v: isinstance(v, list) and all(isinstance(m, dict) for m in v),
    "output": lambda v: isinstance(v, dict),
}
_CAPPED = ("max_tokens", "max_completion_tokens")

# The tool whose call is running, and the secrets it declares: what ``BranchRun._resolve`` may
# resolve. Per task, so calls in flight together each see their own.
_SECRET_SCOPE: contextvars.ContextVar[tuple[str, frozenset[str]] | None] = contextvars.ContextVar(
    "runledger_branch_secret_scope", default=None
)


def args_differ_marker(result: Any) -> dict[str, Any] | None:
    """The marker of an effect simulated because its key was committed with other arguments.

    It is the simulated result itself (``effect.simulated`` has no field for it):
    ``{"simulated": true, "effect", "key", "reason": "args_differ", "args_digest": the branch's,
    "committed_args_digest": the committing claim's (None if that claim could not be read)}``.
    None for anything else."""
    if isinstance(result, dict) and result.get("simulated") is True and result.get("reason") == ARGS_DIFFER:
        return result
    return None


@dataclass(frozen=True)
class KeyHistory:
    """What a live branch needs to know about a key: its state, the args digest of the claim that
    committed it and the run that made that claim (None unless committed; the digest is in that
    run's digest scheme, under its key) and every run that ever claimed it."""

    state: KeyState
    committed_args_digest: str | None
    claimed_by: frozenset[str]
    committed_by: str | None = None


async def read_key_history(client: LedgerClient, key: str, agent: str) -> KeyHistory:
    """The key's subject, read and folded (what ``read_key`` does), keeping what ``KeyState`` does not:
    the digest of the committing claim (a key is claimed only while free, so the claim before the
    commit is the committing one) and the run id of every claim."""
    raws = await read_raw(client, effect_filter(agent, key))
    good, _bad = decode_records(raws)
    state = KeyState(key, agent)
    claim: tuple[str | None, str] | None = None
    committed: tuple[str | None, str] | None = None
    claimants: set[str] = set()
    for rec in good:
        apply_key(state, rec)
        if rec.event.type == "effect.intended":
            claim = (rec.event.payload.get("args_digest"), rec.event.run_id)
            claimants.add(rec.event.run_id)
        if state.status == "committed" and committed is None:
            committed = claim
    if raws:
        state.last_stream_seq = max(r.stream_seq for r in raws)
    if state.status != "committed" or committed is None:
        return KeyHistory(state, None, frozenset(claimants))
    return KeyHistory(state, committed[0], frozenset(claimants), committed[1])


async def read_committed_claim(client: LedgerClient, key: str, agent: str | None = None) -> tuple[KeyState, str | None]:
    """The key's state and, when it is committed, the args digest of the claim that committed it
    (``agent``'s key; found by the key alone when None)."""
    if agent is None:
        agent = await key_agent(client, key)
    if not agent:
        return KeyState(key), None
    history = await read_key_history(client, key, agent)
    return history.state, history.committed_args_digest


class BranchRun(RecordedRun):
    """The host-side Run of a re-run: applies the mode's rules to every call."""

    def __init__(
        self,
        *args: Any,
        parent: Checkpoint,
        fork_step: int,
        mode: CallRule,
        allow_effects: bool = False,
        live_tools: frozenset[str] | None = None,
        sandbox_policy: SandboxPolicy | None = None,
        changed: str | None = None,
        tool_schemas: Mapping[str, dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        """``changed``: the version-tuple element a counterfactual branch changes (None for a re-drive or a
        live re-run). ``tool_schemas``: a tools counterfactual's changed descriptions by tool name
        (``Tool.json_schema()``), put in the ``tools`` parameter of every model call from the fork on."""
        super().__init__(*args, **kwargs)
        self.parent = parent
        self.fork_step = fork_step
        self.mode = mode
        self.changed = changed
        self.tool_schemas = dict(tool_schemas or {})
        self.allow_effects = allow_effects
        self.live_tools = live_tools
        self.sandbox_policy = sandbox_policy or SandboxPolicy()
        # What this re-run recorded so far (its events, their bytes with blob bodies, its blobs).
        self.recorded_events = 0
        self.recorded_bytes = 0
        self.recorded_blobs = 0
        self._lineage: frozenset[str] | None = None
        self._ancestors: dict[str, Checkpoint] = {}  # the parent's ancestors, folded (``lineage``)
        self._digesters: dict[str, Digester] = {}  # the digests of the lineage's runs, by run id
        self._call_ids: set[str] = set()  # tool-call ids the model responses of this run handed out
        self.refusal: Refusal | None = None  # the class of the mode's rule that refused a step, if one did
        self._resolved_secrets = False

    # -- what the host decides -----------------------------------------------------------------------

    async def _append(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> Event:
        event = await super()._append(body, encoded)
        self.recorded_events += 1
        self.recorded_bytes += len(canonical_json(event.payload))
        for value in content_values(event):
            if is_blob_ref(value):
                self.recorded_blobs += 1
                self.recorded_bytes += int(value.get("size") or 0)
        return event

    def check_limits(self) -> None:
        """Raise SandboxViolationError when the re-run has recorded as much as its policy allows. Called by
        the broker before each request, so a cap ends the branch between steps, never inside one."""
        p = self.sandbox_policy
        for what, used, cap, name in (
            ("events", self.recorded_events, p.max_events, "max_events"),
            ("bytes", self.recorded_bytes, p.max_bytes, "max_bytes"),
            ("blobs", self.recorded_blobs, p.max_blobs, "max_blobs"),
        ):
            if used >= cap:
                raise SandboxViolationError(
                    f"the re-run reached its limit of {cap} recorded {what} ({used} so far): the sandboxed agent "
                    f"floods the record; raise SandboxPolicy.{name} if this re-run really needs more"
                )

    def scrub(self, value: Any) -> Any:
        """``value`` with every secret this re-run resolved replaced by its token: what may go back
        to the guest (tool outputs, error texts), as the record holds it."""
        if not self._resolved_secrets or self._protector is None:
            return value
        redactor = self._protector.redactor
        if isinstance(value, str):
            return redactor.redact_known(value)
        if isinstance(value, dict):
            return {redactor.redact_known(k): self.scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        return value

    @contextlib.contextmanager
    def _secrets_of(self, name: str, declared: Any) -> Iterator[None]:
        secrets = frozenset(getattr(declared, "secrets", ()) or ())
        token = _SECRET_SCOPE.set((name, secrets))
        try:
            yield
        finally:
            _SECRET_SCOPE.reset(token)

    def _resolve(self, args: Any) -> Any:
        """``args`` for the tool, ``secret://`` references resolved only for the names the running tool
        declares and the operator allows; any other name raises before anything is looked up."""
        names = SecretResolver.references(args)
        if names:
            tool, declared = _SECRET_SCOPE.get() or ("(undeclared)", frozenset())
            for name in sorted(names):
                if name not in declared:
                    raise SecretNotAllowedError(tool, name, "declared")
                if name not in self.sandbox_policy.secrets:
                    raise SecretNotAllowedError(tool, name, "allowed")
            self._resolved_secrets = True
        return super()._resolve(args)

    def _live_model_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The parameters of a live model call as the host allows them (MODEL_PARAMS; max_tokens capped)."""
        allowed: dict[str, Any] = {}
        for name, value in params.items():
            check = MODEL_PARAMS.get(name)
            if check is None:
                raise SandboxViolationError(
                    f"model parameter {name[:80]!r} is not allowed in a re-run (the model called is the branch's, "
                    f"{self._spec.model.name}); allowed: {', '.join(sorted(MODEL_PARAMS))}"
                )
            if (isinstance(value, float) and not math.isfinite(value)) or not check(value):
                raise SandboxViolationError(f"model parameter {name!r} has a value a re-run refuses: {str(value)[:80]}")
            allowed[name] = min(value, self.sandbox_policy.max_tokens) if name in _CAPPED else value
        return allowed

    def _check_call_id(self, key_fn: Any, args: Any, tool_call_id: str | None) -> None:
        """A tool-call id the guest names may shape an effect's key (a key function taking the
        context) only if a model response of this run handed it out."""
        if tool_call_id is None or tool_call_id in self._call_ids:
            return
        if self._effect_key(key_fn, args, tool_call_id=tool_call_id) != self._effect_key(key_fn, args):
            raise SandboxViolationError(
                f"tool_call_id {tool_call_id[:80]!r} was not handed out by a model response of this run, and "
                "the effect's key would depend on it"
            )

    async def lineage(self) -> frozenset[str]:
        """The runs whose keys this branch may be served: itself, its parent, the parent's ancestors."""
        if self._lineage is None:
            runs = [self.run_id, self.parent.run_id]
            link = self.parent.parent
            while link and len(runs) < MAX_LINEAGE:
                ancestor = str(link.get("forked_from") or "")
                if not ancestor or ancestor in runs:
                    break
                runs.append(ancestor)
                try:
                    folded = fold((await load_run(self._client, ancestor, open_content=False)).records,
                                  check_chain=False)  # fmt: skip
                except RunNotFoundError:
                    break
                self._ancestors[ancestor] = folded  # whose digests a key's committing claim may be in
                link = folded.parent
            self._lineage = frozenset(runs)
        return self._lineage

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

    def _refuse(self, exc: Exception, refusal: Refusal) -> Exception:
        """``exc``, tagged with the class of the mode's rule that refuses the step (kept as ``refusal``:
        the re-run's result names it, as ``rerun --plan`` predicted it)."""
        self.refusal = refusal
        return tagged(exc, refusal)

    def _unanswerable(self, step: int, attempted: str) -> Exception:
        """The error for a call the parent's record cannot answer at ``step``: what the record has
        (kind, name, args digest) and what came. Before the fork it is nondeterminism (in a
        counterfactual, naming the element changed); from the fork on, a re-drive's divergence."""
        rec = self.parent.steps.get(step)
        if rec is None:
            recorded = "nothing (the parent ended before this step)"
        else:
            recorded = f"{rec.kind} {rec.name!r}" + (f" (args {rec.args_digest[:12]})" if rec.args_digest else "")
        if step < self.fork_step:
            return NondeterminismError(self.run_id, step, recorded, attempted, changed=self.changed,
                                       fork_step=self.fork_step)  # fmt: skip
        return NondeterminismError(self.parent.run_id, step, recorded, attempted, diverged=True)

    def _from_record(self, step: int) -> bool:
        return step < self.fork_step or self.mode == "redrive"

    # -- digests: the branch's own (``_digests``), and those of the records it is judged against -----

    async def _digester_of(self, run_id: str) -> Digester | None:
        """The digests of ``run_id`` (the branch, its parent or an ancestor of the parent): its chain
        format and scheme, under its own digest key when keyed, read from the key store (a worker
        opens the lineage's content). Keyed without a readable key, it raises when used
        (KeyStoreError). None for a run outside the lineage."""
        found = self._digesters.get(run_id)
        if found is not None:
            return found
        if run_id == self.run_id:
            return self._digests
        cp = self.parent if run_id == self.parent.run_id else self._ancestors.get(run_id)
        if cp is None:
            return None
        if cp.digest_scheme != KEYED_DIGESTS:
            found = Digester(cp.chain_format, cp.digest_scheme)
        else:
            kid = run_kid(cp.agent, cp.run_id, worker=cp.writer == WORKER_WRITER)
            keys = await self._payload_opener().key(kid, strict=False)
            found = Digester(cp.chain_format, cp.digest_scheme, keys.digest_key if keys is not None else None)
        self._digesters[run_id] = found
        return found

    async def _committed_digest(self, history: KeyHistory, args: Any) -> str | None:
        """``args`` digested as the claim that committed the key digested its own (a branch's digests
        are under its own key, its parent's under the parent's): None when the key is not committed,
        or the committing run's key cannot be read (the two are then not judged equal)."""
        if history.committed_by is None:
            return None
        digester = await self._digester_of(history.committed_by)
        if digester is None:
            return None
        try:
            return digester.digest(args)
        except KeyStoreError:
            return None

    async def _parent_digest(self, value: Any) -> str:
        """``value``'s digest as the parent's record has it: in the parent's scheme, under its key."""
        digester = await self._digester_of(self.parent.run_id)
        assert digester is not None
        return digester.digest(value)

    # -- model ---------------------------------------------------------------------------------------

    async def model(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        response = await self._model(messages, **params)
        self._call_ids.update(str(c["id"]) for c in response.tool_calls if isinstance(c, dict) and c.get("id"))
        return response

    async def _model(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        if self._next_step >= self.fork_step:
            params = self._live_model_params(params)
            if self.tool_schemas and isinstance(params.get("tools"), list):
                # A tools counterfactual takes effect here: the model sees the candidate descriptions.
                params["tools"] = with_tool_schemas(params["tools"], self.tool_schemas)
        if self._own_journal() and self._next_step < self.fork_step:
            return await self._own_prefix_model(messages, params)
        if self._own_journal() or self._next_step >= self.fork_step:
            return await super().model(messages, **params)  # live from the fork on, in every mode
        messages, params = jsonable(messages), jsonable(params)
        request = {"messages": messages, "params": params}
        args_digest, theirs = self._digests.digest(request), await self._parent_digest(request)
        # The prefix is the record. A counterfactual's change shapes the request (the prompt the agent
        # reads from run.prompt, the candidate code's messages): its model calls before the fork are
        # answered by position, not by request; the record's later calls (tools, effects) still are
        # judged by their arguments. A branch that changes nothing must send the recorded request.
        step, rec = self._recorded("model", None, None if self.changed else theirs)
        if rec is None:
            raise self._unanswerable(step, f"model (args {theirs[:12]})")
        self._next_step += 1
        output = dict(await self._open_model_output(rec.output) or {})
        usage = Usage(**(output.pop("usage", None) or {}))
        await self._append(
            ModelCalled(
                step=step, model=rec.name, request={"messages": messages, "params": params},
                args_digest=args_digest, response=output, usage=usage,
            )
        )  # fmt: skip
        return self._recorded_response(output, usage)

    async def _own_prefix_model(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> ModelResponse:
        """A model step before the fork that the branch already recorded (a redelivered re-run): its
        answer, served again as it was, from the parent's record under the parent's model's name (which a
        model counterfactual does not share: RecordedRun's journal would call that nondeterminism). Its
        request is judged as when it was first served (by position in a counterfactual)."""
        step = self._next_step
        own = self._cp.steps[step]
        request = jsonable({"messages": messages, "params": params})
        args_digest = self._digests.digest(request)
        if own.kind != "model" or (not self.changed and own.args_digest != args_digest):
            raise NondeterminismError(
                self.run_id, step, f"{own.kind} {own.name!r} (args {own.args_digest[:12] or '-'})",
                f"model (args {args_digest[:12]})", attempted_args=request, changed=self.changed,
                fork_step=self.fork_step,
            )  # fmt: skip
        self._next_step += 1
        output = dict(await self._open_model_output(own.output) or {})
        usage = Usage(**(output.pop("usage", None) or {}))
        return self._recorded_response(output, usage)

    def _recorded_response(self, output: dict[str, Any], usage: Usage) -> ModelResponse:
        """A recorded response as a resume hands it to the agent: the adapter's own response type (an
        integration's subclass keeps the framework's response), built from the record."""
        response_type = getattr(self._spec.model, "response_type", ModelResponse)
        return response_from_record({**output, "usage": usage.model_dump()}, response_type)

    # -- tools ---------------------------------------------------------------------------------------

    async def tool(
        self, tool: str | Tool, args: Any = None, *, fn: ToolFn | None = None, tool_call_id: str | None = None
    ) -> Any:
        name = tool if isinstance(tool, str) else tool.name
        declared = self._spec.tool_map.get(name) if isinstance(tool, str) else tool
        # An effect tool whose arguments its signature refuses is a failed tool step (as in RecordedRun.tool).
        if declared is not None and declared.effect_class != "read" and declared.argument_error(jsonable(args)) is None:
            assert declared.key is not None
            self._check_call_id(declared.key, jsonable(args), tool_call_id)
            key = self._effect_key(declared.key, jsonable(args), tool_call_id=tool_call_id)
            return await self.effect(name, args, key=key, fn=declared.call, reconcile=declared.reconcile,
                                     effect_class=declared.effect_class, tool_call_id=tool_call_id,
                                     lease_s=declared.lease_s)  # fmt: skip
        step = self._next_step
        if self._own_journal() or not self._from_record(step):
            if self.live_tools is not None and name not in self.live_tools and not self._own_journal():
                refused = ConfigurationError(f"tool {name!r} is not marked live for this re-run (--live-tool {name})")
                raise self._refuse(refused, Refusal.TOOL_NOT_LIVE)
            with self._secrets_of(name, declared):
                return await super().tool(tool, args, fn=fn, tool_call_id=tool_call_id)
        args = jsonable(args)
        args_digest, theirs = self._digests.digest(args), await self._parent_digest(args)
        step, rec = self._recorded("tool", name, theirs)
        if rec is None:
            raise self._unanswerable(step, f"tool {name!r} (args {theirs[:12]})")
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
        args_digest = self._digests.digest(args)
        if self._from_record(step):
            step, rec = self._recorded("effect", name, await self._parent_digest(args))
            if rec is None or rec.key != key:
                raise self._unanswerable(step, f"effect {name!r} key {key!r}")
            if rec.status not in ("committed", "simulated"):  # in doubt or failed: nothing to serve
                raise self._refuse(self._unanswerable(step, f"effect {name!r} key {key!r}"), Refusal.NO_OUTCOME)
            self._next_step += 1
            result = await self._open(rec.output)
            await self._append(EffectIntended(step=step, name=name, key=key, args=args, args_digest=args_digest))
            await self._append(EffectCommitted(step=step, key=key, result=result, via="record"))
            return result
        # Live re-execution: the dry-run stub checks the key, who claimed it, and the arguments it
        # was committed with, against the ledger first.
        history = await read_key_history(self._client, key, self.agent)
        state, committed_digest = history.state, history.committed_args_digest
        lineage = await self.lineage()
        if history.claimed_by - lineage:
            # Claimed by a run outside this lineage (another agent's payment, a sibling branch):
            # its result is that run's content and its key is taken; neither served nor acted.
            self._next_step += 1
            marked = {"simulated": True, "effect": name, "key": key, "reason": OTHER_LINEAGE}
            await self._append(EffectSimulated(step=step, name=name, key=key, args=args, result=marked))
            return marked
        # The branch's arguments digested as the committing claim's were: in its run's scheme, under its key.
        theirs = await self._committed_digest(history, args)
        if state.status == "committed" and committed_digest is not None and committed_digest == theirs:
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
                      "args_digest": theirs, "committed_args_digest": committed_digest}  # fmt: skip
            await self._append(EffectSimulated(step=step, name=name, key=key, args=args, result=marked))
            return marked
        if self.allow_effects:
            declared = self._spec.tool_map.get(name)
            real_fn = fn if fn is not None else (declared.call if declared else None)
            if real_fn is None:
                raise ConfigurationError(f"effect {name!r} has no function on the host to run for real")
            with self._secrets_of(name, declared):
                return await super().effect(name, args, key=key, fn=real_fn, reconcile=reconcile,
                                            effect_class=effect_class, tool_call_id=tool_call_id,
                                            lease_s=lease_s)  # fmt: skip
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

    async def served_effect(self, name: str, args: Any, *, tool_call_id: str | None = None) -> Any:
        """An effect step the guest asked for (the broker's ``effect`` op): the guest names the effect
        and its arguments, never its key.

        Served from a record (the branch's own journal, or the parent's before the fork and in
        ``redrive``), the key is the one that record holds for this step. Live, the effect must be a
        declared effect tool of the agent (``@tool(effect=..., key=...)``): it goes through ``tool``,
        which computes the key from the tool's key function over these arguments. Anything else is
        refused (ConfigurationError): the host has no key function to trust for it."""
        declared = self._spec.tool_map.get(name)
        step = self._next_step
        fn = declared.call if declared is not None else _never
        if self._own_journal():
            own = self._cp.steps[step]
            return await self.effect(name, args, key=own.key or "", fn=fn, tool_call_id=tool_call_id)
        if self._from_record(step):
            theirs = await self._parent_digest(jsonable(args))
            _, rec = self._recorded("effect", name, theirs)
            if rec is None or not rec.key:
                raise self._unanswerable(step, f"effect {name!r} (args {theirs[:12]})")
            return await self.effect(name, args, key=rec.key, fn=fn, tool_call_id=tool_call_id)
        if declared is None or declared.effect_class == "read" or declared.key is None:
            raise ConfigurationError(
                f"effect {name!r} is not a declared effect tool of agent {self._spec.name}: a re-run computes "
                "idempotency keys on the host from the tool's key function; declare it with "
                "@tool(effect=..., key=...) and call it by name"
            )
        return await self.tool(declared, args, tool_call_id=tool_call_id)

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
        args_digest = self._digests.digest(input)
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
            raise self._refuse(ConfigurationError(
                f"child run of agent {agent!r} at step {step}: a live re-run does not start child runs (their code "
                "would run on the host, outside the sandbox); fork after this step, re-drive, or re-run the child"
            ), Refusal.CHILD_LIVE)  # fmt: skip
        theirs = await self._parent_digest(input)
        step, rec = self._recorded("child", agent, theirs)
        if rec is None:
            raise self._unanswerable(step, f"child {agent!r} (input {theirs[:12]})")
        if rec.status not in ("completed", "failed"):
            unanswered = self._unanswerable(step, f"child {agent!r} (input {theirs[:12]})")
            raise self._refuse(unanswered, Refusal.NO_OUTCOME)
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
        approval_digest = self._digests.digest({"action": action, "args": args})
        step, rec = self._recorded("approval", action, await self._parent_digest({"action": action, "args": args}))
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


def with_tool_schemas(tools: list[Any], schemas: Mapping[str, dict[str, Any]]) -> list[Any]:
    """``tools`` (a model call's ``tools`` parameter) with the description and parameters of each tool
    named in ``schemas`` (``Tool.json_schema()`` by name) replaced. Entries keep their layout: OpenAI's
    chat ``{"type": "function", "function": {...}}``, the bare ``{"name", "description", "parameters"}``
    of ``Tool.json_schema()`` and of OpenAI's responses API, Anthropic's ``input_schema``. Others pass."""
    out: list[Any] = []
    for entry in tools:
        nested = isinstance(entry, dict) and isinstance(entry.get("function"), dict)
        holder = entry["function"] if nested else entry
        name = holder.get("name") if isinstance(holder, dict) else None
        new = schemas.get(name) if isinstance(name, str) else None
        if new is None:
            out.append(entry)
            continue
        field = "input_schema" if "input_schema" in holder and "parameters" not in holder else "parameters"
        replaced = {**holder, "description": new.get("description", ""), field: new.get("parameters", {})}
        out.append({**entry, "function": replaced} if nested else replaced)
    return out


def _never(args: Any) -> Any:
    raise AssertionError("a committed effect is never acted again")
