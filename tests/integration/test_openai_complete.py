"""``runledger.integrations.openai`` beyond ``create``: what a 429 costs the turns budget, what
``runledger show`` prints for a turn that only asks for tools, and the rest of the SDK's surface
(``parse``, ``stream()``, ``with_options``, ``with_raw_response``, embeddings, models), each
recorded, resumed without a request (the local server's request log is the witness) and handed
to the agent as the SDK's own objects; what is not recorded says so by name.

The server and its wire formats are ``test_openai_sdk``'s.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from runledger import AgentSpec, Budgets, Run, SyncRun
from runledger.cli import main
from runledger.integrations.openai import NotRecordedError, OpenAIModel, RecordedRawResponse, recorded
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import start_run
from tests.integration.processes import runledger
from tests.integration.test_openai_sdk import (
    API_KEY,
    CALL_A,
    CALL_B,
    QUICK,
    TOOLS,
    Answer,
    Server,
    chat_sse,
    completion,
    drive,
    drive_sync,
    model_steps,
    response,
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


# -- the rest of the SDK's surface ----------------------------------------------------------------------


class Refund(BaseModel):
    order: str
    amount: float


REFUND = '{"order": "o-1", "amount": 12.5}'
VECTOR = [0.5, -1.0, 2.25]  # exact in float32: the SDK asks for base64 and decodes it
MODEL = {"id": "gpt-test", "object": "model", "created": 1700000000, "owned_by": "test-lab"}
PATHS = ["/v1/chat/completions"] * 4 + ["/v1/embeddings", "/v1/models", "/v1/models/gpt-test"]


def surface_script() -> list[Answer]:
    """What the server answers to ``use_the_surface``'s calls, in order."""
    packed = base64.b64encode(struct.pack("<3f", *VECTOR)).decode()
    embeddings = {
        "object": "list", "model": "text-emb", "usage": {"prompt_tokens": 4, "total_tokens": 4},
        "data": [{"object": "embedding", "index": i, "embedding": packed} for i in range(2)],
    }  # fmt: skip
    raw_headers = {"x-request-id": "req_7", "x-ratelimit-remaining-requests": "99", "set-cookie": "session=s3cr3t"}
    return [
        Answer(body=completion(REFUND)),  # parse
        Answer(sse=chat_sse(completion(REFUND))),  # stream()
        Answer(body=completion("raw"), headers=raw_headers),  # with_raw_response
        Answer(body=completion("with options")),  # with_options
        Answer(body=embeddings),
        Answer(body={"object": "list", "data": [MODEL]}),  # models.list
        Answer(body=MODEL),  # models.retrieve
    ]


MESSAGES = [{"role": "user", "content": "refund?"}]


async def use_the_surface(oa: Any, seen: list[Any]) -> None:
    """Each recorded method once, with the async client; ``seen``: what the agent makes of each."""
    parsed = await oa.chat.completions.parse(model="gpt-test", messages=MESSAGES, response_format=Refund)
    seen.append(parsed.choices[0].message.parsed)
    manager = oa.chat.completions.stream(
        model="gpt-test", messages=MESSAGES, response_format=Refund, stream_options={"include_usage": True}
    )
    async with manager as stream:
        done = [event async for event in stream if event.type == "content.done"]
        final = await stream.get_final_completion()
    seen.append((done[0].parsed, final.choices[0].message.parsed, final.usage.completion_tokens))
    raw = await oa.chat.completions.with_raw_response.create(model="gpt-test", messages=MESSAGES)
    assert isinstance(raw, RecordedRawResponse)
    seen.append((raw.parse().choices[0].message.content, raw.request_id, raw.status_code, dict(raw.headers)))
    tuned = oa.with_options(timeout=30, max_retries=5)
    seen.append((await tuned.chat.completions.create(model="gpt-test", messages=MESSAGES)).choices[0].message.content)
    embedded = await oa.embeddings.create(model="text-emb", input=["a", "b"])
    seen.append([d.embedding for d in embedded.data])
    seen.append([m.id async for m in oa.models.list()])
    seen.append((await oa.models.retrieve("gpt-test")).owned_by)


