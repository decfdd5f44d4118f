"""Tools declared once: name, function, effect class, idempotency key and reconcile.

A ``read`` tool is recorded as ``tool.called`` and re-run freely; ``write`` and
``irreversible`` tools go through the effect ledger with the key their ``key``
function builds from the business identity in the arguments (never from a hash
of model-generated text, which changes on retry).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from runledger.record.canonical import digest

EffectClass = Literal["read", "write", "irreversible"]
ToolFn = Callable[..., Any]
KeyFn = Callable[[Any], str]
ReconcileFn = Callable[[str], Any]  # returns the result if the effect happened, NOT_FOUND otherwise


class _NotFound:
    def __repr__(self) -> str:
        return "NOT_FOUND"


NOT_FOUND: Any = _NotFound()
"""What a reconcile function returns when the external system has no trace of the effect."""


@dataclass(frozen=True)
class Tool:
    name: str
    fn: ToolFn
    effect_class: EffectClass = "read"
    key: KeyFn | None = None
    reconcile: ReconcileFn | None = None
    schema: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.effect_class != "read" and self.key is None:
            raise ValueError(f"tool {self.name!r} is {self.effect_class}: it needs a key function")

    @property
    def schema_hash(self) -> str:
        return digest({"name": self.name, "effect_class": self.effect_class, "schema": self.schema})


async def call_maybe_async(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a sync or async function; sync ones run inline (they are the agent's own code)."""
    result = fn(*args)
    if inspect.isawaitable(result):
        return await result
    return result


def tool(
    name: str | None = None,
    *,
    effect: EffectClass = "read",
    key: KeyFn | None = None,
    reconcile: ReconcileFn | None = None,
    schema: dict[str, Any] | None = None,
) -> Callable[[ToolFn], Tool]:
    """Decorator: ``@tool(effect="write", key=lambda a: f"refund:{a['order']}")``."""

    def wrap(fn: ToolFn) -> Tool:
        return Tool(name or fn.__name__, fn, effect, key, reconcile, schema or {})

    return wrap
