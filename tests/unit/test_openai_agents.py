"""``runledger.integrations.openai_agents`` on the in-memory ledger, with the shop agent of
tests/openai_agents_shop.py and its fake Responses API on loopback (the SDK's own model and client over
HTTP): what a run records, a model step's request as complete as the call (the host of a sandboxed
re-run makes the call from it alone), a handoff's callback not run again on resume, the tools a re-run's
host runs, and what is refused. The same agent is SIGKILLed at random moments in
tests/integration/test_openai_agents_resume.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunContextWrapper, WebSearchTool, handoff

from runledger import LedgerClient, VersionMismatchError, load_run
from runledger.integrations.openai_agents import OpenAIAgentsModel, agent_spec, declared_tools
from runledger.log.memory import MemoryLedger
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run
from tests import openai_agents_shop as shop

ASK = "My order o-7 arrived broken."


@pytest.fixture
async def client() -> AsyncIterator[LedgerClient]:
    c = await MemoryLedger().connect()
    yield c
    await c.close()


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[shop.FakeResponses]:
    responses = shop.FakeResponses()
    with responses.serving() as url:
        monkeypatch.setenv("OA_SHOP_URL", url)
        monkeypatch.setenv("OA_SHOP_LOG", str(tmp_path))
        yield responses


async def test_model_calls_tools_effects_and_handoffs_are_steps(
    client: LedgerClient, fake: shop.FakeResponses, tmp_path: Path
) -> None:
    result = await start_run(client, shop.spec(), ASK, run_id="oa-1")
    assert result.status == "completed", result.error
    assert result.output == 'Closed: {"assistant": "closer"}'
    records = (await load_run(client, "oa-1")).records
    cp = fold(records)
    assert [(cp.steps[s].kind, cp.steps[s].name) for s in sorted(cp.steps)] == [
        ("model", "fake-support"), ("tool", "lookup_order"), ("model", "fake-support"), ("effect", "refund"),
        ("model", "fake-support"), ("tool", "transfer_to_closer"), ("model", "fake-closer"),
    ]  # fmt: skip
    assert cp.committed_keys == ["refund:o-7"]
    assert (tmp_path / "tools.log").read_text().splitlines() == ["lookup o-7 - -", "refund o-7 30.0 refund:o-7"]
    first = next(r.event.payload for r in records if r.event.type == "model.called")
    assert first["request"]["messages"][0] == {"role": "system", "content": shop.SUPPORT}
    tools = {t["name"]: t for t in first["request"]["params"]["tools"]}
    assert sorted(tools) == ["lookup_order", "refund", "transfer_to_closer"]
    assert tools["transfer_to_closer"]["handoff"] == "closer"
    assert first["response"]["tool_calls"][0]["function"]["name"] == "lookup_order"  # for the readers
    assert cp.steps[5].output == {"agent": "closer"}, cp.steps[5]


async def test_the_adapter_makes_the_call_from_the_recorded_request_alone(
    client: LedgerClient, fake: shop.FakeResponses
) -> None:
    """What the host of a sandboxed re-run does: no agent, no SDK objects, the step's request only."""
    await start_run(client, shop.spec(), ASK, run_id="oa-host")
    steps = [r.event.payload for r in (await load_run(client, "oa-host")).records if r.event.type == "model.called"]
    sent = list(fake.bodies)
    adapter = OpenAIAgentsModel(shop.provider, model="fake-support")
    for step, body in zip(steps, sent, strict=True):
        response = await adapter.complete(step["request"]["messages"], **step["request"]["params"])
        again = fake.bodies[-1]
        assert {**again, "model": body["model"]} == body, "the recorded request is not the whole call"
        assert response.server is not None and response.server.address == "127.0.0.1", response.server
        assert response.model_dump(exclude={"response_id", "model_finish_reason", "server"}) == {
            k: v for k, v in step["response"].items() if k not in ("response_id", "usage")
        } | {"input_tokens": 20, "output_tokens": 5}


