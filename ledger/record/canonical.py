"""Canonical JSON and digests: the byte form every hash in runledger is computed over.

Two *chain formats* exist; a run records its own in ``run.started`` (``chain_format``; absent
means 1) and every hash and digest of that run uses it (docs/wire.md, "Canonical JSON"):

- **2, RFC 8785 (JCS)**, what new runs record: UTF-8, no insignificant white space, object
  members sorted by the UTF-16 code units of their names, strings escaped as JCS says, numbers
  written as ECMAScript writes a double (``1.0`` is ``1``, ``1e-7``, ``1e+21``, ``-0`` is ``0``).
  One extension, so that Python values JCS cannot hold still record: an integer beyond
  ±(2**53 - 1) is written as its exact decimal digits (JCS would round it to a double first). A
  writer whose numbers are doubles never meets it; for every other value the bytes are JCS's.
- **1, the legacy form** (runs recorded before chain formats existed): Python's
  ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``: keys sorted by code
  point, floats in Python's shortest ``repr`` (``1.0``, ``1e-07``).

Both refuse NaN and infinity. The bytes of the two differ only for floats (integral ones, those
below 1e-4, those of 2**53 and beyond) and for member names holding characters beyond U+FFFF.

``jcs`` is fast for the common case: one walk of the value finds whether the value is plain JCS
(no float outside the cases where ``repr`` and ECMAScript agree, no name beyond U+FFFF);
integral floats are turned into integers on a copy; anything else (rare) goes through the
pure-Python serializer ``_jcs_slow``. A plain value made only of the JSON-native types themselves
(``dict`` with ``str`` names, ``list``, ``tuple``, ``str``, ``int`` within 64 bits, ``bool``,
``None``, and floats written positionally) is written by msgspec's encoder with sorted names,
about ten times faster than the standard library's C encoder and byte for byte the same for
those values (every code point escapes alike, names sort by code point, such floats print as
``repr``: tests/unit/test_canonical.py compares both); anything else the walk met (a subclass, an
object, a bigger integer) goes to the C encoder, so every value encodes, and fails, as it always did.
Rejected: the ``rfc8785`` package alone (pure Python on every value, several times slower on the
hot path, and it refuses integers beyond 2**53 that agents' tools do return); post-processing the
encoder's output (a number cannot be told from digits inside a string without tokenizing it
again); msgspec for every value (it writes ``1e-7``, ``1e16`` and NaN as ``null``, where the legacy
form and JCS need ``1e-07``, ``1e+16`` and an error).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import math
import re
from collections.abc import Callable
from typing import Any, Literal

import msgspec
from pydantic_core import to_jsonable_python

ChainFormat = Literal[1, 2]
LEGACY_CHAIN_FORMAT: ChainFormat = 1
JCS_CHAIN_FORMAT: ChainFormat = 2
# What new runs record (run.started's chain_format). Every reader verifies both. Content a run seals
# or stores by reference is serialized in the run's format too (CONTENT_FORMAT, below),
# so a value the agent receives live equals its replay (a float 950.0 is 950 in both).
CHAIN_FORMAT: ChainFormat = JCS_CHAIN_FORMAT
# The chain format of the subject whose content is being sealed or stored by reference, while it is
# (set by runledger.log.publish.SubjectWriter around its transform; read by runledger.protect.capture).
CONTENT_FORMAT: contextvars.ContextVar[int] = contextvars.ContextVar("runledger_content_format", default=1)
CHAIN_FORMATS: dict[int, str] = {1: "legacy (Python json, sorted keys)", 2: "RFC 8785 (JCS)"}

_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _unserializable(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _c_encode() -> Callable[[Any], str]:
    """``_encoder.encode`` without its per-call set-up: ``JSONEncoder.iterencode`` builds a new C
    encoder (and a closure) at every call, a third of the time of encoding a small value. Same
    output (the same C encoder, built once with the same options); no circular-reference markers
    (shared markers would not be thread-safe; a cycle in a JSON-native value ends in RecursionError)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - an interpreter without the C accelerator
        return _encoder.encode
    c_encoder = make(None, _unserializable, json.encoder.encode_basestring, None, ":", ",", True, False, False)
    join = "".join

    def encode(value: Any) -> str:
        return join(c_encoder(value, 0))

    return encode


