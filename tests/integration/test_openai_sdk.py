"""``runledger.integrations.openai``: the official SDK, async (``AsyncOpenAI`` in async agent code)
and blocking (``OpenAI`` in a ``sync_agent``), against a real HTTP server on loopback that speaks the
chat-completions and responses wire formats (JSON and SSE), with a real nats-server.

The server's request log is the witness for how many calls were made; the agent's own list of what
it received is the witness that a resume hands it equal objects.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest

from runledger import AgentSpec, ConfigurationError, Run, SyncRun, sync_agent
from runledger.integrations.openai import OpenAIModel, SyncRecordedStream, recorded
from runledger.log.client import LedgerClient
from runledger.log.server import ServerState
from runledger.ops.decisions import approve
from runledger.protect.loading import load_run
from runledger.sdk.agent import AgentFn
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.retry import Retry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
QUICK = Retry(attempts=3, backoff_s=0.01, max_backoff_s=0.02, deadline_s=20)
API_KEY = "sk-rltest-3f9a1c77e0b24d5a8c6e"  # planted: it must reach no stored byte
CALL_A = {"id": "call_a", "type": "function", "function": {"name": "lookup", "arguments": '{"order": "o-1"}'}}
CALL_B = {"id": "call_b", "type": "function", "function": {"name": "lookup", "arguments": '{"order": "o-2"}'}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def completion(content: str | None = "done", tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "gpt-test",
        "system_fingerprint": "fp_1",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }  # fmt: skip


def response(text: str = "hello", calls: list[dict[str, Any]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    output: list[dict[str, Any]] = [
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": text, "annotations": []}]}
    ] + [{"type": "function_call", "id": f"fc_{c['id']}", "call_id": c["id"], "name": c["function"]["name"],
          "arguments": c["function"]["arguments"], "status": "completed"} for c in calls]  # fmt: skip
    return {
        "id": "resp_1", "object": "response", "created_at": 1700000000, "model": "gpt-test", "status": "completed",
        "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "usage": {"input_tokens": 9, "output_tokens": 4, "total_tokens": 13,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
    }  # fmt: skip


def chat_sse(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks a server streams for ``body``: text in pieces, tool calls in pieces, then usage."""
    head = {k: body[k] for k in ("id", "created", "model", "system_fingerprint")} | {"object": "chat.completion.chunk"}
    message = body["choices"][0]["message"]
    chunks = [head | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    text = message.get("content") or ""
    for i in range(0, len(text), 3):
        chunks.append(head | {"choices": [{"index": 0, "delta": {"content": text[i : i + 3]}}]})
    for n, tc in enumerate(message.get("tool_calls") or []):
        args = tc["function"]["arguments"]
        first = {
            "index": n,
            "id": tc["id"],
            "type": "function",
            "function": {"name": tc["function"]["name"], "arguments": ""},
        }
        chunks.append(head | {"choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
        for i in range(0, len(args), 5):
            piece = {"index": n, "function": {"arguments": args[i : i + 5]}}
            chunks.append(head | {"choices": [{"index": 0, "delta": {"tool_calls": [piece]}}]})
    chunks.append(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": body["choices"][0]["finish_reason"]}]})
    chunks.append(head | {"choices": [], "usage": body["usage"]})
    return chunks


def responses_sse(body: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": body | {"status": "in_progress", "output": []}}
    ]
    for n, item in enumerate(body["output"]):
        events.append({"type": "response.output_item.added", "output_index": n, "item": item})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            for i in range(0, len(text), 2):
                events.append({"type": "response.output_text.delta", "item_id": item["id"], "output_index": n,
                               "content_index": 0, "delta": text[i : i + 2], "logprobs": []})  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": n, "item": item})
    events.append({"type": "response.completed", "response": body})
    return [e | {"sequence_number": i} for i, e in enumerate(events)]


@dataclass
class Answer:
    """A status and a JSON body, or an SSE stream; ``hold_after``: stop the stream after that many
    events until the test sets ``Server.release`` (at most 10 s; whether it came is in ``Server.held``)."""

    status: int = 200
    body: Any = None
    sse: list[dict[str, Any]] | None = None
    hold_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Server:
    url: str = ""
    script: list[Answer] = field(default_factory=list)
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    held: list[bool] = field(default_factory=list)


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # models
            self.answer({})

        def do_POST(self) -> None:
            self.answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

        def answer(self, body: dict[str, Any]) -> None:
            state.requests.append((self.path, body))
            state.keys.append(self.headers.get("Authorization", ""))
            answer = state.script.pop(0)
            if answer.sse is not None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for n, event in enumerate(answer.sse):
                    if n == answer.hold_after:
                        state.held.append(state.release.wait(10))
                    name = f"event: {event['type']}\n" if "type" in event else ""
                    self.wfile.write(f"{name}data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                if self.path.endswith("/chat/completions"):
                    self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True
                return
            data = json.dumps(answer.body).encode()
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()


def sdk_client(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=API_KEY, base_url=server.url)


async def drive(
    client: LedgerClient, server: Server, run_id: str, body: Any, seen: list[Any]
) -> tuple[AgentSpec, list[Any]]:
    """Start a run of ``body(run, oa)`` (then an approval), approve it, resume it: return the spec and
    what the agent received live; ``seen`` then holds what it received on resume."""

    async def agent(run: Run) -> Any:
        async with sdk_client(server) as sdk:
            await body(run, recorded(sdk, run))
        await run.approval("go-on")
        return "ok"

    return await drive_agent(client, server, run_id, agent, seen)


async def drive_sync(
    client: LedgerClient, server: Server, run_id: str, body: Callable[[SyncRun, Any], None], seen: list[Any]
) -> tuple[AgentSpec, list[Any]]:
    """``drive`` for blocking agent code: ``body(run, oa)`` runs in a ``sync_agent`` with the blocking
    ``openai.OpenAI`` client, recorded through the agent's ``SyncRun``."""

    def agent(run: SyncRun) -> Any:
        with openai.OpenAI(api_key=API_KEY, base_url=server.url) as sdk:
            body(run, recorded(sdk, run))
        run.approval("go-on")
        return "ok"

    return await drive_agent(client, server, run_id, sync_agent(agent), seen)


async def drive_agent(
    client: LedgerClient, server: Server, run_id: str, agent: AgentFn, seen: list[Any]
) -> tuple[AgentSpec, list[Any]]:
    spec = AgentSpec("openai-sdk", agent, OpenAIModel(model="gpt-test", retry=QUICK), agent_version="v1")
    first = await start_run(client, spec, run_id=run_id)
    assert first.status == "suspended", first
    live = list(seen)
    calls = len(server.requests)
    await approve(client, run_id, first.pending[0], by="op")
    seen.clear()
    done = await resume_run(client, spec, run_id)
    assert done.status == "completed", done
    assert len(server.requests) == calls, "the resume called the API again"
    assert seen == live, "the resume handed the agent other objects than the live calls did"
    return spec, live


async def model_steps(client: LedgerClient, run_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in (await load_run(client, run_id)).events if e.type == "model.called"]


async def test_chat_and_responses_calls_are_steps_and_resume_as_equal_objects(
    client: LedgerClient, server: Server
) -> None:
    server.script = [Answer(body=completion(None, [CALL_A, CALL_B])), Answer(body=response("hi", [CALL_A]))]
    seen: list[Any] = []

    async def body(run: Run, oa: Any) -> None:
        chat = await oa.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "orders?"}], tools=TOOLS, parallel_tool_calls=True
        )
        seen.append(chat)
        resp = await oa.responses.create(model="gpt-test", input="say hi", instructions="be brief")
        seen.append(resp)

    _, live = await drive(client, server, "oa-sdk-1", body, seen)
    chat, resp = live
    assert isinstance(chat, openai.types.chat.ChatCompletion) and chat.id == "chatcmpl-1"
    assert [tc.id for tc in chat.choices[0].message.tool_calls or []] == ["call_a", "call_b"]
    assert isinstance(resp, openai.types.responses.Response) and resp.output_text == "hi"
    assert [path for path, _ in server.requests] == ["/v1/chat/completions", "/v1/responses"]
    assert server.requests[0][1]["tools"] == TOOLS and server.requests[1][1]["instructions"] == "be brief"

    steps = await model_steps(client, "oa-sdk-1")
    assert [s["model"] for s in steps] == ["gpt-test", "gpt-test"]
    assert steps[0]["request"]["messages"] == [{"role": "user", "content": "orders?"}]
    assert steps[0]["request"]["params"]["parallel_tool_calls"] is True
    assert steps[0]["response"]["tool_calls"] == [CALL_A, CALL_B]
    assert steps[0]["response"]["finish_reason"] == "tool_calls"
    assert (steps[0]["usage"]["input_tokens"], steps[0]["usage"]["output_tokens"]) == (11, 7)
    assert steps[1]["request"]["params"]["endpoint"] == "/responses"
    assert steps[1]["response"]["content"] == "hi" and steps[1]["response"]["tool_calls"] == [CALL_A]
    assert (steps[1]["usage"]["input_tokens"], steps[1]["usage"]["output_tokens"]) == (9, 4)


async def test_streams_pass_through_live_and_are_synthesised_on_resume(client: LedgerClient, server: Server) -> None:
    chat_body = completion("streamed text here", [CALL_A, CALL_B])
    resp_body = response("streamed reply")
    server.script = [Answer(sse=chat_sse(chat_body)), Answer(sse=responses_sse(resp_body))]
    seen: list[Any] = []

    async def body(run: Run, oa: Any) -> None:
        stream = await oa.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "go"}], tools=TOOLS, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        async with stream:
            seen.append(accumulate_chat([chunk async for chunk in stream]))
        final = None
        async for event in await oa.responses.create(model="gpt-test", input="go", stream=True):
            if event.type == "response.completed":
                final = event.response
        seen.append(final)

    _, live = await drive(client, server, "oa-sdk-stream", body, seen)
    assert live[0] == (
        "streamed text here",
        {0: {"id": "call_a", "args": '{"order": "o-1"}'}, 1: {"id": "call_b", "args": '{"order": "o-2"}'}},
        "tool_calls",
        7,
    )
    assert live[1].output_text == "streamed reply" and live[1].id == "resp_1"
    steps = await model_steps(client, "oa-sdk-stream")
    assert steps[0]["response"]["content"] == "streamed text here"
    assert steps[0]["response"]["tool_calls"] == [CALL_A, CALL_B]
    assert steps[0]["request"]["params"]["stream"] is True
    assert steps[1]["response"]["content"] == "streamed reply" and steps[1]["usage"]["output_tokens"] == 4


