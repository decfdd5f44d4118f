"""Retries and retryable failures: a model endpoint that answers 429 (a real HTTP server on
loopback), tools that time out, attempts recorded one by one, and a run failed on a retryable
error continued with ``resume --retry``."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from runledger import AgentSpec, ConfigurationError, OpenAIChatModel, Run, ScriptedModel, tool
from runledger.cli import main
from runledger.log.client import LedgerClient
from runledger.ops.trace import list_runs
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import RetryRequest, resume_run, start_run
from runledger.sdk.retry import Retry

pytestmark = pytest.mark.integration
QUICK = Retry(attempts=3, backoff_s=0.01, max_backoff_s=0.02, deadline_s=10)


class Endpoint:
    """An OpenAI-compatible endpoint whose next answers the test sets: a status code each."""

    def __init__(self) -> None:
        self.script: list[int] = []
        self.calls = 0


@pytest.fixture
def endpoint() -> Iterator[tuple[str, Endpoint]]:
    state = Endpoint()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            state.calls += 1
            status = state.script.pop(0) if state.script else 200
            if status == 200:
                body = {
                    "choices": [{"message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1},
                }
            else:
                body = {"error": {"message": "rate limited", "code": status}}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", state
    finally:
        server.shutdown()


async def ask(run: Run) -> str:
    return (await run.model([{"role": "user", "content": "hi"}])).content


def model_spec(url: str, retry: Retry) -> AgentSpec:
    return AgentSpec("retrier", ask, OpenAIChatModel("gpt-test", base_url=url, retry=retry), agent_version="v1")


async def test_a_429_is_retried_and_every_attempt_is_recorded(
    client: LedgerClient, endpoint: tuple[str, Endpoint]
) -> None:
    url, state = endpoint
    state.script = [429, 503]
    result = await start_run(client, model_spec(url, QUICK), run_id="retry-429")
    assert result.status == "completed" and result.output == "done"
    assert state.calls == 3
    attempts = [e.payload for e in (await load_run(client, "retry-429")).events if e.type == "model.called"]
    assert [(a["attempt"], a["will_retry"], a["error"] is not None) for a in attempts] == [
        (1, True, True),
        (2, True, True),
        (3, False, False),
    ]
    assert attempts[0]["error"]["retryable"] is True
    cp = fold((await load_run(client, "retry-429")).records)
    assert (cp.steps[0].status, cp.steps[0].attempts, cp.steps[0].output["content"]) == ("ok", 3, "done")


async def test_a_final_error_is_not_retried(client: LedgerClient, endpoint: tuple[str, Endpoint]) -> None:
    url, state = endpoint
    state.script = [400]
    result = await start_run(client, model_spec(url, QUICK), run_id="retry-400")
    assert result.status == "failed" and state.calls == 1
    cp = fold((await load_run(client, "retry-400")).records)
    assert cp.failure_retryable is False
    with pytest.raises(ConfigurationError, match="final failure"):
        await resume_run(client, model_spec(url, QUICK), "retry-400", retry=RetryRequest(by="op"))


async def test_a_run_failed_on_a_retryable_error_is_resumed_with_retry(
    client: LedgerClient, endpoint: tuple[str, Endpoint], nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url, state = endpoint
    state.script = [429, 429, 429]  # every attempt of the first run is rate limited
    first = await start_run(client, model_spec(url, QUICK), run_id="retry-later")
    assert first.status == "failed"
    (summary,) = [r for r in await list_runs(client) if r.run_id == "retry-later"]
    assert summary.retryable
    assert await asyncio.to_thread(main, ["runs", "--nats", nats_url]) == 0  # the CLI runs its own event loop
    assert "retryable: `runledger resume retry-later --retry" in capsys.readouterr().out
    # A plain resume says there is nothing to do; --retry continues from the failed step.
    assert (await resume_run(client, model_spec(url, QUICK), "retry-later")).nothing_to_do
    result = await resume_run(client, model_spec(url, QUICK), "retry-later", retry=RetryRequest("op", "limit lifted"))
    assert result.status == "completed" and result.output == "done"
    assert state.calls == 4
    log = await load_run(client, "retry-later")
    assert [e.payload for e in log.events if e.type == "run.retried"] == [
        {"step": 0, "by": "op", "reason": "limit lifted"}
    ]
    attempts = [e.payload["attempt"] for e in log.events if e.type == "model.called"]
    assert attempts == [1, 2, 3, 4]  # the retry is the step's fourth attempt, on the record


async def test_a_tool_declares_which_failures_it_retries(client: LedgerClient) -> None:
    answers: list[Any] = [TimeoutError("slow"), TimeoutError("slow"), {"order": "o-1", "ok": True}]
    calls: list[str] = []

    def lookup(order: str) -> dict[str, Any]:
        calls.append(order)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    def strict(order: str) -> dict[str, Any]:
        calls.append(order)
        raise ValueError("no such order")

    flaky = tool("lookup", retry=Retry(attempts=3, backoff_s=0.01, on=(TimeoutError,)))(lookup)
    once = tool("strict", retry=Retry(attempts=3, backoff_s=0.01, on=(TimeoutError,)))(strict)

    async def agent(run: Run) -> Any:
        found = await run.tool(flaky, {"order": "o-1"})
        try:
            await run.tool(once, {"order": "o-2"})
        except Exception as exc:  # a ValueError is not in the tool's retry list: one attempt, recorded
            return {"found": found, "error": str(exc)}
        return {"found": found}

    result = await start_run(client, AgentSpec("tools", agent, ScriptedModel([])), run_id="retry-tool")
    assert result.status == "completed"
    assert calls == ["o-1", "o-1", "o-1", "o-2"]
    cp = fold((await load_run(client, "retry-tool")).records)
    assert (cp.steps[0].attempts, cp.steps[0].status) == (3, "ok")
    assert (cp.steps[1].attempts, cp.steps[1].status) == (1, "error")


async def test_a_plain_resume_of_a_retryable_failure_names_the_retry_command(
    client: LedgerClient, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.agents import rate_limited_spec

    first = await start_run(client, rate_limited_spec(), run_id="retry-hint")
    assert first.status == "failed"
    capsys.readouterr()
    args = ["resume", "retry-hint", "--agent", "tests.agents:rate_limited_spec", "--nats", nats_url]
    assert await asyncio.to_thread(main, args) == 1  # Exit.FAILED: still failed, nothing was run
    assert capsys.readouterr().out == (
        "run retry-hint failed on a retryable error (model 'limited' (step 0) raised ModelError: 429: rate limited): "
        "nothing was run. To run its failed step again: `runledger resume retry-hint "
        "--agent tests.agents:rate_limited_spec --retry --by NAME --reason ...`\n"
    )
