"""One rule on every path back to agent code that calls the OpenAI SDK: what it receives live it receives again.

A probe agent calls the official SDK (``openai.AsyncOpenAI``, or ``openai.OpenAI`` under
``sync_agent``) through ``runledger.integrations.openai.recorded``; the SDK speaks HTTP to a fake
server in this process (an ``httpx.MockTransport``: the SDK's own parsing of JSON bodies and of SSE
streams) that answers with drawn bodies (tests/unit/test_replay_paths_openai.py): a chat completion
(text, a tool call's arguments, and fields a compatible server adds: ``cost`` in the usage, a
``reasoning`` on the message, an object at the top), its stream, a response of the Responses API and
its stream, and embeddings with drawn floats. The agent

- creates a chat completion, streams one and accumulates the chunks as ordinary code does (text,
  tool calls, finish reason, the usage object), and streams one with ``chat.completions.stream()``
  (its final ``ParsedChatCompletion``);
- creates a response and streams one (the response of its ``response.completed`` event);
- creates embeddings;

and puts what it received into its next request as agent code does (the message object itself in
the chat's history, the rest dumped with ``json.dumps``), so a value that differs in key order or
number type makes the next request's digest differ. Each observation is ``observed``: every SDK
object as its class, the fields it has set, and its fields and extras in order, typed at every node.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx
import openai
from pydantic import BaseModel

from runledger import AgentSpec, DataPolicy, Run, SyncRun, sync_agent
from runledger.integrations.openai import OpenAIModel, recorded
from tests.replay_paths import replay_observed, typed

if TYPE_CHECKING:
    from runledger.log.client import LedgerClient
    from runledger.testing import ReplayResult

AGENT = "oa-probe"
VALUES: dict[str, Any] = {}  # "chat", "responses", "embeddings": the bodies the server answers
STOP_AFTER: list[int] = []  # when set, the agent dies after that many observations
OBSERVED: list[str] = []
CALLS: list[str] = []  # every request the server answered: a resume makes none for a recorded step
USER = {"role": "user", "content": "probe"}


class Killed(BaseException):
    """The process dying between two steps."""


def observed(value: Any) -> Any:
    """``typed`` at every node; an SDK object (any pydantic model) as its class, the fields it has set
    (what ``model_dump(exclude_unset=True)``, the SDK's own serialisation, keeps) and its fields and
    extras in order."""
    if isinstance(value, BaseModel):
        fields = {**value.__dict__, **(value.__pydantic_extra__ or {})}
        return {
            type(value).__name__: {
                "set": sorted(value.model_fields_set),
                "fields": [[k, observed(v)] for k, v in fields.items()],
            }
        }
    if type(value) is dict:
        return {"dict": [[observed(k), observed(v)] for k, v in value.items()]}
    if type(value) in (list, tuple):
        return {type(value).__name__: [observed(v) for v in value]}
    return typed(value)


# -- the fake server --------------------------------------------------------------------------------------


def chat_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks a server streams for the completion ``body``, as OpenRouter streams them: every chunk
    with the completion's other fields (``provider``), the reasoning, text and arguments in pieces,
    the usage last."""
    head = {k: v for k, v in body.items() if k not in ("choices", "usage", "object")} | {
        "object": "chat.completion.chunk"
    }
    message = body["choices"][0]["message"]
    text, reasoning = message.get("content"), message.get("reasoning")
    first = {"role": "assistant", "content": None if text is None else ""}
    chunks = [head | {"choices": [{"index": 0, "delta": first}]}]
    if isinstance(reasoning, str):
        chunks += [head | {"choices": [{"index": 0, "delta": {"reasoning": reasoning[i : i + 4]}}]}
                   for i in range(0, len(reasoning), 4)]  # fmt: skip
    text = text or ""
    chunks += [
        head | {"choices": [{"index": 0, "delta": {"content": text[i : i + 3]}}]} for i in range(0, len(text), 3)
    ]
    for n, tc in enumerate(message.get("tool_calls") or []):
        first = {"index": n, "id": tc["id"], "type": "function", "function": {"name": tc["function"]["name"]}}
        chunks.append(head | {"choices": [{"index": 0, "delta": {"tool_calls": [first]}}]})
        args = tc["function"]["arguments"]
        for i in range(0, len(args), 5):
            piece = {"index": n, "function": {"arguments": args[i : i + 5]}}
            chunks.append(head | {"choices": [{"index": 0, "delta": {"tool_calls": [piece]}}]})
    chunks.append(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": body["choices"][0]["finish_reason"]}]})
    return [*chunks, head | {"choices": [], "usage": body["usage"]}]


def response_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": body | {"status": "in_progress", "output": []}}
    ]
    for n, item in enumerate(body["output"]):
        events.append({"type": "response.output_item.added", "output_index": n, "item": item})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events += [
                {"type": "response.output_text.delta", "item_id": item["id"], "output_index": n,
                 "content_index": 0, "delta": text[i : i + 2], "logprobs": []}
                for i in range(0, len(text), 2)
            ]  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": n, "item": item})
    events.append({"type": "response.completed", "response": body})
    return [e | {"sequence_number": i} for i, e in enumerate(events)]


def _sse(events: list[dict[str, Any]], done: bool) -> bytes:
    lines = [f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events]
    return ("".join(lines) + ("data: [DONE]\n\n" if done else "")).encode()


def answer(request: httpx.Request) -> httpx.Response:
    """What the fake server answers: the drawn body of the endpoint, as JSON or as a stream."""
    path = request.url.path
    CALLS.append(path)
    streamed = bool(json.loads(request.content or b"{}").get("stream"))
    if path.endswith("/chat/completions"):
        body = VALUES["chat"]
        if streamed:
            return httpx.Response(
                200, content=_sse(chat_chunks(body), True), headers={"content-type": "text/event-stream"}
            )
    elif path.endswith("/responses"):
        body = VALUES["responses"]
        if streamed:
            return httpx.Response(
                200, content=_sse(response_events(body), False), headers={"content-type": "text/event-stream"}
            )
    else:
        body = VALUES["embeddings"]
    # ensure_ascii=False: names beyond U+FFFF travel as themselves; a float as Python writes it (210.0).
    return httpx.Response(
        200, content=json.dumps(body, ensure_ascii=False).encode(), headers={"content-type": "application/json"}
    )


def async_client() -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return openai.AsyncOpenAI(api_key="sk-probe", base_url="http://probe.invalid/v1", http_client=http)


def blocking_client() -> openai.OpenAI:
    http = httpx.Client(transport=httpx.MockTransport(answer))
    return openai.OpenAI(api_key="sk-probe", base_url="http://probe.invalid/v1", http_client=http)


# -- the agent ---------------------------------------------------------------------------------------------


def _saw(seen: list[Any], kind: str, value: Any) -> None:
    seen.append([kind, observed(value)])
    if STOP_AFTER and len(seen) >= STOP_AFTER[0]:
        raise Killed(f"killed after {len(seen)} observations")


def accumulated(chunks: list[Any]) -> dict[str, Any]:
    """What ordinary code makes of a chat stream: the text, the tool calls, the finish reason, the usage."""
    text, calls, finish, usage = "", {}, None, None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] += (tc.function.name if tc.function else None) or ""
                slot["args"] += (tc.function.arguments if tc.function else None) or ""
    return {"text": text, "calls": [calls[i] for i in sorted(calls)], "finish": finish, "usage": usage}


