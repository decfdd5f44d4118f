"""The effect protocol's write path (runledger.sdk.run ``effect``, runledger.sdk.effects): an effect
returns once its key holds the outcome, and the outcome's mirror onto the run lands before anything
else the run writes. A run whose mirror failed writes nothing more and claims no other key; a resume
completes the step from the key. The run and the key record the same sealed content."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runledger import AgentSpec, FencedError, Run, ScriptedModel
from runledger.errors import PublishError
from runledger.log.client import LedgerClient, connect
from runledger.log.reader import decode_records, read_raw
from runledger.log.subjects import effect_filter
from runledger.ops.verify import verify_runs
from runledger.protect.loading import load_run
from runledger.record.events import Event
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.models import ModelResponse
from runledger.sdk.run import RecordedRun

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
AGENT = "effects-agent"
REPLY = ModelResponse(content="ok")


def spec_of(fn: Any) -> AgentSpec:
    return AgentSpec(AGENT, fn, ScriptedModel(lambda messages: REPLY), agent_version="v1")


async def key_events(client: LedgerClient, key: str) -> list[Event]:
    good, bad = decode_records(await read_raw(client, effect_filter(AGENT, key)))
    assert bad == []
    return [r.event for r in good]


async def run_types(client: LedgerClient, run_id: str) -> list[str]:
    return [r.event.type for r in (await load_run(client, run_id, open_content=False)).records]


async def test_the_outcome_lands_on_the_run_before_its_next_event_and_by_commit(
    client: LedgerClient, nats_url: str
) -> None:
    seen: dict[str, Any] = {}
    client_url = nats_url

    async def agent(run: Run) -> Any:
        assert isinstance(run, RecordedRun)
        writer = run._writer
        append = writer.append

        async def slow_mirror(body: Any, *args: Any) -> Any:  # an acknowledgement that takes its time
            if body.TYPE == "effect.committed":
                writer.append = append  # type: ignore[method-assign]
                await asyncio.sleep(0.3)
            return await append(body, *args)

        writer.append = slow_mirror  # type: ignore[method-assign]
        first = await run.effect("charge", {"n": 1}, key="charge:1", fn=lambda a: {"charged": a["n"]})
        await run.commit()  # the outcome is on the run's subject once this returns, for every reader
        async with await connect(client_url) as reader:
            seen["after_commit"] = await run_types(reader, run.run_id)
        # Back to back, and in parallel with a tool: the mirrors keep the run's append order.
        second = await run.effect("charge", {"n": 2}, key="charge:2", fn=lambda a: {"charged": a["n"]})
        await run.model([{"role": "user", "content": "next"}])
        both = await asyncio.gather(
            run.effect("charge", {"n": 3}, key="charge:3", fn=lambda a: {"charged": a["n"]}),
            run.tool("read", {"q": 1}, fn=lambda a: a),
            run.effect("charge", {"n": 4}, key="charge:4", fn=lambda a: {"charged": a["n"]}),
        )
        return [first, second, *both]

    result = await start_run(client, spec_of(agent), run_id="mirror-order")
    assert result.status == "completed", result.error
    assert result.output == [{"charged": 1}, {"charged": 2}, {"charged": 3}, {"q": 1}, {"charged": 4}]
    assert seen["after_commit"] == ["run.started", "effect.intended", "effect.committed"]
    types = await run_types(client, "mirror-order")
    assert types[:6] == ["run.started", "effect.intended", "effect.committed", "effect.intended",
                         "effect.committed", "model.called"]  # fmt: skip
    assert types[-1] == "run.completed" and types.count("effect.committed") == 4
    cp = fold((await load_run(client, "mirror-order")).records)
    assert sorted(cp.committed_keys) == ["charge:1", "charge:2", "charge:3", "charge:4"]
    assert all(cp.steps[s].status == "committed" for s in (0, 1, 3, 5))
    assert [(v.run_id, v.ok) for v in await verify_runs(client, "mirror-order", deep=True)] == [("mirror-order", True)]


async def test_the_run_and_the_key_record_the_same_sealed_content(client: LedgerClient) -> None:
    async def agent(run: Run) -> Any:
        return await run.effect("refund", {"order": "o-1", "amount": 9.5}, key="refund:o-1",
                                fn=lambda a: {"refund_id": "rf-1", "amount": a["amount"]})  # fmt: skip

    result = await start_run(client, spec_of(agent), run_id="same-seal")
    assert result.status == "completed", result.error
    sealed = [r.event for r in (await load_run(client, "same-seal", open_content=False)).records]
    claim, outcome = await key_events(client, "refund:o-1")
    intent, committed = sealed[1], sealed[2]
    assert intent.payload["args"]["$enc"] == "A256GCM"  # sealed, not in the clear
    assert intent.payload["args"] == claim.payload["args"]
    assert committed.payload["result"] == outcome.payload["result"]
    opened = fold((await load_run(client, "same-seal")).records)
    assert opened.steps[0].output == {"refund_id": "rf-1", "amount": 9.5}
    # A resume replays the step from the run's own record.
    again = await resume_run(client, spec_of(agent), "same-seal")
    assert again.nothing_to_do and again.output == {"refund_id": "rf-1", "amount": 9.5}


async def test_a_run_that_lost_its_subject_before_the_mirror_claims_nothing_more_and_the_resume_completes_the_step(
    client: LedgerClient,
) -> None:
    """Another process resumes the run between the key's outcome and its mirror (a holder that was
    paused there) and completes it after that step. The holder's mirror is fenced; its next effect
    raises FencedError before claiming its key. The resume took the outcome from the key: the
    function ran once."""
    calls: list[str] = []

    def charge(args: Any) -> dict[str, Any]:
        calls.append(args["key"])
        return {"charged": args["key"]}

    async def only_a(run: Run) -> Any:
        return [await run.effect("charge", {"key": "a"}, key="lost:a", fn=charge)]

    resumed: list[Any] = []

    async def holder(run: Run) -> Any:
        assert isinstance(run, RecordedRun)
        write_key = run._append_key

        async def then_resumed_elsewhere(state: Any, body: Any) -> Any:
            written = await write_key(state, body)
            resumed.append(await resume_run(client, spec_of(only_a), run.run_id))
            return written

        run._append_key = then_resumed_elsewhere  # type: ignore[method-assign]
        first = await run.effect("charge", {"key": "a"}, key="lost:a", fn=charge)
        return [first, await run.effect("charge", {"key": "b"}, key="lost:b", fn=charge)]

    with pytest.raises(FencedError):
        await start_run(client, spec_of(holder), run_id="lost-run")
    assert resumed[0].status == "completed" and resumed[0].output == [{"charged": "a"}]
    assert calls == ["a"]
    assert await key_events(client, "lost:b") == []  # the holder claimed nothing once its run was gone
    records = (await load_run(client, "lost-run")).records
    cp = fold(records)
    assert cp.status == "completed" and cp.committed_keys == ["lost:a"]
    mirrors = [r.event.payload["via"] for r in records if r.event.type == "effect.committed"]
    assert mirrors == ["record"]  # step 0's one mirror: the resume's, from the key
    assert [v.ok for v in await verify_runs(client, "lost-run")] == [True]


async def test_a_mirror_that_cannot_be_stored_stops_the_run_before_anything_else_is_written(
    client: LedgerClient,
) -> None:
    """The server stays unreachable for the outcome's mirror (PublishError), then answers again:
    the run still writes nothing after the missing mirror (its next step raises the failure), so the
    run shows the effect as the crash rows of docs/wire.md do, and a resume completes it."""
    model_calls: list[int] = []

    async def agent(run: Run) -> Any:
        if isinstance(run, RecordedRun) and not run.replaying and not model_calls:
            writer = run._writer
            append = writer.append

            async def refuse_the_mirror(body: Any, *args: Any) -> Any:
                if body.TYPE == "effect.committed":
                    writer.append = append  # type: ignore[method-assign]
                    raise PublishError(writer.subject, "test", "no acknowledgement after 3 attempts (timeout)")
                return await append(body, *args)

            writer.append = refuse_the_mirror  # type: ignore[method-assign]
        charged = await run.effect("charge", {"n": 1}, key="unmirrored:1", fn=lambda a: {"charged": a["n"]})
        model_calls.append(1)
        await run.model([{"role": "user", "content": "after"}])
        return charged

    with pytest.raises(PublishError, match="no acknowledgement"):
        await start_run(client, spec_of(agent), run_id="unmirrored")
    assert await run_types(client, "unmirrored") == ["run.started", "effect.intended"]
    assert [e.type for e in await key_events(client, "unmirrored:1")] == ["effect.intended", "effect.committed"]
    result = await resume_run(client, spec_of(agent), "unmirrored")
    assert result.status == "completed" and result.output == {"charged": 1}
    types = await run_types(client, "unmirrored")
    assert types[2:5] == ["run.resumed", "effect.committed", "model.called"], types
