"""The context of an effect: what its function, its key function and the code below them know of it.

``EffectContext`` names one attempt at one effect: the idempotency ``key``, the ``run_id``, the
``step``, the ``attempt`` (1 for the first claim of the key; a resume that takes an in-doubt claim
over after its lease claims attempt 2, and so on), the model's ``tool_call_id`` when the call came
from one, the ``fencing_token`` (the stream sequence of this attempt's claim on the key's subject:
it grows with every attempt) and the claim's ``lease_s``.

Pass ``ctx.key`` downstream as the service's idempotency key, and the fencing token with it:
``ctx.fencing_headers()`` gives both as HTTP headers (``Idempotency-Key``, ``Fencing-Token``). Two
attempts at one effect (a paused holder that wakes up after a resume took its claim over) call the
service with the same key, so a service that honors it applies the effect once; the ledger fences
the older attempt's writes (``FencedError``). A service that keeps the highest token per key
(``runledger.sdk.fencing.FencingTokens``, or the same few lines in any language: docs/wire.md)
refuses the older attempt's call once the newer one's has arrived, even where it ignores the key.

How a function receives it:

- *a parameter*: an effect function (``run.effect(..., fn=...)``) or a key function that declares a
  parameter after its first one named ``ctx``, or annotated ``EffectContext``, receives the context
  there (``def refund(args, ctx)``, ``lambda args, ctx: ...``). Functions of one parameter are
  called as they always were.
- *ambient*: while an effect function runs, ``EffectContext.current()`` returns its context
  anywhere below it (an HTTP helper, a tool function reached through ``Tool.call``, a worker thread
  started with ``asyncio.to_thread``: a ``contextvars`` variable); None elsewhere.

Checking the claim before acting: a holder paused inside its effect function (SIGSTOP, a swapped-out
VM, a long GC pause) may wake after its lease, when a resume has already taken the key over. The
ledger fences its writes, not its HTTP call, so the function asks first, right before the call:

- ``ctx.check()`` (sync, about a microsecond): raises ``LeaseExpiredError`` once the claim's lease
  has run out by this process's own clock, measured from the claim's ``ts`` (the moment the
  resume's wait starts from), on ``lease_clock()``: monotonic, and counting while the machine sleeps.
  ``margin_s`` asks for that much lease still left (the time the call itself needs).
- ``ctx.check(ledger=True)`` / ``await ctx.acheck(ledger=True)``: also reads the key's last message
  (one direct get, about 0.3-0.4 ms) and raises ``ClaimTakenOverError`` when anything was written after
  this attempt's claim (an operator's forced resolution within the lease, a takeover the clock
  cannot see); the clock is read again after the answer. The blocking form works from any thread
  but the event loop's (a sync effect function is called on the loop: it uses the clock alone, or
  is made async, or hands its work to ``asyncio.to_thread``).

Both are errors the function raises as they are, without calling the service: the attempt did
nothing, so it is recorded as failed (or fenced out when the key was taken over). A check narrows
the window to the call itself; only a service that keeps the highest fencing token per key (or
honours the key) closes it (docs/wire.md, "The key in the world"). A context made outside
a claim (a key function's, one made by hand) holds no lease and no ledger: its checks pass.

A key function runs before the key exists and before any claim: its context has ``key=""``,
``attempt=0`` and ``fencing_token=0``, and a key must not depend on the step or the attempt (every
attempt must build the same key), only on the business identity in the arguments and, when the
effect belongs to the run, the run id.

No I/O of its own and nothing of NATS (the sandbox guest imports agent code that annotates with it):
the ledger check reads through the probe the SDK hands the context (runledger.sdk.key_probe).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import math
import os
import re
import time
import typing
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from runledger.errors import ClaimTakenOverError, ConfigurationError, LeaseExpiredError

_CURRENT: ContextVar[EffectContext | None] = ContextVar("runledger_effect_context", default=None)
# The run this task starts, resumes or re-runs (``current_run_id``).
_RUN_ID: ContextVar[str | None] = ContextVar("runledger_run_id", default=None)
# The headers an attempt's call carries to a service (docs/wire.md, "The key in the world").
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
FENCING_TOKEN_HEADER = "Fencing-Token"


if hasattr(time, "CLOCK_BOOTTIME"):

    def lease_clock() -> float:
        """Seconds on the clock a holder measures its own lease with: CLOCK_BOOTTIME (Linux), which
        never goes back and, unlike CLOCK_MONOTONIC, keeps counting while the machine is suspended."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)

else:  # pragma: no cover - other systems

    def lease_clock() -> float:
        """Seconds on the clock a holder measures its own lease with: ``time.monotonic()``."""
        return time.monotonic()