def _completed(events: list[Any]) -> Any:
    return next(e.response for e in events if e.type == "response.completed")


def _finish(seen: list[Any]) -> dict[str, Any]:
    text = json.dumps(seen, ensure_ascii=False)
    OBSERVED.append(text)
    return {"observed": text}


def _dumped(*values: Any) -> str:
    return json.dumps([v.model_dump(exclude_unset=True) for v in values], ensure_ascii=False)


async def prober(run: Run) -> Any:
    seen: list[Any] = []
    async with async_client() as sdk:
        oa = recorded(sdk, run)
        chat = await oa.chat.completions.create(model="gpt-probe", messages=[USER])
        _saw(seen, "chat", chat)
        history = [USER, chat.choices[0].message, {"role": "user", "content": _dumped(chat)}]
        async with await oa.chat.completions.create(
            model="gpt-probe", messages=history, stream=True, stream_options={"include_usage": True}
        ) as stream:
            chunks = [chunk async for chunk in stream]
        _saw(seen, "chat.stream", accumulated(chunks))
        usage = accumulated(chunks)["usage"]
        async with oa.chat.completions.stream(
            model="gpt-probe", messages=[USER, {"role": "user", "content": _dumped(usage)}]
        ) as events:
            final = await events.get_final_completion()
        _saw(seen, "chat.final", final)
        response = await oa.responses.create(model="gpt-probe", input=_dumped(final))
        _saw(seen, "responses", response)
        streamed = _completed(
            [
                event
                async for event in await oa.responses.create(model="gpt-probe", input=_dumped(response), stream=True)
            ]
        )
        _saw(seen, "responses.stream", streamed)
        embedded = await oa.embeddings.create(model="emb-probe", input=_dumped(streamed))
        _saw(seen, "embeddings", embedded)
        await oa.embeddings.create(model="emb-probe", input=_dumped(embedded))
    return _finish(seen)


