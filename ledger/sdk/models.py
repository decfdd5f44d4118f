"""Model adapters behind one interface.

``ModelAdapter.complete(messages, **params) -> ModelResponse``. Two adapters ship:
``OpenAIChatModel`` (any OpenAI-compatible /chat/completions endpoint, what users
point at their provider) and ``ScriptedModel`` (deterministic, for tests, examples
and this machine, where no model service is reachable).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from runledger.errors import ModelError
from runledger.sdk.retry import Retry

# Rate limits and server-side failures: a later attempt may succeed. 4xx otherwise will not.
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
DEFAULT_RETRY = Retry(attempts=4, backoff_s=1.0, max_backoff_s=20.0, deadline_s=120.0)


class ModelResponse(BaseModel):
    model_config = ConfigDict(frozen=True)
    content: str = ""
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str = "stop"
    input_tokens: int = 0
    output_tokens: int = 0


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
    """An OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, LiteLLM, ...).

    The API key is read from the environment variable named by ``api_key_env`` where
    the call runs, so it is never part of the record.
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
        return ModelResponse(
            content=message.get("content") or "",
            tool_calls=message.get("tool_calls") or [],
            finish_reason=choice.get("finish_reason") or "stop",
            input_tokens=int(usage.get("prompt_tokens", 0)),
            output_tokens=int(usage.get("completion_tokens", 0)),
        )

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(
            f"{self.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                result: dict[str, Any] = json.loads(resp.read())
                return result
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            raise ModelError(
                f"{self.base_url} answered HTTP {exc.code}: {detail}",
                retryable=exc.code in RETRYABLE_STATUS,
                status=exc.code,
            ) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise ModelError(f"{self.base_url} could not be reached: {exc}", retryable=True) from exc
        except http.client.HTTPException as exc:
            # A reply cut short (IncompleteRead) or garbled at the HTTP level: the connection broke
            # mid-answer, as retryable as one that broke before it.
            raise ModelError(f"{self.base_url} broke off its answer: {exc!r}", retryable=True) from exc
        except ValueError as exc:  # a body that is not JSON
            raise ModelError(f"{self.base_url} answered with a body that is not JSON: {exc}") from exc

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        body = await asyncio.to_thread(self._post, self.request_body(messages, **params))
        return self.parse(body)
