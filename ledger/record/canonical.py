"""Canonical JSON and digests: the byte form every hash in runledger is computed over.

Canonical JSON is UTF-8, keys sorted, no insignificant white space, no NaN or
infinity. Any language can reproduce it (RFC 8785-like, minus number
normalisation: integers stay integers and floats use the shortest repr), so an
agent written in another language can publish events that hash the same.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic_core import to_jsonable_python

_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> bytes:
    """The canonical bytes of a JSON-native value (dict, list, str, int, float, bool, None)."""
    return _encoder.encode(value).encode("utf-8")


def jsonable(value: Any) -> Any:
    """Convert a Python value to its JSON-native form (tuples to lists, models to dicts...).

    The SDK hands this converted value back to the agent in live mode too, so a live
    run and its replay see exactly the same values.
    """
    try:
        return to_jsonable_python(value)
    except Exception as exc:  # pydantic_core raises PydanticSerializationError, a ValueError
        raise TypeError(f"value of type {type(value).__name__} cannot be recorded as JSON: {exc}") from exc


def as_recorded(value: Any) -> Any:
    """``value`` as a replay will return it: through the canonical JSON the record keeps (keys
    sorted, numbers as JSON reads them back). What an agent receives live goes through this, so
    code that serializes a result into its next prompt sends the same text live and on resume."""
    return json.loads(canonical_json(value))


def digest(value: Any) -> str:
    """sha256 hex of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def short_digest(text: str) -> str:
    """A 32-hex digest usable as a NATS subject token (idempotency keys, request ids)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
