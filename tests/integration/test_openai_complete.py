"""``runledger.integrations.openai`` beyond ``create``: what a 429 costs the turns budget, what
``runledger show`` prints for a turn that only asks for tools, and the rest of the SDK's surface
(``parse``, ``stream()``, ``with_options``, ``with_raw_response``, embeddings, models), each
recorded, resumed without a request (the local server's request log is the witness) and handed
to the agent as the SDK's own objects; what is not recorded says so by name.

The server and its wire formats are ``test_openai_sdk``'s.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runledger import AgentSpec, Budgets, Run
from runledger.cli import main
from runledger.integrations.openai import OpenAIModel, recorded
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import start_run
from tests.integration.test_openai_sdk import (
    CALL_A,
    CALL_B,
    QUICK,
    TOOLS,
    Answer,
    Server,
    completion,
    model_steps,
    sdk_client,
)
from tests.integration.test_openai_sdk import server as server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
LIMITED = {"error": {"message": "slow down", "type": "rate_limit"}}


async def test_a_rate_limited_attempt_that_is_retried_is_no_turn(client: LedgerClient, server: Server) -> None:
    """A budget of one turn, a 429 then a 200: the retry is made (the 429 is not a turn), the run
    completes with one turn spent, and both attempts are on the record."""
    server.script = [Answer(429, LIMITED), Answer(body=completion("ok"))]

    async def agent(run: Run) -> Any:
        async with sdk_client(server) as sdk:
            reply = await recorded(sdk, run).chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "x"}]
            )
        return reply.choices[0].message.content

    spec = AgentSpec(
        "openai-turns", agent, OpenAIModel(model="gpt-test", retry=QUICK), agent_version="v1", budgets=Budgets(turns=1)
    )
    result = await start_run(client, spec, run_id="oa-turns")
    assert result.status == "completed" and result.output == "ok", result
    assert len(server.requests) == 2
    cp = fold((await load_run(client, "oa-turns")).records)
    assert cp.spent["turns"] == 1 and cp.spent["tokens"] == 18
    assert [(a["attempt"], a["will_retry"]) for a in await model_steps(client, "oa-turns")] == [(1, True), (2, False)]


async def test_show_prints_the_tool_calls_of_a_turn_that_only_asks_for_tools(
    client: LedgerClient, server: Server, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No content, two tool calls, and a server that gave no finish reason: the step records
    ``tool_calls`` (not ``stop``), and ``show`` prints each call's name and arguments."""
    body = completion(None, [CALL_A, CALL_B])
    body["choices"][0]["finish_reason"] = None
    server.script = [Answer(body=body)]

    async def agent(run: Run) -> Any:
        async with sdk_client(server) as sdk:
            reply = await recorded(sdk, run).chat.completions.create(
                model="gpt-test", messages=[{"role": "user", "content": "orders?"}], tools=TOOLS
            )
        return [tc.id for tc in reply.choices[0].message.tool_calls or []]

    spec = AgentSpec("openai-show", agent, OpenAIModel(model="gpt-test", retry=QUICK), agent_version="v1")
    assert (await start_run(client, spec, run_id="oa-show")).output == ["call_a", "call_b"]
    (step,) = await model_steps(client, "oa-show")
    assert step["response"]["finish_reason"] == "tool_calls"
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["show", "oa-show", "--nats", nats_url]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "model.called" in line]
    assert '→ lookup({"order": "o-1"}), lookup({"order": "o-2"})' in line, line