async def test_a_rate_limit_is_retried_with_every_attempt_recorded(client: LedgerClient, server: Server) -> None:
    limited = {"error": {"message": "slow down", "type": "rate_limit"}}
    server.script = [Answer(429, limited), Answer(body=completion("ok"))]
    seen: list[Any] = []

    async def body(run: Run, oa: Any) -> None:
        seen.append(await oa.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "x"}]))

    await drive(client, server, "oa-sdk-429", body, seen)
    assert len(server.requests) == 2, "the SDK's own retries must be off: runledger retries, recorded"
    attempts = await model_steps(client, "oa-sdk-429")
    assert [(a["attempt"], a["will_retry"]) for a in attempts] == [(1, True), (2, False)]
    assert attempts[0]["error"]["retryable"] is True and "HTTP 429" in attempts[0]["error"]["message"]
    assert attempts[1]["error"] is None and attempts[1]["response"]["content"] == "ok"


async def test_the_api_key_reaches_no_stored_byte(
    client: LedgerClient, server: Server, nats_server: ServerState
) -> None:
    server.script = [Answer(body=completion("fine")), Answer(sse=chat_sse(completion("also fine")))]
    seen: list[Any] = []

    async def body(run: Run, oa: Any) -> None:
        seen.append(await oa.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "x"}],
            extra_headers={"X-Api-Key": API_KEY}))  # fmt: skip
        text = ""
        async for chunk in await oa.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "y"}], stream=True
        ):
            text += "".join(choice.delta.content or "" for choice in chunk.choices)
        seen.append(text)

    await drive(client, server, "oa-sdk-key", body, seen)
    assert server.keys == [f"Bearer {API_KEY}"] * 2, "the server did not see the key: the test proves nothing"
    opened = json.dumps([e.payload for e in (await load_run(client, "oa-sdk-key")).events], default=str)
    assert "chatcmpl-1" in opened and API_KEY not in opened
    needle = API_KEY.encode()
    for path in Path(nats_server.data_dir).rglob("*"):
        if path.is_file():
            assert needle not in path.read_bytes(), f"the API key is stored in {path}"