_encode = _c_encode()
# The same bytes as ``_encode`` for the values ``_walk`` finds native (module docstring).
_native_encode = msgspec.json.Encoder(order="sorted").encode
_encode_string = json.encoder.encode_basestring  # JSON string escaping as JCS has it: ", \, \b \f \n \r \t, \u00xx
_MAX_SAFE = 2**53
_REPR_LIKE_ES6 = 1e-4  # a non-integral float at least this large: Python's repr is ECMAScript's string


def recorded_chain_format(chain_format: int) -> int | None:
    """What ``run.started`` records for ``chain_format``: nothing for the legacy format (so such a
    run records exactly what it recorded before chain formats existed), else the number."""
    return None if chain_format == LEGACY_CHAIN_FORMAT else chain_format


def canonical_json(value: Any, chain_format: int = LEGACY_CHAIN_FORMAT) -> bytes:
    """The canonical bytes of a JSON-native value (dict, list, str, int, float, bool, None) in
    ``chain_format`` (1: legacy, 2: RFC 8785). Raises ValueError for NaN or infinity."""
    if chain_format == JCS_CHAIN_FORMAT:
        return jcs(value)
    if chain_format != LEGACY_CHAIN_FORMAT:
        raise ValueError(f"unknown chain format {chain_format!r} (known: {', '.join(map(str, CHAIN_FORMATS))})")
    return _encode(value).encode("utf-8")


def jcs(value: Any) -> bytes:
    """RFC 8785 canonical JSON of a JSON-native value (see the module docstring for its one extension)."""
    kind = _walk(value)
    if kind == _SLOW:
        return "".join(_jcs_slow(value, [])).encode("utf-8")
    if kind & _INTEGRAL_FLOATS:
        value = _integral_to_int(value)
    return _encode(value).encode("utf-8") if kind & _FOREIGN else _native_encode(value)


# What ``_walk`` finds: one of the first three, with _FOREIGN added when a plain value holds
# something other than the native types themselves (msgspec's bytes are proven for those only).
_PLAIN, _INTEGRAL_FLOATS, _SLOW, _FOREIGN = 0, 1, 2, 4
_MIN_NATIVE_INT, _MAX_NATIVE_INT = -(2**63), 2**64  # what msgspec writes as a 64-bit integer


def _walk(value: Any) -> int:
    """How ``value`` must be written: as the C encoder (or msgspec, for native values) writes it,
    after integral floats became integers, or by ``_jcs_slow``."""
    found = _PLAIN
    foreign = 0
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is str or item is None or kind is bool:
            pass
        elif kind is dict:
            for key, child in item.items():
                if type(key) is not str:
                    foreign = _FOREIGN
                elif not key.isascii() and max(key) > "\uffff":
                    return _SLOW  # UTF-16 order differs from code-point order only past U+FFFF
                push(child)
        elif kind is list or kind is tuple:
            extend(item)
        elif kind is int:
            if not _MIN_NATIVE_INT <= item < _MAX_NATIVE_INT:
                foreign = _FOREIGN
        elif kind is float:
            if item.is_integer():
                if abs(item) >= _MAX_SAFE:
                    return _SLOW
                found = _INTEGRAL_FLOATS
            elif not abs(item) >= _REPR_LIKE_ES6:  # also NaN (is_integer is False for it)
                return _SLOW
            elif not abs(item) < _MAX_SAFE:  # infinity: the C encoder refuses it, as it always did
                foreign = _FOREIGN
        else:
            foreign = _FOREIGN  # a subclass or another object: not walked, as before
    return found | foreign


