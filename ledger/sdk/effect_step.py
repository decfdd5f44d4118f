"""The effect step of a run: an action outside the run done at most once per idempotency key.

``RecordedRun.effect`` (and an effect tool's ``RecordedRun.tool``) claims the key on its own
subject (the claim carries the intent: the only write ahead of acting, the run's fence checked in
flight with it), acts, and records the outcome on the key first and then the intent and the outcome
on the run; a resume that finds a claim without an outcome settles it (waits for its lease,
reconciles, or reports it in doubt). docs/wire.md's crash table is the contract.
Separate from runledger.sdk.run (the journal and the other steps) because it is the one step
with a second writer's subject and its own fencing; ``RecordedRun`` inherits it, so the names
are the run's as before.

The NATS-bound modules (effects, publish) are imported where an effect is settled, for the
reason runledger.sdk.run gives.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from runledger.errors import (
    ConfigurationError,
    EffectClaimedElsewhereError,
    EffectFailedError,
    EffectInDoubtError,
    FencedError,
    NondeterminismError,
)
from runledger.record import canonical
from runledger.record.canonical import CHAIN_FORMAT, CONTENT_FORMAT, jsonable
from runledger.record.events import (
    EffectCommitted,
    EffectFailed,
    EffectIntended,
    EffectResolved,
    ErrorInfo,
    Payload,
    RunSuspended,
)
from runledger.sdk.context import EffectContext, call_effect, call_key, effect_lease, lease_ends
from runledger.sdk.crashpoints import crash_point, pause_point
from runledger.sdk.errorinfo import error_info
from runledger.sdk.holder import this_holder
from runledger.sdk.tools import NOT_FOUND, EffectClass, ToolFn, call_maybe_async

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.log.publish import RetryPolicy, SubjectWriter
    from runledger.log.subjects import Writer
    from runledger.protect.capture import PayloadProtector
    from runledger.record.digests import Digester
    from runledger.record.events import Event
    from runledger.record.fold import Checkpoint, StepRecord
    from runledger.sdk.effects import KeyState

logger = logging.getLogger("runledger.sdk.run")  # the run's log, as before the step had its own module
P = TypeVar("P", bound=Payload)

# How many times _settle reads the key again after another writer got to it first, before it gives up.
_SETTLE_ROUNDS = 20


def _report_lease_wait(seconds: float, state: KeyState) -> None:
    logger.info(
        "effect %r: attempt %d (fencing token %d) of run %s step %s has no outcome and holds its lease for "
        "another %.1fs (its process may be paused, not dead); waiting for the lease to expire",
        state.key, state.attempt, state.fencing_token, state.run_id, state.step, seconds,
    )  # fmt: skip


def _new_key(key: str) -> KeyState:
    """A key as never claimed (its first claim is fenced on "the subject is empty")."""
    from runledger.sdk.effects import KeyState

    return KeyState(key)


class EffectStep:
    """The effect step of ``RecordedRun`` (its base: every method here runs on a RecordedRun).

    Also the key's side of it: claims and outcomes fenced on the key's own subject, and the
    outcome mirrored onto the run's subject after the key holds it."""

    # What the run holds and does, declared for the type checker: RecordedRun defines each.
    _client: LedgerClient
    _writer: SubjectWriter
    _key_writer: Writer
    _cp: Checkpoint
    _policy: RetryPolicy
    _protector: PayloadProtector | None
    _next_step: int
    _continuing: bool
    _keys_first: bool  # a resumed run's first live effects read their key before anything else
    _mirroring: set[asyncio.Task[None]]
    _append_lock: asyncio.Lock
    _unmirrored: BaseException | None

    if TYPE_CHECKING:
        _digests: Digester

        @property
        def run_id(self) -> str: ...
        @property
        def agent(self) -> str: ...
        async def _append(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> Event: ...
        async def _append_held(self, body: Payload, encoded: Mapping[str, bytes] | None = None) -> Event: ...
        def _take_step(self) -> tuple[int, StepRecord | None]: ...
        def _check(
            self, step: int, rec: StepRecord, kind: str, name: str, args_digest: str | None, args: Any = None
        ) -> None: ...
        async def _check_budgets(self, step: int, *, model_call: bool) -> None: ...
        async def _before_live(self, name: str) -> None: ...
        def _after_step(self, step: int) -> None: ...
        async def _open(self, value: Any) -> Any: ...
        def _resolve(self, args: Any) -> Any: ...

    async def effect(
        self,
        name: str,
        args: Any,
        *,
        key: str,
        fn: ToolFn,
        reconcile: Any = None,
        effect_class: EffectClass = "write",
        tool_call_id: str | None = None,
        lease_s: float | None = None,
    ) -> Any:
        """Perform a side effect at most once per idempotency ``key``, across processes.

        Claims the key on its own subject (first claim wins, server-side), calls ``fn(args)``,
        records the outcome. A key already committed returns its recorded result without
        acting. A claim with no outcome is in doubt: ``reconcile(key)`` decides (it returns the
        result, or NOT_FOUND when the external system has no trace), else EffectInDoubtError.

        ``fn`` receives the attempt's ``EffectContext`` (key, run id, step, attempt, the model's
        ``tool_call_id``, the fencing token) when it declares a parameter for it (``ctx``, or
        annotated ``EffectContext``), and through ``EffectContext.current()`` anywhere below it
        (runledger.sdk.context): pass ``ctx.key`` to the service as its idempotency key. The claim
        carries a lease of ``lease_s`` seconds (default ``$RUNLEDGER_EFFECT_LEASE_S``, else 30):
        a resume that finds the claim without an outcome waits for the lease to expire before it
        settles it, so a holder that is only paused is not overtaken while it may still act.
        """
        return await self._native_effect(
            name, jsonable(args), key=key, fn=fn, reconcile=reconcile,
            effect_class=effect_class, tool_call_id=tool_call_id, lease_s=lease_s,
        )  # fmt: skip

    async def _native_effect(
        self,
        name: str,
        args: Any,
        *,
        key: str,
        fn: ToolFn,
        reconcile: Any = None,
        effect_class: EffectClass = "write",
        tool_call_id: str | None = None,
        lease_s: float | None = None,
        about: dict[str, Any] | None = None,
    ) -> Any:
        """``effect`` with ``args`` JSON-native already (``jsonable``: a declared effect tool's
        arguments, converted once for their check, their key and the step). ``about``: the intent's
        optional facts of a declared tool (its ``description``, and ``via``)."""
        if not key:
            raise ConfigurationError(f"effect {name!r} needs a non-empty idempotency key")
        lease = effect_lease(lease_s)
        args_json, args_digest = self._digests.encoded(args)  # the bytes sealed too
        if self._continuing:
            # A run continued without replay (lifecycle.open_run) whose earlier attempt stopped inside
            # this effect: settle that step, as a replay of it would, instead of a new one that would
            # find the key claimed by another step. An outcome still on its way to the run is no orphan.
            orphan = await self._orphaned_effect(key)
            if orphan is not None:
                self._check(orphan.step, orphan, "effect", name, args_digest, args)
                return await self._settle(
                    orphan.step, name, args, key, fn, reconcile,
                    effect_class=effect_class, tool_call_id=tool_call_id, lease_s=lease, about=about,
                )  # fmt: skip
        step, rec = self._take_step()
        if rec is not None:
            self._check(step, rec, "effect", name, args_digest, args)
            if rec.key != key:
                raise NondeterminismError(self.run_id, step, f"effect key {rec.key!r}", f"effect key {key!r}")
            if rec.status == "committed":
                return await self._open_committed(key, rec.output, None)
            if rec.status == "failed":
                raise EffectFailedError(key, (rec.error or {}).get("message", "failed"))
            # Recorded as intended only: the process died (or stopped) somewhere inside the effect.
            return await self._settle(
                step, name, args, key, fn, reconcile,
                effect_class=effect_class, tool_call_id=tool_call_id, lease_s=lease, about=about,
            )  # fmt: skip
        known = await self._key_history(key) if self._keys_first else None
        if known is not None:
            # A resumed run whose last process stopped inside this effect: the key may hold its claim or
            # outcome while the run's record of it was lost with the process (docs/wire.md, rows "1" to
            # "3"). Settled from the key as read, never asking the tool's source first (a stopped MCP server).
            return await self._settle(
                step, name, args, key, fn, reconcile,
                effect_class=effect_class, tool_call_id=tool_call_id, lease_s=lease, about=about, state=known,
            )  # fmt: skip
        await self._before_live(name)  # before anything of the call is recorded (deferred_tools)
        await self._check_budgets(step, model_call=False)
        # A claim is seen by other processes: the run's last effect record lands on the run first (a
        # process that lost the run stops here, before it claims anything).
        await self._mirrored()
        # Under output durability the steps before this one are acknowledged before acting: their
        # window's round trips start now, while the intent is built and sealed, and end in flight with
        # the claim (``_write_ahead``).
        self._writer.flush_soon()
        # The claim of the key is the one write ahead of acting, and it is the intent: its payload is
        # the run's ``effect.intended``. Optimistically the key's first event (fenced on "the subject is
        # empty"); a key with a history refuses it, and _settle reads the key and decides.
        intent = await self._protected(EffectIntended(
            step=step, name=name, key=key, args=args, args_digest=args_digest, effect_class=effect_class,
            lease_s=lease, tool_call_id=tool_call_id, holder=this_holder() or None, **(about or {}),
        ), {"args": args_json})  # fmt: skip
        claimed = await self._write_ahead(intent)
        if claimed is None:
            return await self._settle(
                step, name, args, key, fn, reconcile,
                effect_class=effect_class, tool_call_id=tool_call_id, lease_s=lease, about=about,
            )  # fmt: skip
        return await self._act(step, args, fn, claimed, intent)

    async def _key_history(self, key: str) -> KeyState | None:
        """The state of ``key`` when it was claimed before (one read), None when it is free: for the first
        live effects of a resumed run; the first key found free ends the check (the effects the last
        process was inside come first)."""
        from runledger.sdk.effects import read_key

        state = await read_key(self._client, key, self.agent)
        if state.status == "free":
            self._keys_first = False
            return None
        return state

    async def _orphaned_effect(self, key: str) -> StepRecord | None:
        """The run's effect step on ``key`` recorded as intended only, once the last outcome on its
        way to the run has landed (an outcome still in flight is no orphan); None when there is none."""
        await self._mirrored()
        return next(
            (r for r in self._cp.steps.values() if r.kind == "effect" and r.key == key and r.status == "intended"),
            None,
        )

    async def _write_ahead(self, intent: EffectIntended, state: KeyState | None = None) -> KeyState | None:
        """Claim the intent's key, the only write ahead of acting, with the run's fence checked in
        flight with it (``_run_is_ours``). Returns the key's state as claimed; None when the key has
        a history (a new key's claim, ``state`` None) or moved on since ``state`` was read (a claim
        after it): the caller settles it.

        The fence check refuses an effect of a run that another process owns (resumed elsewhere,
        cancelled and taken over): the key this process just claimed is freed again with an outcome
        that says nothing was done (``effect.failed``, ``FencedError``), and FencedError is raised.
        Under output durability the check is the flush of the run's window (fenced on the run) when it
        holds events, and the window is acknowledged before this returns: nothing acts before the log
        holds every step that led to it, and the claim does not wait for them (docs/wire.md)."""
        fence = asyncio.ensure_future(self._run_is_ours())
        try:
            claimed = await self._claim_key(state or _new_key(intent.key), intent)
        except BaseException:
            await asyncio.gather(fence, return_exceptions=True)  # never act, never leave it running
            raise
        try:
            await fence
        except BaseException as exc:
            if claimed is not None and isinstance(exc, Exception):
                await self._release(claimed, intent, exc)
            raise
        return claimed

    async def _run_is_ours(self) -> None:
        """Raise FencedError when the run's subject moved past this writer's last event (another
        process appended to it: the run was resumed elsewhere or taken over). One direct get of the
        run's last message (no write, no fsync); under output durability, the window's own flush
        when it holds events (fenced on the run, it answers the same question)."""
        from runledger.log.publish import last_subject_seq
        from runledger.log.subjects import fence_filter

        writer = self._writer
        windowed = getattr(writer, "unacknowledged", 0)
        await writer.commit()  # raises FencedError when the window is refused
        if windowed:
            return
        subject = fence_filter(writer.subject) or writer.subject
        last = await last_subject_seq(self._client.js, subject)
        if last > writer.last_stream_seq:
            # A step of this run may be on its way in parallel (gathered calls): its ack moves the
            # writer. Once the run's appends are done, the question is asked again.
            async with self._append_lock:
                last = await last_subject_seq(self._client.js, subject)
                if last > writer.last_stream_seq:
                    raise FencedError(writer.subject, f"{writer.msg_id_prefix}:{writer.next_seq}",
                                      writer.last_stream_seq, last)  # fmt: skip

    async def _claim_key(self, state: KeyState, intent: EffectIntended) -> KeyState | None:
        """Append the claim right after ``state``; None when another writer got there first."""
        try:
            return await self._write_key(state, intent, committed=True)
        except FencedError:
            return None

    async def _release(self, state: KeyState, intent: EffectIntended, why: Exception) -> None:
        """Free a key this process claimed and will not act on (the run is not its own any more):
        ``effect.failed`` on the key, fenced on the claim, saying nothing was done. A release that
        cannot be written leaves the claim in doubt, as a crash would (its holder is this process)."""
        failed = EffectFailed(
            step=intent.step, key=intent.key, fencing_token=state.fencing_token,
            error=ErrorInfo(type=type(why).__name__, message=f"not performed: the run moved on before the effect "
                            f"acted (another process owns it); nothing was done. {why}"),
        )  # fmt: skip
        try:
            await self._write_key(state, failed, committed=True)
        except Exception as exc:
            logger.warning("effect %r of run %s step %s: its claim could not be released (%s); it stays in doubt "
                           "until settled (nothing was done)", intent.key, self.run_id, intent.step, exc)  # fmt: skip

    def _effect_key(self, key_fn: Callable[..., Any], args: Any, *, tool_call_id: str | None = None) -> str:
        """The idempotency key ``key_fn`` builds from ``args`` for the effect about to take the next
        step. A key function that declares a parameter for it (``ctx``, or annotated
        ``EffectContext``) receives the context before any claim: run id, step, tool-call id, with
        ``key=""``, ``attempt=0`` and ``fencing_token=0`` (runledger.sdk.context)."""
        ctx = EffectContext(
            key="", run_id=self.run_id, step=self._next_step, attempt=0, fencing_token=0, tool_call_id=tool_call_id
        )
        return call_key(key_fn, args, ctx)

    async def _settle(
        self,
        step: int,
        name: str,
        args: Any,
        key: str,
        fn: ToolFn,
        reconcile: Any,
        *,
        effect_class: EffectClass,
        tool_call_id: str | None,
        lease_s: float,
        about: dict[str, Any] | None = None,
        state: KeyState | None = None,
    ) -> Any:
        """Bring the key to an outcome for this step: reuse, reconcile, or claim and act (``state``: the
        key as just read, else it is read here).

        A claim of this step without an outcome whose lease has not expired is waited for (its
        holder may be paused, not dead); then it is settled by ``reconcile`` (or the run
        suspends in doubt), and a free key is claimed by a new attempt (a new fencing token),
        which fences the old holder's writes out. Every write here is fenced on the key as read:
        when another writer got there first, the key is read again and the decision taken anew."""
        from runledger.log.subjects import AGENT_WRITER
        from runledger.sdk.effects import agent_view, lease_remaining, read_key, wait_for_lease

        # What the run records of this step, with its outcome: the key's claims carry the same payload.
        intent = EffectIntended(
            step=step, name=name, key=key, args=args, args_digest=self._digests.digest(args),
            effect_class=effect_class, lease_s=lease_s, tool_call_id=tool_call_id, holder=this_holder() or None,
            **(about or {}),
        )  # fmt: skip
        if state is None:
            state = await read_key(self._client, key, self.agent)
        for _ in range(_SETTLE_ROUNDS):
            if self._key_writer == AGENT_WRITER:
                state = agent_view(state)  # a key only workers' branches claimed is not the agent's word
            if state.status == "claimed":
                if self._adopts(state, step):
                    # A run continued without replay whose earlier attempt claimed the key and stopped
                    # before the run recorded anything of the effect: settled on the claim's own step.
                    step = cast(int, state.step)
                    intent = intent.model_copy(update={"step": step})
                if state.run_id != self.run_id or state.step != step:
                    holder = -1 if state.step is None else state.step
                    raise EffectClaimedElsewhereError(key, state.run_id or "?", holder)
                if lease_remaining(state) > 0:
                    state = await wait_for_lease(self._client, state, on_wait=_report_lease_wait)
                    continue
                if reconcile is None:
                    await self._record_on_run(intent)  # the run shows the effect in doubt from now on
                    await self._append(RunSuspended(step=step, request_id=key, reason="effect_in_doubt"))
                    raise EffectInDoubtError(self.run_id, step, key)
                await self._before_live(name)  # a reconcile asks the tool's service
                found = await self._reconciled(step, key, reconcile, intent)
                resolution = EffectResolved(
                    key=key,
                    by="reconcile",
                    outcome="not_committed" if found is NOT_FOUND else "committed",
                    result=None if found is NOT_FOUND else jsonable(found),
                )
                state = await self._try_append_key(state, resolution) or await read_key(self._client, key, self.agent)
                continue
            if state.status == "committed":
                committed = EffectCommitted(
                    step=step, key=key, result=state.result, via="reconcile" if state.via == "reconcile" else "record"
                )
                await self._record_on_run(intent, committed)
                self._after_step(step)
                return await self._open_committed(key, state.result, state.run_id)
            # free (never claimed, released, or an earlier attempt failed): claim a new attempt, act, record.
            await self._before_live(name)
            await self._writer.commit()  # the run's own fencing raises, before the key's is caught
            claimed = await self._write_ahead(intent, state)
            if claimed is not None:
                return await self._act(step, args, fn, claimed, intent)
            state = await read_key(self._client, key, self.agent)
        raise EffectClaimedElsewhereError(key, state.run_id or "?", -1 if state.step is None else state.step)

    def _adopts(self, state: KeyState, step: int) -> bool:
        """Whether this run, continued without replay (lifecycle.open_run), takes the claim in
        ``state`` for its own: the run's claim of another step, of which the run holds no outcome."""
        if not self._continuing or state.run_id != self.run_id or state.step is None or state.step == step:
            return False
        rec = self._cp.steps.get(state.step)
        return rec is None or (rec.kind == "effect" and rec.key == state.key and rec.status == "intended")

    async def _record_on_run(self, intent: EffectIntended, outcome: Payload | None = None) -> None:
        """Append the effect's intent to the run unless the run holds it already (recorded by the
        protocol before this one, or by an earlier settle), then its ``outcome``, if any."""
        rec = self._cp.steps.get(intent.step)
        if rec is None or rec.kind != "effect" or rec.key != intent.key:
            await self._append(intent)
        if outcome is not None:
            await self._append(outcome)

    async def _open_committed(self, key: str, result: Any, committed_by: str | None) -> Any:
        """A committed effect's result as the agent receives it. A result sealed under a key that is
        gone (the run that committed it was erased) raises EffectResultErasedError, which the agent
        can handle: the key stays committed and the action is not done again."""
        from runledger.errors import EffectResultErasedError, PayloadUnavailableError
        from runledger.protect.blobs import is_blob_ref
        from runledger.protect.capture import is_sealed

        try:
            return await self._open(result)
        except PayloadUnavailableError as exc:
            if not (is_sealed(result) or (is_blob_ref(result) and result.get("enc"))):
                raise  # hash-only capture, a missing blob: not an erasure
            raise EffectResultErasedError(key, committed_by, exc.reason) from exc

    async def _reconciled(self, step: int, key: str, reconcile: Any, intent: EffectIntended) -> Any:
        """What ``reconcile(key)`` found. A reconcile that raises (its service unreachable) answers
        nothing: the key stays in doubt and the run suspends (``effect_in_doubt``, resumable once the
        key is resolved or the service answers again), never a final failure of the run."""
        try:
            return await call_maybe_async(reconcile, key)
        except Exception as exc:
            cause = f"{type(exc).__name__}: {exc}"
            logger.warning("effect %r of run %s step %s: reconcile failed (%s)", key, self.run_id, step, cause)
            await self._record_on_run(intent)
            await self._append(RunSuspended(step=step, request_id=key, reason="effect_in_doubt"))
            raise EffectInDoubtError(self.run_id, step, key, reconcile_error=cause) from exc

    async def _act(self, step: int, args: Any, fn: ToolFn, state: KeyState, intent: EffectIntended) -> Any:
        """The key is claimed by this step: call the function, record the outcome (key first, then the
        run: the intent and the outcome together).

        The function gets this attempt's context, which can check the claim before the function acts
        (``ctx.check()``: its lease by this process's clock, and the key's last message on the ledger);
        the outcome is fenced on this attempt's claim. Under step durability the key's outcome is
        acknowledged before this returns; under output durability it is on its way (``_defer``), and
        acknowledged before anything leaves the process (the run's next commit)."""
        from runledger.sdk.key_probe import KeyProbe

        key = intent.key
        lease_end = lease_ends(state.claimed_at, state.lease_s)  # read right after the claim's ack, before any pause
        crash_point(f"effect:{key}:claimed")
        pause_point(f"effect:{key}:claimed")
        ctx = EffectContext(
            key=key, run_id=self.run_id, step=step, attempt=state.attempt, fencing_token=state.fencing_token,
            tool_call_id=intent.tool_call_id, lease_s=state.lease_s, lease_ends=lease_end,
            _probe=KeyProbe(self._client, state.agent or self.agent, key, asyncio.get_running_loop()),
        )  # fmt: skip
        started = time.perf_counter()
        try:
            result = jsonable(await call_effect(fn, self._resolve(args), ctx))
        except Exception as exc:
            info = error_info(exc, False)
            failed = EffectFailed(step=step, key=key, error=info, fencing_token=ctx.fencing_token)
            await self._append_key(state, failed)
            await self._record_on_run(intent, failed)
            self._after_step(step)
            raise EffectFailedError(key, f"{info.type}: {info.message}") from exc
        duration = (time.perf_counter() - started) * 1000
        crash_point(f"effect:{key}:acted")
        pause_point(f"effect:{key}:acted")
        # Encoded once: sealed as the record's content, and decoded as what the agent gets (as_recorded).
        result_json = canonical.canonical_json(result, self._cp.chain_format)
        committed = await self._protected(
            EffectCommitted(step=step, key=key, result=result, duration_ms=duration, fencing_token=ctx.fencing_token),
            {"result": result_json},
        )
        if getattr(self._writer, "unacknowledged", None) is not None:
            self._defer(self._outcome_later(state, intent, committed))  # output durability
        else:
            await self._append_key(state, committed)
            crash_point(f"effect:{key}:recorded")
            await self._mirror(intent, committed)
        return canonical.read_back(json.loads(result_json), result_json)

    async def _protected(self, body: P, encoded: Mapping[str, bytes] | None = None) -> P:
        """``body`` as the run records it, protected once for the run and the key alike (the same
        sealed content on both subjects), when protecting it again changes nothing: its content
        sealed or hashed, so the writers' own pass leaves the markers as they are, and the run's
        chain in the key's content format. Otherwise ``body`` as it is: each writer protects it.
        ``encoded``: content fields' canonical JSON in the run's format (PayloadProtector.protect)."""
        protector = self._protector
        if (
            protector is None
            or self._writer.transform != protector.protect
            or not (protector.policy.encrypt or protector.policy.capture == "hash-only")
            or self._writer.chain_format != CHAIN_FORMAT
        ):
            return body
        token = CONTENT_FORMAT.set(CHAIN_FORMAT)
        try:
            return cast(P, await protector.protect(body, encoded))
        finally:
            CONTENT_FORMAT.reset(token)

    async def _mirror(self, intent: EffectIntended, committed: EffectCommitted) -> None:
        """Record the effect on the run once its key acknowledged the outcome: the intent and the
        outcome, in the run's append order (after the steps already waiting, before any later one),
        built and published once this returns, acknowledged before the run's next event and by
        ``commit``. The step is durable already: its key holds the claim (the intent) and the outcome,
        and a crash before the run holds them leaves the state a resume completes from the key
        (``_settle``: ``effect.committed`` with ``via: "record"``). A record that fails (FencedError:
        another process owns the run; PublishError) stops the run at its next append or commit, which
        raise it: nothing is written after it."""
        lock = self._append_lock
        handed: list[asyncio.Lock] = []
        if not lock.locked():
            # Free (no other step appending): taken here at once, without a turn of the loop, and
            # handed to the task, so the record is ahead of whatever the agent appends next while
            # its work (protect, build, publish) is done after this returns.
            await lock.acquire()
            handed.append(lock)
        task = self._defer(self._mirror_outcome(intent, committed, handed))
        if handed:
            # A task cancelled before its first step never runs its own release.
            task.add_done_callback(lambda _: handed.pop().release() if handed else None)
        else:
            # The task's first step joins the lock's queue (asyncio.Lock is FIFO): one turn of the
            # loop and it is ahead of whatever the agent appends next.
            await asyncio.sleep(0)

    def _defer(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` (an effect's record on its way) as a task the run's commit waits for."""
        task = asyncio.ensure_future(work)
        self._mirroring.add(task)  # held until it is done (the loop holds tasks weakly)
        task.add_done_callback(self._mirroring.discard)
        return task

    async def _outcome_later(self, state: KeyState, intent: EffectIntended, committed: EffectCommitted) -> None:
        """Output durability: the key's outcome, then the run's record of the effect in its window.
        Acknowledged by the run's next commit (``commit`` waits for it), before anything leaves the
        process; a crash before the key holds it leaves the claim in doubt (docs/wire.md)."""
        try:
            await self._append_key(state, committed, commit_run=False)
            crash_point(f"effect:{intent.key}:recorded")
        except BaseException as exc:
            self._unmirrored = exc
            if not isinstance(exc, Exception):
                raise
            return
        await self._mirror_outcome(intent, committed, [])

    async def _mirror_outcome(
        self, intent: EffectIntended, committed: EffectCommitted, handed: list[asyncio.Lock]
    ) -> None:
        """Append the effect's record (under the append lock ``_mirror`` handed over, if it did), then fold it."""
        try:
            if handed:
                lock = handed.pop()
            else:
                lock = self._append_lock
                await lock.acquire()
            try:
                rec = self._cp.steps.get(intent.step)
                if rec is None or rec.kind != "effect" or rec.key != intent.key:
                    await self._append_held(intent)
                await self._append_held(committed)
            finally:
                lock.release()
        except BaseException as exc:
            self._unmirrored = exc
            if not isinstance(exc, Exception):
                raise
            return
        self._after_step(intent.step)

    async def _mirrored(self) -> None:
        """Return once every effect record on its way is on the run; raise what stopped one."""
        if self._mirroring:
            await asyncio.wait(list(self._mirroring))  # never cancelled with a caller that gives up waiting
        if self._unmirrored is not None:
            raise self._unmirrored

    async def _write_key(self, state: KeyState, body: Payload, *, committed: bool = False) -> KeyState:
        """Append to the key right after ``state``, fenced on it (FencedError when another writer was first).

        The run's own steps are acknowledged first (output durability): a key is seen by others. A
        FencedError from that commit is the run's (another process owns it), never the key's.
        ``committed``: the caller has just committed them (a new key's claim: ``_write_ahead``)."""
        from runledger.sdk.effects import append_to_key

        if not committed:
            await self._writer.commit()
        return await append_to_key(
            self._client,
            state,
            body,
            run_id=self.run_id,
            agent=self.agent,
            policy=self._policy,
            transform=self._writer.transform,
            writer=self._key_writer,
        )

    async def _try_append_key(self, state: KeyState, body: Payload) -> KeyState | None:
        """Append to the key right after ``state`` (fenced on it); None when another writer got there first."""
        await self._writer.commit()  # the run's own fencing raises, before the key's is caught
        try:
            return await self._write_key(state, body)
        except FencedError:
            return None

    async def _append_key(self, state: KeyState, body: Payload, *, commit_run: bool = True) -> KeyState:
        """Record this attempt's outcome on the key, fenced on its claim.

        Anything written to the key since the claim (a resolution, a newer attempt's claim, taken
        over after the lease) means this process lost the claim while it acted (it was paused, or
        slower than its lease): it stops with FencedError and records nothing more. Whatever it
        did in the world carried the same idempotency key as the attempt that took over."""
        if commit_run:
            await self._writer.commit()  # the run's own fencing raises as it is, not as a lost claim
        try:
            return await self._write_key(state, body, committed=True)
        except FencedError:
            logger.warning(
                "effect %r: attempt %d (fencing token %d) of run %s step %s lost its claim before recording "
                "its outcome (the key was settled or claimed again after the lease); this process stops",
                state.key, state.attempt, state.fencing_token, self.run_id, state.step,
            )  # fmt: skip
            raise
