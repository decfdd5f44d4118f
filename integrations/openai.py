"""The official OpenAI SDK's calls recorded as the model steps of a run.

``recorded(client, run)`` wraps an ``openai.AsyncOpenAI`` (async agent code, ``run`` a ``Run``) or
an ``openai.OpenAI`` (blocking agent code under ``sync_agent``, ``run`` its ``SyncRun``): its
``chat.completions.create`` and ``responses.create`` go through ``run.model``, so each is a
``model.called`` step of the run, with the SDK's budgets, retries, journal and divergence checks.
The run's model adapter must be ``OpenAIModel`` (``AgentSpec(model=OpenAIModel(client))``):
``run.model`` calls it, and it makes the SDK call the wrapper set up for this task. What is
recorded: the messages (or ``input``) and every other argument except ``extra_headers`` and
``timeout`` as the request; the SDK's response as JSON (content, tool calls, finish reason, usage,
ids) and its token usage. Headers are never part of the record, and the client's API key lives only
in the client.

Live, a call returns what the SDK returned (a ``ChatCompletion``, a ``Response``). On resume, the
recorded step is answered from the record, the API is not called, and the same SDK type is rebuilt
from the recorded JSON (equal to the live object). ``stream=True`` returns a ``RecordedStream``
(an async iterator; ``SyncRecordedStream``, a plain one, for the blocking client): live, the SDK's
chunks (or events) pass through as they arrive and the assembled response is recorded; on resume, a
stream is synthesised from the record (whole texts and tool calls in one chunk each, then the finish
reason and usage), so code that accumulates a stream gets the same result. The blocking client's
calls are made in a worker thread while the run's event loop goes on. Its streaming ``create``
returns once the first chunk is in (or the step is answered from the record), as the SDK's own
returns once the response has begun, and raises the step's failure if no stream began.

Retries are runledger's, not the SDK's: calls are made with ``max_retries=0`` and the adapter's
``Retry`` (``OpenAIModel(retry=...)``) retries HTTP 408/409/429/5xx, timeouts and connection
errors, each attempt recorded (runledger.sdk.retry). A call that exhausts them raises
``ToolFailedError`` (``kind="model"``), the error a replay of the step raises too. A stream that
breaks after chunks reached the caller is not retried (the caller would see them twice).

Rejected: recording steps here, beside ``run.model`` (a second copy of the retry loop, the budget
checks and the journal's divergence checks), and wrapping the client's HTTP transport (the record
would hold wire bytes, headers included, instead of a model step that the fold, ``runledger show``
and the projection read); for the blocking client, calling the SDK in the agent's thread and handing
``run.model`` the result (the adapter would not make the call, so the retries and their records
could not be runledger's). Not covered: endpoints other than the two above.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import queue
import threading
import typing
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from runledger import require_extra

require_extra("openai", "runledger.integrations.openai")

import openai  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402
from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from runledger import (  # noqa: E402
    DEFAULT_RETRY,
    RETRYABLE_STATUS,
    ConfigurationError,
    ModelError,
    ModelResponse,
    Retry,
    Run,
    SyncRun,
)

__all__ = [
    "OpenAIModel",
    "OpenAIResponse",
    "RecordedOpenAI",
    "RecordedStream",
    "SyncRecordedOpenAI",
    "SyncRecordedStream",
    "recorded",
]

CHAT = "/chat/completions"
RESPONSES = "/responses"
# Arguments passed to the SDK but not recorded: headers may carry credentials; a timeout is not data.
UNRECORDED = frozenset({"extra_headers", "timeout"})

T = TypeVar("T")


class OpenAIResponse(ModelResponse):
    """A ``ModelResponse`` that also carries the SDK's response as JSON (``sdk``) and the endpoint
    that gave it, so a replay rebuilds the SDK's object."""

    endpoint: str = CHAT
    sdk: dict[str, Any] | None = None


@dataclass
class _Call:
    """The SDK call ``recorded`` set up for ``OpenAIModel.complete`` to make."""

    endpoint: str
    create: Callable[..., Any]  # a coroutine function, or a blocking one (``blocking``: the openai.OpenAI client)
    kwargs: dict[str, Any]
    forward: Callable[[Any], None] | None = None  # a stream: hands each chunk to the caller as it arrives
    blocking: bool = False
    attempts: int = 0
    forwarded: int = 0


