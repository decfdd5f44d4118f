"""An effect function checks its claim before it acts (``EffectContext.check`` / ``acheck``) against
a real server: a takeover within the lease seen by the ledger, a lease that ran out with nobody
taking over (the attempt is recorded as failed, the key stays free), the blocking check from a
worker thread and on the event loop, and what a check costs."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import pytest

from runledger import (
    AgentSpec,
    ClaimTakenOverError,
    ConfigurationError,
    EffectContext,
    FencedError,
    Run,
    ScriptedModel,
)
from runledger.log.client import LedgerClient
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import effect_filter
from runledger.sdk.effects import read_key, resolve_key
from runledger.sdk.lifecycle import start_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
AGENT = "check-agent"


def spec_of(fn: Any) -> AgentSpec:
    return AgentSpec(AGENT, fn, ScriptedModel([]), agent_version="v1")


async def key_types(client: LedgerClient, key: str) -> list[str]:
    good, bad = decode_records(await read_raw(client, effect_filter(AGENT, key)))
    assert bad == []
    return [r.event.type for r in good]


async def test_the_ledger_check_sees_a_takeover_within_the_lease_that_the_clock_cannot(client: LedgerClient) -> None:
    seen: dict[str, Any] = {}

    async def pay(args: Any, ctx: EffectContext) -> str:
        # An operator forces the key while this attempt still holds its lease (30 s).
        await resolve_key(client, ctx.key, committed=False, by="ops", reason="test", force=True, agent=AGENT)
        ctx.check()  # the clock says nothing: the lease still runs
        try:
            await ctx.acheck(ledger=True)
        except ClaimTakenOverError as exc:
            seen["error"] = exc
            raise
        seen["paid"] = True  # never reached
        return "paid"

    async def agent(run: Run) -> Any:
        return await run.effect("pay", {"order": "o1"}, key="pay:o1", fn=pay, lease_s=30)

    with pytest.raises(FencedError):  # the failed attempt's record is fenced out: the key moved on
        await start_run(client, spec_of(agent), run_id="taken-1")
    error = seen["error"]
    assert "paid" not in seen
    assert (error.key, error.run_id, error.step, error.attempt) == ("pay:o1", "taken-1", 0, 1)
    assert error.last_seq > error.fencing_token
    assert "must not act" in str(error) and "runledger effects show pay:o1" in str(error)
    assert await key_types(client, "pay:o1") == ["effect.intended", "effect.resolved"]


async def test_a_lease_run_out_with_nobody_taking_over_fails_the_attempt_and_frees_the_key(
    client: LedgerClient,
) -> None:
    calls: list[str] = []

    async def slow_pay(args: Any, ctx: EffectContext) -> str:
        await asyncio.sleep(0.5)  # longer than its lease: a pause, a swap, a slow dependency
        ctx.check()
        calls.append(ctx.key)
        return "paid"

    async def agent(run: Run) -> Any:
        return await run.effect("pay", {"order": "o2"}, key="pay:o2", fn=slow_pay, lease_s=0.3)

    result = await start_run(client, spec_of(agent), run_id="expired-1")
    assert calls == [] and result.status == "failed"
    assert "LeaseExpiredError" in (result.error or "") and "ran out" in (result.error or "")
    assert await key_types(client, "pay:o2") == ["effect.intended", "effect.failed"]
    assert (await read_key(client, "pay:o2", AGENT)).status == "failed"  # free: the next attempt may claim it

    async def fast_pay(args: Any, ctx: EffectContext) -> str:
        ctx.check()
        calls.append(ctx.key)
        return "paid"

    async def again(run: Run) -> Any:
        return await run.effect("pay", {"order": "o2"}, key="pay:o2", fn=fast_pay, lease_s=5)

    result = await start_run(client, spec_of(again), run_id="expired-2")
    assert result.status == "completed" and calls == ["pay:o2"]


async def test_the_blocking_check_asks_the_ledger_from_a_thread_and_refuses_on_the_loop(client: LedgerClient) -> None:
    seen: dict[str, Any] = {}

    def blocking_pay(ctx: EffectContext) -> str:  # blocking code, handed to a worker thread
        ctx.check(ledger=True)
        return "paid"

    async def pay(args: Any, ctx: EffectContext) -> str:
        return await asyncio.to_thread(blocking_pay, ctx)

    def on_the_loop(args: Any, ctx: EffectContext) -> str:  # a sync effect function runs on the loop
        try:
            ctx.check(ledger=True)
        except ConfigurationError as exc:
            seen["error"] = str(exc)
        ctx.check()  # the clock alone works anywhere
        return "paid"

    async def agent(run: Run) -> Any:
        first = await run.effect("pay", 1, key="pay:o3", fn=pay)
        second = await run.effect("pay", 2, key="pay:o4", fn=on_the_loop)
        return [first, second]

    result = await start_run(client, spec_of(agent), run_id="threads-1")
    assert result.status == "completed" and result.output == ["paid", "paid"]
    assert "acheck(ledger=True)" in seen["error"] and "asyncio.to_thread" in seen["error"]


async def test_what_a_check_costs(client: LedgerClient) -> None:
    """The clock check is a clock read and a comparison; the ledger check one direct get."""
    costs: dict[str, list[float]] = {"clock": [], "ledger": []}

    async def measure(args: Any, ctx: EffectContext) -> str:
        for _ in range(2000):
            started = time.perf_counter()
            ctx.check()
            costs["clock"].append(time.perf_counter() - started)
        for _ in range(300):
            started = time.perf_counter()
            await ctx.acheck(ledger=True)
            costs["ledger"].append(time.perf_counter() - started)
        return "measured"

    async def agent(run: Run) -> Any:
        return await run.effect("measure", None, key="measure:1", fn=measure, lease_s=60)

    result = await start_run(client, spec_of(agent), run_id="cost-1")
    assert result.status == "completed"
    clock_us = statistics.median(costs["clock"]) * 1e6
    ledger_ms = statistics.median(costs["ledger"]) * 1e3
    ledger_p99 = statistics.quantiles(costs["ledger"], n=100)[98] * 1e3
    print(f"ctx.check(): p50 {clock_us:.2f} us; await ctx.acheck(ledger=True): p50 {ledger_ms:.3f} ms, "
          f"p99 {ledger_p99:.3f} ms")  # fmt: skip
    assert clock_us < 50  # loose bounds for a loaded 2-core machine: the point is the order of magnitude
    assert ledger_ms < 20