def sync_prober(run: SyncRun) -> Any:
    """``prober`` with the blocking client."""
    seen: list[Any] = []
    with blocking_client() as sdk:
        oa = recorded(sdk, run)
        chat = oa.chat.completions.create(model="gpt-probe", messages=[USER])
        _saw(seen, "chat", chat)
        history = [USER, chat.choices[0].message, {"role": "user", "content": _dumped(chat)}]
        with oa.chat.completions.create(
            model="gpt-probe", messages=history, stream=True, stream_options={"include_usage": True}
        ) as stream:
            chunks = list(stream)
        _saw(seen, "chat.stream", accumulated(chunks))
        usage = accumulated(chunks)["usage"]
        with oa.chat.completions.stream(
            model="gpt-probe", messages=[USER, {"role": "user", "content": _dumped(usage)}]
        ) as events:
            final = events.get_final_completion()
        _saw(seen, "chat.final", final)
        response = oa.responses.create(model="gpt-probe", input=_dumped(final))
        _saw(seen, "responses", response)
        with oa.responses.create(model="gpt-probe", input=_dumped(response), stream=True) as events:
            streamed = _completed(list(events))
        _saw(seen, "responses.stream", streamed)
        embedded = oa.embeddings.create(model="emb-probe", input=_dumped(streamed))
        _saw(seen, "embeddings", embedded)
        oa.embeddings.create(model="emb-probe", input=_dumped(embedded))
    return _finish(seen)


POLICY = DataPolicy(capture="full")  # recorded in full: redaction is not the difference under test


def spec() -> AgentSpec:
    return AgentSpec(AGENT, prober, OpenAIModel(model="gpt-probe"), agent_version="oa-probe-v1", data_policy=POLICY)


def sync_spec() -> AgentSpec:
    return AgentSpec(AGENT, sync_agent(sync_prober), OpenAIModel(model="gpt-probe"), agent_version="oa-probe-v1",
                     data_policy=POLICY)  # fmt: skip


def reset(values: dict[str, Any]) -> None:
    VALUES.clear()
    VALUES.update(values)
    OBSERVED.clear()
    STOP_AFTER.clear()
    CALLS.clear()


# -- the paths ---------------------------------------------------------------------------------------------


async def live(client: LedgerClient, run_id: str, make: Callable[[], AgentSpec] = spec) -> str:
    """A recorded run, driven live: what the agent observed."""
    from runledger.sdk.lifecycle import start_run

    result = await start_run(client, make(), run_id=run_id)
    assert result.status == "completed", result
    return str(result.output["observed"])


async def resumed(client: LedgerClient, run_id: str, stop_after: int, make: Callable[[], AgentSpec] = spec) -> str:
    """A run killed after ``stop_after`` observations (no outcome recorded), then resumed: what the
    resume observed, from its journal up to the kill and live after it. A recorded step calls no API."""
    from runledger.sdk.lifecycle import resume_run, start_run

    STOP_AFTER.append(stop_after)
    try:
        await start_run(client, make(), run_id=run_id)
    except Killed:
        pass
    else:
        raise AssertionError("the first drive was not killed")
    STOP_AFTER.clear()
    calls = len(CALLS)
    result = await resume_run(client, make(), run_id)
    assert result.status == "completed", result
    assert len(CALLS) - calls == 7 - stop_after, f"the resume called the API for a recorded step: {CALLS[calls:]}"
    return str(result.output["observed"])


async def replayed(client: LedgerClient, run_id: str, make: Callable[[], AgentSpec] = spec) -> tuple[ReplayResult, str]:
    """The recorded run exported and replayed in this process: the result and what the agent observed."""
    return await replay_observed(client, run_id, make(), OBSERVED, CALLS)