# -- the blocking client (openai.OpenAI) in a sync_agent -------------------------------------------------


async def test_blocking_chat_and_responses_calls_are_steps_and_resume_as_equal_objects(
    client: LedgerClient, server: Server, nats_server: ServerState
) -> None:
    server.script = [Answer(body=completion(None, [CALL_A, CALL_B])), Answer(body=response("hi", [CALL_A]))]
    seen: list[Any] = []

    def body(run: SyncRun, oa: Any) -> None:
        chat = oa.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "orders?"}], tools=TOOLS, parallel_tool_calls=True
        )
        seen.append(chat)
        for call in chat.choices[0].message.tool_calls:  # the parallel calls, run as tool steps
            seen.append(run.tool("lookup", json.loads(call.function.arguments), fn=lambda a: {"found": a["order"]}))
        seen.append(oa.responses.create(model="gpt-test", input="say hi", instructions="be brief"))

    _, live = await drive_sync(client, server, "oa-sync-1", body, seen)
    chat, found_1, found_2, resp = live
    assert isinstance(chat, openai.types.chat.ChatCompletion) and chat.id == "chatcmpl-1"
    assert [tc.id for tc in chat.choices[0].message.tool_calls or []] == ["call_a", "call_b"]
    assert (found_1, found_2) == ({"found": "o-1"}, {"found": "o-2"})
    assert isinstance(resp, openai.types.responses.Response) and resp.output_text == "hi"
    assert [path for path, _ in server.requests] == ["/v1/chat/completions", "/v1/responses"]
    assert server.requests[0][1]["tools"] == TOOLS and server.requests[1][1]["instructions"] == "be brief"
    assert server.keys == [f"Bearer {API_KEY}"] * 2

    events = (await load_run(client, "oa-sync-1")).events
    assert [e.type for e in events if e.type in ("model.called", "tool.called")] == [
        "model.called", "tool.called", "tool.called", "model.called"
    ]  # fmt: skip
    steps = await model_steps(client, "oa-sync-1")
    assert steps[0]["request"]["messages"] == [{"role": "user", "content": "orders?"}]
    assert steps[0]["request"]["params"] == {
        "endpoint": "/chat/completions", "model": "gpt-test", "tools": TOOLS, "parallel_tool_calls": True
    }  # fmt: skip
    assert steps[0]["response"]["tool_calls"] == [CALL_A, CALL_B]
    assert (steps[0]["usage"]["input_tokens"], steps[0]["usage"]["output_tokens"]) == (11, 7)
    assert steps[1]["request"]["messages"] == [{"role": "user", "content": "say hi"}]
    assert steps[1]["response"]["content"] == "hi" and steps[1]["response"]["tool_calls"] == [CALL_A]
    assert (steps[1]["usage"]["input_tokens"], steps[1]["usage"]["output_tokens"]) == (9, 4)
    assert API_KEY not in json.dumps([e.payload for e in events], default=str)
    for path in Path(nats_server.data_dir).rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), f"the API key is stored in {path}"


