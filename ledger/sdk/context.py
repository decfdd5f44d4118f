"""The context of an effect: what its function, its key function and the code below them know of it.

``EffectContext`` names one attempt at one effect: the idempotency ``key``, the ``run_id``, the
``step``, the ``attempt`` (1 for the first claim of the key; a resume that takes an in-doubt claim
over after its lease claims attempt 2, and so on), the model's ``tool_call_id`` when the call came
from one, the ``fencing_token`` (the stream sequence of this attempt's claim on the key's subject:
it grows with every attempt) and the claim's ``lease_s``.

Pass ``ctx.key`` downstream as the service's idempotency key. Two attempts at one effect (a paused
holder that wakes up after a resume took its claim over) call the service with the same key, so a
service that honors it applies the effect once; the ledger fences the older attempt's writes
(``FencedError``). A service that also stores the fencing token can refuse any call with a
smaller one.

How a function receives it:

- *a parameter*: an effect function (``run.effect(..., fn=...)``) or a key function that declares a
  parameter after its first one named ``ctx``, or annotated ``EffectContext``, receives the context
  there (``def refund(args, ctx)``, ``lambda args, ctx: ...``). Functions of one parameter are
  called as they always were.
- *ambient*: while an effect function runs, ``EffectContext.current()`` returns its context
  anywhere below it (an HTTP helper, a tool function reached through ``Tool.call``, a worker thread
  started with ``asyncio.to_thread``: a ``contextvars`` variable); None elsewhere.

A key function runs before the key exists and before any claim: its context has ``key=""``,
``attempt=0`` and ``fencing_token=0``, and a key must not depend on the step or the attempt (every
attempt must build the same key), only on the business identity in the arguments and, when the
effect belongs to the run, the run id.

Pure: no I/O and nothing of NATS (the sandbox guest imports agent code that annotates with it).
"""

from __future__ import annotations

import inspect
import math
import os
import re
import typing
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from runledger.errors import ConfigurationError

_CURRENT: ContextVar[EffectContext | None] = ContextVar("runledger_effect_context", default=None)


@dataclass(frozen=True)
class EffectContext:
    """One attempt at one effect (see the module's docstring)."""

    key: str
    run_id: str
    step: int
    attempt: int
    fencing_token: int
    tool_call_id: str | None = None
    lease_s: float | None = None

    @staticmethod
    def current() -> EffectContext | None:
        """The context of the effect function running in this task or thread; None outside one."""
        return _CURRENT.get()


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
    try:
        found = _PARAMETERS[fn]
    except (KeyError, TypeError):
        found = _find_parameter(fn)
        with suppress(TypeError):  # not weakly referenceable: looked up again next time
            _PARAMETERS[fn] = _NONE if found is None else found
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
