"""The OpenAI SDK's objects, rebuilt over what runledger.integrations.openai recorded.

What the wrapper hands an agent, live and on resume alike, built from a step's recorded JSON the
way the SDK builds it from the wire: the chunks of a chat stream and the events of a responses
stream synthesised from a recorded response (and a live chat stream assembled into one), the event
stream of ``chat.completions.stream()`` (``RecordedChatCompletionStream``: the SDK's own
``ChatCompletionStreamState`` fed with the step's chunks, so its events, snapshot and parsed final
completion are the SDK's), the raw response of ``with_raw_response`` (``RecordedRawResponse``: the
parsed object, the status and the recorded headers; no HTTP response, which a resume never had),
the page of ``models.list()``, and ``NotRecordedError``, what a part of the SDK that is not
recorded raises when it is reached through the wrapper.

Rejected: handing ``chat.completions.stream()`` callers the SDK's ``AsyncChatCompletionStream``
over a recorded stream (it reads ``raw_stream.response``, an httpx response a resume does not
have, and closes it); returning the live ``LegacyAPIResponse`` from ``with_raw_response`` (a resume
could not give the same object back, and what an agent received live must be what it receives on
resume).
"""

from __future__ import annotations

import functools
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

from runledger import require_extra

require_extra("openai", "runledger.integrations.openai_objects")

import httpx  # noqa: E402
import openai  # noqa: E402
from openai.lib._parsing import parse_chat_completion, type_to_response_format_param  # noqa: E402
from openai.lib._parsing._completions import validate_input_tools  # noqa: E402
from openai.lib._parsing._responses import parse_response, type_to_text_format_param  # noqa: E402
from openai.lib.streaming.chat import ChatCompletionStreamState  # noqa: E402
from openai.resources.responses.responses import _make_tools  # noqa: E402
from openai.types import Model  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402
from openai.types.responses import ResponseStreamEvent  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from runledger import ConfigurationError, ModelError  # noqa: E402

__all__ = [
    "COVERED",
    "NotRecordedError",
    "RecordedChatCompletionStream",
    "RecordedChatCompletionStreamManager",
    "RecordedPage",
    "RecordedRawResponse",
    "Surface",
    "SyncRecordedChatCompletionStream",
    "SyncRecordedChatCompletionStreamManager",
    "as_parse_create",
    "as_recorded_of",
    "as_responses_parse_create",
    "assembled_chat",
    "chat_chunks",
    "chat_parser",
    "kept_headers",
    "models_page",
    "page_request",
    "recorded_object",
    "response_events",
    "responses_parser",
    "unchanged",
]

T = TypeVar("T")

# What the wrapper records, as NotRecordedError lists it.
COVERED = (
    "chat.completions.create (stream=True too), chat.completions.parse, chat.completions.stream, "
    "responses.create (stream=True too), responses.parse, embeddings.create, models.list, models.retrieve, "
    "with_options/copy, and with_raw_response on each of these but the streams"
)


class NotRecordedError(ConfigurationError, AttributeError):
    """A part of the OpenAI SDK the recorded client does not record (``beta``, ``files``,
    ``audio``, ...). An ``AttributeError`` too, so ``hasattr`` and ``getattr(..., default)`` on the
    recorded client behave as on any object that lacks the attribute."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(
            f"{path} is not recorded by runledger.integrations.openai: a call through it would be no "
            f"step of the run, and a resume would make it again. Recorded: {COVERED}. Make this call "
            "with the unwrapped client (not recorded), or record it yourself as a step: "
            "run.tool('name', args, fn=...) for a read, run.effect(...) for a call that changes something"
        )


class Surface:
    """A part of the recorded client (``client``, ``client.chat``, ``client.chat.completions``, ...):
    an attribute it does not have is one the wrapper does not record, and says so by its path."""

    _path = "client"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # the interpreter's and the copy/pickle protocols' own lookups
            raise AttributeError(name)
        raise NotRecordedError(f"{self._path}.{name}")


def _given(value: Any) -> bool:
    return not isinstance(value, openai.NotGiven) and type(value).__name__ != "Omit"


def as_parse_create(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``chat.completions.parse``'s and ``stream``'s arguments as ``create`` takes them (checked as
    the SDK checks them): a ``response_format`` class as its JSON schema, which the SDK sends (and
    runledger records)."""
    validate_input_tools(kwargs.get("tools", openai.omit))
    if not _given(kwargs.get("response_format", openai.omit)):
        return dict(kwargs)
    return {**kwargs, "response_format": type_to_response_format_param(kwargs["response_format"])}


