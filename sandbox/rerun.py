"""Re-runs: stand a recorded run back up at step k and drive it again, in a sandbox.

``Rerunner.rerun(request)`` loads the parent run, checks the version tuple (the agent
named must be the one that recorded the run; a counterfactual changes exactly one
element), starts the branch run (``run.started`` + ``run.forked``) or resumes it when a
re-run request is redelivered, hands a sandbox the agent (acquired while the branch is
started; a warm one has the agent loaded already), and lets the broker answer it through
a BranchRun until the agent reports its outcome. The outcome is
recorded on the branch by the same ``drive`` that records live runs. The sandbox is awaited inside
that ``drive``: whatever goes wrong with it, before its hello (garbage on the channel, no
connection) or after, is the branch's ``run.failed``, and its container is removed before ``rerun``
returns.

The names a request carries (its agent, a counterfactual's agent, model or tools) are checked against the
operator's allow-list (``CodeAllowList``, ``$RUNLEDGER_ALLOW_CODE``) before anything is read,
imported or called (``check_names``).

The re-run's wall-clock limit is the host's: the request's ``timeout_s``, capped at the pool's
``SandboxPolicy.timeout_s`` (a request cannot buy more time than its worker allows; the result
says when it was capped). When it runs out, whatever the branch is waiting for (the guest, a host
tool, a model call) is cancelled and the container killed; the branch fails (reason ``sandbox``).

``Rerunner.dead_letter`` records a request its worker gives up on (``runledger.sandbox.worker``)
as its branch's ``run.failed``, starting the branch from the parent's record if it never started.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
import traceback
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from runledger.errors import CodeNotAllowedError, ConfigurationError, RunNotFoundError
from runledger.log.client import LedgerClient
from runledger.log.publish import RetryPolicy, SubjectWriter
from runledger.log.reader import RunLog
from runledger.log.subjects import WORKER_WRITER, run_subject
from runledger.protect.capture import DataPolicy, PayloadProtector, client_opener, run_protector
from runledger.protect.erasure import cascade_to, erased_now
from runledger.protect.loading import load_run
from runledger.record.canonical import digest, recorded_chain_format
from runledger.record.digests import recorded_digest_scheme
from runledger.record.events import ErrorInfo, RunFailed, RunForked, RunResumed, RunStarted, VersionTuple
from runledger.record.fold import Checkpoint, apply, fold
from runledger.record.ids import new_id
from runledger.record.records import Recorded
from runledger.record.versions import identity
from runledger.sandbox.branch import BranchRun, CallRule
from runledger.sandbox.broker import Broker
from runledger.sandbox.candidate import CHANGEABLE, ELEMENTS, describe_change, judge_load, resolve_in_place
from runledger.sandbox.containers import CodeMounts, Sandbox, SandboxPool, code_mounts
from runledger.sandbox.decision import Exercise, default_fork, exercise_of
from runledger.sandbox.errors import (
    Refusal,
    RerunDeadLetteredError,
    RerunRequestError,
    RunErasedError,
    SandboxViolationError,
    tagged,
)
from runledger.sandbox.responses import ResponseCache
from runledger.sdk.agent import AgentSpec, CodeAllowList, load_agent, load_model, load_named
from runledger.sdk.lifecycle import RunResult, drive
from runledger.sdk.run import new_digest_scheme
from runledger.sdk.tools import Tool

Mode = Literal["replay", "redrive", "live", "counterfactual"]
# What a tool is besides what the model sees (its description and parameter schema): its implementation.
# ``--set tools=`` may change none of it; a change to any is a code change (``--set agent=``).
IMPLEMENTATION = ("fn", "effect_class", "key", "reconcile", "secrets", "lease_s", "retry", "inline")


class RerunRequest(BaseModel):
    """What an operator asks for. Serialised onto the LEDGER_CMD work queue as JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    parent_run_id: str
    agent: str
    mode: Mode
    fork_step: int | None = None
    base_mode: Literal["redrive", "live"] = "redrive"
    change: dict[str, str] = Field(default_factory=dict)
    allow_effects: bool = False
    live_tools: list[str] | None = None
    timeout_s: float = 60.0
    request_id: str = Field(default_factory=new_id)

    @property
    def branch_run_id(self) -> str:
        return f"br-{self.request_id}"