def use_the_surface_blocking(oa: Any, seen: list[Any]) -> None:
    """``use_the_surface`` with the blocking client."""
    parsed = oa.chat.completions.parse(model="gpt-test", messages=MESSAGES, response_format=Refund)
    seen.append(parsed.choices[0].message.parsed)
    manager = oa.chat.completions.stream(
        model="gpt-test", messages=MESSAGES, response_format=Refund, stream_options={"include_usage": True}
    )
    with manager as stream:
        done = [event for event in stream if event.type == "content.done"]
        final = stream.get_final_completion()
    seen.append((done[0].parsed, final.choices[0].message.parsed, final.usage.completion_tokens))
    raw = oa.with_raw_response.chat.completions.create(model="gpt-test", messages=MESSAGES)
    seen.append((raw.parse().choices[0].message.content, raw.request_id, raw.status_code, dict(raw.headers)))
    tuned = oa.copy(timeout=30, max_retries=5)
    seen.append(tuned.chat.completions.create(model="gpt-test", messages=MESSAGES).choices[0].message.content)
    seen.append([d.embedding for d in oa.embeddings.create(model="text-emb", input=["a", "b"]).data])
    seen.append([m.id for m in oa.models.list()])
    seen.append(oa.models.retrieve("gpt-test").owned_by)


def expected() -> list[Any]:
    refund = Refund(order="o-1", amount=12.5)
    kept = {"x-request-id": "req_7", "x-ratelimit-remaining-requests": "99", "content-type": "application/json"}
    return [
        refund, (refund, refund, 7), ("raw", "req_7", 200, kept), "with options", [VECTOR, VECTOR], ["gpt-test"],
        "test-lab",
    ]  # fmt: skip


async def check_the_record(client: LedgerClient, server: Server, run_id: str) -> None:
    assert [path for path, _ in server.requests] == PATHS, "each method made its request exactly once"
    sent_format = server.requests[0][1]["response_format"]
    assert sent_format["type"] == "json_schema" and sent_format["json_schema"]["name"] == "Refund"
    assert server.requests[4][1]["encoding_format"] == "base64"  # the SDK's own choice, decoded by it
    steps = await model_steps(client, run_id)
    assert [s["request"]["params"]["endpoint"] for s in steps] == ["/chat/completions"] * 4 + ["/embeddings"]
    assert steps[0]["request"]["params"]["response_format"] == sent_format
    assert steps[1]["request"]["params"]["stream"] is True and steps[1]["response"]["content"] == REFUND
    http = steps[2]["response"]["http"]
    assert http["status"] == 200 and http["headers"]["x-request-id"] == "req_7"
    assert "set-cookie" not in http["headers"] and "s3cr3t" not in json.dumps(steps)
    assert all("http" not in s["response"] for s in steps[:2] + steps[3:])  # only with_raw_response keeps it
    assert steps[4]["request"]["messages"] == [{"role": "user", "content": ["a", "b"]}]
    assert steps[4]["usage"]["input_tokens"] == 4 and steps[4]["response"]["sdk"]["data"][1]["embedding"] == VECTOR
    events = (await load_run(client, run_id)).events
    tools = [e.payload for e in events if e.type == "tool.called"]
    assert [t["name"] for t in tools] == ["openai.models.list", "openai.models.retrieve"]
    assert tools[1]["args"] == {"model": "gpt-test"} and tools[1]["output"]["owned_by"] == "test-lab"
    cp = fold((await load_run(client, run_id)).records)
    assert cp.spent["turns"] == 5 and cp.spent["tokens"] == 4 * 18 + 4