_CALL: ContextVar[_Call | None] = ContextVar("runledger_openai_call", default=None)


class OpenAIModel:
    """The model adapter of a run whose agent calls the OpenAI SDK through ``recorded``.

    ``name`` (the recorded model name) is the ``model`` argument of the call being made, else
    ``model``. Called by ``run.model`` directly (no wrapper), it makes a chat completion with
    ``client`` (async, or blocking in a worker thread) and ``model``, and records the SDK's response."""

    response_type = OpenAIResponse

    def __init__(
        self,
        client: openai.AsyncOpenAI | openai.OpenAI | None = None,
        model: str = "openai",
        retry: Retry | None = DEFAULT_RETRY,
    ) -> None:
        self._client = client
        self._model = model
        self.retry = retry

    @property
    def name(self) -> str:
        call = _CALL.get()
        model = call.kwargs.get("model") if call is not None else None
        return model if isinstance(model, str) else self._model

    @name.setter
    def name(self, value: str) -> None:  # ModelAdapter's name is settable: it sets the default model
        self._model = value

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        call = _CALL.get()
        if call is None:
            if self._client is None:
                raise ConfigurationError("OpenAIModel() without a client answers only calls made through recorded()")
            client = self._client.with_options(max_retries=0)
            kwargs = {"model": self._model, "messages": messages, **params}
            call = _Call(CHAT, client.chat.completions.create, kwargs, blocking=isinstance(client, openai.OpenAI))
        call.attempts += 1
        try:
            if call.forward is not None:
                result = await _stream_through(call)
            elif call.blocking:
                result = await asyncio.to_thread(call.create, **call.kwargs)
            else:
                result = await call.create(**call.kwargs)
        except openai.APIStatusError as exc:
            raise ModelError(
                f"OpenAI {call.endpoint} answered HTTP {exc.status_code}: {exc.message}",
                retryable=exc.status_code in RETRYABLE_STATUS and not call.forwarded,
                status=exc.status_code,
            ) from exc
        except openai.APIConnectionError as exc:  # timeouts included
            raise ModelError(f"OpenAI {call.endpoint} failed: {exc}", retryable=not call.forwarded) from exc
        return _normalised(call.endpoint, result)


def _usage(sdk: dict[str, Any], endpoint: str) -> tuple[int, int]:
    usage = sdk.get("usage") or {}
    if endpoint == CHAT:
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)


