"""The official OpenAI SDK's calls recorded as the model steps of a run.

``recorded(client, run)`` wraps an ``openai.AsyncOpenAI`` (async agent code, ``run`` a ``Run``) or
an ``openai.OpenAI`` (blocking agent code under ``sync_agent``, ``run`` its ``SyncRun``): its
``chat.completions`` ``create``, ``parse`` and ``stream``, ``responses`` ``create`` and ``parse``,
and ``embeddings.create`` go through ``run.model``, so each is a ``model.called`` step of the run, with
the SDK's budgets, retries, journal and divergence checks; ``models.list`` and ``models.retrieve``
are read tool steps (``openai.models.list``). ``with_options`` (``copy``) and ``with_raw_response``
give the same, recorded; any other attribute of the SDK (``beta``, ``files``, ``audio``, ...)
raises ``NotRecordedError``, an ``AttributeError`` that names it and says what to do.
The run's model adapter must be ``OpenAIModel`` (``AgentSpec(model=OpenAIModel(client))``):
``run.model`` calls it, and it makes the SDK call the wrapper set up for this task. What is
recorded: the messages (or ``input``) and every other argument except ``extra_headers`` and
``timeout`` as the request; the SDK's response as JSON (content, tool calls, finish reason, usage,
ids) and its token usage. Headers are never part of the record, and the client's API key lives only
in the client.

A call returns the SDK's object rebuilt from the recorded JSON, live and on resume alike (equal to
what the SDK returned; on resume the API is not called). ``parse`` and ``stream()`` are recorded as
the ``create`` they make (``response_format`` as the JSON schema sent), and the SDK's own functions
make the ``ParsedChatCompletion`` and the stream events from the recorded completion or chunks
(runledger.integrations.openai_objects). ``with_raw_response`` keeps the status and a few response
headers (ids, rate limits) with the step, never cookies. ``stream=True`` returns a ``RecordedStream``
(an async iterator; ``SyncRecordedStream``, a plain one, for the blocking client): live, the SDK's
chunks (or events) pass through as they arrive, each rebuilt from its JSON as the record gives it
back (the run's ``as_recorded``), and the response the SDK's own ``ChatCompletionStreamState``
assembles from them is recorded; on resume, a stream is synthesised from the record (each message
whole and each tool call in one chunk, then the finish reason and usage, every chunk with the
completion's fields), so code that accumulates a stream, and the SDK's own accumulation, get the
same result. The blocking client's
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
could not be runledger's); for ``parse``, calling the SDK's ``parse`` live (its parsing would run
before the record, and a refusal to parse, ``LengthFinishReasonError``, would be a failed step live
but a different error on resume). Not covered: the rest of the SDK, by name (``NotRecordedError``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from runledger import require_extra

require_extra("openai", "runledger.integrations.openai")

import openai  # noqa: E402
from openai.lib.streaming.chat import ChatCompletionStreamState  # noqa: E402
from openai.types import CreateEmbeddingResponse, Model  # noqa: E402
from openai.types.chat import ChatCompletion  # noqa: E402
from openai.types.responses import Response  # noqa: E402
from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer  # noqa: E402

from runledger import (  # noqa: E402
    DEFAULT_RETRY,
    RETRYABLE_STATUS,
    ConfigurationError,
    ModelError,
    ModelResponse,
    Retry,
    Run,
    SyncRun,
    Tool,
    server_of,
)
from runledger.integrations.openai_objects import (  # noqa: E402
    NotRecordedError,
    RecordedChatCompletionStream,
    RecordedChatCompletionStreamManager,
    RecordedRawResponse,
    Surface,
    SyncRecordedChatCompletionStream,
    SyncRecordedChatCompletionStreamManager,
    as_parse_create,
    as_recorded_of,
    as_responses_parse_create,
    assembled_chat,
    chat_chunks,
    chat_parser,
    kept_headers,
    models_page,
    page_request,
    recorded_object,
    response_events,
    responses_parser,
    unchanged,
)

__all__ = [
    "NotRecordedError",
    "OpenAIModel",
    "OpenAIResponse",
    "RecordedChatCompletionStream",
    "RecordedOpenAI",
    "RecordedRawResponse",
    "RecordedStream",
    "SyncRecordedChatCompletionStream",
    "SyncRecordedOpenAI",
    "SyncRecordedStream",
    "recorded",
]

logger = logging.getLogger(__name__)

CHAT = "/chat/completions"
RESPONSES = "/responses"
EMBEDDINGS = "/embeddings"
# Arguments passed to the SDK but not recorded: headers may carry credentials; a timeout is not data.
UNRECORDED = frozenset({"extra_headers", "timeout"})

T = TypeVar("T")


class OpenAIResponse(ModelResponse):
    """A ``ModelResponse`` that also carries the SDK's response as JSON (``sdk``) and the endpoint
    that gave it, so a replay rebuilds the SDK's object."""

    endpoint: str = CHAT
    sdk: dict[str, Any] | None = None
    http: dict[str, Any] | None = None  # with_raw_response: the status and the kept response headers

    @model_serializer(mode="wrap")
    def _without_http(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("http") is None:  # recorded only for with_raw_response: other records stay as they were
            data.pop("http", None)
        return data


@dataclass
class _Call:
    """The SDK call ``recorded`` set up for ``OpenAIModel.complete`` to make."""

    endpoint: str
    create: Callable[..., Any]  # a coroutine function, or a blocking one (``blocking``: the openai.OpenAI client)
    kwargs: dict[str, Any]
    forward: Callable[[Any], None] | None = None  # a stream: hands each chunk to the caller as it arrives
    # A value as the run's record gives it back (RecordedRun.as_recorded): how a live chunk is handed on.
    as_recorded: Callable[[Any], Any] = unchanged
    blocking: bool = False
    raw: bool = False  # ``create`` is the SDK's with_raw_response one: its status and headers are kept
    attempts: int = 0
    forwarded: int = 0
    base_url: Any = None  # the client's: where the call goes (model.called's server, host and port only)


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
            call = _Call(CHAT, client.chat.completions.create, kwargs, blocking=isinstance(client, openai.OpenAI),
                         base_url=client.base_url)  # fmt: skip
        call.attempts += 1
        result: Any
        try:
            if call.forward is not None:
                result = await _stream_through(call)
            elif call.blocking:
                result = await asyncio.to_thread(call.create, **call.kwargs)
            else:
                result = await call.create(**call.kwargs)
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            raise _model_error(call.endpoint, exc, call.forwarded) from exc
        http = None
        if call.raw:  # the SDK's LegacyAPIResponse: its body is read, parse() makes no request
            http = {"status": result.status_code, "headers": kept_headers(result.headers)}
            result = result.parse()
        return _normalised(call.endpoint, result, http).model_copy(update={"server": server_of(call.base_url)})


def _model_error(endpoint: str, exc: openai.APIStatusError | openai.APIConnectionError, forwarded: int) -> ModelError:
    """The SDK's failure as runledger's retries read it: HTTP 408/409/429/5xx, timeouts and
    connection errors are retryable, unless chunks of a stream already reached the caller."""
    if isinstance(exc, openai.APIStatusError):
        return ModelError(
            f"OpenAI {endpoint} answered HTTP {exc.status_code}: {exc.message}",
            retryable=exc.status_code in RETRYABLE_STATUS and not forwarded,
            status=exc.status_code,
        )
    return ModelError(f"OpenAI {endpoint} failed: {exc}", retryable=not forwarded)  # timeouts included


def _usage(sdk: dict[str, Any], endpoint: str) -> tuple[int, int]:
    usage = sdk.get("usage") or {}
    if endpoint in (CHAT, EMBEDDINGS):
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)