async def test_parse_stream_raw_options_embeddings_and_models_are_recorded_and_resumed_as_the_sdk_s_objects(
    client: LedgerClient, server: Server
) -> None:
    server.script = surface_script()
    seen: list[Any] = []

    async def body(run: Run, oa: Any) -> None:
        await use_the_surface(oa, seen)

    _, live = await drive(client, server, "oa-surface", body, seen)
    assert live == expected()
    assert isinstance(live[0], Refund)
    await check_the_record(client, server, "oa-surface")


async def test_the_blocking_client_records_the_same_surface(client: LedgerClient, server: Server) -> None:
    server.script = surface_script()
    seen: list[Any] = []

    def body(run: SyncRun, oa: Any) -> None:
        use_the_surface_blocking(oa, seen)

    _, live = await drive_sync(client, server, "oa-sync-surface", body, seen)
    assert live == expected()
    await check_the_record(client, server, "oa-sync-surface")


def killed_spec() -> AgentSpec:
    """The agent ``test_a_run_killed_midway_resumes_without_repeating_a_request`` runs in a process
    of its own: the surface once, with the SDK configured from the environment."""

    async def agent(run: Run) -> Any:
        seen: list[Any] = []
        async with openai.AsyncOpenAI() as sdk:  # OPENAI_BASE_URL, OPENAI_API_KEY
            await use_the_surface(recorded(sdk, run), seen)
        return json.loads(json.dumps(seen, default=lambda o: o.model_dump()))

    return AgentSpec("openai-surface", agent, OpenAIModel(model="gpt-test", retry=QUICK), agent_version="v1")


@pytest.mark.timeout(120)
async def test_a_run_killed_midway_resumes_without_repeating_a_request(
    client: LedgerClient, server: Server, nats_url: str
) -> None:
    """SIGKILLed right after its fourth step (parse, stream, raw, with_options) was recorded, the
    run is resumed by another process: those four are served from the record, the three after
    are made live, and the server saw each request once."""
    server.script = surface_script()
    env = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": API_KEY}
    agent = "tests.integration.test_openai_complete:killed_spec"
    crashed = await asyncio.to_thread(
        runledger, nats_url, "run", "--agent", agent, "--run-id", "oa-killed", "--input", "null",
        env={**env, "RUNLEDGER_CRASH_AT": "step:3:recorded"},
    )  # fmt: skip
    assert crashed.returncode == -9, crashed.stderr
    assert [path for path, _ in server.requests] == PATHS[:4]
    done = await asyncio.to_thread(runledger, nats_url, "resume", "oa-killed", "--agent", agent, env=env)
    assert done.returncode == 0 and "completed" in done.stdout, done.stderr
    cp = fold((await load_run(client, "oa-killed")).records)
    assert cp.status == "completed" and cp.output == json.loads(
        json.dumps(expected(), default=lambda o: o.model_dump())
    )
    await check_the_record(client, server, "oa-killed")


