"""The response cache of a sweep: identical live model requests answered once.

``runledger rerun --where ... --cache-responses`` (opt-in) hands every re-run of the sweep (every
candidate of a matrix too) one ``ResponseCache``. A branch's live model calls are made on the host
(runledger.sandbox.branch), through ``CachedModel``: a request (the model's name, the messages, the
parameters) whose digest (``runledger.record.canonical.digest``) the cache holds is answered from it,
any other is sent to the model and its response kept. The branch records the response either way, as a
model step like any other. The cache counts the calls really made (``calls``) and those served from
it (``hits``); the sweep's report shows both (text, ``--json``, JUnit properties).

It lives as long as its holder: one CLI invocation, or a ``ResponseCache`` an API caller passes to
several sweeps (a second identical sweep then calls the model not once). It is never written to disk:
a model's responses are run content the ledger seals under its data policy, and a cache file would
keep them in the clear. Two identical requests in flight at once may both reach the model (the second
does not wait for the first).

``--samples`` and the cache do not go together: samples must draw fresh from the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runledger.record.canonical import digest
from runledger.sdk.models import ModelAdapter, ModelResponse


@dataclass
class ResponseCache:
    """Responses by request digest, and how many calls were made and served."""

    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: int = 0  # requests sent to the model
    hits: int = 0  # requests answered from the cache

    def wrap(self, model: ModelAdapter) -> CachedModel:
        return CachedModel(model, self)


class CachedModel:
    """``model`` answered from ``cache`` when it holds the request (module docstring)."""

    def __init__(self, model: ModelAdapter, cache: ResponseCache) -> None:
        self._model, self._cache = model, cache
        self.name = model.name

    def __getattr__(self, attr: str) -> Any:  # response_type, retry...: the model's own
        return getattr(self._model, attr)

    async def complete(self, messages: list[dict[str, Any]], **params: Any) -> ModelResponse:
        key = digest({"model": self.name, "messages": messages, "params": params})
        response_type = getattr(self._model, "response_type", ModelResponse)
        kept = self._cache.responses.get(key)
        if kept is not None:
            self._cache.hits += 1
            return response_type.model_validate(kept)
        response = await self._model.complete(messages, **params)
        self._cache.calls += 1
        self._cache.responses[key] = response.model_dump(mode="json")
        return response
