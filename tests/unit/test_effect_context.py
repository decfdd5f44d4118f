"""Which functions take an ``EffectContext`` and how they get it (runledger.sdk.context), the lease a
claim carries, and the lease arithmetic of a key's state."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from typing import Any

import pytest

from runledger import ConfigurationError, EffectContext
from runledger.sdk.context import DEFAULT_LEASE_S, call_effect, call_key, context_parameter, effect_lease
from runledger.sdk.effects import KeyState, lease_remaining

CTX = EffectContext(key="refund:o1", run_id="r1", step=3, attempt=2, fencing_token=17, tool_call_id="c1", lease_s=5.0)


def one(args: Any) -> Any:
    return ("one", args)


def named(args: Any, ctx: Any) -> Any:
    return ("named", args, ctx.key)


def annotated(args: Any, context: EffectContext) -> Any:
    return ("annotated", args, context.fencing_token)


def optional(args: Any, *, c: EffectContext | None = None) -> Any:
    return ("optional", args, c and c.attempt)


def positional_only(args: Any, ctx: Any, /) -> Any:
    return ("positional_only", args, ctx.step)


def defaulted(args: Any, retries: int = 3) -> Any:  # a second parameter that is not the context
    return ("defaulted", args, retries)


def first_named_ctx(ctx: Any) -> Any:  # the first parameter is the arguments', whatever its name
    return ("first", ctx)


class Callable:
    def __call__(self, args: Any, ctx: EffectContext) -> Any:
        return ("object", args, ctx.run_id)


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (one, ("one", 1)),
        (named, ("named", 1, "refund:o1")),
        (annotated, ("annotated", 1, 17)),
        (optional, ("optional", 1, 2)),
        (positional_only, ("positional_only", 1, 3)),
        (defaulted, ("defaulted", 1, 3)),
        (first_named_ctx, ("first", 1)),
        (Callable(), ("object", 1, "r1")),
        (functools.partial(named), ("named", 1, "refund:o1")),
        (lambda a, ctx: ("lambda", a, ctx.tool_call_id), ("lambda", 1, "c1")),
        (lambda a: ("lambda1", a), ("lambda1", 1)),
    ],
)
def test_a_function_gets_the_context_only_when_it_declares_it(fn: Any, expected: Any) -> None:
    assert asyncio.run(call_effect(fn, 1, CTX)) == expected


def test_the_parameter_is_found_by_name_or_by_annotation() -> None:
    assert context_parameter(one) is None and context_parameter(defaulted) is None
    assert context_parameter(first_named_ctx) is None and context_parameter(len) is None
    found = context_parameter(annotated)
    assert found is not None and found.name == "context"


class _Shop:
    def __init__(self, name: str) -> None:
        self.name = name

    def refund(self, args: Any, ctx: EffectContext) -> Any:
        return self.name, args, ctx.tool_call_id

    def cancel(self, args: Any) -> Any:
        return self.name, args


class _OtherShop(_Shop):
    def cancel(self, args: Any, ctx: EffectContext | None = None) -> Any:
        return self.name, args, ctx is not None


def test_methods_of_every_instance_get_the_context_as_their_function_declares() -> None:
    # A bound method is a new object at each access: what is remembered is its function's.
    for _ in range(2):
        for shop in (_Shop("a"), _Shop("b")):
            assert asyncio.run(call_effect(shop.refund, 1, CTX)) == (shop.name, 1, "c1")
            assert asyncio.run(call_effect(shop.cancel, 1, CTX)) == (shop.name, 1)
        assert asyncio.run(call_effect(_OtherShop("c").cancel, 1, CTX)) == ("c", 1, True)
        assert asyncio.run(call_effect(_OtherShop("c").refund, 2, CTX)) == ("c", 2, "c1")


def test_an_async_effect_function_is_awaited_with_the_context_bound() -> None:
    async def fn(args: Any) -> Any:
        await asyncio.sleep(0)
        inner = await asyncio.to_thread(EffectContext.current)  # a worker thread sees it too
        return args, EffectContext.current(), inner

    assert asyncio.run(call_effect(fn, 2, CTX)) == (2, CTX, CTX)
    assert EffectContext.current() is None


def test_the_context_is_unbound_when_the_function_raises() -> None:
    def fn(args: Any) -> Any:
        raise ValueError("no")

    with pytest.raises(ValueError):
        asyncio.run(call_effect(fn, 1, CTX))
    assert EffectContext.current() is None


def test_key_functions_of_one_or_two_parameters() -> None:
    assert call_key(lambda a: f"refund:{a['order']}", {"order": "o1"}, CTX) == "refund:o1"
    assert call_key(lambda a, ctx: f"charge:{a}:{ctx.run_id}", 5, CTX) == "charge:5:r1"
    with pytest.raises(ConfigurationError, match="must return a str"):
        call_key(lambda a: 7, 5, CTX)


def test_the_context_is_frozen() -> None:
    with pytest.raises(AttributeError):
        CTX.key = "other"  # type: ignore[misc]


def test_the_lease_comes_from_the_call_the_environment_or_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNLEDGER_EFFECT_LEASE_S", raising=False)
    assert effect_lease() == DEFAULT_LEASE_S == 30.0
    assert effect_lease(2) == 2.0
    monkeypatch.setenv("RUNLEDGER_EFFECT_LEASE_S", "1.5")
    assert effect_lease() == 1.5 and effect_lease(4) == 4.0
    monkeypatch.setenv("RUNLEDGER_EFFECT_LEASE_S", "soon")
    with pytest.raises(ConfigurationError, match="RUNLEDGER_EFFECT_LEASE_S"):
        effect_lease()
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ConfigurationError, match="positive"):
            effect_lease(bad)


def _claimed(at: float, lease: float | None) -> KeyState:
    stamp = dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    return KeyState("k", status="claimed", run_id="r", step=0, attempt=1, claimed_at=stamp, lease_s=lease)


def test_what_is_left_of_a_lease() -> None:
    now = 1_800_000_000.0
    assert lease_remaining(_claimed(now - 2, 5), now=now) == pytest.approx(3)
    assert lease_remaining(_claimed(now - 9, 5), now=now) == 0  # expired
    assert lease_remaining(_claimed(now - 9, None), now=now) == 0  # a claim from before leases
    assert lease_remaining(_claimed(now + 60, 5), now=now) == 5  # a fast clock: never more than the lease
    free = _claimed(now, 5)
    free.status = "committed"
    assert lease_remaining(free, now=now) == 0