async def test_what_is_not_recorded_says_so_by_name(
    client: LedgerClient, server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Each part of the SDK the wrapper does not record raises ``NotRecordedError`` naming it (an
    ``AttributeError`` too); the SDK's own retries asked of ``with_options`` are refused aloud."""
    refused: list[str] = []

    async def agent(run: Run) -> Any:
        async with sdk_client(server) as sdk:
            oa = recorded(sdk, run)
            for reach in (
                lambda: oa.beta, lambda: oa.files, lambda: oa.audio, lambda: oa.with_streaming_response,
                lambda: oa.chat.completions.messages, lambda: oa.responses.stream, lambda: oa.models.delete,
                lambda: oa.with_options(timeout=5).images, lambda: oa.with_raw_response.files,
                lambda: oa.models.with_raw_response,
            ):  # fmt: skip
                with pytest.raises(NotRecordedError) as info:
                    reach()
                assert isinstance(info.value, AttributeError) and "record it yourself as a step" in str(info.value)
                refused.append(str(info.value).split(" is not recorded")[0])
            assert not hasattr(oa, "beta") and getattr(oa.chat, "moderations", None) is None
            with pytest.raises(NotRecordedError, match="with_raw_response with stream=True"):
                await oa.chat.completions.with_raw_response.create(model="gpt-test", messages=[], stream=True)
            tuned = oa.with_options(max_retries=5, timeout=9)
            assert tuned._client.max_retries == 0 and tuned._client.timeout == 9
        return "ok"

    spec = AgentSpec("openai-uncovered", agent, OpenAIModel(model="gpt-test"), agent_version="v1")
    assert (await start_run(client, spec, run_id="oa-uncovered")).status == "completed"
    assert refused == [
        "AsyncOpenAI.beta", "AsyncOpenAI.files", "AsyncOpenAI.audio", "AsyncOpenAI.with_streaming_response",
        "AsyncOpenAI.chat.completions.messages", "AsyncOpenAI.responses.stream", "AsyncOpenAI.models.delete",
        "AsyncOpenAI.images", "AsyncOpenAI.with_raw_response.files", "AsyncOpenAI.models.with_raw_response",
    ]  # fmt: skip
    assert server.requests == []
    assert any("with_options(max_retries=5) on a recorded client is ignored" in r.message for r in caplog.records)


async def test_a_rate_limited_models_read_is_retried_with_each_attempt_recorded(
    client: LedgerClient, server: Server
) -> None:
    """The SDK's own retries are off: runledger retries a models read (``DEFAULT_RETRY``), each
    attempt a ``tool.called`` of the step; a resume reads neither again."""
    server.script = [Answer(429, LIMITED), Answer(body={"object": "list", "data": [MODEL]})]
    seen: list[Any] = []

    async def body(run: Run, oa: Any) -> None:
        seen.append([m.id for m in (await oa.models.list()).data])

    _, live = await drive(client, server, "oa-models-429", body, seen)
    assert live == [["gpt-test"]] and len(server.requests) == 2
    attempts = [e.payload for e in (await load_run(client, "oa-models-429")).events if e.type == "tool.called"]
    assert [(a["step"], a["attempt"], a["will_retry"]) for a in attempts] == [(0, 1, True), (0, 2, False)]
    assert attempts[0]["error"]["retryable"] and "HTTP 429" in attempts[0]["error"]["message"]


async def test_responses_parse_is_recorded_and_resumed_as_a_parsed_response(
    client: LedgerClient, server: Server
) -> None:
    """``responses.parse`` with a ``text_format`` and a pydantic function tool: recorded as the
    ``responses.create`` the SDK would send (``text.format`` the schema, the tool converted), and
    ``output_parsed`` / ``parsed_arguments`` are the pydantic objects, live and on resume."""
    call = {
        "id": "call_r",
        "type": "function",
        "function": {"name": "refund", "arguments": '{"order": "o-2", "amount": 3.0}'},
    }
    server.script = [Answer(body=response(REFUND, [call]))]
    seen: list[Any] = []

    async def body(run: Run, oa: Any) -> None:
        parsed = await oa.responses.parse(
            model="gpt-test",
            input="refund?",
            text_format=Refund,
            tools=[openai.pydantic_function_tool(Refund, name="refund")],
        )
        seen.append((parsed.output_parsed, parsed.output[1].parsed_arguments))

    _, live = await drive(client, server, "oa-responses-parse", body, seen)
    assert live == [(Refund(order="o-1", amount=12.5), Refund(order="o-2", amount=3.0))]
    sent = server.requests[0][1]
    assert sent["text"]["format"]["type"] == "json_schema" and sent["text"]["format"]["name"] == "Refund"
    assert sent["tools"][0]["name"] == "refund" and sent["tools"][0]["strict"] is True
    (step,) = await model_steps(client, "oa-responses-parse")
    assert step["request"]["params"]["endpoint"] == "/responses"
    assert step["request"]["params"]["text"] == sent["text"] and step["request"]["params"]["tools"] == sent["tools"]
