"""LangGraph's values in the record: JSON the protection path can read, and a list channel recorded as its tail.

``typed_to_record`` / ``record_to_typed`` turn the serializer's typed bytes into a JSON value and back,
losslessly; ``tail_record`` / ``splice_tail`` record a growing list channel as the elements after its
parent checkpoint's. Used by the saver (runledger.integrations.langgraph) and by re-runs of a thread
(runledger.integrations.langgraph_rerun).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runledger import require_extra

require_extra("langgraph", "runledger.integrations.langgraph")

import ormsgpack  # noqa: E402 (after the extra's check: the one line that installs it, not an ImportError)

# The agent a thread's run is recorded under unless the saver is given one.
DEFAULT_AGENT = "langgraph"
# LangGraph's names for a Command's writes (langgraph._internal._constants, not exported): the
# task id of writes that belong to no task, and the channel of a resume value; and the channel of
# a graph's input.
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
RESUME = "__resume__"
START_CHANNEL = "__start__"

Typed = tuple[str, bytes]


# -- values as JSON the protection path can read ------------------------------------------------------------------
#
# LangGraph's serializer turns a value into typed bytes (mostly msgpack with extension types for
# messages, pydantic models, datetimes...). Recorded as they are, they would be opaque to the
# redactor; base64 of msgpack hides an API key as well as encryption does. So msgpack is transcoded
# into a JSON tree with the same information (strings stay strings and a dict's keys stay keys,
# which the detectors read) and back into msgpack that the serializer loads as the same value.
# Markers are objects whose first key starts with "$". Canonical JSON sorts keys and a dict's order
# is part of its value, so a dict whose keys are not in the order canonical JSON gives them back (in
# either chain format: ``_in_canonical_order``) is recorded as {"$dict": ..., "$order": [keys]}; one
# with keys that are not strings, or that could be mistaken for a marker, as {"$map": [[key, value], ...]}.

_INT64 = 2**63


@dataclass(frozen=True)
class _Ext:
    code: int
    value: Any


def _ext_hook(code: int, data: bytes) -> _Ext:
    return _Ext(code, ormsgpack.unpackb(data, ext_hook=_ext_hook, option=ormsgpack.OPT_NON_STR_KEYS))


def _to_tree(value: Any) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if -_INT64 <= value < _INT64 else {"$int": str(value)}
    if isinstance(value, float):
        return value if math.isfinite(value) and not value.is_integer() else {"$float": repr(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, (list, tuple)):
        return [_to_tree(v) for v in value]
    if isinstance(value, dict):
        keys = list(value)
        if not all(isinstance(k, str) and not k.startswith("$") for k in keys):
            return {"$map": [[_to_tree(k), _to_tree(v)] for k, v in value.items()]}
        plain = {k: _to_tree(v) for k, v in value.items()}
        return plain if _in_canonical_order(keys) else {"$dict": plain, "$order": keys}
    if isinstance(value, _Ext):
        return {"$ext": value.code, "value": _to_tree(value.value)}
    raise TypeError(f"cannot record a msgpack value of type {type(value).__name__}")


def _in_canonical_order(keys: list[str]) -> bool:
    """Whether canonical JSON gives ``keys`` back in this order, whatever the run's chain format: JCS
    sorts names by their UTF-16 code units, the legacy form by code point; the two differ only for
    a name beyond U+FFFF (a surrogate pair sorts below U+E000..U+FFFF)."""
    if keys != sorted(keys):
        return False
    return all(k.isascii() for k in keys) or keys == sorted(keys, key=lambda k: k.encode("utf-16-be"))


def _from_tree(tree: Any) -> Any:
    if isinstance(tree, list):
        return [_from_tree(v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "$ext" in tree:
        inner = ormsgpack.packb(_from_tree(tree["value"]), option=ormsgpack.OPT_NON_STR_KEYS)
        return ormsgpack.Ext(int(tree["$ext"]), inner)
    if "$dict" in tree:
        plain = tree["$dict"]
        order = [k for k in tree.get("$order") or [] if isinstance(k, str) and k in plain]
        return {k: _from_tree(plain[k]) for k in [*order, *(k for k in plain if k not in order)]}
    if "$map" in tree:
        return {_hashable(_from_tree(k)): _from_tree(v) for k, v in tree["$map"]}
    try:
        if "$int" in tree:
            return int(tree["$int"])
        if "$float" in tree:
            return float(tree["$float"])
        if "$bytes" in tree:
            return base64.b64decode(tree["$bytes"], validate=True)
    except ValueError:
        return next(iter(tree.values()))  # redacted in the record: the token stands for the value
    return {k: _from_tree(v) for k, v in tree.items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def typed_to_record(typed: Typed) -> dict[str, Any]:
    """LangGraph's typed bytes as a JSON value (``{"type", "value"}``, or ``{"type", "b64"}`` for
    encodings other than msgpack), losslessly: ``record_to_typed`` gives bytes that load as the same."""
    kind, data = typed
    if kind == "null":
        return {"type": "null"}
    if kind == "msgpack":
        raw = ormsgpack.unpackb(data, ext_hook=_ext_hook, option=ormsgpack.OPT_NON_STR_KEYS)
        return {"type": "msgpack", "value": _to_tree(raw)}
    return {"type": kind, "b64": base64.b64encode(data).decode()}


def record_to_typed(record: Mapping[str, Any]) -> Typed:
    """The inverse of ``typed_to_record``."""
    kind = str(record["type"])
    if kind == "null":
        return "null", b""
    if kind == "msgpack":
        return "msgpack", ormsgpack.packb(_from_tree(record["value"]), option=ormsgpack.OPT_NON_STR_KEYS)
    return kind, base64.b64decode(record["b64"])


# -- a list channel recorded as its tail ------------------------------------------------------------------------
#
# A checkpoint records each channel whose version changed, and ``messages`` changes at every step
# holding the whole list: recorded whole, each checkpoint costs (redaction, sealing, the JSON tree,
# canonical JSON) as much as the thread is long. So a value whose msgpack is an array that begins
# with the exact bytes of the channel's value in the parent checkpoint is recorded as its tail:
# ``{"type": "msgpack+tail", "at": <the parent's element count>, "value": [the new elements]}``.
# The reader splices the bytes back: msgpack decodes an array element after element, so n
# elements with the same bytes are the same elements, and the value read is byte for byte the one
# written. The base is named by the event's ``parent_checkpoint_id`` and the parent's
# ``channel_versions``, both in the clear: a base version recorded as content was redacted (its
# random digits pass for a card number). The base is a value of the same run, so erasing the
# thread leaves no piece readable; a fork from a past checkpoint extends that checkpoint's list.
# Rejected: trusting the list objects' identity (a message mutated in place between two
# checkpoints would be recorded stale), and content-addressing each message (a digest per element
# to compute, store and look up, for a thread that only ever appends).
TAIL = "msgpack+tail"


def _array_header(count: int) -> bytes:
    if count < 16:
        return bytes([0x90 | count])
    if count < 2**16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _array(data: bytes) -> tuple[int, int] | None:
    """(element count, offset of the first element) when ``data`` is a msgpack array, else None."""
    if not data:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F, 1
    if first == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if first == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None


def tail_record(base: Typed, typed: Typed) -> dict[str, Any] | None:
    """``typed`` as the elements after ``base``'s (``{"type": "msgpack+tail", "at", "value"}``), or
    None unless both are msgpack arrays and ``typed``'s begins with every byte of ``base``'s."""
    if base[0] != "msgpack" or typed[0] != "msgpack":
        return None
    old, new = _array(base[1]), _array(typed[1])
    if old is None or new is None or old[0] == 0 or new[0] < old[0]:
        return None
    body = memoryview(base[1])[old[1] :]
    if not typed[1].startswith(body, new[1]):  # a memcmp (comparing memoryviews goes byte by byte)
        return None
    end = new[1] + len(body)
    tail = _array_header(new[0] - old[0]) + typed[1][end:]
    raw = ormsgpack.unpackb(tail, ext_hook=_ext_hook, option=ormsgpack.OPT_NON_STR_KEYS)
    return {"type": TAIL, "at": old[0], "value": _to_tree(raw)}


def splice_tail(base: Typed, record: Mapping[str, Any]) -> Typed:
    """The typed bytes a ``tail_record`` stands for, given its base's. Raises ValueError when
    ``base`` is not the msgpack array of ``record["at"]`` elements it extended."""
    old = _array(base[1]) if base[0] == "msgpack" else None
    tail = ormsgpack.packb(_from_tree(record["value"]), option=ormsgpack.OPT_NON_STR_KEYS)
    new = _array(tail)
    if old is None or new is None or old[0] != record.get("at"):
        found = f"has {old[0]} elements" if old is not None else "is not a list"
        raise ValueError(f"its tail extends a list of {record.get('at')!r} elements, the parent's value {found}")
    return "msgpack", _array_header(old[0] + new[0]) + base[1][old[1] :] + tail[new[1] :]


__all__ = [
    "DEFAULT_AGENT",
    "NULL_TASK_ID",
    "RESUME",
    "START_CHANNEL",
    "TAIL",
    "Typed",
    "record_to_typed",
    "splice_tail",
    "tail_record",
    "typed_to_record",
]
