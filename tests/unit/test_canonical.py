"""Canonical JSON: both chain formats, the RFC 8785 number layout, and the fast path against the slow one."""

from __future__ import annotations

import json
import math
import random
import struct

import pytest

from runledger.record.canonical import (
    CHAIN_FORMAT,
    _jcs_slow,
    as_recorded,
    canonical_json,
    digest,
    es6_number,
    jcs,
    read_back,
    recorded_chain_format,
)


def slow(value: object) -> bytes:
    return "".join(_jcs_slow(value, [])).encode()


def test_both_formats_and_what_the_python_sdk_records() -> None:
    value = {"b": 1.0, "a": [1e-7, "é"], "\U0001f600": 0, "\ufb33": 1}
    assert CHAIN_FORMAT == 2
    assert (
        canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    )
    assert canonical_json(value, 2) == '{"a":[1e-7,"\u00e9"],"b":1,"\U0001f600":0,"\ufb33":1}'.encode()
    assert digest(value) != digest(value, 2)
    assert recorded_chain_format(1) is None and recorded_chain_format(2) == 2
    with pytest.raises(ValueError, match="unknown chain format"):
        canonical_json(value, 3)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {"x": [math.nan]}])
def test_nan_and_infinity_are_refused_in_both_formats(bad: object) -> None:
    for fmt in (1, 2):
        with pytest.raises(ValueError):
            canonical_json(bad, fmt)


def test_fast_path_equals_the_serializer_on_random_values() -> None:
    rng = random.Random(3)

    def value(depth: int) -> object:
        kind = rng.randrange(9 if depth < 4 else 6)
        if kind == 0:
            return rng.choice([None, True, False])
        if kind == 1:
            return rng.choice([0, -1, 2**53 - 1, 2**53 + 1, -(2**63), rng.randrange(-(10**6), 10**6)])
        if kind == 2:
            return struct.unpack(">d", rng.getrandbits(64).to_bytes(8, "big"))[0]
        if kind == 3:
            return rng.choice([0.0, -0.0, 1.0, 0.5, 1e-5, 1e-4, 2.0**53, 1e21, 12.25, 3e-7])
        if kind in (4, 5):
            return "".join(
                rng.choice(["a", "é", "\x00", '"', "\\", "\U0001f600", "\ufb33", "\u2028"]) for _ in range(3)
            )
        if kind in (6, 7):
            keys = ["".join(rng.choice(["a", "B", "\ue000", "\U00010000", "1"]) for _ in range(2)) for _ in range(4)]
            return {k: value(depth + 1) for k in keys}
        return [value(depth + 1) for _ in range(rng.randrange(4))]

    legacy = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for _ in range(3000):
        v = value(0)
        try:
            # The legacy format is exactly the standard library's encoder (built once, not per call).
            assert canonical_json(v, 1) == legacy.encode(v).encode("utf-8"), v
        except ValueError:
            with pytest.raises(ValueError):
                legacy.encode(v)
        try:
            expected = slow(v)
        except ValueError:
            with pytest.raises(ValueError):
                jcs(v)
            continue
        assert jcs(v) == expected, v


def test_es6_layout_at_every_exponent() -> None:
    # ECMAScript switches to exponent form below 1e-6 and from 1e21 on; Python's repr at other points.
    cases = {1e-7: "1e-7", 1e-6: "0.000001", 1.5e-6: "0.0000015", 1e20: "100000000000000000000", 1e21: "1e+21",
             123e-20: "1.23e-18", 2.0**53: "9007199254740992", 2.0**60: "1152921504606847000", -0.0: "0"}  # fmt: skip
    for number, text in cases.items():
        assert es6_number(number) == text
        assert jcs(number).decode() == text


def test_what_an_agent_receives_live_is_what_the_record_returns() -> None:
    # In format 2 an integral float is written as an integer, so it comes back as one.
    assert as_recorded({"x": 1.0, "y": 0.5}, 2) == {"x": 1, "y": 0.5}
    assert type(as_recorded({"x": 1.0}, 2)["x"]) is int
    assert type(as_recorded({"x": 1.0})["x"]) is float


def test_a_double_written_as_digits_beyond_64_bits_reads_back_a_double() -> None:
    # JCS writes -9.223372036854776e18 as -9223372036854776000: an integer no 64-bit field holds
    # (LangGraph's msgpack refused the reply live). Read back, it is the double again, on every path.
    doubles = [-9.223372036854776e18, 2e19, -1e20, 9.999999999999999e20]
    assert jcs(doubles) == b"[-9223372036854776000,20000000000000000000,-100000000000000000000,999999999999999900000]"
    back = as_recorded({"x": doubles}, 2)["x"]
    assert back == doubles and [type(v) for v in back] == [float] * 4
    raw = jcs({"x": doubles})
    assert read_back(json.loads(raw), raw.decode()) == {"x": doubles}
    # Integers keep their type: within 64 bits, or digits no double has (2**64, exact), or 1e21 and beyond
    # (a double is written with an exponent there). Only the round integer a double shares reads as it.
    ints = [2**63, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 2**80, 10**21, 1234567890123456789]
    assert all(type(v) is int for v in as_recorded(ints, 2)) and as_recorded(ints, 2) == ints
    assert as_recorded([10**19, 2 * 10**19], 2) == [10**19, 2e19]
    # Each is read from the digits alone: the same value by the slow path and in a long string.
    assert read_back(["1" * 25, 2 * 10**19], b'["1111111111111111111111111",20000000000000000000]') == ["1" * 25, 2e19]
    assert jcs(as_recorded({"x": doubles}, 2)) == raw  # reading back never changes the record's bytes


def c_encoder(value: object) -> bytes:
    """What jcs wrote for a plain value before msgspec did: the standard library's C encoder."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def test_msgspec_writes_plain_values_as_the_c_encoder_did() -> None:
    # Every code point escapes alike (in names too), names sort by code point, and the floats jcs
    # hands to msgspec (non-integral, 1e-4 <= |x| < 2**53) print as repr.
    text = "".join(chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF)
    assert jcs(text) == c_encoder(text)
    names = {chr(cp): cp for cp in range(0, 0x10000, 7) if not 0xD800 <= cp <= 0xDFFF}
    assert jcs(names) == c_encoder(names)
    rng = random.Random(5)
    floats = [rng.choice((1, -1)) * 10 ** rng.uniform(-4, 15.95) for _ in range(20000)]
    floats = [x for x in floats + [round(x, 3) for x in floats] if not x.is_integer() and abs(x) >= 1e-4]
    assert jcs(floats) == c_encoder(floats)
    big = [2**63 - 1, -(2**63), 2**64 - 1, 10**30, -(10**30), 2**53 + 1]  # the last ones: the C encoder's
    assert jcs(big) == c_encoder(big)
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate: no UTF-8 for it, whichever encoder
        jcs({"x": "\ud800"})


def test_values_other_than_the_native_types_encode_as_they_always_did() -> None:
    import enum
    from collections import OrderedDict

    class Level(enum.IntEnum):
        HIGH = 3

    class Text(str):
        pass

    for value in ({"n": Level.HIGH}, OrderedDict(b=1, a=2), {"t": Text("x")}, ("a", 0.5), {"i": 10**400 // 10**390}):
        assert jcs(value) == c_encoder(value), value
    with pytest.raises(TypeError):
        jcs({1: "an integer name", "a": 0})  # the C encoder cannot sort mixed names: refused, as before
    with pytest.raises(TypeError):
        jcs({"x": object()})