def lease_ends(claimed_at: str | None, lease_s: float | None) -> float | None:
    """When (on ``lease_clock()``) the lease of a claim this process wrote runs out: the claim's
    ``ts`` (this process's wall clock, stamped before the claim was sent) carried over to the lease
    clock, plus ``lease_s``. Called right after the claim was acknowledged, so the wall clock's age
    of the claim is a few milliseconds: kept within [0, lease_s], whatever the wall clock did
    meanwhile. Resumes wait for the lease from the same ``ts``. None without a lease."""
    if claimed_at is None or lease_s is None:
        return None
    claimed = dt.datetime.fromisoformat(claimed_at.replace("Z", "+00:00")).timestamp()
    age = min(max(time.time() - claimed, 0.0), lease_s)
    return lease_clock() - age + lease_s


class ClaimProbe(Protocol):
    """What a context asks the ledger through (runledger.sdk.key_probe.KeyProbe): the stream
    sequence of the key's last message, read on ``loop`` (the run's event loop)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    async def last_sequence(self, at_least: int) -> int: ...


@dataclass(frozen=True)
class EffectContext:
    """One attempt at one effect (see the module's docstring).

    ``lease_ends``: when this attempt's lease runs out on ``lease_clock()`` (None without a claim or
    a lease); ``check`` / ``acheck`` judge the claim by it, and by the ledger when asked."""

    key: str
    run_id: str
    step: int
    attempt: int
    fencing_token: int
    tool_call_id: str | None = None
    lease_s: float | None = None
    lease_ends: float | None = None
    _probe: ClaimProbe | None = field(default=None, repr=False, compare=False)

    @staticmethod
    def current() -> EffectContext | None:
        """The context of the effect function running in this task or thread; None outside one."""
        return _CURRENT.get()

    def fencing_headers(self) -> dict[str, str]:
        """The headers this attempt's calls send: its idempotency key and its fencing token
        (``Idempotency-Key``, ``Fencing-Token``), for a service that answers a key once and keeps
        the highest token per key (``runledger.sdk.fencing.FencingTokens``)."""
        return {IDEMPOTENCY_KEY_HEADER: self.key, FENCING_TOKEN_HEADER: str(self.fencing_token)}

    def lease_left(self) -> float | None:
        """Seconds left of this attempt's lease by this process's clock (negative once it ran out);
        None when the context holds no lease."""
        return None if self.lease_ends is None else self.lease_ends - lease_clock()

    def check(self, *, margin_s: float = 0.0, ledger: bool = False, timeout_s: float = 10.0) -> None:
        """Raise unless this attempt may still act: call it right before the external call.

        ``LeaseExpiredError`` when less than ``margin_s`` (default 0) of the lease is left by this
        process's clock; with ``ledger``, also ``ClaimTakenOverError`` when the key's subject no
        longer ends at this attempt's claim (one read, waited for at most ``timeout_s``; a failed
        read raises ``LedgerReadError``: unconfirmed is not confirmed). The ledger is asked from any
        thread but the run's event loop's, where it would block the loop it needs: ConfigurationError
        (use ``await ctx.acheck(ledger=True)`` from async code)."""
        self._check_lease(margin_s)
        probe = self._probe
        if not ledger or probe is None:
            return
        if _running_loop() is probe.loop:
            raise ConfigurationError(
                f"effect {self.key!r}: ctx.check(ledger=True) was called on the run's event loop (a sync effect "
                "function runs there), where waiting for the ledger would block the loop that reads it. Use "
                "ctx.check() (the lease, by the clock), make the function async and `await ctx.acheck(ledger=True)`, "
                "or run the blocking part with asyncio.to_thread"
            )
        future = asyncio.run_coroutine_threadsafe(probe.last_sequence(self.fencing_token), probe.loop)
        self._judge(future.result(timeout_s), margin_s)

    async def acheck(self, *, margin_s: float = 0.0, ledger: bool = False) -> None:
        """``check`` for async code: the same judgement; the ledger's read is awaited."""
        self._check_lease(margin_s)
        probe = self._probe
        if not ledger or probe is None:
            return
        read = probe.last_sequence(self.fencing_token)
        if _running_loop() is probe.loop:
            last = await read
        else:  # another loop (a thread's own): the read runs on the run's
            last = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(read, probe.loop))
        self._judge(last, margin_s)

    def _check_lease(self, margin_s: float) -> None:
        if not (math.isfinite(margin_s) and margin_s >= 0):
            raise ConfigurationError(f"margin_s must be a non-negative number of seconds, not {margin_s!r}")
        left = self.lease_left()
        if left is not None and left <= margin_s:
            raise LeaseExpiredError(
                self.key, self.run_id, self.step, self.attempt, self.fencing_token, self.lease_s or 0.0, left, margin_s
            )

    def _judge(self, last_seq: int, margin_s: float) -> None:
        # Anything after the claim (even a message the key's rules step over) fences this attempt's
        # outcome out: it must not act. The clock again: the read may have been slow, or paused.
        if last_seq > self.fencing_token:
            raise ClaimTakenOverError(self.key, self.run_id, self.step, self.attempt, self.fencing_token, last_seq)
        self._check_lease(margin_s)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