def _normalised(endpoint: str, result: BaseModel) -> OpenAIResponse:
    """The SDK's response as runledger records it: the common fields every reader knows (content,
    OpenAI-style tool calls, finish reason, usage) and the whole response."""
    sdk = result.model_dump(mode="json", exclude_unset=True)
    input_tokens, output_tokens = _usage(sdk, endpoint)
    if endpoint == CHAT:
        choice = (sdk.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        content, tool_calls = message.get("content") or "", message.get("tool_calls") or []
        # No reason given (some compatible servers, a stream cut before its last chunk): a reply
        # that asks for tools is a tool-call turn, never recorded as "stop".
        finish = choice.get("finish_reason") or ("tool_calls" if tool_calls else "stop")
    else:
        items = sdk.get("output") or []
        content = "".join(
            part.get("text", "")
            for item in items
            if item.get("type") == "message"
            for part in item.get("content") or []
            if part.get("type") == "output_text"
        )
        tool_calls = [
            {"id": item["call_id"], "type": "function",
             "function": {"name": item["name"], "arguments": item.get("arguments", "")}}
            for item in items
            if item.get("type") == "function_call"
        ]  # fmt: skip
        finish = "tool_calls" if tool_calls else ("length" if sdk.get("status") == "incomplete" else "stop")
    return OpenAIResponse(
        content=content,
        tool_calls=tool_calls,
        finish_reason=finish,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        endpoint=endpoint,
        sdk=sdk,
    )


# -- streams ---------------------------------------------------------------------------------------


async def _stream_through(call: _Call) -> BaseModel:
    """Make a streaming call, hand each chunk to the caller as it comes, return the assembled response."""
    assert call.forward is not None
    chunks: list[Any] = []
    if call.blocking:
        await asyncio.to_thread(_drain_blocking, call, chunks)
    else:
        async for chunk in await call.create(**call.kwargs):
            chunks.append(chunk)
            call.forwarded += 1
            call.forward(chunk)
    if call.endpoint == CHAT:
        return _assembled_chat(chunks)
    for event in reversed(chunks):
        if getattr(event, "type", None) in ("response.completed", "response.incomplete", "response.failed"):
            response: Response = event.response
            return response
    raise ModelError("OpenAI /responses stream ended without its response.completed event")


def _drain_blocking(call: _Call, chunks: list[Any]) -> None:
    """The blocking client's stream, read in a worker thread: each chunk to the caller's queue."""
    assert call.forward is not None
    for chunk in call.create(**call.kwargs):
        chunks.append(chunk)
        call.forwarded += 1
        call.forward(chunk)


def _assembled_chat(chunks: list[ChatCompletionChunk]) -> ChatCompletion:
    if not chunks:
        raise ModelError("OpenAI /chat/completions stream ended without a chunk")
    first = chunks[0]
    choices: dict[int, dict[str, Any]] = {}
    usage: Any = None
    for chunk in chunks:
        usage = chunk.usage or usage
        for c in chunk.choices:
            choice = choices.setdefault(
                c.index, {"index": c.index, "message": {"role": "assistant", "content": None}, "finish_reason": None}
            )
            message, delta = choice["message"], c.delta
            if delta.content:
                message["content"] = (message["content"] or "") + delta.content
            if delta.refusal:
                message["refusal"] = message.get("refusal", "") + delta.refusal
            for tc in delta.tool_calls or []:
                calls = message.setdefault("tool_calls", [])
                while len(calls) <= tc.index:
                    calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                slot = calls[tc.index]
                slot["id"] = tc.id or slot["id"]
                if tc.function is not None:
                    slot["function"]["name"] += tc.function.name or ""
                    slot["function"]["arguments"] += tc.function.arguments or ""
            if c.finish_reason:
                choice["finish_reason"] = c.finish_reason
    body: dict[str, Any] = {
        "id": first.id,
        "object": "chat.completion",
        "created": first.created,
        "model": first.model,
        "choices": [choices[i] for i in sorted(choices)],
    }
    if first.system_fingerprint is not None:
        body["system_fingerprint"] = first.system_fingerprint
    if first.service_tier is not None:
        body["service_tier"] = first.service_tier
    if usage is not None:
        body["usage"] = usage.model_dump(mode="json", exclude_unset=True)
    return ChatCompletion.construct(**body)


def _chat_chunks(sdk: dict[str, Any]) -> list[ChatCompletionChunk]:
    """A stream that assembles to the recorded completion: per choice its text and each tool call in
    one chunk, then its finish reason; the usage last."""
    head = {k: sdk[k] for k in ("id", "created", "model", "system_fingerprint", "service_tier") if k in sdk}
    head["object"] = "chat.completion.chunk"
    chunks: list[dict[str, Any]] = []
    for choice in sdk.get("choices") or []:
        message, index = choice.get("message") or {}, choice.get("index", 0)
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        if message.get("refusal"):
            delta["refusal"] = message["refusal"]
        chunks.append({**head, "choices": [{"index": index, "delta": delta}]})
        for i, tc in enumerate(message.get("tool_calls") or []):
            call = {"index": i, "id": tc.get("id"), "type": "function", "function": tc.get("function")}
            chunks.append({**head, "choices": [{"index": index, "delta": {"tool_calls": [call]}}]})
        chunks.append(
            {**head, "choices": [{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}]}
        )
    if sdk.get("usage") is not None:
        chunks.append({**head, "choices": [], "usage": sdk["usage"]})
    return [ChatCompletionChunk.construct(**c) for c in chunks]


def _sdk_object(response: OpenAIResponse) -> ChatCompletion | Response:
    """The SDK's object for a recorded response, built as the SDK builds one from the wire (its
    ``construct``: nested models, no validation), so it equals the object the live call returned."""
    sdk = response.sdk or {}
    return ChatCompletion.construct(**sdk) if response.endpoint == CHAT else Response.construct(**sdk)


@functools.cache
def _event_classes() -> dict[str, type[BaseModel]]:
    members = typing.get_args(ResponseStreamEvent)  # Annotated[Union[...], discriminator]
    if members and typing.get_origin(members[0]) is typing.Union:
        members = typing.get_args(members[0])
    classes: dict[str, type[BaseModel]] = {}
    for cls in members:
        (name,) = typing.get_args(cls.model_fields["type"].annotation)
        classes[name] = cls
    return classes


def _event(data: dict[str, Any]) -> ResponseStreamEvent:
    event: ResponseStreamEvent = _event_classes()[data["type"]].construct(**data)  # type: ignore[assignment]
    return event


def _response_events(sdk: dict[str, Any]) -> list[ResponseStreamEvent]:
    """The events of a stream that ends in the recorded response: created, each output item added
    (a message's texts as one delta each) and done, completed."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**sdk, "status": "in_progress", "output": []}}
    ]
    for n, item in enumerate(sdk.get("output") or []):
        events.append({"type": "response.output_item.added", "output_index": n, "item": item})
        for k, part in enumerate(item.get("content") or [] if item.get("type") == "message" else []):
            if part.get("type") == "output_text":
                where = {"item_id": item.get("id", ""), "output_index": n, "content_index": k, "logprobs": []}
                events.append({"type": "response.output_text.delta", "delta": part.get("text", ""), **where})
                events.append({"type": "response.output_text.done", "text": part.get("text", ""), **where})
        if item.get("type") == "function_call":
            where = {"item_id": item.get("id", ""), "output_index": n}
            events.append(
                {"type": "response.function_call_arguments.delta", "delta": item.get("arguments", ""), **where}
            )
            events.append({"type": "response.function_call_arguments.done", "arguments": item.get("arguments", ""),
                           "name": item.get("name", ""), **where})  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": n, "item": item})
    events.append({"type": "response.completed", "response": sdk})
    return [_event({**e, "sequence_number": i}) for i, e in enumerate(events)]


def _synthesised(response: OpenAIResponse) -> list[Any]:
    """The stream a resume hands the caller for a recorded streaming step."""
    assert response.sdk is not None
    return list(_chat_chunks(response.sdk) if response.endpoint == CHAT else _response_events(response.sdk))


class RecordedStream(Generic[T]):
    """What a recorded ``stream=True`` call returns: an async iterator of the SDK's chunks (chat) or
    events (responses), live as they arrive, on resume synthesised from the record. The step is
    recorded when the stream ends; ``close()`` (or leaving ``async with``) waits for that."""

    def __init__(self, task: asyncio.Future[ModelResponse], call: _Call, queue: asyncio.Queue[Any]) -> None:
        self._task = task
        self._call = call
        self._queue = queue
        self._replayed: list[Any] | None = None

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        queue = self._queue
        while self._replayed is None:
            if not queue.empty():
                item: T = queue.get_nowait()
                return item
            if self._task.done():
                response = _checked(self._task.result())
                if self._call.attempts:
                    raise StopAsyncIteration
                self._replayed = _synthesised(response)
                break
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, self._task}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                got: T = getter.result()
                return got
            getter.cancel()
        if not self._replayed:
            raise StopAsyncIteration
        out: T = self._replayed.pop(0)
        return out

    async def close(self) -> None:
        """Wait until the step is recorded (the rest of a live stream is still read and recorded)."""
        await asyncio.wait({self._task})

    async def __aenter__(self) -> RecordedStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


_END = object()  # after a blocking stream's last chunk: the step has ended


class SyncRecordedStream(Generic[T]):
    """What a recorded ``stream=True`` call of the blocking client returns: an iterator of the SDK's
    chunks (chat) or events (responses), live as they arrive, on resume synthesised from the record.
    The step is recorded when the stream ends; ``close()`` (or leaving ``with``) waits for that.

    The step runs in a thread of its own (``SyncRun.model`` blocks until the step ends), in a copy of
    the caller's context; the constructor waits for the first chunk, or the end of the step, so the
    step has its number before the caller's next call takes one."""

    def __init__(self, run: SyncRun, call: _Call, messages: list[dict[str, Any]], params: dict[str, Any]) -> None:
        self._call = call
        self._queue: queue.Queue[Any] = queue.Queue()
        call.forward = self._queue.put
        self._done: concurrent.futures.Future[ModelResponse] = concurrent.futures.Future()
        self._replayed: list[Any] | None = None
        context = contextvars.copy_context()
        context.run(_CALL.set, call)
        thread = threading.Thread(
            target=context.run, args=(self._step, run, messages, params), name="runledger-openai-stream", daemon=True
        )
        thread.start()
        self._first: Any = self._queue.get()
        if self._first is _END:  # no stream: the step's failure is the call's, as the SDK raises it from create
            _checked(self._done.result())

    def _step(self, run: SyncRun, messages: list[dict[str, Any]], params: dict[str, Any]) -> None:
        try:
            self._done.set_result(run.model(messages, **params))
        except BaseException as exc:  # handed to the caller's thread, raised there
            self._done.set_exception(exc)
        finally:
            self._queue.put(_END)

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._replayed is None:
            item = self._first if self._first is not None else self._queue.get()
            self._first = None
            if item is not _END:
                got: T = item
                return got
            self._first = _END  # the end stays the end for every later call
            response = _checked(self._done.result())
            self._replayed = [] if self._call.attempts else _synthesised(response)
        if not self._replayed:
            raise StopIteration
        out: T = self._replayed.pop(0)
        return out

    def close(self) -> None:
        """Wait until the step is recorded (the rest of a live stream is still read and recorded)."""
        concurrent.futures.wait([self._done])

    def __enter__(self) -> SyncRecordedStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the wrapper -------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """``value`` as JSON data (SDK models dumped), without the SDK's "not given" markers."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if not _absent(v)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _absent(value: Any) -> bool:
    return isinstance(value, openai.NotGiven) or type(value).__name__ == "Omit"


def _checked(response: ModelResponse) -> OpenAIResponse:
    if not isinstance(response, OpenAIResponse) or response.sdk is None:
        raise ConfigurationError(
            "recorded(client, run) needs the run's model to be runledger.integrations.openai.OpenAIModel: "
            "AgentSpec(..., model=OpenAIModel(client))"
        )
    return response


def _request(endpoint: str, kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and params ``run.model`` records for an SDK call made with ``kwargs``."""
    recorded_args = {k: v for k, v in kwargs.items() if k not in UNRECORDED and not _absent(v)}
    if endpoint == CHAT:
        messages = _plain(recorded_args.pop("messages", []))
    else:
        given = _plain(recorded_args.pop("input", []))
        messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
    return messages, {"endpoint": endpoint, **_plain(recorded_args)}


class RecordedOpenAI:
    """An ``openai.AsyncOpenAI`` whose ``chat.completions.create`` and ``responses.create`` are
    recorded steps of ``run``; made by ``recorded``."""

    def __init__(self, client: openai.AsyncOpenAI, run: Run) -> None:
        if not isinstance(client, openai.AsyncOpenAI):
            raise ConfigurationError(
                f"recorded(client, run) wraps an openai.AsyncOpenAI (async agent code) or an openai.OpenAI "
                f"(a sync_agent), not {type(client).__name__}"
            )
        if isinstance(run, SyncRun):
            raise ConfigurationError(
                "recorded(openai.AsyncOpenAI(), run) needs the async Run; blocking agent code (a sync_agent, "
                "with its SyncRun) wraps the blocking client: recorded(openai.OpenAI(), run)"
            )
        self._client = client.with_options(max_retries=0)  # runledger retries, each attempt recorded
        self._run = run
        self.chat = _Chat(self)
        self.responses = _Responses(self)

    async def _call(self, endpoint: str, create: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        messages, params = _request(endpoint, kwargs)
        call = _Call(endpoint, create, kwargs)
        stream_queue: asyncio.Queue[Any] | None = None
        if kwargs.get("stream"):
            stream_queue = asyncio.Queue()
            call.forward = stream_queue.put_nowait

        async def step() -> ModelResponse:
            _CALL.set(call)  # this task's own context: concurrent calls each see their own
            return await self._run.model(messages, **params)

        task = asyncio.ensure_future(step())
        if stream_queue is not None:
            await asyncio.sleep(0)  # let the task take its step number now, in call order
            return RecordedStream(task, call, stream_queue)
        response = _checked(await task)
        assert response.sdk is not None
        return _sdk_object(response)


class _Completions:
    def __init__(self, owner: RecordedOpenAI) -> None:
        self._owner = owner

    async def create(self, **kwargs: Any) -> Any:
        """``AsyncOpenAI.chat.completions.create``, recorded: a ``ChatCompletion``, or with
        ``stream=True`` a ``RecordedStream`` of ``ChatCompletionChunk``."""
        return await self._owner._call(CHAT, self._owner._client.chat.completions.create, kwargs)


class _Chat:
    def __init__(self, owner: RecordedOpenAI) -> None:
        self.completions = _Completions(owner)


class _Responses:
    def __init__(self, owner: RecordedOpenAI) -> None:
        self._owner = owner

    async def create(self, **kwargs: Any) -> Any:
        """``AsyncOpenAI.responses.create``, recorded: a ``Response``, or with ``stream=True`` a
        ``RecordedStream`` of the response's stream events."""
        return await self._owner._call(RESPONSES, self._owner._client.responses.create, kwargs)


class SyncRecordedOpenAI:
    """An ``openai.OpenAI`` (the blocking client) whose ``chat.completions.create`` and
    ``responses.create`` are recorded steps of ``run``, the ``SyncRun`` of a ``sync_agent``; made by
    ``recorded``. Calls block the agent's thread, as the SDK's do; the SDK call itself is made by
    ``OpenAIModel`` in a worker thread, with runledger's retries."""

    def __init__(self, client: openai.OpenAI, run: SyncRun) -> None:
        if not isinstance(client, openai.OpenAI):
            raise ConfigurationError(f"SyncRecordedOpenAI wraps an openai.OpenAI, not {type(client).__name__}")
        if not isinstance(run, SyncRun):
            raise ConfigurationError(
                "recorded(openai.OpenAI(), run) needs the SyncRun of a sync_agent (blocking agent code); "
                f"got {type(run).__name__}: async agent code wraps openai.AsyncOpenAI()"
            )
        self._client = client.with_options(max_retries=0)  # runledger retries, each attempt recorded
        self._run = run
        self.chat = _SyncChat(self)
        self.responses = _SyncResponses(self)

    def _call(self, endpoint: str, create: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        messages, params = _request(endpoint, kwargs)
        call = _Call(endpoint, create, kwargs, blocking=True)
        if kwargs.get("stream"):
            return SyncRecordedStream(self._run, call, messages, params)
        # SyncRun.model runs the step on the run's event loop in a copy of this thread's context
        # (asyncio.run_coroutine_threadsafe), so the adapter there sees this call.
        token = _CALL.set(call)
        try:
            response = _checked(self._run.model(messages, **params))
        finally:
            _CALL.reset(token)
        assert response.sdk is not None
        return _sdk_object(response)


class _SyncCompletions:
    def __init__(self, owner: SyncRecordedOpenAI) -> None:
        self._owner = owner

    def create(self, **kwargs: Any) -> Any:
        """``OpenAI.chat.completions.create``, recorded: a ``ChatCompletion``, or with ``stream=True``
        a ``SyncRecordedStream`` of ``ChatCompletionChunk``."""
        return self._owner._call(CHAT, self._owner._client.chat.completions.create, kwargs)


class _SyncChat:
    def __init__(self, owner: SyncRecordedOpenAI) -> None:
        self.completions = _SyncCompletions(owner)


class _SyncResponses:
    def __init__(self, owner: SyncRecordedOpenAI) -> None:
        self._owner = owner

    def create(self, **kwargs: Any) -> Any:
        """``OpenAI.responses.create``, recorded: a ``Response``, or with ``stream=True`` a
        ``SyncRecordedStream`` of the response's stream events."""
        return self._owner._call(RESPONSES, self._owner._client.responses.create, kwargs)


@overload
def recorded(client: openai.AsyncOpenAI, run: Run) -> RecordedOpenAI: ...
@overload
def recorded(client: openai.OpenAI, run: SyncRun) -> SyncRecordedOpenAI: ...
def recorded(client: openai.AsyncOpenAI | openai.OpenAI, run: Run | SyncRun) -> RecordedOpenAI | SyncRecordedOpenAI:
    """``client`` with its ``chat.completions.create`` and ``responses.create`` recorded as model
    steps of ``run`` (whose model adapter must be ``OpenAIModel``): an ``openai.AsyncOpenAI`` with
    the ``Run`` of async agent code, an ``openai.OpenAI`` with the ``SyncRun`` of a ``sync_agent``.

    Raises ``ConfigurationError`` for another client, or a client and run that do not go together."""
    if isinstance(client, openai.OpenAI):
        return SyncRecordedOpenAI(client, run)  # type: ignore[arg-type]  # checked there, with the fix in the message
    return RecordedOpenAI(client, run)  # type: ignore[arg-type]
