"""Redaction off the event loop: values holding much text are redacted in a worker thread.

Redaction is linear but a 20 MiB tool output still takes a second or two: in the loop it would
stall every other run of the process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from runledger.cpu import in_thread

# Values holding this much text are redacted in a worker thread (``off_loop``).
OFFLOAD_MIN_CHARS = 64 * 1024
_T = TypeVar("_T")


def text_size(value: Any, limit: int = OFFLOAD_MIN_CHARS) -> int:
    """How many characters of text ``value`` (JSON-native) holds in its strings, counting stopped at ``limit``."""
    if isinstance(value, str):
        return len(value)
    if not isinstance(value, dict | list):
        return 0  # a number, a boolean, None
    total = 0
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        for item in node.values() if type(node) is dict else node:
            kind = type(item)
            if kind is str:
                total += len(item)
                if total >= limit:
                    return total
            elif kind is dict or kind is list or isinstance(item, dict | list):
                stack.append(item)
            elif isinstance(item, str):
                total += len(item)
    return total


async def off_loop(value: Any, fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)``, in a worker thread when ``value`` (what ``fn`` will redact) holds
    ``OFFLOAD_MIN_CHARS`` of text or more, so that the event loop goes on meanwhile; else here.

    Redaction is linear but a 20 MiB tool output still takes a second or two: in the loop it would
    stall every other run of the process. The detectors scan in windows (``WINDOW_CHARS``), so the
    worker gives the GIL back every few milliseconds."""
    if text_size(value, OFFLOAD_MIN_CHARS) < OFFLOAD_MIN_CHARS:
        return fn(*args)
    return await in_thread(fn, *args)  # (its CPU charged to a metered re-run: runledger.cpu)
