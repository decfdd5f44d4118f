"""Model adapters behind one interface.

``ModelAdapter.complete(messages, **params) -> ModelResponse``. Two adapters ship:
``OpenAIChatModel`` (any OpenAI-compatible /chat/completions endpoint, what users
point at their provider) and ``ScriptedModel`` (deterministic, for tests, examples
and this machine, where no model service is reachable).

``OpenAIChatModel`` speaks through the ``openai`` package, imported only when one is made, so the
core installs without it. Rejected for it:

- ``chat.completions.create``: its keyword signature refuses the provider-specific parameters this
  adapter has always passed through (vLLM's ``top_k``, Ollama's ``options``), and its lenient
  parsing turns a body that is not a chat completion into an object of ``None`` fields instead of an
  error. The SDK's own generic ``post`` sends the body as given (with the SDK's transport, timeouts
  and error types) and returns the raw reply, which ``parse`` checks.
- ``openai.AsyncOpenAI``: its connection pool belongs to the event loop that opened it, while an
  adapter outlives loops (``run_sync`` starts one per run); a client per call would pay the SSL
  setup every time (~55 ms measured here) and lose keep-alive. One blocking client, called from a
  worker thread, serves every loop and keeps its connections.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from runledger.cpu import in_thread
from runledger.errors import ModelError
from runledger.extras import require_extra
from runledger.record.payloads import Server
from runledger.sdk.retry import Retry

if TYPE_CHECKING:
    import openai

# Rate limits and server-side failures: a later attempt may succeed. 4xx otherwise will not.
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
DEFAULT_RETRY = Retry(attempts=4, backoff_s=1.0, max_backoff_s=20.0, deadline_s=120.0)


class ModelResponse(BaseModel):
    """What a model call answered. ``finish_reason`` is the adapter's (``stop`` when it fills one
    in); ``model_finish_reason`` the model's own as the provider gave it (OpenAI's ``finish_reason``,
    Anthropic's ``stop_reason``...), recorded beside it when the adapter saw one. ``server``: where
    the adapter sent the call (``server_of(url)``), recorded on the step's event (``model.called``'s
    ``server``), not in the response an agent gets back."""

    model_config = ConfigDict(frozen=True)
    content: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str = "stop"
    input_tokens: int = 0
    output_tokens: int = 0
    model_finish_reason: str | None = None
    server: Server | None = None


_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def server_of(url: Any) -> Server | None:
    """The host and port of ``url`` (``server.address`` / ``server.port``), the scheme's default
    port when it names none; None for what is not a URL with a host. Never the path, the query or
    credentials: ``https://user:key@api.example.com/v1?k=1`` is ``api.example.com`` and 443."""
    try:
        parts = urlsplit(str(url))
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is no number
        return None
    if not host:
        return None
    return Server(address=host, port=port if port is not None else _DEFAULT_PORTS.get(parts.scheme.lower()))


class ModelAdapter(Protocol):
    """What a model adapter is: a name (part of the version tuple) and ``complete``. An adapter
    may also have a ``retry`` attribute (a ``Retry``): failed calls it retries are recorded
    attempt by attempt (runledger.sdk.retry). Raise ``ModelError(retryable=True)`` for failures a
    later attempt may cure."""

    name: str

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse: ...