@dataclasses.dataclass
class RerunResult(RunResult):
    parent_run_id: str = ""
    fork_step: int = 0
    mode: str = ""
    changed: str | None = None
    changed_from: Any = None  # the changed element's recorded value, and the branch's
    changed_to: Any = None
    warm: bool = False
    requests: int = 0
    host_cpu_s: float = 0.0  # the host CPU the broker spent for the guest (runledger.cpu)
    time_limit_s: float | None = None  # the wall-clock limit the re-run ran under
    requested_time_limit_s: float | None = None  # set when the request asked for more than the worker allows
    refusal: str | None = None  # the Refusal class of the mode's rule that failed the branch at a step, if one did
    exercise: Exercise | None = None  # whether the change was exercised from the fork on (runledger.sandbox.decision)

    @property
    def change_note(self) -> str:
        """The change in one line (``agent code changed: code:ab12 -> code:cd34``), "" when nothing changed."""
        return describe_change(self.changed, self.changed_from, self.changed_to)

    @property
    def time_limit_note(self) -> str:
        """How the time limit was capped, for an operator reading the result ("" when it was not)."""
        if self.requested_time_limit_s is None or self.time_limit_s is None:
            return ""
        asked = self.requested_time_limit_s
        return f"time limit capped at the worker's {self.time_limit_s:g}s (the request asked for {asked:g}s)"


def safe_text(text: str, limit: int = 4000) -> str:
    """``text`` as it can be recorded: lone surrogates (and anything else UTF-8 cannot hold)
    escaped, at most ``limit`` characters (the end kept: a traceback's last frames)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else "..." + text[-limit:]


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, recordable (``safe_text``) even if its ``__str__`` raises."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a hostile or broken __str__: the type is still worth reporting
        text = f"{type(exc).__name__} (its message could not be read)"
    return safe_text(text, 2000)


def check_change(request: RerunRequest) -> None:
    """Raise RerunRequestError unless ``request`` changes nothing, or (a counterfactual) one element."""
    if request.mode != "counterfactual":
        if request.change:
            raise RerunRequestError(
                "only a counterfactual branch changes the version tuple (--mode counterfactual)", Refusal.CHANGE
            )
        return
    if len(request.change) != 1 or next(iter(request.change)) not in CHANGEABLE:
        raise RerunRequestError(
            f"a counterfactual branch changes exactly one of {', '.join(CHANGEABLE)}: --set NAME=VALUE, got "
            f"{request.change or 'nothing'}",
            Refusal.CHANGE,
        )


def check_names(request: RerunRequest, allowed: CodeAllowList) -> None:
    """Raise CodeNotAllowedError if ``request`` names code (its agent, a counterfactual's agent, model or
    tools) outside ``allowed``: before anything of it is imported or called on this host
    (RerunRequestError first if its change is malformed)."""
    check_change(request)
    try:
        allowed.check(request.agent, "agent")
        for what in ("agent", "model", "tools"):
            value = request.change.get(what)
            if value is not None:
                allowed.check(value, what)
    except CodeNotAllowedError as exc:
        raise tagged(exc, Refusal.NOT_ALLOWED) from None


def _is_tools(obj: Any) -> bool:
    return isinstance(obj, list | tuple) and bool(obj) and all(isinstance(t, Tool) for t in obj)


def load_tools(ref: str, *, allowed: CodeAllowList | None = None) -> list[Tool]:
    """The tools ``ref`` names (a list of ``Tool``, or what a factory of its module returns): a tools
    counterfactual's candidate, loaded like an agent or a model (``allowed`` as for ``load_agent``)."""
    obj = load_named(ref, "tools", "a list of tools", _is_tools, allowed=allowed)
    if not _is_tools(obj):
        raise ConfigurationError(f"{ref!r} is not a list of tools (runledger.Tool) nor a function returning one")
    return list(obj)


def _implementation(tool: Tool, attribute: str) -> Any:
    value = getattr(tool, attribute)
    return inspect.unwrap(value) if attribute == "fn" else value


def candidate_tools(host: AgentSpec, tools: list[Tool], ref: str) -> list[Tool]:
    """``tools`` in ``host``'s order, if they are ``host``'s tools with other descriptions or parameter
    schemas (what the model sees) and the same implementations; RerunRequestError (``tool_code``)
    for a tool added, removed or implemented otherwise: that is a code change (``--set agent=``)."""
    mine = host.tool_map
    names = sorted(t.name for t in tools)
    if names != sorted(mine) or len(set(names)) != len(names):
        raise RerunRequestError(
            f"--set tools={ref} declares the tools {names}, the agent has {sorted(mine)}: a tool added or removed "
            "is a code change; try it with --set agent=MODULE:ATTR",
            Refusal.TOOL_CODE,
        )
    for t in tools:
        differs = [a for a in IMPLEMENTATION if _implementation(t, a) != _implementation(mine[t.name], a)]
        if differs:
            raise RerunRequestError(
                f"--set tools={ref}: tool {t.name!r} changes its {', '.join(differs)}, not only its description "
                "or parameter schema: a change to a tool's implementation is a code change; try it with "
                "--set agent=MODULE:ATTR",
                Refusal.TOOL_CODE,
            )
    order = {t.name: i for i, t in enumerate(host.tools)}
    return sorted(tools, key=lambda t: order[t.name])