def _normalised(endpoint: str, result: BaseModel, http: dict[str, Any] | None = None) -> OpenAIResponse:
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
        given = choice.get("finish_reason")
        finish = given or ("tool_calls" if tool_calls else "stop")
    elif endpoint == EMBEDDINGS:
        content, tool_calls, finish, given = "", [], "stop", None
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
        given = (sdk.get("incomplete_details") or {}).get("reason")  # the model's own, when it was cut short
    return OpenAIResponse(
        content=content,
        tool_calls=tool_calls,
        finish_reason=finish,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        endpoint=endpoint,
        sdk=sdk,
        http=http,
        model_finish_reason=given if isinstance(given, str) else None,
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
            call.forward(recorded_object(chunk, call.as_recorded))
    if call.endpoint == CHAT:
        return assembled_chat(chunks)
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
        call.forward(recorded_object(chunk, call.as_recorded))


_SDK_TYPES: dict[str, type[BaseModel]] = {
    CHAT: ChatCompletion, RESPONSES: Response, EMBEDDINGS: CreateEmbeddingResponse
}  # fmt: skip


def _sdk_object(response: OpenAIResponse) -> Any:
    """The SDK's object for a recorded response, built as the SDK builds one from the wire (its
    ``construct``: nested models, no validation), so it equals the object the live call returned."""
    return _SDK_TYPES[response.endpoint].construct(**(response.sdk or {}))


def _synthesised(response: OpenAIResponse) -> list[Any]:
    """The stream a resume hands the caller for a recorded streaming step."""
    assert response.sdk is not None
    return list(chat_chunks(response.sdk) if response.endpoint == CHAT else response_events(response.sdk))


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
        as_one = isinstance(given, str) or endpoint == EMBEDDINGS  # an embedding's input, whatever its form
        messages = [{"role": "user", "content": given}] if as_one else given
    return messages, {"endpoint": endpoint, **_plain(recorded_args)}


def _kept(obj: Any) -> Any:
    return obj


def _refuse_raw_stream(kwargs: dict[str, Any], raw: bool) -> None:
    if raw and kwargs.get("stream"):
        raise NotRecordedError("with_raw_response with stream=True (record the stream without with_raw_response)")


def _stream_request(kwargs: dict[str, Any]) -> tuple[ChatCompletionStreamState[Any], dict[str, Any]]:
    """What ``chat.completions.stream(...)`` sends (the ``create`` it stands for, streamed) and the SDK's
    state that turns the chunks into its stream events, for the async and the blocking client alike."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState(
        response_format=kwargs.get("response_format", openai.omit), input_tools=kwargs.get("tools", openai.omit)
    )
    return state, {**as_parse_create(kwargs), "stream": True}


class RecordedOpenAI(Surface):
    """An ``openai.AsyncOpenAI`` whose calls are recorded steps of ``run`` (``chat.completions``
    ``create``/``parse``/``stream``, ``responses.create``/``parse``, ``embeddings.create``: model steps;
    ``models.list``/``retrieve``: tool steps); made by ``recorded``. ``with_options`` (``copy``)
    and ``with_raw_response`` give the same, recorded; any other part of the SDK raises
    ``NotRecordedError`` naming it."""

    _path = "AsyncOpenAI"

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
        _resources(self)

    def with_options(self, **options: Any) -> RecordedOpenAI:
        """The SDK's ``with_options`` (a client with other options: timeout, headers, base URL),
        still recorded. ``max_retries`` is not the SDK's to use: runledger retries, each attempt
        recorded (``OpenAIModel(retry=...)``); it is dropped, with a warning."""
        return RecordedOpenAI(self._client.with_options(**_options(options)), self._run)

    copy = with_options

    @property
    def with_raw_response(self) -> Any:
        """The SDK's ``client.with_raw_response``: each call returns a ``RecordedRawResponse``."""
        return _RawClient(self)

    async def _call(
        self, endpoint: str, create: Callable[..., Any], kwargs: dict[str, Any], raw: bool = False,
        then: Callable[[Any], Any] = _kept,
    ) -> Any:  # fmt: skip
        _refuse_raw_stream(kwargs, raw)
        messages, params = _request(endpoint, kwargs)
        call = _Call(endpoint, create, kwargs, raw=raw, as_recorded=as_recorded_of(self._run),
                     base_url=getattr(self._client, "base_url", None))  # fmt: skip
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
        made = then(_sdk_object(response))
        return RecordedRawResponse(made, response.http) if raw else made

    def _chat_stream(self, create: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        state, create_kwargs = _stream_request(kwargs)

        async def start() -> RecordedChatCompletionStream[Any]:
            return RecordedChatCompletionStream(await self._call(CHAT, create, create_kwargs), state)

        return RecordedChatCompletionStreamManager(start)

    def _read(self, name: str, args: dict[str, Any], fetch: Callable[[], Any], build: Callable[[Any], T]) -> Any:
        """A read of the API that is no model call (``models``): a read tool step named
        ``openai.<name>``, its result the response as JSON, rebuilt by ``build``; HTTP 429/5xx,
        timeouts and connection errors retried as ``DEFAULT_RETRY`` says, each attempt recorded."""

        async def fn(_: Any) -> Any:
            try:
                return _plain(await fetch())
            except (openai.APIStatusError, openai.APIConnectionError) as exc:
                raise _model_error(f"/{name.split('.')[0]}", exc, 0) from exc

        async def get() -> T:
            return build(await self._run.tool(Tool(f"openai.{name}", fn, retry=DEFAULT_RETRY), args))

        return page_request(get) if name == "models.list" else get()  # type: ignore[arg-type]  # build: a page


class SyncRecordedOpenAI(Surface):
    """An ``openai.OpenAI`` (the blocking client) recorded as ``RecordedOpenAI`` records the async
    one, for the ``SyncRun`` of a ``sync_agent``; made by ``recorded``. Calls block the agent's
    thread, as the SDK's do; the SDK call itself is made by ``OpenAIModel`` in a worker thread, with
    runledger's retries."""

    _path = "OpenAI"

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
        _resources(self)

    def with_options(self, **options: Any) -> SyncRecordedOpenAI:
        """``RecordedOpenAI.with_options``, for the blocking client."""
        return SyncRecordedOpenAI(self._client.with_options(**_options(options)), self._run)

    copy = with_options

    @property
    def with_raw_response(self) -> Any:
        return _RawClient(self)

    def _call(
        self, endpoint: str, create: Callable[..., Any], kwargs: dict[str, Any], raw: bool = False,
        then: Callable[[Any], Any] = _kept,
    ) -> Any:  # fmt: skip
        _refuse_raw_stream(kwargs, raw)
        messages, params = _request(endpoint, kwargs)
        call = _Call(endpoint, create, kwargs, blocking=True, raw=raw, as_recorded=as_recorded_of(self._run),
                     base_url=getattr(self._client, "base_url", None))  # fmt: skip
        if kwargs.get("stream"):
            return SyncRecordedStream(self._run, call, messages, params)
        # SyncRun.model runs the step on the run's event loop in a copy of this thread's context
        # (asyncio.run_coroutine_threadsafe), so the adapter there sees this call.
        token = _CALL.set(call)
        try:
            response = _checked(self._run.model(messages, **params))
        finally:
            _CALL.reset(token)
        made = then(_sdk_object(response))
        return RecordedRawResponse(made, response.http) if raw else made

    def _chat_stream(self, create: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        state, create_kwargs = _stream_request(kwargs)
        return SyncRecordedChatCompletionStreamManager(
            lambda: SyncRecordedChatCompletionStream(self._call(CHAT, create, create_kwargs), state)
        )

    def _read(self, name: str, args: dict[str, Any], fetch: Callable[[], Any], build: Callable[[Any], T]) -> T:
        def fn(_: Any) -> Any:
            try:
                return _plain(fetch())
            except (openai.APIStatusError, openai.APIConnectionError) as exc:
                raise _model_error(f"/{name.split('.')[0]}", exc, 0) from exc

        return build(self._run.tool(Tool(f"openai.{name}", fn, retry=DEFAULT_RETRY), args))


def _options(options: dict[str, Any]) -> dict[str, Any]:
    if "max_retries" in options:
        logger.warning(
            "with_options(max_retries=%s) on a recorded client is ignored: runledger retries, each attempt "
            "recorded (OpenAIModel(retry=Retry(...)))", options["max_retries"]
        )  # fmt: skip
    return {k: v for k, v in options.items() if k != "max_retries"}


_Owner = RecordedOpenAI | SyncRecordedOpenAI


def _resources(owner: _Owner) -> None:
    owner.chat = _Chat(owner)  # type: ignore[union-attr]
    owner.responses = _Responses(owner)  # type: ignore[union-attr]
    owner.embeddings = _Embeddings(owner)  # type: ignore[union-attr]
    owner.models = _Models(owner)  # type: ignore[union-attr]


class _Resource(Surface):
    """One of the SDK's resources, recorded. Its methods return what the client's ``_call`` does:
    an awaitable for the async client (``await client.chat.completions.create(...)``), the value
    for the blocking one. ``with_raw_response``: the same resource, whose calls return a
    ``RecordedRawResponse``."""

    name = ""

    def __init__(self, owner: _Owner, raw: bool = False) -> None:
        self._owner = owner
        self._raw = raw
        self._path = f"{owner._path}.{'with_raw_response.' if raw else ''}{self.name}"

    @property
    def with_raw_response(self) -> Any:
        return type(self)(self._owner, raw=True)

    def _sdk(self, method: str) -> Callable[..., Any]:
        resource: Any = self._owner._client
        for part in self.name.split("."):
            resource = getattr(resource, part)
        return getattr(resource.with_raw_response if self._raw else resource, method)  # type: ignore[no-any-return]


class _Completions(_Resource):
    name = "chat.completions"

    def create(self, **kwargs: Any) -> Any:
        """``chat.completions.create``, recorded: a ``ChatCompletion``, or with ``stream=True`` a
        ``RecordedStream`` (``SyncRecordedStream``) of ``ChatCompletionChunk``."""
        return self._owner._call(CHAT, self._sdk("create"), kwargs, self._raw)

    def parse(self, **kwargs: Any) -> Any:
        """``chat.completions.parse``, recorded: a ``ParsedChatCompletion`` whose
        ``choices[0].message.parsed`` is an instance of ``response_format`` (a pydantic model)."""
        return self._owner._call(CHAT, self._sdk("create"), as_parse_create(kwargs), self._raw, chat_parser(kwargs))

    def stream(self, **kwargs: Any) -> Any:
        """``chat.completions.stream``, recorded: ``async with`` it (``with``, blocking) for a
        ``RecordedChatCompletionStream`` of the SDK's stream events."""
        if self._raw:
            raise NotRecordedError(f"{self._path}.stream")
        return self._owner._chat_stream(self._sdk("create"), kwargs)


class _Chat(Surface):
    def __init__(self, owner: _Owner, raw: bool = False) -> None:
        self._path = f"{owner._path}.{'with_raw_response.' if raw else ''}chat"
        self.completions = _Completions(owner, raw)


class _Responses(_Resource):
    name = "responses"

    def create(self, **kwargs: Any) -> Any:
        """``responses.create``, recorded: a ``Response``, or with ``stream=True`` a
        ``RecordedStream`` (``SyncRecordedStream``) of the response's stream events."""
        return self._owner._call(RESPONSES, self._sdk("create"), kwargs, self._raw)

    def parse(self, **kwargs: Any) -> Any:
        """``responses.parse``, recorded as the ``create`` it makes (``text_format`` as the JSON
        schema sent in ``text.format``): a ``ParsedResponse``, ``output_parsed`` an instance of
        ``text_format`` (a pydantic model)."""
        sent = as_responses_parse_create(kwargs)
        parser = responses_parser(sent, kwargs.get("text_format", openai.omit))
        return self._owner._call(RESPONSES, self._sdk("create"), sent, self._raw, parser)


class _Embeddings(_Resource):
    name = "embeddings"

    def create(self, **kwargs: Any) -> Any:
        """``embeddings.create``, recorded as a model step (its prompt tokens charged to the run's
        budgets): a ``CreateEmbeddingResponse``."""
        return self._owner._call(EMBEDDINGS, self._sdk("create"), kwargs, self._raw)


class _Models(_Resource):
    name = "models"

    def list(self) -> Any:
        """``models.list``, recorded as a read tool step ``openai.models.list``: awaited (async) a
        page with ``data``; iterable (``async for`` / ``for``) as the SDK's."""
        return self._owner._read("models.list", {}, self._sdk("list"), models_page)

    def retrieve(self, model: str, **kwargs: Any) -> Any:
        """``models.retrieve``, recorded as a read tool step ``openai.models.retrieve``: a ``Model``."""
        fetch = functools.partial(self._sdk("retrieve"), model, **kwargs)
        return self._owner._read("models.retrieve", {"model": model}, fetch, lambda got: Model.construct(**got))

    @property
    def with_raw_response(self) -> Any:
        raise NotRecordedError(f"{self._path}.with_raw_response")


class _RawClient(Surface):
    """``client.with_raw_response``: the recorded resources, each call returning a ``RecordedRawResponse``."""

    def __init__(self, owner: _Owner) -> None:
        self._path = f"{owner._path}.with_raw_response"
        self.chat = _Chat(owner, raw=True)
        self.responses = _Responses(owner, raw=True)
        self.embeddings = _Embeddings(owner, raw=True)


@overload
def recorded(client: openai.AsyncOpenAI, run: Run) -> RecordedOpenAI: ...
@overload
def recorded(client: openai.OpenAI, run: SyncRun) -> SyncRecordedOpenAI: ...
def recorded(client: openai.AsyncOpenAI | openai.OpenAI, run: Run | SyncRun) -> RecordedOpenAI | SyncRecordedOpenAI:
    """``client`` with its calls recorded as steps of ``run`` (whose model adapter must be
    ``OpenAIModel``): an ``openai.AsyncOpenAI`` with the ``Run`` of async agent code, an
    ``openai.OpenAI`` with the ``SyncRun`` of a ``sync_agent``. What is recorded: ``RecordedOpenAI``.

    Raises ``ConfigurationError`` for another client, or a client and run that do not go together."""
    if isinstance(client, openai.OpenAI):
        return SyncRecordedOpenAI(client, run)  # type: ignore[arg-type]  # checked there, with the fix in the message
    return RecordedOpenAI(client, run)  # type: ignore[arg-type]