def chat_parser(kwargs: dict[str, Any]) -> Callable[[Any], Any]:
    """What ``chat.completions.parse`` makes of a completion: the SDK's ``ParsedChatCompletion``
    (``message.parsed`` an instance of ``response_format``, strict tools' ``parsed_arguments``),
    made by the SDK's own function from the recorded completion, live and on resume alike."""
    response_format, tools = kwargs.get("response_format", openai.omit), kwargs.get("tools", openai.omit)
    return lambda completion: parse_chat_completion(
        response_format=response_format, input_tools=tools, chat_completion=completion
    )


def as_responses_parse_create(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``responses.parse``'s arguments as ``responses.create`` takes them, converted as the SDK
    converts them: ``text_format`` as ``text.format`` (its JSON schema), pydantic function tools
    as Responses tools."""
    text_format = kwargs.get("text_format", openai.omit)
    sent = {k: v for k, v in kwargs.items() if k != "text_format"}
    if _given(text_format):
        text = dict(kwargs.get("text") or {})
        if "format" in text:
            raise TypeError("Cannot mix and match text.format with text_format")  # the SDK's own refusal
        sent["text"] = {**text, "format": type_to_text_format_param(text_format)}
    if _given(kwargs.get("tools", openai.omit)):
        sent["tools"] = _make_tools(kwargs["tools"])
    return sent


def responses_parser(sent: dict[str, Any], text_format: Any) -> Callable[[Any], Any]:
    """What ``responses.parse`` makes of a response: the SDK's ``ParsedResponse`` (``output_parsed``
    an instance of ``text_format``), made by the SDK's own function from the recorded response."""
    tools = sent.get("tools", openai.omit)
    return lambda response: parse_response(text_format=text_format, input_tools=tools, response=response)


# Response headers kept with a with_raw_response step: the ids and limits an agent reads, never
# cookies or anything else a server may set.
KEPT_HEADERS = frozenset({"x-request-id", "openai-processing-ms", "openai-version", "openai-model", "content-type"})


def kept_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k in KEPT_HEADERS or k.startswith("x-ratelimit-")}


class RecordedRawResponse(Generic[T]):
    """What ``with_raw_response.<call>`` returns, live and on resume: ``parse()`` gives the SDK's
    object (as the call without ``with_raw_response`` returns it), ``headers`` the recorded response
    headers (``x-request-id``, ``openai-*``, ``x-ratelimit-*``, ``content-type``; no others are
    recorded), ``status_code`` and ``request_id`` as the SDK's ``LegacyAPIResponse`` has them. No
    ``http_response``: a resume made no request."""

    def __init__(self, parsed: T, http: dict[str, Any] | None) -> None:
        self._parsed = parsed
        http = http or {}
        self.status_code: int = int(http.get("status", 200))
        self.headers = httpx.Headers(http.get("headers") or {})
        self.retries_taken = 0  # the SDK's own; runledger's retries are the step's recorded attempts

    @property
    def request_id(self) -> str | None:
        found: str | None = self.headers.get("x-request-id")
        return found

    def parse(self, *, to: type[Any] | None = None) -> T:
        if to is not None:
            raise ConfigurationError("RecordedRawResponse.parse(to=...) is not supported: parse() gives the object")
        return self._parsed

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotRecordedError(f"with_raw_response's response.{name}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecordedRawResponse):
            return NotImplemented
        return (self._parsed, self.status_code, dict(self.headers)) == (
            other._parsed, other.status_code, dict(other.headers)
        )  # fmt: skip

    __hash__ = None  # type: ignore[assignment]


class RecordedPage(Generic[T]):
    """What ``models.list()`` gives once awaited: ``data``, iterable (``for``/``async for``)."""

    def __init__(self, data: list[T]) -> None:
        self.data = data
        self.object = "list"

    def __iter__(self) -> Iterator[T]:
        return iter(self.data)

    async def __aiter__(self) -> AsyncIterator[T]:
        for item in self.data:
            yield item

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecordedPage) and self.data == other.data

    __hash__ = None  # type: ignore[assignment]


def unchanged(value: Any) -> Any:
    return value