def seen_hashes(spec: AgentSpec) -> dict[str, str]:
    """Per tool, a hash of what the model is shown of it (name, description, parameters) and its effect
    class: the value a tools counterfactual records as changed (``Tool.schema_hash``, the version
    tuple's, leaves the description out)."""
    return {t.name: digest({**t.json_schema(), "effect_class": t.effect_class}) for t in spec.tools}


def changed_schemas(host: AgentSpec, spec: AgentSpec) -> dict[str, dict[str, Any]]:
    """The tools whose description or parameters ``spec`` changes from ``host``, by name: what a tools
    counterfactual puts in the model's ``tools`` parameter from its fork on (``BranchRun``)."""
    return {
        t.name: t.json_schema() for t in spec.tools
        if t.name in host.tool_map and t.json_schema() != host.tool_map[t.name].json_schema()
    }  # fmt: skip


def branch_spec(
    host: AgentSpec, request: RerunRequest, allowed: CodeAllowList | None = None,
    recorded: Mapping[str, Any] | None = None,
) -> tuple[AgentSpec, str, str | None, Any, Any]:  # fmt: skip
    """The spec the branch runs with, its agent ref, and (changed, from, to) of the version tuple.

    A changed agent is compared with the ``recorded`` version tuple when one is given (the parent's:
    the code that recorded it may be gone, edited in place), else with ``host``'s; every other change
    with ``host``, which is then the recorded code (``resolve_in_place``). A changed agent or model is
    loaded only from the operator's ``allowed`` code (default: the environment's,
    ``CodeAllowList.from_env``); anything else raises CodeNotAllowedError before it is imported or
    called."""
    allowed = CodeAllowList.from_env() if allowed is None else allowed
    check_change(request)
    if request.mode != "counterfactual":
        return host, request.agent, None, None, None
    ((what, value),) = request.change.items()
    ref = request.agent
    try:
        if what == "model":
            spec = dataclasses.replace(host, model=load_model(value, allowed=allowed))
        elif what == "prompt":
            spec = dataclasses.replace(host, prompt=value)
        elif what == "tools":
            spec = dataclasses.replace(host, tools=candidate_tools(host, load_tools(value, allowed=allowed), value))
        else:
            spec, ref = load_agent(value, allowed=allowed), value
    except CodeNotAllowedError as exc:
        raise tagged(exc, Refusal.NOT_ALLOWED) from None
    except ConfigurationError as exc:  # a bad name: no retry can cure the request
        raise RerunRequestError(str(exc), Refusal.CANDIDATE) from exc
    field = ELEMENTS[what]
    if what == "agent" and recorded is not None:  # like with like: by the rule the parent was recorded under
        before, after = identity(recorded), spec.version_like(recorded).model_dump()
    else:
        before, after = host.version().model_dump(), spec.version().model_dump()
    # The four elements (a recorded code hash, beside agent_version, goes with it).
    differs = [k for k in ELEMENTS.values() if before.get(k) != after.get(k)]
    if what == "tools":
        # A new description changes what the model sees, not Tool.schema_hash: judged by what it sees.
        was, now = seen_hashes(host), seen_hashes(spec)
        if differs not in ([], [field]) or was == now:
            raise RerunRequestError(
                f"--set tools=... must change what the model is shown of the tools (a description or a parameter "
                f"schema) and nothing else; it changes {differs or 'nothing'}",
                Refusal.ELEMENT,
            )
        return spec, ref, field, was, now
    if differs != [field]:
        hint = ""
        if what == "agent" and set(differs) == {"agent_version", "tool_schema_hashes"}:
            hint = (": new tool descriptions or parameter schemas with the same implementations are their own "
                    "change (--set tools=MODULE:ATTR), the code another")  # fmt: skip
        raise RerunRequestError(
            f"--set {what}=... must change exactly the {field} element of the version tuple; it changes "
            f"{differs or 'nothing'}{hint}",
            Refusal.ELEMENT,
        )
    return spec, ref, field, before.get(field), after.get(field)


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What a re-run request resolves to once every check before its first step passed."""

    host: AgentSpec  # the agent named (the code that recorded the run, unless edited in place since)
    spec: AgentSpec  # what the branch runs with (a counterfactual's change applied)
    ref: str  # the agent the sandbox loads
    changed: str | None  # the version-tuple element changed, and from what to what
    before: Any
    after: Any
    fork_step: int
    code: CodeMounts  # what the sandbox mounts (code_location)
    tool_schemas: dict[str, dict[str, Any]]  # a tools counterfactual's changed descriptions
    # The request as the branch runs it: a re-drive or live re-run of code edited in place since the
    # record is the counterfactual of the agent element it is (``resolve_in_place``).
    request: RerunRequest
    fork_rule: str = ""  # why the fork is at ``fork_step`` (the request's --at-step, or the decision)

    @property
    def in_place(self) -> bool:
        """The agent named is not the code that recorded the run: the working tree's code, edited since."""
        return self.request.mode == "counterfactual" and self.request.change == {"agent": self.request.agent}