def _count_tokens(text: str) -> int:
    # A rough, deterministic estimate (about 4 characters a token) for the scripted model.
    return max(1, len(text) // 4)


class ScriptedModel:
    """Answers from a script: a list of replies consumed in order, or a function of the messages.

    A reply is a string (content) or a ModelResponse. Token usage is estimated from
    the text so budgets behave as with a real model.
    """

    def __init__(
        self,
        script: Sequence[str | ModelResponse] | Callable[[list[dict[str, Any]]], str | ModelResponse],
        name: str = "scripted-1",
        retry: Retry | None = None,
    ) -> None:
        self.name = name
        self.retry = retry
        self._script = script
        self._position = 0

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        if callable(self._script):
            reply = self._script(messages)
        else:
            if self._position >= len(self._script):
                raise ModelError(f"scripted model {self.name} ran out of replies after {self._position}")
            reply = self._script[self._position]
            self._position += 1
        if isinstance(reply, ModelResponse):
            return reply
        prompt = "".join(str(m.get("content", "")) for m in messages)
        return ModelResponse(content=reply, input_tokens=_count_tokens(prompt), output_tokens=_count_tokens(reply))


class OpenAIChatModel:
    """An OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, LiteLLM, ...), through
    the ``openai`` package (``pip install 'runledger[openai]'``; without it the first call raises
    ``MissingExtraError`` naming the extra). The constructor needs no extra: a spec naming this
    adapter is also loaded where the model is never called, as in a re-run's sandbox, whose image
    holds the core only and whose model calls the host makes.

    The request is the model, the messages and every parameter as given (provider-specific ones
    included), posted to ``{base_url}/chat/completions``. The API key is read from the environment
    variable named by ``api_key_env`` at each call, where the call runs, and sent as that request's
    ``Authorization`` header (none when the variable is unset): it is never part of the record, nor
    of the adapter. The SDK's own environment (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
    ``OPENAI_ORG_ID``, ``OPENAI_PROJECT_ID``) is not used: the arguments alone say where the call goes
    and what it carries. Retries are ``retry``'s (HTTP 408/409/429/5xx, timeouts, broken connections;
    each attempt recorded, runledger.sdk.retry); the SDK's own are off, so there is one policy.

    Raises ``ModelError``: ``retryable`` for those failures, final for another status or a reply
    that is not a chat completion.
    """

    def __init__(
        self,
        model: str,
        base_url: str = "https://api.openai.com/v1",
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        retry: Retry | None = DEFAULT_RETRY,
    ) -> None:
        self.name = model
        self.retry = retry
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self._sdk: openai.OpenAI | None = None
        self._sdk_lock = threading.Lock()

    def request_body(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        return {"model": self.name, "messages": messages, **params}

    @staticmethod
    def parse(body: dict[str, Any]) -> ModelResponse:
        try:
            choice = body["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError) as exc:
            raise ModelError(f"unexpected chat-completions response: {str(body)[:300]}") from exc
        usage = body.get("usage") or {}
        tool_calls = message.get("tool_calls") or []
        return ModelResponse(
            content=message.get("content") or "",
            tool_calls=tool_calls,
            # No reason given: a reply that asks for tools is a tool-call turn, not "stop".
            finish_reason=choice.get("finish_reason") or ("tool_calls" if tool_calls else "stop"),
            input_tokens=int(usage.get("prompt_tokens", 0)),
            output_tokens=int(usage.get("completion_tokens", 0)),
            model_finish_reason=choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None,
        )

    def _client(self) -> openai.OpenAI:
        with self._sdk_lock:  # calls run in worker threads: one client for all of them
            if self._sdk is None:
                require_extra("openai", "OpenAIChatModel")
                import openai

                # The key travels per request (read at call time), so the client holds a placeholder:
                # it must hold something, or the SDK refuses to start without OPENAI_API_KEY set.
                self._sdk = openai.OpenAI(
                    api_key="unused", base_url=self.base_url, timeout=self.timeout_s, max_retries=0
                )
            return self._sdk

    def _post(self, body: dict[str, Any]) -> Any:
        client = self._client()  # first: without the extra, MissingExtraError names it
        import httpx
        import openai
        from openai._types import Omit  # exported as openai.Omit only by later releases than the 1.50 allowed

        key = os.environ.get(self.api_key_env)
        headers: dict[str, str | Omit] = {
            # Omit() removes the header the client would send with its placeholder: no key, no header.
            "Authorization": f"Bearer {key}" if key else Omit(),
            # The SDK adds these from OPENAI_ORG_ID / OPENAI_PROJECT_ID; this adapter is configured by
            # its arguments alone, and the endpoint may not be OpenAI's.
            "OpenAI-Organization": Omit(),
            "OpenAI-Project": Omit(),
        }
        try:
            reply = client.post("/chat/completions", cast_to=httpx.Response, body=body, options={"headers": headers})
        except openai.APIStatusError as exc:
            raise ModelError(
                f"{self.base_url} answered HTTP {exc.status_code}: {exc.response.text[:300]}",
                retryable=exc.status_code in RETRYABLE_STATUS,
                status=exc.status_code,
            ) from exc
        except openai.APITimeoutError as exc:
            raise ModelError(f"{self.base_url} timed out (timeout_s={self.timeout_s:g})", retryable=True) from exc
        except openai.APIConnectionError as exc:
            # Refused, reset, or a reply cut short mid-body (the SDK wraps httpx's error): the connection
            # broke before or during the answer, and a later attempt may get through.
            cause = exc.__cause__ or exc
            raise ModelError(f"{self.base_url} could not be reached or broke off: {cause!r}", retryable=True) from exc
        except openai.OpenAIError as exc:
            raise ModelError(f"{self.base_url}: the openai SDK refused the call: {exc}") from exc
        try:
            return json.loads(reply.content)
        except ValueError as exc:
            raise ModelError(f"{self.base_url} answered with a body that is not JSON: {exc}") from exc

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        # The blocking client in a worker thread: see the module's note for the async one rejected.
        body = await in_thread(self._post, self.request_body(messages, **params))
        return self.parse(body).model_copy(update={"server": server_of(self.base_url)})
