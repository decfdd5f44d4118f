"""``OpenAIChatModel`` (the ``openai`` package underneath) against a real HTTP server on loopback
that misbehaves on purpose: what the README promises ("retries HTTP 429, 5xx and timeouts by default
... each attempt is recorded"), a reply that is not JSON or not a chat completion (a clear, final
failure), a body cut short, a reply with ``tool_calls`` that drives real tool steps and replays
identically, and the key: read where and when each call is made, sent, never recorded.

The server's own request log is the witness for how many calls were made.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from runledger import AgentSpec, ModelResponse, OpenAIChatModel, Run
from runledger.log.client import LedgerClient
from runledger.ops.decisions import approve
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import resume_run, start_run
from runledger.sdk.retry import NO_RETRY, Retry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
QUICK = Retry(attempts=3, backoff_s=0.01, max_backoff_s=0.02, deadline_s=20)


def completion(content: str | None = "done", **message: Any) -> dict[str, Any]:
    return {
        "choices": [{"message": {"role": "assistant", "content": content, **message},
                     "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }  # fmt: skip


@dataclass
class Answer:
    """One scripted reply: a status and a JSON body, or raw bytes, after an optional delay.
    ``short_by``: announce that many more bytes than are sent, then close (a body cut short)."""

    status: int = 200
    body: Any = field(default_factory=completion)
    raw: bytes | None = None
    delay_s: float = 0.0
    short_by: int = 0


class Endpoint:
    def __init__(self) -> None:
        self.script: list[Answer] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.closing = threading.Event()


@pytest.fixture
def endpoint() -> Iterator[tuple[str, Endpoint]]:
    state = Endpoint()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            state.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            state.headers.append(dict(self.headers))
            answer = state.script.pop(0) if state.script else Answer()
            if answer.delay_s:
                state.closing.wait(answer.delay_s)
            data = answer.raw if answer.raw is not None else json.dumps(answer.body).encode()
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data) + answer.short_by))
            if answer.short_by:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            if answer.short_by:
                self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", state
    finally:
        state.closing.set()
        server.shutdown()
        server.server_close()


async def ask(run: Run) -> str:
    return (await run.model([{"role": "user", "content": "hi"}])).content


def spec(url: str, retry: Retry | None = QUICK, timeout_s: float = 10.0) -> AgentSpec:
    model = OpenAIChatModel("gpt-test", base_url=url, retry=retry, timeout_s=timeout_s)
    return AgentSpec("openai-agent", ask, model, agent_version="v1")


async def model_attempts(client: LedgerClient, run_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in (await load_run(client, run_id)).events if e.type == "model.called"]


@pytest.mark.parametrize("status", [429, 500, 502, 503])
async def test_a_rate_limit_or_server_error_is_retried_and_each_attempt_recorded(
    client: LedgerClient, endpoint: tuple[str, Endpoint], status: int
) -> None:
    url, server = endpoint
    server.script = [Answer(status, {"error": {"message": f"status {status}"}})]
    result = await start_run(client, spec(url), run_id=f"oa-{status}")
    assert result.status == "completed" and result.output == "done"
    assert len(server.requests) == 2
    attempts = await model_attempts(client, f"oa-{status}")
    assert [(a["attempt"], a["will_retry"]) for a in attempts] == [(1, True), (2, False)]
    assert attempts[0]["error"]["retryable"] is True and f"HTTP {status}" in attempts[0]["error"]["message"]
    assert attempts[1]["error"] is None


async def test_server_errors_past_the_attempts_fail_the_run_retryably(
    client: LedgerClient, endpoint: tuple[str, Endpoint]
) -> None:
    url, server = endpoint
    server.script = [Answer(500, {"error": {}}) for _ in range(3)]
    result = await start_run(client, spec(url), run_id="oa-500x3")
    assert result.status == "failed" and len(server.requests) == QUICK.attempts
    cp = fold((await load_run(client, "oa-500x3")).records)
    assert cp.failure_retryable is True and cp.steps[0].attempts == QUICK.attempts


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (Answer(raw=b'{"choices": [{"message": '), "not JSON"),
        (Answer(raw=b"<html>502 Bad Gateway</html>"), "not JSON"),
        (Answer(body={"object": "list", "data": []}), "unexpected chat-completions response"),
        (Answer(body={"choices": []}), "unexpected chat-completions response"),
        (Answer(body=None), "unexpected chat-completions response"),
    ],
    ids=["truncated-json", "html", "no-choices", "empty-choices", "null"],
)
async def test_a_reply_that_is_not_a_chat_completion_fails_the_step_clearly_and_once(
    client: LedgerClient, endpoint: tuple[str, Endpoint], answer: Answer, says: str
) -> None:
    """A 200 whose body is not a chat completion will not improve on retry: one call, a final
    failure that says what came back, recorded on the step."""
    url, server = endpoint
    server.script = [answer]
    result = await start_run(client, spec(url), run_id="oa-bad")
    assert result.status == "failed" and len(server.requests) == 1
    (attempt,) = await model_attempts(client, "oa-bad")
    assert attempt["error"]["type"] == "ModelError" and says in attempt["error"]["message"], attempt["error"]
    assert attempt["error"]["retryable"] is False
    assert fold((await load_run(client, "oa-bad")).records).failure_retryable is False


async def test_a_body_cut_short_is_retried_like_a_dropped_connection(
    client: LedgerClient, endpoint: tuple[str, Endpoint]
) -> None:
    url, server = endpoint
    server.script = [Answer(short_by=500)]  # announces 500 bytes more than it sends, then hangs up
    result = await start_run(client, spec(url), run_id="oa-short")
    assert result.status == "completed" and result.output == "done" and len(server.requests) == 2
    first = (await model_attempts(client, "oa-short"))[0]["error"]
    assert first["type"] == "ModelError" and first["retryable"] is True, first


async def test_a_timeout_is_retried_and_recorded(client: LedgerClient, endpoint: tuple[str, Endpoint]) -> None:
    url, server = endpoint
    server.script = [Answer(delay_s=5.0)]  # the first answer comes long after the adapter's timeout
    result = await start_run(client, spec(url, timeout_s=0.5), run_id="oa-slow")
    assert result.status == "completed" and result.output == "done" and len(server.requests) == 2
    first = (await model_attempts(client, "oa-slow"))[0]
    assert first["will_retry"] is True and first["error"]["retryable"] is True
    assert "timed out" in first["error"]["message"], first["error"]


async def test_a_timeout_without_retries_fails_the_run_retryably(
    client: LedgerClient, endpoint: tuple[str, Endpoint]
) -> None:
    url, server = endpoint
    server.script = [Answer(delay_s=5.0)]
    result = await start_run(client, spec(url, retry=NO_RETRY, timeout_s=0.5), run_id="oa-slow-once")
    assert result.status == "failed" and len(server.requests) == 1
    assert fold((await load_run(client, "oa-slow-once")).records).failure_retryable is True


LOOKUP_CALL = {
    "id": "call_7",
    "type": "function",
    "function": {"name": "lookup_order", "arguments": json.dumps({"order": "o-1", "fields": ["status", "amount"]})},
}


async def test_tool_calls_drive_tool_steps_and_replay_as_they_were_live(
    client: LedgerClient, endpoint: tuple[str, Endpoint]
) -> None:
    """The model asks for a tool (content null, tool_calls with JSON-string arguments); the agent
    runs it and sends the result back; an approval suspends the run. The resume serves both model
    calls and the tool from the record (the server and the tool see nothing more) and the agent
    receives the same values it received live."""
    url, server = endpoint
    server.script = [Answer(body=completion(None, tool_calls=[LOOKUP_CALL])), Answer(body=completion("refund o-1"))]
    looked_up: list[dict[str, Any]] = []
    seen: list[Any] = []

    def lookup_order(args: dict[str, Any]) -> dict[str, Any]:
        looked_up.append(args)
        return {"order": args["order"], "status": "delivered", "amount": 20.0}

    tools = [{"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}]

    async def agent(run: Run) -> Any:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "refund order o-1?"}]
        first = await run.model(messages, tools=tools)
        seen.append(first.model_dump())
        messages.append({"role": "assistant", "content": first.content or None, "tool_calls": first.tool_calls})
        for call in first.tool_calls:
            args = json.loads(call["function"]["arguments"])
            result = await run.tool(call["function"]["name"], args, fn=lookup_order, tool_call_id=call["id"])
            seen.append(result)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
        final = await run.model(messages, tools=tools)
        seen.append(final.model_dump())
        await run.approval("refund", {"order": "o-1"})
        return final.content

    model = OpenAIChatModel("gpt-test", base_url=url, retry=QUICK)
    agent_spec = AgentSpec("openai-tools", agent, model, agent_version="v1")
    first = await start_run(client, agent_spec, run_id="oa-tools")
    assert first.status == "suspended"
    live = list(seen)
    assert live[0]["tool_calls"] == [LOOKUP_CALL] and live[0]["finish_reason"] == "tool_calls"
    assert live[0]["content"] == ""
    assert looked_up == [{"order": "o-1", "fields": ["status", "amount"]}]
    assert len(server.requests) == 2
    assert server.requests[0]["tools"] == tools
    assert server.requests[1]["messages"][1]["tool_calls"] == [LOOKUP_CALL]
    assert server.requests[1]["messages"][2]["tool_call_id"] == "call_7"

    await approve(client, "oa-tools", first.pending[0], by="op")
    seen.clear()
    done = await resume_run(client, agent_spec, "oa-tools")
    assert done.status == "completed" and done.output == "refund o-1"
    assert seen == live, "the replay gave the agent other values than the live calls did"
    assert len(server.requests) == 2 and len(looked_up) == 1, "a resume called the model or the tool again"
    tool_steps = [e.payload for e in (await load_run(client, "oa-tools")).events if e.type == "tool.called"]
    assert [(p["name"], p["args"]) for p in tool_steps] == [("lookup_order", looked_up[0])]


async def test_the_key_is_read_at_each_call_sent_and_never_recorded(
    client: LedgerClient, endpoint: tuple[str, Endpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key in the environment: no Authorization header at all (a local server needs none, and the
    SDK's own OPENAI_API_KEY is not a fallback, nor are its organization and project variables sent
    to an endpoint that may not be OpenAI's). A key set, then rotated, while the run goes on: each
    call sends the key of its moment. None of them reaches the record."""
    url, server = endpoint
    monkeypatch.delenv("RL_TEST_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-sdk-default-must-not-be-sent")
    monkeypatch.setenv("OPENAI_ORG_ID", "org-not-for-this-endpoint")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-not-for-this-endpoint")
    keys = ["sk-first-0f3a9c2e", "sk-rotated-77d1b4a0"]

    async def agent(run: Run) -> list[str]:
        replies = [await run.model([{"role": "user", "content": "no key"}])]
        for key in keys:
            monkeypatch.setenv("RL_TEST_KEY", key)
            replies.append(await run.model([{"role": "user", "content": "keyed"}]))
        return [r.content for r in replies]

    model = OpenAIChatModel("gpt-test", base_url=url, api_key_env="RL_TEST_KEY", retry=QUICK)
    result = await start_run(client, AgentSpec("keys", agent, model, agent_version="v1"), run_id="oa-keys")
    assert result.status == "completed" and result.output == ["done"] * 3
    assert [h.get("Authorization") for h in server.headers] == [None, f"Bearer {keys[0]}", f"Bearer {keys[1]}"]
    assert not [h for h in server.headers if "not-for-this-endpoint" in json.dumps(h)]
    stored = b"".join(e.to_bytes() for e in (await load_run(client, "oa-keys")).events)
    assert b'"keyed"' in stored, "the record is not readable here: the check below would prove nothing"
    assert b"sk-" not in stored and b"Bearer" not in stored


async def test_parameters_reach_the_endpoint_as_given_provider_specific_ones_included(
    client: LedgerClient, endpoint: tuple[str, Endpoint]
) -> None:
    """The body is the model, the messages and the parameters as the agent passed them, including
    ones the OpenAI API does not define (vLLM's ``top_k``, Ollama's ``options``), and nothing else."""
    url, server = endpoint
    params = {"temperature": 0, "top_k": 40, "options": {"num_ctx": 4096}, "tools": [{"type": "function"}]}

    async def agent(run: Run) -> ModelResponse:
        return await run.model([{"role": "user", "content": "hi"}], **params)

    model = OpenAIChatModel("local-llm", base_url=url, retry=QUICK)
    result = await start_run(client, AgentSpec("params", agent, model, agent_version="v1"), run_id="oa-params")
    assert result.status == "completed"
    assert server.requests == [{"model": "local-llm", "messages": [{"role": "user", "content": "hi"}], **params}]
    (step,) = await model_attempts(client, "oa-params")
    assert step["request"] == {"messages": [{"role": "user", "content": "hi"}], "params": params}