def preflight(
    parent: Checkpoint, request: RerunRequest, allowed: CodeAllowList, found: list[Exception] | None = None
) -> Preflight | None:
    """Every check ``Rerunner.rerun`` makes before a branch is started, in its order: the mode, the
    names (allow-list), the parent (started, not erased), the agent (loads; is the recorded code, or
    code edited in place: ``resolve_in_place``), the counterfactual (its value loads, it changes exactly
    its element), the fork step (``--at-step``, else the decision: runledger.sandbox.decision), the code
    to mount.

    Raises the first refusal, tagged with its class (``runledger.sandbox.errors.refusal_of``). With
    ``found`` (the plan), each refusal is appended instead and the checks go on while the next ones do
    not need what failed; None is returned when anything was refused. Loads (imports) only what a
    worker would: nothing before the names passed the allow-list."""

    def refuse(exc: Exception) -> None:
        if found is None:
            raise exc
        found.append(exc)

    if request.mode == "replay":
        refuse(RerunRequestError("trace replay executes nothing: use `runledger show RUN`", Refusal.REPLAY))
    try:
        check_names(request, allowed)
    except (RerunRequestError, CodeNotAllowedError) as exc:
        refuse(exc)
        return None
    if parent.version is None:
        refuse(RerunRequestError(f"run {request.parent_run_id} has no run.started event", Refusal.NO_START))
    if parent.erased is not None:
        refuse(RunErasedError(parent.run_id, parent.erased))
    try:
        host = load_agent(request.agent, allowed=allowed)
    except ConfigurationError as exc:
        refuse(tagged(exc, Refusal.AGENT))
        return None
    except Exception as exc:  # the agent's own import or factory failed: the re-run raises it as it is
        if found is None:
            raise
        found.append(RerunRequestError(f"agent {request.agent} cannot be loaded: {describe(exc)}", Refusal.AGENT))
        return None
    try:
        request = resolve_in_place(parent, host, request)
    except RerunRequestError as exc:
        refuse(exc)
    try:
        spec, ref, changed, before, after = branch_spec(host, request, allowed, parent.version)
    except (RerunRequestError, CodeNotAllowedError) as exc:
        refuse(exc)
        return None
    fork_step, fork_rule = request.fork_step, f"--at-step {request.fork_step}"
    if fork_step is None:
        decision = default_fork(parent)
        fork_step, fork_rule = decision.step, decision.why
    if not 0 <= fork_step <= parent.last_step + 1:
        refuse(RerunRequestError(f"--at-step must be within 0..{parent.last_step + 1} for run {parent.run_id}",
                                 Refusal.FORK_STEP))  # fmt: skip
    try:
        code = code_location(spec, ref)
    except RerunRequestError as exc:
        refuse(exc)
        return None
    if found:
        return None
    schemas = changed_schemas(host, spec) if changed == "tool_schema_hashes" else {}
    return Preflight(host, spec, ref, changed, before, after, fork_step, code, schemas, request, fork_rule)


def code_location(spec: AgentSpec, ref: str = "") -> CodeMounts:
    """What a sandbox mounts read-only for the agent ``ref`` loads to: each top-level package or module
    of its import closure (``runledger.sandbox.containers.code_mounts``), never the host's site-packages."""
    try:
        return code_mounts(spec.fn, ref)
    except RerunRequestError as exc:
        raise RerunRequestError(str(exc), Refusal.NOT_PACKAGED) from None


def _call_rule(request: RerunRequest) -> CallRule:
    """The rule the branch applies from its fork (a trace replay never gets this far)."""
    if request.mode == "counterfactual":
        return request.base_mode
    return "live" if request.mode == "live" else "redrive"