def accumulate_chat(stream: Any) -> tuple[str, dict[int, dict[str, str]], str | None, int | None]:
    """What ordinary code makes of a chat stream: the text, the tool calls, the finish reason, the usage."""
    text, calls, finish, usage = "", {}, None, None
    for chunk in stream:
        assert isinstance(chunk, openai.types.chat.ChatCompletionChunk)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "args": ""})
                slot["id"] = tc.id or slot["id"]
                slot["args"] += (tc.function.arguments if tc.function else None) or ""
    return text, calls, finish, usage.completion_tokens if usage else None


async def test_blocking_streams_pass_through_live_and_are_synthesised_on_resume(
    client: LedgerClient, server: Server
) -> None:
    """Live, the first chunks reach the agent while the server still holds the rest of the stream
    (it waits for the agent to say it has them): the stream passes through, it is not replayed from a
    buffer at the end. The step is recorded when the stream ends; a resume synthesises both streams."""
    chat_body = completion("streamed text here", [CALL_A, CALL_B])
    resp_body = response("streamed reply")
    server.script = [Answer(sse=chat_sse(chat_body), hold_after=2), Answer(sse=responses_sse(resp_body))]
    seen: list[Any] = []
    first_chunks: list[Any] = []

    def body(run: SyncRun, oa: Any) -> None:
        stream = oa.chat.completions.create(
            model="gpt-test", messages=[{"role": "user", "content": "go"}], tools=TOOLS, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        assert isinstance(stream, SyncRecordedStream)

        def chunks() -> Iterator[Any]:
            for n, chunk in enumerate(stream):
                if n == 0:
                    first_chunks.append(chunk)
                    server.release.set()  # live: the server sends the rest only now
                yield chunk

        with stream:
            seen.append(accumulate_chat(chunks()))
        final = None
        for event in oa.responses.create(model="gpt-test", input="go", stream=True):
            if event.type == "response.completed":
                final = event.response
        seen.append(final)

    _, live = await drive_sync(client, server, "oa-sync-stream", body, seen)
    assert server.held == [True], "the server was never told the first chunks had arrived: no pass-through"
    assert live[0] == (
        "streamed text here",
        {0: {"id": "call_a", "args": '{"order": "o-1"}'}, 1: {"id": "call_b", "args": '{"order": "o-2"}'}},
        "tool_calls",
        7,
    )
    assert live[1].output_text == "streamed reply" and live[1].id == "resp_1"
    steps = await model_steps(client, "oa-sync-stream")
    assert [s["request"]["params"]["stream"] for s in steps] == [True, True]
    assert steps[0]["response"]["content"] == "streamed text here"
    assert steps[0]["response"]["tool_calls"] == [CALL_A, CALL_B]
    assert steps[0]["usage"]["output_tokens"] == 7
    assert steps[1]["response"]["content"] == "streamed reply" and steps[1]["usage"]["output_tokens"] == 4


async def test_blocking_calls_retry_a_rate_limit_with_every_attempt_recorded(
    client: LedgerClient, server: Server
) -> None:
    """A 429 before a completion and a 429 before a stream: each retried once by runledger (the
    SDK's own retries are off), the failed attempt recorded, the caller none the wiser."""
    limited = {"error": {"message": "slow down", "type": "rate_limit"}}
    server.script = [
        Answer(429, limited), Answer(body=completion("ok")),
        Answer(429, limited), Answer(sse=chat_sse(completion("streamed ok"))),
    ]  # fmt: skip
    seen: list[Any] = []

    def body(run: SyncRun, oa: Any) -> None:
        seen.append(oa.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "x"}]))
        stream = oa.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "y"}], stream=True)
        seen.append(accumulate_chat(stream)[0])

    _, live = await drive_sync(client, server, "oa-sync-429", body, seen)
    assert live[0].choices[0].message.content == "ok" and live[1] == "streamed ok"
    assert len(server.requests) == 4, "the SDK's own retries must be off: runledger retries, recorded"
    attempts = await model_steps(client, "oa-sync-429")
    assert [(a["step"], a["attempt"], a["will_retry"]) for a in attempts] == [(0, 1, True), (0, 2, False),
                                                                             (1, 1, True), (1, 2, False)]  # fmt: skip
    assert all(a["error"]["retryable"] and "HTTP 429" in a["error"]["message"] for a in attempts[::2])
    assert [a["response"]["content"] for a in attempts[1::2]] == ["ok", "streamed ok"]