def _integral_to_int(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {k: _integral_to_int(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [_integral_to_int(v) for v in value]
    if kind is float and value.is_integer():
        return int(value)
    return value


def _jcs_slow(value: Any, out: list[str]) -> list[str]:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_encode_string(value))
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(es6_number(value))
    elif isinstance(value, dict):
        out.append("{")
        for i, key in enumerate(sorted(value, key=_utf16_key)):
            if i:
                out.append(",")
            out.append(_encode_string(key))
            out.append(":")
            _jcs_slow(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _jcs_slow(item, out)
        out.append("]")
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
    return out


def _utf16_key(key: Any) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"keys must be str, not {type(key).__name__}")
    return key.encode("utf-16-be", "surrogatepass")


def es6_number(value: float) -> str:
    """The string ECMAScript's ``Number.prototype.toString`` gives a double (RFC 8785, 3.2.2.3).

    Python's ``repr`` already yields the shortest digits that read back as the same double, the
    closest when several do (what ECMAScript asks for); only the layout differs."""
    if not math.isfinite(value):
        raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
    if value == 0:
        return "0"  # -0 too
    text = repr(abs(value))
    mantissa, _, exp_text = text.partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    stripped = digits.lstrip("0")
    n = len(whole) + int(exp_text or 0) - (len(digits) - len(stripped))  # value = 0.<digits> * 10**n
    digits = stripped.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * -n + digits
    else:
        e = n - 1
        out = (digits[0] + ("." + digits[1:] if k > 1 else "")) + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return "-" + out if value < 0 else out


def jsonable(value: Any) -> Any:
    """Convert a Python value to its JSON-native form (tuples to lists, models to dicts...).

    The SDK hands this converted value back to the agent in live mode too, so a live
    run and its replay see exactly the same values.
    """
    try:
        return to_jsonable_python(value)
    except Exception as exc:  # pydantic_core raises PydanticSerializationError, a ValueError
        raise TypeError(f"value of type {type(value).__name__} cannot be recorded as JSON: {exc}") from exc


def as_recorded(value: Any, chain_format: int = LEGACY_CHAIN_FORMAT) -> Any:
    """``value`` as a replay will return it: through the canonical JSON the record keeps (keys
    sorted, numbers as JSON reads them back: in format 2 an integral float comes back an
    integer, one beyond 64 bits a float: ``read_back``). What an agent receives live goes through
    this, so code that serializes a result into its next prompt sends the same text live and on resume."""
    raw = canonical_json(value, chain_format)
    return read_back(json.loads(raw), raw)


# A run of 19 digits (a JSON integer below -2**63 has 19 after its minus sign, one of 2**64 and up 20): bytes
# with none hold no integer beyond 64 bits. Found by mapping every digit to "0" and everything else to a
# blank, then a substring search (both in C: under a microsecond for a kilobyte; a regular expression
# took 13).
_DIGIT_TO_ZERO = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_NINETEEN = b"0" * 19
_LONG_TEXT = re.compile(r"[0-9]{19}")
_ES6_DIGITS_BELOW = 10**21  # ECMAScript writes a double's digits below 1e21, an exponent from there


def read_back(value: Any, raw: bytes | bytearray | memoryview | str) -> Any:
    """``value``, just parsed from the record's bytes ``raw``, with the one reading rule every path
    back to an agent shares: a whole number beyond 64 bits whose digits are exactly those JCS writes
    for a double (``-9223372036854776000`` for ``-9.223372036854776e18``) reads back as that double.

    JCS writes every double below 1e21 without an exponent, so such a float reads back an integer
    no 64-bit field holds: msgpack (LangGraph's checkpoints), DuckDB's BIGINT and most frameworks
    refuse it where the float was fine. An integer the agent gave (the chain format's extension writes
    it exactly) keeps its type unless it is that same round number (``10**19``): the one value the
    bytes cannot tell apart, read as the double JSON numbers are. Within 64 bits nothing changes.
    Costs a scan of ``raw`` for a run of 19 digits; the value is walked only when it has one."""
    if isinstance(raw, str):
        if _LONG_TEXT.search(raw) is None:
            return value
    elif _NINETEEN not in bytes(raw).translate(_DIGIT_TO_ZERO):
        return value
    return _doubles(value)


def _doubles(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {k: _doubles(v) for k, v in value.items()}
    if kind is list:
        return [_doubles(v) for v in value]
    if kind is int and not _MIN_NATIVE_INT <= value < _MAX_NATIVE_INT and abs(value) < _ES6_DIGITS_BELOW:
        double = float(value)  # the nearest double: JCS wrote its shortest digits, padded with zeros
        if es6_number(double) == str(value):
            return double
    return value


def digest(value: Any, chain_format: int = LEGACY_CHAIN_FORMAT) -> str:
    """sha256 hex of the canonical JSON of ``value`` in ``chain_format``."""
    return encoded_digest(value, chain_format)[1]


def encoded_digest(value: Any, chain_format: int = LEGACY_CHAIN_FORMAT) -> tuple[bytes, str]:
    """The canonical JSON of ``value`` in ``chain_format`` and its ``digest``, encoding it once (a
    step records its arguments' digest and seals the same bytes: runledger.sdk.run)."""
    raw = canonical_json(value, chain_format)
    return raw, hashlib.sha256(raw).hexdigest()


def short_digest(text: str) -> str:
    """A 32-hex digest usable as a NATS subject token (idempotency keys, request ids): the first
    32 hex digits of sha256 of the UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