def killable(on_handoff: Any = None) -> tuple[Agent[Any], Agent[Any], list[bool]]:
    """The shop's agent (and its closer) whose process dies (``Killed``) once its handoff is recorded, before
    the closer's model call, while the returned flag is set; ``on_handoff`` is the handoff's callback."""
    armed = [True]

    def closing(ctx: RunContextWrapper[Any], agent: Agent[Any]) -> str:
        if armed[0]:
            raise shop.Killed("killed after the handoff")
        return shop.CLOSER

    closer = Agent(name="closer", instructions=closing, model="fake-closer")
    to_closer = handoff(closer, on_handoff=on_handoff)
    support = Agent(name="support", instructions=shop.SUPPORT, model="fake-support",
                    tools=[shop.lookup_order, shop.refund], handoffs=[to_closer])  # fmt: skip
    return support, closer, armed


def killable_spec(agent: Agent[Any], closer: Agent[Any]) -> Any:
    return agent_spec(agent, effects={"refund": shop.REFUND}, agent_version="shop-v1", agents=[closer],
                      model=OpenAIAgentsModel(shop.provider, model="fake-support"))  # fmt: skip


async def test_a_resumed_handoff_hands_off_without_running_its_callback_again(
    client: LedgerClient, fake: shop.FakeResponses
) -> None:
    called: list[str] = []
    agent, closer, armed = killable(lambda ctx: called.append("closer"))
    with pytest.raises(shop.Killed):
        await start_run(client, killable_spec(agent, closer), ASK, run_id="oa-handoff")
    assert called == ["closer"] and len(fake.requests) == 3
    armed[0] = False
    result = await resume_run(client, killable_spec(agent, closer), "oa-handoff")
    assert result.status == "completed", result.error
    assert result.output == 'Closed: {"assistant": "closer"}'
    assert called == ["closer"], "the handoff's callback ran again on resume"
    assert len(fake.requests) == 4, "a recorded model call was made again"


async def test_a_resume_with_other_instructions_is_a_version_change(
    client: LedgerClient, fake: shop.FakeResponses
) -> None:
    agent, closer, armed = killable()
    with pytest.raises(shop.Killed):
        await start_run(client, killable_spec(agent, closer), ASK, run_id="oa-v")
    armed[0] = False
    edited = agent.clone(instructions=shop.SUPPORT + " Be brief.")
    with pytest.raises(VersionMismatchError):
        await resume_run(client, killable_spec(edited, closer), "oa-v")


async def test_a_custom_handoff_to_an_agent_a_resume_cannot_find_is_refused(client: LedgerClient) -> None:
    agent = killable()[0]
    result = await start_run(client, agent_spec(agent, agent_version="v1"), ASK, run_id="oa-unknown")
    assert result.status == "failed" and "agents=[...]" in (result.error or ""), result.error


async def test_declared_tools_run_the_agents_functions_for_a_reruns_host(tmp_path: Path, fake: Any) -> None:
    tools = {t.name: t for t in declared_tools(shop.build(), {"refund": shop.REFUND})}
    assert sorted(tools) == ["lookup_order", "refund", "transfer_to_closer"]
    assert tools["refund"].effect_class == "irreversible" and tools["lookup_order"].effect_class == "read"
    assert (await tools["lookup_order"].fn({"order": "o-9"}))["order"] == "o-9"
    assert await tools["transfer_to_closer"].fn({}) == {"agent": "closer"}


async def test_what_is_not_recorded_is_refused_before_anything_runs(client: LedgerClient) -> None:
    hosted = Agent(name="searcher", instructions="Search.", model="fake", tools=[WebSearchTool()])
    result = await start_run(client, agent_spec(hosted, agent_version="v1"), "find it", run_id="oa-hosted")
    assert result.status == "failed" and "hosted tool" in (result.error or ""), result.error
