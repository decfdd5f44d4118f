"""The projector's decoder answers exactly as ``decode`` does, and takes its fast path for real events."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from runledger.projections.decoder import _decode_proven, decode_record
from runledger.record.canonical import canonical_json
from runledger.record.events import PAYLOADS, ClockRead, decode
from tests.unit.helpers import Chain
from tests.unit.test_events import _hostile_corpus, _outcome, _rehashed
from tests.unit.test_pydantic_contract import SAMPLES


def _every_type() -> list[bytes]:
    """One canonical event of every registered type, in one hash chain."""
    chain = Chain()
    for type_ in sorted(PAYLOADS):
        chain.add(PAYLOADS[type_].model_validate(SAMPLES[type_]))
    return chain.raw


def _spliced_hash(raw: bytes) -> bytes:
    """``raw`` with a hash that matches its bytes as they are (what a hostile writer can publish)."""
    found = re.search(rb'"prev_hash":"([0-9a-f]{64})"', raw)  # raw need not be JSON
    assert found is not None
    at = raw.index(b'"hash":"')
    without = raw[:at] + raw[at + len(b'"hash":"') + 64 + 2 :]
    digest = hashlib.sha256(found.group(1))
    digest.update(without)
    return raw[: at + 8] + digest.hexdigest().encode() + raw[at + 8 + 64 :]


def _more_hostile() -> list[bytes]:
    """Inputs a compiled parser may read differently from pydantic-core's: duplicates, escapes, numbers."""
    chain = Chain()
    chain.start()
    chain.add(ClockRead(step=0, value="2026-01-01T00:00:00+00:00"))
    good = chain.raw[1]
    base = json.loads(good)
    out: list[bytes] = []
    for old, new in [
        (b'"seq":1,', b'"seq":1,"seq":1,'),  # a duplicated envelope key
        (b'"seq":1,', b'"seq":0,"seq":1,'),
        (b'"step":0,', b'"step":0,"step":0,'),  # a duplicated payload key
        (b'"step":0,', b'"step":1,"step":0,'),
        (b'"step":0,', b'"step":0e0,'),
        (b'"step":0,', b'"step":-0,'),
        (b'"step":0,', b'"step":00,'),
        (b'"value":"', b'"value":"\\u0000'),
        (b'"value":"', b'"value":"\\ud83d\\ude00'),
        (b'"value":"', b'"value":"\\udc00'),
        (b'"value":"', b'"value":"\xed\xa0\x80'),  # a surrogate encoded in UTF-8: not UTF-8
        (b'"value":"', b'"value":"\xc0\x80'),  # an overlong encoding
        (b'"ts":"', b'"ts":"\\u0032'),
    ]:
        assert old in good, old
        changed = good.replace(old, new, 1)
        out += [changed, _spliced_hash(changed)]
    for seq in [2**63 - 1, 2**63, 2**64, -1]:
        out.append(_rehashed({**base, "seq": seq}))
    for value in [1e-400, 1e308, 1.7976931348623157e308, 123456789012345678901234567890]:
        out.append(_rehashed({**base, "payload": {**base["payload"], "value": value}}))
    out.append(_spliced_hash(good.replace(b'"step":0,', b'"step":1e-400,', 1)))
    out.append(_spliced_hash(good.replace(b'"step":0,', b'"step":-1e400,', 1)))
    out.append(good + b"\n")
    out.append(_spliced_hash(good + b" "))
    out.append(canonical_json({**base, "payload": []}))
    return out


@pytest.mark.parametrize("corpus", [_hostile_corpus, _more_hostile, _every_type])
def test_decode_record_answers_exactly_as_decode(corpus: object) -> None:
    assert callable(corpus)
    accepted = 0
    for raw in corpus():
        expected = _outcome(decode, raw)
        assert _outcome(decode_record, raw) == expected, raw
        accepted += expected[0] == "event"
    assert accepted >= 5  # each corpus exercises both answers or is all valid


def test_the_fast_path_only_accepts_what_decode_accepts() -> None:
    taken = 0
    for raw in [*_hostile_corpus(), *_more_hostile()]:
        proven = _decode_proven(raw)
        if proven is not None:
            taken += 1
            assert _outcome(lambda _, event=proven: event, raw) == _outcome(decode, raw), raw
    assert taken >= 5


def test_the_fast_path_is_taken_for_every_event_type() -> None:
    # Without this, a fast path that always fell back would pass every test above, and be slow.
    for raw in _every_type():
        proven = _decode_proven(raw)
        assert proven is not None, raw
        assert proven == decode(raw)
        assert list(proven.__dict__) == list(decode(raw).__dict__)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400"])
def test_non_finite_numbers_never_take_the_fast_path(literal: bytes) -> None:
    chain = Chain()
    chain.start()
    chain.add(ClockRead(step=0, value="v"))
    raw = _spliced_hash(chain.raw[1].replace(b'"step":0,', b'"step":0,"x":' + literal + b",", 1))
    assert _decode_proven(raw) is None
    assert _outcome(decode_record, raw) == _outcome(decode, raw)
    assert _outcome(decode, raw)[0] == "raised"
