"""Effects carry their context into the world: what the effect and key functions receive, the
lease a claim holds, and what settling a claim whose lease still runs does (waits, or is forced)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

import pytest

from runledger import NOT_FOUND, AgentSpec, EffectContext, FencedError, Run, ScriptedModel
from runledger.log.client import LedgerClient
from runledger.log.publish import RetryPolicy
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import effect_filter
from runledger.protect.loading import load_run
from runledger.record.events import EffectCommitted, Event
from runledger.record.fold import fold
from runledger.sdk.effects import append_to_key, lease_remaining, read_key, resolve_key
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.run import RecordedRun

pytestmark = pytest.mark.integration


class Vanished(BaseException):
    """Raised inside an effect function: the process is gone between the claim and the outcome
    (no ``except Exception`` of the SDK catches it, so nothing more is recorded)."""


def spec_of(fn: Any) -> AgentSpec:
    return AgentSpec("ctx-agent", fn, ScriptedModel([]), agent_version="v1")


async def key_events(client: LedgerClient, key: str) -> list[tuple[int, Event]]:
    good, bad = decode_records(await read_raw(client, effect_filter("ctx-agent", key)))
    assert bad == []
    return [(r.stream_seq, r.event) for r in good]


def ts(event: Event) -> float:
    return dt.datetime.fromisoformat(event.ts.replace("Z", "+00:00")).timestamp()


async def test_the_effect_function_and_the_key_function_receive_the_context(client: LedgerClient) -> None:
    seen: dict[str, Any] = {}

    def charge(args: dict[str, Any], ctx: EffectContext) -> dict[str, Any]:
        seen["ctx"], seen["ambient"] = ctx, EffectContext.current()
        return {"charged": args["amount"], "key": ctx.key}

    async def notify(args: Any, *, context: EffectContext) -> str:  # async, keyword-only, found by annotation
        seen["notify"] = context
        return "sent"

    async def agent(run: Run) -> Any:
        await run.tool("read", 1, fn=lambda a: a)
        assert isinstance(run, RecordedRun)
        key = run._effect_key(lambda a, ctx: f"charge:{a['order']}:{ctx.run_id}", {"order": "o1"}, tool_call_id="c-7")
        seen["key_ctx"] = run._effect_key(lambda a, ctx: f"{ctx.key!r}/{ctx.step}/{ctx.attempt}", None)
        seen["one_arg_key"] = run._effect_key(lambda a: f"k:{a}", 5)
        charged = await run.effect(
            "charge", {"order": "o1", "amount": 5}, key=key, fn=charge, tool_call_id="c-7", lease_s=12
        )
        told = await run.effect("notify", "hi", key=f"notify:{run.run_id}", fn=notify)
        plain = await run.effect("plain", [1, 2], key=f"plain:{run.run_id}", fn=lambda a: sum(a))
        return {"charged": charged, "told": told, "plain": plain}

    result = await start_run(client, spec_of(agent), run_id="ctx-1")
    assert result.status == "completed", result.error
    assert result.output == {"charged": {"charged": 5, "key": "charge:o1:ctx-1"}, "told": "sent", "plain": 3}
    assert seen["key_ctx"] == "''/1/0" and seen["one_arg_key"] == "k:5"  # before any claim: no key, attempt 0

    ctx = seen["ctx"]
    ((claim_seq, claim), (_, outcome)) = await key_events(client, "charge:o1:ctx-1")
    assert (ctx.key, ctx.run_id, ctx.step, ctx.attempt) == ("charge:o1:ctx-1", "ctx-1", 1, 1)
    assert ctx.tool_call_id == "c-7" and ctx.lease_s == 12
    assert ctx.fencing_token == claim_seq  # the stream sequence of this attempt's claim on the key
    assert seen["ambient"] == ctx and EffectContext.current() is None  # bound only while it runs
    assert claim.payload["lease_s"] == 12 and claim.payload["tool_call_id"] == "c-7"
    assert outcome.type == "effect.committed" and outcome.payload["fencing_token"] == claim_seq
    assert seen["notify"].step == 2 and seen["notify"].attempt == 1 and seen["notify"].lease_s == 30.0

    cp = fold((await load_run(client, "ctx-1")).records)
    assert cp.steps[1].status == "committed" and sorted(cp.committed_keys) == [
        "charge:o1:ctx-1",
        "notify:ctx-1",
        "plain:ctx-1",
    ]


async def test_after_the_lease_a_resume_claims_a_new_attempt_with_a_new_fencing_token(
    client: LedgerClient, caplog: pytest.LogCaptureFixture
) -> None:
    contexts: list[EffectContext] = []
    lease = 1.5

    def pay(args: Any, ctx: EffectContext) -> dict[str, Any]:
        contexts.append(ctx)
        if len(contexts) == 1:
            raise Vanished  # the first holder never records an outcome
        return {"paid": args}

    async def agent(run: Run) -> Any:
        return await run.effect(
            "pay", 7, key="pay:inv-1", fn=pay, reconcile=lambda key: NOT_FOUND, lease_s=lease, tool_call_id="t1"
        )

    spec = spec_of(agent)
    with pytest.raises(Vanished):
        await start_run(client, spec, run_id="lease-1")
    state = await read_key(client, "pay:inv-1")
    assert state.status == "claimed" and state.attempt == 1 and 0 < lease_remaining(state) <= lease

    caplog.set_level(logging.INFO, logger="runledger")
    result = await resume_run(client, spec, "lease-1")
    assert result.status == "completed" and result.output == {"paid": 7}

    first, second = contexts
    events = await key_events(client, "pay:inv-1")
    assert [e.type for _, e in events] == ["effect.intended", "effect.resolved", "effect.intended", "effect.committed"]
    (seq1, claim1), (_, resolved), (seq2, claim2), (_, committed) = events
    assert claim2.payload["lease_s"] == lease and claim2.payload["tool_call_id"] == "t1"
    assert (first.attempt, first.fencing_token) == (1, seq1)
    assert (second.attempt, second.fencing_token) == (2, seq2) and seq2 > seq1
    assert (second.key, second.run_id, second.step, second.tool_call_id) == ("pay:inv-1", "lease-1", 0, "t1")
    assert committed.payload["fencing_token"] == seq2
    # Nothing was settled before the first claim's lease had expired, and the wait was reported.
    assert ts(resolved) >= ts(claim1) + lease
    assert resolved.payload["by"] == "reconcile" and resolved.payload["forced"] is False
    assert any("holds its lease" in r.getMessage() and "pay:inv-1" in r.getMessage() for r in caplog.records)

    # The first attempt's holder, had it survived, can record nothing: its claim is fenced out.
    run_state = await read_key(client, "pay:inv-1")
    assert run_state.attempt == 2 and run_state.fencing_token == seq2
    with pytest.raises(FencedError):
        await append_to_key(
            client, state, EffectCommitted(step=0, key="pay:inv-1", fencing_token=seq1),
            run_id="lease-1", agent="ctx-agent", policy=RetryPolicy(),
        )  # fmt: skip


async def test_resolving_a_claim_whose_lease_runs_waits_or_is_forced(client: LedgerClient) -> None:
    def vanish(args: Any) -> Any:
        raise Vanished

    async def agent(run: Run) -> Any:
        await run.effect("a", 1, key="a:1", fn=vanish, lease_s=1.5)

    async def agent_b(run: Run) -> Any:
        await run.effect("b", 1, key="b:1", fn=vanish, lease_s=600)

    for fn, run_id in ((agent, "resolve-wait"), (agent_b, "resolve-force")):
        with pytest.raises(Vanished):
            await start_run(client, spec_of(fn), run_id=run_id)

    told: list[tuple[float, bool]] = []
    started = time.monotonic()
    state = await resolve_key(
        client, "a:1", committed=False, by="alice", on_lease=lambda s, claim, forced: told.append((s, forced))
    )
    waited = time.monotonic() - started
    assert state.status == "free" and len(told) == 1 and told[0][1] is False
    assert waited >= told[0][0] - 0.05  # it waited out what was left of the lease
    (_, claim), (_, resolved) = await key_events(client, "a:1")
    assert ts(resolved) >= ts(claim) + 1.5 and resolved.payload["forced"] is False

    told.clear()
    started = time.monotonic()
    state = await resolve_key(
        client, "b:1", committed=True, by="bob", result={"ok": 1}, force=True,
        on_lease=lambda s, claim, forced: told.append((s, forced)),
    )  # fmt: skip
    assert time.monotonic() - started < 30 and state.status == "committed"
    assert told and told[0][1] is True and told[0][0] > 500
    (_, _), (_, resolved) = await key_events(client, "b:1")
    assert resolved.payload["forced"] is True and resolved.payload["by"] == "bob"