async def test_a_blocking_stream_that_fails_raises_from_create_and_the_run_fails(
    client: LedgerClient, server: Server
) -> None:
    """No stream ever began (a 400: final): the blocking ``create`` raises the step's failure, as the
    SDK raises its error from ``create``, and the failure is the step's on the record."""
    server.script = [Answer(400, {"error": {"message": "bad request", "type": "invalid_request_error"}})]
    raised: list[BaseException] = []

    def agent(run: SyncRun) -> Any:
        with openai.OpenAI(api_key=API_KEY, base_url=server.url) as sdk:
            try:
                recorded(sdk, run).chat.completions.create(model="gpt-test", messages=[], stream=True)
            except Exception as exc:
                raised.append(exc)
                raise

    spec = AgentSpec("openai-sdk", sync_agent(agent), OpenAIModel(model="gpt-test", retry=QUICK), agent_version="v1")
    result = await start_run(client, spec, run_id="oa-sync-400")
    assert result.status == "failed" and len(server.requests) == 1
    assert [type(e).__name__ for e in raised] == ["ToolFailedError"] and "HTTP 400" in str(raised[0])
    (attempt,) = await model_steps(client, "oa-sync-400")
    assert attempt["error"]["retryable"] is False and "HTTP 400" in attempt["error"]["message"]


async def test_a_client_and_a_run_that_do_not_go_together_are_refused(client: LedgerClient, server: Server) -> None:
    refusals: list[str] = []

    async def agent(run: Run) -> Any:
        with openai.OpenAI(api_key=API_KEY, base_url=server.url) as blocking:
            with pytest.raises(ConfigurationError, match="SyncRun of a sync_agent") as info:
                recorded(blocking, run)  # type: ignore[call-overload]
            refusals.append(str(info.value))
        return "ok"

    def blocking_agent(run: SyncRun) -> Any:
        with pytest.raises(ConfigurationError, match=r"recorded\(openai.OpenAI\(\), run\)") as info:
            recorded(sdk_client(server), run)  # type: ignore[call-overload]
        refusals.append(str(info.value))
        with pytest.raises(ConfigurationError, match="not str"):
            recorded("sk-not-a-client", run)  # type: ignore[call-overload]
        return "ok"

    model = OpenAIModel(model="gpt-test")
    assert (await start_run(client, AgentSpec("a", agent, model), run_id="oa-mix-1")).status == "completed"
    assert (
        await start_run(client, AgentSpec("b", sync_agent(blocking_agent), model), run_id="oa-mix-2")
    ).output == "ok"
    assert len(refusals) == 2 and server.requests == []