class Rerunner:
    def __init__(
        self, client: LedgerClient, pool: SandboxPool, policy: RetryPolicy = RetryPolicy(),
        allowed: CodeAllowList | None = None, responses: ResponseCache | None = None,
    ) -> None:  # fmt: skip
        """``allowed``: the code a request may name (default: ``$RUNLEDGER_ALLOW_CODE``, read now);
        ``responses``: a sweep's response cache (runledger.sandbox.responses), None to call the model each time."""
        self.responses = responses
        self.client = client
        self.pool = pool
        self.policy = policy
        self.allowed = CodeAllowList.from_env() if allowed is None else allowed

    async def rerun(self, request: RerunRequest) -> RerunResult:
        """Fork the request's branch from its parent and drive it with the agent in a sandbox.

        A request that already ran (redelivered) returns its recorded outcome, ``nothing_to_do``.
        Raises RerunRequestError (a trace replay, a refusal of the preflight), CodeNotAllowedError
        before anything is read, imported or called, and what the read and the fork raise."""
        if request.mode == "replay":
            raise RerunRequestError("trace replay executes nothing: use `runledger show RUN`", Refusal.REPLAY)
        parent, checked = await self._preflight(request)
        request = checked.request  # as the branch runs it: code edited in place is an agent counterfactual
        spec, fork_step, changed = checked.spec, checked.fork_step, checked.changed
        if self.responses is not None:  # identical live requests of the sweep answered once
            spec = dataclasses.replace(spec, model=self.responses.wrap(spec.model))
        branch_id = request.branch_run_id
        # The sandbox is acquired while the branch is opened (keys, reads, run.started): a cold
        # container starts in the time those round trips take, and a drained pool refills sooner.
        acquiring = asyncio.create_task(self._acquire(checked.code, checked.ref))
        try:
            cp, writer, protector, run_input = await self._open_branch(
                spec, parent, request, fork_step, changed, checked.before, checked.after
            )
        except Exception:
            await self._release(acquiring)
            raise
        except BaseException:  # cancelled (a worker stopping): no wait; its pool's close() removes the container
            acquiring.cancel()
            raise
        common: dict[str, Any] = {
            "parent_run_id": parent.run_id,
            "fork_step": fork_step,
            "mode": request.mode,
            "changed": changed,
            "changed_from": checked.before,
            "changed_to": checked.after,
        }
        if cp.status in ("completed", "failed"):  # a redelivered request that already ran: once only
            await self._release(acquiring)
            return RerunResult(branch_id, cp.status, output=cp.output, reason=cp.failure_reason,
                               error=(cp.error or {}).get("message"), nothing_to_do=True, exercise=exercise_of(cp),
                               **common)  # fmt: skip
        run = BranchRun(
            self.client, spec, writer, cp, policy=self.policy, parent=parent, fork_step=fork_step,
            mode=_call_rule(request),
            allow_effects=request.allow_effects, protector=protector,
            live_tools=frozenset(request.live_tools) if request.live_tools is not None else None,
            sandbox_policy=self.pool.policy, changed=changed, tool_schemas=checked.tool_schemas,
        )  # fmt: skip
        run._input = run_input
        start = {
            "agent": checked.ref, "agent_version": spec.version().agent_version, "run_id": branch_id,
            "agent_name": spec.name, "input": run_input, "prompt": spec.prompt,
            # The host's listings of tools listed from outside the code (an MCP server's, over stdio or
            # HTTP): the guest, which has no network, declares the same tools from them.
            "tool_listings": spec.tool_listings(),
        }  # fmt: skip
        limit, asked = self.time_limit(request)
        session = _SandboxSession(self, acquiring, checked, start, limit, asked)
        result = await session.drive_branch(run)
        return RerunResult(**dataclasses.asdict(result), warm=session.warm, requests=session.requests,
                           host_cpu_s=session.host_cpu_s, time_limit_s=limit, requested_time_limit_s=asked,
                           refusal=run.refusal, exercise=exercise_of(run.checkpoint), **common)  # fmt: skip

    async def _preflight(self, request: RerunRequest) -> tuple[Checkpoint, Preflight]:
        """The parent's checkpoint and the request resolved against it, every check before the
        branch's first step passed (those ``rerun --plan`` makes too: runledger.sandbox.plan)."""
        check_names(request, self.allowed)  # before anything is read, imported or called
        # Content stays sealed here: the branch opens each parent value only when it serves it.
        parent_log = await load_run(self.client, request.parent_run_id, open_content=False)
        parent = fold(parent_log.records, check_chain=False)
        checked = preflight(parent, request, self.allowed)
        assert checked is not None  # without ``found`` every refusal raises
        return parent, checked

    async def _acquire(self, code: CodeMounts, agent: str) -> tuple[Sandbox, bool]:
        """A sandbox with ``agent`` loaded, and whether it came warm from the pool."""
        warm_before = self.pool.warm_hits
        sandbox = await self.pool.acquire(code, agent)  # a warm hit counts before any await
        return sandbox, self.pool.warm_hits > warm_before

    async def _release(self, acquiring: asyncio.Task[tuple[Sandbox, bool]]) -> None:
        """Remove the sandbox ``acquiring`` brings, unused: the re-run ended before it started. A
        creation in progress is waited for, not cancelled (its container would outlive the cancel)."""
        try:
            sandbox, _ = await asyncio.shield(acquiring)
        except Exception:  # the acquire's own error does not matter: the re-run already has an outcome
            return
        await self.pool.discard(sandbox)

    def time_limit(self, request: RerunRequest) -> tuple[float, float | None]:
        """(the re-run's wall-clock limit, what the request asked for if that was more than the
        worker allows): the request's ``timeout_s`` capped at the pool policy's ``timeout_s``."""
        allowed = self.pool.policy.timeout_s
        if request.timeout_s > allowed:
            return allowed, request.timeout_s
        return request.timeout_s, None

    async def dead_letter(
        self, request: RerunRequest, error: RerunDeadLetteredError, cause: BaseException | None = None
    ) -> RerunResult:
        """Give ``request`` up: its branch records ``run.failed`` (reason ``exception``, error type
        ``RerunDeadLetteredError``, ``error``'s message, ``cause``'s traceback when there is one).

        A branch the request never started is started from the parent's record first (its
        ``run.started`` and ``run.forked``, no input: nothing of it ran), so every dead-lettered
        request is a failed branch that ``runledger runs`` and ``runledger reruns`` list. A branch
        that already ended is left as it is (``nothing_to_do``). Nothing here loads the agent's
        code beyond its data policy, and an agent that cannot even be loaded gets the default
        (sealed) one: the agent may be what poisons the request.

        Raises RunNotFoundError when neither the branch nor the parent run exists, PublishError
        when the failure cannot be written."""
        branch_id = request.branch_run_id
        try:
            policy = load_agent(request.agent, allowed=self.allowed).data_policy
        except Exception:  # any error of the agent's import or factory, or a name not allowed: the default seals
            policy = DataPolicy()
        common: dict[str, Any] = {"parent_run_id": request.parent_run_id, "mode": request.mode}
        try:
            log = await load_run(self.client, branch_id, open_content=False)
        except RunNotFoundError:
            log = None
        if log is not None:
            cp = fold(log.records)
            if cp.status in ("completed", "failed"):
                return RerunResult(branch_id, cp.status, reason=cp.failure_reason,
                                   error=(cp.error or {}).get("message"), nothing_to_do=True,
                                   fork_step=(cp.parent or {}).get("fork_step", 0), **common)  # fmt: skip
            protector = await run_protector(self.client, log.agent, branch_id, policy, worker=True)
            writer = SubjectWriter(self.client.js, log.subject, run_id=branch_id, agent=log.agent,
                                   msg_id_prefix=branch_id, next_seq=cp.next_seq, prev_hash=cp.last_hash,
                                   last_stream_seq=log.last_stream_seq, policy=self.policy,
                                   transform=protector.protect, chain_format=cp.chain_format)  # fmt: skip
        else:
            parent = fold((await load_run(self.client, request.parent_run_id, open_content=False)).records,
                          check_chain=False)  # fmt: skip
            if parent.version is None:
                raise RerunRequestError(f"run {request.parent_run_id} has no run.started event")
            if parent.erased is not None:  # no branch is started from an erased run, not even a failed one
                raise RunErasedError(parent.run_id, parent.erased)
            protector = await run_protector(self.client, parent.agent, branch_id, policy, worker=True)
            subject = run_subject(parent.agent, branch_id, WORKER_WRITER)
            writer = SubjectWriter(self.client.js, subject, run_id=branch_id, agent=parent.agent,
                                   msg_id_prefix=branch_id, policy=self.policy,
                                   transform=protector.protect)  # fmt: skip
            cp = Checkpoint()
            fork_step = default_fork(parent).step if request.fork_step is None else request.fork_step
            for body in (
                RunStarted(agent=parent.agent, version=VersionTuple(**parent.version), capture=policy.capture,
                           budgets=dict(parent.limits),  # type: ignore[arg-type]
                           labels={"parent_run_id": parent.run_id, "request_id": request.request_id},
                           chain_format=recorded_chain_format(parent.chain_format),
                           digest_scheme=recorded_digest_scheme(new_digest_scheme(protector))),
                RunForked(forked_from=parent.run_id, fork_step=fork_step, mode=request.mode),
            ):  # fmt: skip
                apply(cp, Recorded(await writer.append(body), writer.last_stream_seq))
        trace = None
        if cause is not None:
            trace = safe_text("".join(traceback.format_exception(cause)), 20_000)
        await writer.append(
            RunFailed.of("exception", ErrorInfo(type=type(error).__name__, message=str(error), traceback=trace),
                         cp.last_step if cp.last_step >= 0 else None)
        )  # fmt: skip
        fork_step = (cp.parent or {}).get("fork_step", 0)
        return RerunResult(branch_id, "failed", reason="exception", error=str(error), fork_step=fork_step, **common)

    async def _open_branch(
        self, spec: AgentSpec, parent: Checkpoint, request: RerunRequest, fork_step: int,
        changed: str | None, before: Any, after: Any,
    ) -> tuple[Checkpoint, SubjectWriter, PayloadProtector, Any]:  # fmt: skip
        """The branch's checkpoint, writer, content protector and (opened) input: created on the
        first delivery of a request, resumed (fenced) on a redelivery."""
        branch_id = request.branch_run_id
        opener = client_opener(self.client)

        async def branch_log() -> RunLog | None:
            try:
                return await load_run(self.client, branch_id, open_content=False)
            except RunNotFoundError:
                return None

        # Two independent round trips (the run's keys, the branch's record so far) at once.
        protector, log = await asyncio.gather(
            run_protector(self.client, spec.name, branch_id, spec.data_policy, worker=True), branch_log()
        )
        if log is None:
            cp = Checkpoint()
            writer = SubjectWriter(self.client.js, run_subject(spec.name, branch_id, WORKER_WRITER), run_id=branch_id,
                                   agent=spec.name, msg_id_prefix=branch_id, policy=self.policy,
                                   transform=protector.protect)  # fmt: skip
            run_input = await opener.open_value(parent.input, strict=False)
            gather = getattr(spec, "rerun_input", None)
            if gather is not None:
                # A framework's agent re-driven from its record (a LangGraph thread's inputs and resume
                # values: runledger.integrations.langgraph.GraphAgent): read here, recorded as the
                # branch's input, so a redelivered request resumes from the branch's own record.
                run_input = await gather(self.client, parent.run_id, run_input)
            for body in (
                RunStarted(agent=spec.name, version=spec.version(), input=run_input, capture=spec.data_policy.capture,
                           budgets=dict(parent.limits),  # type: ignore[arg-type]
                           labels={"parent_run_id": parent.run_id, "request_id": request.request_id},
                           # the parent's: the branch's digests are compared with the parent's record
                           chain_format=recorded_chain_format(parent.chain_format),
                           # its own key's (the parent's record is judged under the parent's: BranchRun)
                           digest_scheme=recorded_digest_scheme(new_digest_scheme(protector))),
                RunForked(forked_from=parent.run_id, fork_step=fork_step, mode=request.mode, changed=changed,
                          changed_from=before, changed_to=after,
                          # the branch's own rules, for its resume (runledger.sandbox.resume)
                          request=request.model_dump(mode="json")),
            ):  # fmt: skip
                event = await writer.append(body)
                apply(cp, Recorded(event, writer.last_stream_seq))
            # Erasure records the parent's run.erased before it looks for branches; checking after
            # run.forked is recorded means either it finds this branch or this finds the erasure.
            erased = await erased_now(self.client, parent.run_id)
            if erased is not None:
                await cascade_to(self.client, branch_id, parent.run_id, "branch")
                raise RunErasedError(parent.run_id, erased)
            return cp, writer, protector, run_input
        cp = fold(log.records)
        writer = SubjectWriter(self.client.js, log.subject, run_id=branch_id, agent=log.agent,
                               msg_id_prefix=branch_id, next_seq=cp.next_seq, prev_hash=cp.last_hash,
                               last_stream_seq=log.last_stream_seq, policy=self.policy,
                               transform=protector.protect, chain_format=cp.chain_format)  # fmt: skip
        if cp.status not in ("completed", "failed"):
            event = await writer.append(RunResumed(attempt=cp.attempts + 1, from_step=cp.last_step, worker="rerun"))
            apply(cp, Recorded(event, writer.last_stream_seq))
        return cp, writer, protector, await opener.open_value(cp.input, strict=False)