def as_recorded_of(run: Any) -> Callable[[Any], Any]:
    """The run's ``as_recorded`` (a ``RecordedRun``'s, a ``SyncRun``'s); a run that records nothing
    itself (the sandbox guest's: its host makes the calls, and no live chunk reaches it) has none."""
    found: Callable[[Any], Any] = getattr(run, "as_recorded", unchanged)
    return found


def recorded_object(obj: T, as_recorded: Callable[[Any], Any]) -> T:
    """An SDK object (a live stream's chunk or event) as the record gives its JSON back (``as_recorded``:
    the run's canonical form), built again as the SDK builds one from the wire: what a caller receives
    of a live stream, as of every recorded response (keys in the record's order, in chain format 2 a
    whole-number float an integer where the SDK's type does not make it a float again)."""
    if not isinstance(obj, BaseModel):
        return obj
    data = as_recorded(obj.model_dump(mode="json", exclude_unset=True))
    rebuilt: T = type(obj).construct(**data)
    return rebuilt


def models_page(recorded: dict[str, Any]) -> RecordedPage[Model]:
    return RecordedPage([Model.construct(**m) for m in recorded.get("data") or []])


class _PageRequest(Generic[T]):
    """``models.list()`` of the async client: awaited, the page; iterated with ``async for``, its items."""

    def __init__(self, fetch: Callable[[], Awaitable[RecordedPage[T]]]) -> None:
        self._fetch = fetch

    def __await__(self) -> typing.Generator[Any, None, RecordedPage[T]]:
        return self._fetch().__await__()

    async def __aiter__(self) -> AsyncIterator[T]:
        for item in (await self._fetch()).data:
            yield item


def page_request(fetch: Callable[[], Awaitable[RecordedPage[T]]]) -> _PageRequest[T]:
    return _PageRequest(fetch)