@pytest.mark.parametrize("mode", [[], ["--sync"]], ids=["async", "blocking"])
async def test_the_example_records_its_answer_and_resumes_from_the_record(
    client: LedgerClient,
    server: Server,
    nats_url: str,
    mode: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from runledger.examples.openai_sdk.agent import main

    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    server.script = [Answer(body=completion("An idempotency key names a request."))]
    args = ["--nats", nats_url, "--run", "ex-1", "--base-url", server.url, "--model", "gpt-test", *mode]
    await asyncio.to_thread(main, [*args, "What is an idempotency key?"])  # the example runs its own loop
    assert capsys.readouterr().out == "completed An idempotency key names a request.\n"
    await asyncio.to_thread(main, [*args, "--resume"])
    assert capsys.readouterr().out == "completed An idempotency key names a request.\n"
    assert len(server.requests) == 1 and server.keys == [f"Bearer {API_KEY}"]
    (step,) = await model_steps(client, "ex-1")
    assert step["request"]["messages"] == [{"role": "user", "content": "What is an idempotency key?"}]


@pytest.mark.parametrize("blocking", [False, True], ids=["async-client", "blocking-client"])
async def test_openai_model_alone_answers_run_model_through_either_client(
    client: LedgerClient, server: Server, blocking: bool
) -> None:
    """No wrapper: ``run.model(messages)`` is a chat completion made with the adapter's client (the
    blocking one in a worker thread), a 429 retried by runledger, and a resume answers from the record."""
    server.script = [Answer(429, {"error": {"message": "slow down"}}), Answer(body=completion(None, [CALL_A]))]
    seen: list[Any] = []

    async def agent(run: Run) -> Any:
        seen.append((await run.model([{"role": "user", "content": "order?"}], tools=TOOLS)).model_dump())
        await run.approval("go-on")
        return "ok"

    sdk: openai.OpenAI | openai.AsyncOpenAI = (
        openai.OpenAI(api_key=API_KEY, base_url=server.url) if blocking else sdk_client(server)
    )
    spec = AgentSpec("openai-direct", agent, OpenAIModel(sdk, model="gpt-test", retry=QUICK), agent_version="v1")
    first = await start_run(client, spec, run_id="oa-direct")
    assert first.status == "suspended", first
    live = list(seen)
    await approve(client, "oa-direct", first.pending[0], by="op")
    seen.clear()
    assert (await resume_run(client, spec, "oa-direct")).status == "completed"
    assert seen == live and len(server.requests) == 2 and server.keys == [f"Bearer {API_KEY}"] * 2
    assert live[0]["tool_calls"] == [CALL_A] and live[0]["sdk"]["id"] == "chatcmpl-1"
    assert server.requests[1] == ("/v1/chat/completions", {
        "model": "gpt-test", "messages": [{"role": "user", "content": "order?"}], "tools": TOOLS
    })  # fmt: skip
    attempts = await model_steps(client, "oa-direct")
    assert [(a["attempt"], a["will_retry"]) for a in attempts] == [(1, True), (2, False)]


@pytest.mark.parametrize("verbose", [[], ["-v"]], ids=["quiet", "verbose"])
def test_the_cli_shows_httpx_request_lines_only_when_asked(
    server: Server, nats_url: str, verbose: list[str], tmp_path: Path
) -> None:
    """`runledger run` of an agent on the OpenAI SDK: the user sees the run's outcome, not the HTTP
    client's INFO lines about each request (``-v`` brings them back)."""
    server.script = [Answer(body=completion("quiet answer"))]
    env = {**os.environ, "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": API_KEY, "OPENAI_MODEL": "gpt-test",
           "RUNLEDGER_HOME": str(tmp_path / "home")}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "runledger", *verbose, "run", "--nats", nats_url,
         "--agent", "runledger.examples.openai_sdk.agent:env_spec", "--input", '"What is a key?"'],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "quiet answer" in done.stdout and len(server.requests) == 1
    assert ("HTTP Request:" in done.stderr) == bool(verbose), done.stderr