DEFAULT_LEASE_S = 30.0
LEASE_ENV = "RUNLEDGER_EFFECT_LEASE_S"


def effect_lease(lease_s: float | None = None) -> float:
    """The lease a claim carries: ``lease_s`` when given, else ``$RUNLEDGER_EFFECT_LEASE_S``, else
    ``DEFAULT_LEASE_S`` (30 s). Make it longer than the effect function ever takes: a resume that
    finds the claim without an outcome waits this long (from the claim) before it takes it over."""
    source = "lease_s"
    if lease_s is None:
        text = os.environ.get(LEASE_ENV)
        if not text:
            return DEFAULT_LEASE_S
        source = f"${LEASE_ENV}"
        try:
            lease_s = float(text)
        except ValueError:
            raise ConfigurationError(f"{source} must be a number of seconds, not {text!r}") from None
    if not (math.isfinite(lease_s) and lease_s > 0):
        raise ConfigurationError(f"{source} must be a positive number of seconds, not {lease_s!r}")
    return float(lease_s)


@contextmanager
def bound(ctx: EffectContext) -> Iterator[EffectContext]:
    """Make ``ctx`` what ``EffectContext.current()`` returns inside the block."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


_NAME = "ctx"
_ANNOTATION = re.compile(r"\bEffectContext\b")
_NONE: Any = object()
_PARAMETERS: weakref.WeakKeyDictionary[Callable[..., Any], Any] = weakref.WeakKeyDictionary()
_BOUND_PARAMETERS: weakref.WeakKeyDictionary[Callable[..., Any], Any] = weakref.WeakKeyDictionary()


def _is_context_annotation(annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):  # postponed annotations: "EffectContext", "runledger.EffectContext | None"
        return _ANNOTATION.search(annotation) is not None
    return annotation is EffectContext or EffectContext in typing.get_args(annotation)


def _find_parameter(fn: Callable[..., Any]) -> inspect.Parameter | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): called with the value alone
        return None
    if params and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        params = params[1:]  # the first positional parameter is the arguments', whatever its name
    for p in params:
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if p.name == _NAME or _is_context_annotation(p.annotation):
            return p
    return None


def context_parameter(fn: Callable[..., Any]) -> inspect.Parameter | None:
    """The parameter through which ``fn`` takes an ``EffectContext``: after the first, named ``ctx``
    or annotated ``EffectContext``; None when it declares none."""
    # A bound method is a new object at every attribute access (``tool.call``): it is remembered by
    # its function, whose bound signature (the first parameter dropped) every binding shares.
    bound_to = getattr(fn, "__func__", None) if inspect.ismethod(fn) else None
    cache, key = (_PARAMETERS, fn) if bound_to is None else (_BOUND_PARAMETERS, bound_to)
    try:
        found = cache[key]
    except (KeyError, TypeError):
        found = _find_parameter(fn)
        with suppress(TypeError):  # not weakly referenceable: looked up again next time
            cache[key] = _NONE if found is None else found
        return found
    return None if found is _NONE else found


def call_with_context(fn: Callable[..., Any], value: Any, ctx: EffectContext) -> Any:
    """``fn(value)``, or ``fn(value, ctx)`` when ``fn`` declares a parameter for the context."""
    param = context_parameter(fn)
    if param is None:
        return fn(value)
    if param.kind is inspect.Parameter.POSITIONAL_ONLY:
        return fn(value, ctx)
    return fn(value, **{param.name: ctx})


async def call_effect(fn: Callable[..., Any], args: Any, ctx: EffectContext) -> Any:
    """Call an effect function with its arguments (and its context, when it declares it), sync or
    async, with ``ctx`` bound as ``EffectContext.current()`` for everything it calls."""
    with bound(ctx):
        result = call_with_context(fn, args, ctx)
        if inspect.isawaitable(result):
            result = await result
    return result


def call_key(key_fn: Callable[..., Any], args: Any, ctx: EffectContext) -> str:
    """The idempotency key ``key_fn`` builds from ``args`` (and the pre-claim context, when it
    declares a parameter for it)."""
    key = call_with_context(key_fn, args, ctx)
    if not isinstance(key, str):
        raise ConfigurationError(f"a key function must return a str, not {type(key).__name__}")
    return key


def current_run_id() -> str | None:
    """The id of the run this task is starting, resuming or re-running (its tool listings, version
    check and drive included), None outside one: for what an integration names after the run (an MCP
    stdio server's log file, runledger.integrations.mcp)."""
    return _RUN_ID.get()


@contextmanager
def naming_run(run_id: str) -> Iterator[None]:
    """While inside, ``current_run_id()`` is ``run_id``."""
    token = _RUN_ID.set(run_id)
    try:
        yield
    finally:
        _RUN_ID.reset(token)