class RecordedChatCompletionStream(Generic[T]):
    """What ``async with client.chat.completions.stream(...) as stream`` gives: the SDK's stream
    events (``chunk``, ``content.delta``, ``content.done``, ``tool_calls.function.arguments.*``,
    ...) made by the SDK's ``ChatCompletionStreamState`` from the step's chunks (live as they
    arrive, on resume synthesised from the record), ``get_final_completion()`` (a
    ``ParsedChatCompletion``, ``parsed`` filled from ``response_format``), ``until_done()``,
    ``current_completion_snapshot``, ``close()``."""

    def __init__(self, chunks: Any, state: ChatCompletionStreamState[Any]) -> None:
        self._chunks = chunks  # a RecordedStream of ChatCompletionChunk
        self._state = state
        self._iterator = self._events()

    async def _events(self) -> AsyncIterator[Any]:
        async for chunk in self._chunks:
            if chunk.object == "chat.completion.chunk":  # as the SDK's stream skips anything else
                for event in self._state.handle_chunk(chunk):
                    yield event

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterator

    async def __anext__(self) -> Any:
        return await self._iterator.__anext__()

    async def until_done(self) -> RecordedChatCompletionStream[T]:
        async for _ in self._iterator:
            pass
        return self

    async def get_final_completion(self) -> Any:
        await self.until_done()
        return self._state.get_final_completion()

    @property
    def current_completion_snapshot(self) -> Any:
        return self._state.current_completion_snapshot

    async def close(self) -> None:
        """Wait until the step is recorded (the rest of a live stream is still read and recorded)."""
        await self._chunks.close()

    async def __aenter__(self) -> RecordedChatCompletionStream[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RecordedChatCompletionStreamManager(Generic[T]):
    """What the async ``chat.completions.stream(...)`` returns: ``async with`` it for the stream.
    The step starts (and takes its number) when the ``async with`` is entered, as the SDK's request
    is made then."""

    def __init__(self, start: Callable[[], Awaitable[RecordedChatCompletionStream[T]]]) -> None:
        self._start = start
        self._stream: RecordedChatCompletionStream[T] | None = None

    async def __aenter__(self) -> RecordedChatCompletionStream[T]:
        self._stream = await self._start()
        return self._stream

    async def __aexit__(self, *exc: object) -> None:
        if self._stream is not None:
            await self._stream.close()


class SyncRecordedChatCompletionStream(Generic[T]):
    """The blocking client's ``RecordedChatCompletionStream``: ``with client.chat.completions.stream(...)
    as stream``, then ``for event in stream``, ``get_final_completion()``, ``until_done()``."""

    def __init__(self, chunks: Any, state: ChatCompletionStreamState[Any]) -> None:
        self._chunks = chunks  # a SyncRecordedStream of ChatCompletionChunk
        self._state = state
        self._iterator = self._events()

    def _events(self) -> Iterator[Any]:
        for chunk in self._chunks:
            if chunk.object == "chat.completion.chunk":
                yield from self._state.handle_chunk(chunk)

    def __iter__(self) -> Iterator[Any]:
        return self._iterator

    def __next__(self) -> Any:
        return next(self._iterator)

    def until_done(self) -> SyncRecordedChatCompletionStream[T]:
        for _ in self._iterator:
            pass
        return self

    def get_final_completion(self) -> Any:
        self.until_done()
        return self._state.get_final_completion()

    @property
    def current_completion_snapshot(self) -> Any:
        return self._state.current_completion_snapshot

    def close(self) -> None:
        self._chunks.close()

    def __enter__(self) -> SyncRecordedChatCompletionStream[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncRecordedChatCompletionStreamManager(Generic[T]):
    """What the blocking ``chat.completions.stream(...)`` returns: ``with`` it for the stream."""

    def __init__(self, start: Callable[[], SyncRecordedChatCompletionStream[T]]) -> None:
        self._start = start
        self._stream: SyncRecordedChatCompletionStream[T] | None = None

    def __enter__(self) -> SyncRecordedChatCompletionStream[T]:
        self._stream = self._start()
        return self._stream

    def __exit__(self, *exc: object) -> None:
        if self._stream is not None:
            self._stream.close()


# -- streams synthesised from a record, and assembled from a live one ---------------------------------


def assembled_chat(chunks: list[ChatCompletionChunk]) -> ChatCompletion:
    """The completion a live chat stream amounts to, as the SDK's own ``ChatCompletionStreamState``
    assembles it (what ``chat.completions.stream()`` gives as its final completion): the first chunk's
    fields (a compatible server's own included), each choice's message with its deltas accumulated
    (text, reasoning, tool calls, any field a server streams), its logprobs and finish reason, the
    last chunk's usage. Not what the state adds of its own: a tool call's ``index`` (a delta's, not a
    completion's), ``parsed`` and ``parsed_arguments`` (a parse of the recorded completion makes them)."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    handled = 0
    for chunk in chunks:
        if chunk.object == "chat.completion.chunk":  # as the SDK's stream skips anything else
            state.handle_chunk(chunk)
            handled += 1
    if not handled:
        raise ModelError("OpenAI /chat/completions stream ended without a chunk")
    body = state.current_completion_snapshot.model_dump(mode="json", exclude_unset=True)
    for choice in body.get("choices") or []:
        message = choice.get("message") or {}
        message.pop("parsed", None)
        for call in message.get("tool_calls") or []:
            call.pop("index", None)
            (call.get("function") or {}).pop("parsed_arguments", None)
    return ChatCompletion.construct(**body)


def chat_chunks(sdk: dict[str, Any]) -> list[ChatCompletionChunk]:
    """A stream that the SDK's ``ChatCompletionStreamState`` (and code that accumulates a stream)
    assembles to the recorded completion (``assembled_chat``'s inverse): every chunk with the
    completion's fields; per choice, its message whole in one delta (its text, reasoning, any field
    a server gave it) with the choice's own fields, each tool call in one chunk, then its finish
    reason and logprobs; the usage last."""
    head = {k: v for k, v in sdk.items() if k not in ("choices", "usage", "object")}
    head["object"] = "chat.completion.chunk"
    chunks: list[dict[str, Any]] = []
    for choice in sdk.get("choices") or []:
        message, index = dict(choice.get("message") or {}), choice.get("index", 0)
        calls = message.pop("tool_calls", None) or []
        own = {k: v for k, v in choice.items() if k not in ("message", "index", "finish_reason", "logprobs")}
        chunks.append({**head, "choices": [{**own, "index": index, "delta": message}]})
        for i, tc in enumerate(calls):
            chunks.append({**head, "choices": [{"index": index, "delta": {"tool_calls": [{"index": i, **tc}]}}]})
        end = {"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}
        if choice.get("logprobs") is not None:
            end["logprobs"] = choice["logprobs"]  # after the first chunk: the SDK's state adds them once
        chunks.append({**head, "choices": [end]})
    if sdk.get("usage") is not None:
        chunks.append({**head, "choices": [], "usage": sdk["usage"]})
    return [ChatCompletionChunk.construct(**c) for c in chunks]


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


def response_events(sdk: dict[str, Any]) -> list[ResponseStreamEvent]:
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