@dataclasses.dataclass
class _SandboxSession:
    """A branch driven with its agent in a sandbox: ``in_sandbox`` stands for the agent's function
    and hands the run to the sandbox's guest through a Broker, all within the wall-clock ``limit``
    (``asked``: what the request asked for, when that was more than the worker allows).

    The sandbox is being acquired (``acquiring``) while the branch is opened; ``sandbox`` is it
    once the drive got it, ``warm`` whether it came warm from the pool, ``requests`` the broker's
    count of the guest's requests."""

    rerunner: Rerunner
    acquiring: asyncio.Task[tuple[Sandbox, bool]]
    checked: Preflight
    start: dict[str, Any]  # the broker's start message: which agent, run and input
    limit: float
    asked: float | None
    deadline: float = dataclasses.field(init=False)
    sandbox: Sandbox | None = None
    warm: bool = False
    requests: int = 0
    host_cpu_s: float = 0.0
    clean_exit: bool = False

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.limit

    async def drive_branch(self, run: BranchRun) -> RunResult:
        """Drive the branch with ``in_sandbox`` as its agent. Afterwards the sandbox goes back to
        the pool's finisher after a clean exit and is removed otherwise; one never got is released
        (waited for, then removed), or left to the pool's close() when the worker is stopping."""
        pool = self.rerunner.pool
        stopped = False
        try:
            agent = dataclasses.replace(self.checked.spec, fn=self.in_sandbox)
            return await drive(run, agent, record_nondeterminism=True)
        except asyncio.CancelledError:
            stopped = True
            raise
        finally:
            if self.sandbox is not None and self.clean_exit:
                pool.finish_later(self.sandbox)
            elif self.sandbox is not None:
                await pool.discard(self.sandbox)
            elif stopped:
                self.acquiring.cancel()  # a worker stopping: no wait; its pool's close() removes the container
            else:
                await self.rerunner._release(self.acquiring)  # waited for, then removed: nothing is left running

    async def in_sandbox(self, run: Any) -> Any:
        """The agent's function for the drive: the guest's output, within the time limit. Past the
        limit, raises SandboxViolationError with the container killed; a violation before it names the
        container's state."""
        try:
            # The limit covers everything the branch waits for, not only the guest's next
            # message: a host tool, a model call or a write that hangs is cancelled too.
            remaining = max(0.0, self.deadline - time.monotonic())
            output = await asyncio.wait_for(self._serve(run), timeout=remaining)
        except SandboxViolationError as exc:
            if time.monotonic() < self.deadline:
                where = f"; the container {await self.sandbox.describe()}" if self.sandbox is not None else ""
                raise SandboxViolationError(f"{exc}{where}") from exc
            raise await self._over_limit() from exc
        except TimeoutError as exc:
            if time.monotonic() < self.deadline:
                raise  # some other wait inside the branch, recorded as it is
            raise await self._over_limit() from exc
        self.clean_exit = True
        return output

    async def _serve(self, run: Any) -> Any:
        """Take the sandbox and broker the run to its guest until the guest's output."""
        # Inside drive: a sandbox that cannot be had (garbage before its hello, no connection)
        # fails the branch like anything after the hello.
        checked, policy = self.checked, self.rerunner.pool.policy
        sandbox, self.warm = await asyncio.shield(self.acquiring)  # never cancelled mid-creation (see _release)
        self.sandbox = sandbox
        # The guest loaded the agent before its hello: code that does not load in the image (or is
        # another version there) fails the branch here, as `rerun --plan` predicted (Refusal.IMAGE).
        loaded = sandbox.hello.get("preloaded") if isinstance(sandbox.hello, dict) else None
        if isinstance(loaded, dict) and loaded.get("agent") == checked.ref:
            problem = judge_load(loaded, checked.spec, checked.ref, checked.code, policy.image)
            if problem:
                run.refusal = Refusal.IMAGE
                raise RerunRequestError(problem, Refusal.IMAGE)
        reader, channel_writer = await sandbox.channel(5.0)
        broker = Broker(reader, channel_writer, self.start, deadline=self.deadline, policy=policy)
        try:
            return await broker.serve(run, sandbox.hello)
        finally:
            self.requests, self.host_cpu_s = broker.requests, broker.meter.used

    async def _over_limit(self) -> SandboxViolationError:
        """Kill the container now, before the outcome is recorded, and say which limit it passed."""
        if self.sandbox is not None:
            await self.rerunner.pool.discard(self.sandbox)
        capped = f" (the worker's limit; the request asked for {self.asked:g}s)" if self.asked is not None else ""
        return SandboxViolationError(
            f"the re-run exceeded its wall-clock limit of {self.limit:g}s{capped}: its container was killed"
        )
