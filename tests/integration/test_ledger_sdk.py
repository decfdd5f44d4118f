"""The SDK's other faces: the sync facade, model adapters, and a server that stays down."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runledger import AgentSpec, OpenAIChatModel, PublishError, Run, ScriptedModel
from runledger.log.client import connect
from runledger.log.publish import RetryPolicy
from runledger.log.server import EmbeddedServer
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.sdk.lifecycle import start_run
from runledger.sdk.sync import SyncRun, resume_sync, run_sync, sync_agent
from tests.conftest import eventually

pytestmark = pytest.mark.integration


def test_sync_facade_records_and_resumes(nats_url: str) -> None:
    ran: list[int] = []

    def agent(run: SyncRun) -> Any:
        first = run.tool("inc", 1, fn=lambda a: ran.append(a) or a + 1)
        run.approval("go", {"n": first})
        return {"first": first, "reply": run.model([{"role": "user", "content": "hi"}]).content}

    spec = AgentSpec("sync-agent", sync_agent(agent), ScriptedModel(["hello"]))
    first = run_sync(nats_url, spec, None, run_id="sync1")
    assert first.status == "suspended"

    import asyncio

    from runledger.ops.decisions import approve

    async def decide() -> None:
        async with await connect(nats_url) as client:
            await approve(client, "sync1", first.pending[0], by="op")

    asyncio.run(decide())
    result = resume_sync(nats_url, spec, "sync1")
    assert result.status == "completed" and result.output == {"first": 2, "reply": "hello"}
    assert ran == [1]


@pytest.fixture
def chat_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local OpenAI-compatible endpoint (no model service is reachable from here)."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            reply = {
                "choices": [{"message": {"role": "assistant", "content": "refund approved"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 17, "completion_tokens": 3},
            }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()


async def test_openai_adapter_records_usage_and_never_the_key(
    nats_url: str, chat_server: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = chat_server
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-test-0123456789abcdef")
    model = OpenAIChatModel("gpt-test", base_url=url, api_key_env="TEST_PROVIDER_KEY")

    async def agent(run: Run) -> str:
        return (await run.model([{"role": "user", "content": "refund?"}], temperature=0)).content

    async with await connect(nats_url) as client:
        result = await start_run(client, AgentSpec("oa", agent, model), run_id="openai1")
        log = await load_run(client, "openai1")
    assert result.output == "refund approved"
    assert seen[0]["path"] == "/v1/chat/completions"
    assert seen[0]["auth"] == "Bearer sk-test-0123456789abcdef"
    assert seen[0]["body"] == {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "refund?"}],
        "temperature": 0,
    }
    cp = fold(log.records)
    assert cp.spent["tokens"] == 20 and cp.steps[0].output["usage"] == {"input_tokens": 17, "output_tokens": 3}
    assert b"sk-test" not in b"".join(e.to_bytes() for e in log.events)


async def test_a_server_that_stays_down_fails_the_step_clearly(tmp_path: Path) -> None:
    server = EmbeddedServer(home=tmp_path / "home")
    state = server.start(data_dir=tmp_path / "data")
    calls: list[int] = []

    async def agent(run: Run) -> None:
        await run.tool("one", 1, fn=lambda a: calls.append(a))
        os.kill(state.pid, signal.SIGKILL)
        await eventually(lambda: server.state() is None)
        await run.tool("two", 2, fn=lambda a: calls.append(a))

    try:
        async with await connect(state.url) as client:
            with pytest.raises(PublishError) as info:
                await start_run(
                    client,
                    AgentSpec("down", agent, ScriptedModel([])),
                    run_id="down1",
                    policy=RetryPolicy(deadline_s=2.0, ack_timeout_s=0.5),
                )
    finally:
        server.stop()
    assert "was not acknowledged" in str(info.value) and "down1:2" in str(info.value)
    assert "resume the run" in str(info.value)
    assert calls == [1, 2]  # the step ran; its record is what could not be stored
