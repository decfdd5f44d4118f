from __future__ import annotations

import json

import pytest

from ledger.canonical import canonical_json
from ledger.errors import EventDecodeError, UnknownSchemaVersionError
from ledger.events import PAYLOADS, UPCASTERS, ClockRead, ToolCalled, decode, json_schemas, upcast
from tests.unit.helpers import Chain


def test_round_trip_keeps_bytes_and_hash() -> None:
    chain = Chain()
    chain.start(input={"ticket": "T-1", "text": "ünïcode ✓"})
    chain.add(ToolCalled(step=0, name="lookup", args={"b": 1, "a": [1.5, None]}, args_digest="d", output="x"))
    for event, raw in zip(chain.events, chain.raw, strict=True):
        decoded = decode(raw)
        assert decoded == event
        assert decoded.to_bytes() == raw
        assert canonical_json(json.loads(raw)) == raw


def test_chain_links_each_event_to_the_previous() -> None:
    chain = Chain()
    first = chain.start()
    second = chain.add(ClockRead(step=0, value="2026-01-01T00:00:00+00:00"))
    assert first.prev_hash == "0" * 64
    assert second.prev_hash == first.hash


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe not json", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"id": "x"}', "not an event envelope"),
    ],
)
def test_garbage_is_a_decode_error_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(EventDecodeError) as info:
        decode(raw)
    assert reason in info.value.reason
    assert info.value.raw == raw


def _mutate(raw: bytes, **changes: object) -> bytes:
    data = json.loads(raw)
    for key, value in changes.items():
        if key.startswith("payload."):
            data["payload"][key.split(".", 1)[1]] = value
        else:
            data[key] = value
    return canonical_json(data)


def test_modified_content_fails_the_hash_check() -> None:
    chain = Chain()
    chain.start()
    chain.add(ToolCalled(step=0, name="refund", args={"amount": 10}, args_digest="d", output="ok"))
    tampered = _mutate(chain.raw[1], **{"payload.output": "not ok"})
    with pytest.raises(EventDecodeError, match="hash does not match"):
        decode(tampered)


def test_unknown_type_and_future_schema_version_are_named() -> None:
    chain = Chain()
    chain.start()
    with pytest.raises(EventDecodeError, match=r"unknown event type 'run\.exploded'"):
        decode(_mutate(chain.raw[0], type="run.exploded"))
    with pytest.raises(UnknownSchemaVersionError) as info:
        decode(_mutate(chain.raw[0], schema_version=99))
    assert info.value.version == 99
    assert "upgrade runledger" in str(info.value)


def test_payload_that_breaks_its_schema_is_rejected() -> None:
    chain = Chain()
    chain.add(ToolCalled(step=0, name="t", args=None, args_digest="d"))
    with pytest.raises(EventDecodeError, match=r"invalid tool\.called payload"):
        decode(_mutate(chain.raw[0], **{"payload.step": "zero"}))


def test_upcaster_lifts_an_old_payload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ClockRead, "VERSION", 2)
    monkeypatch.setitem(UPCASTERS, ("clock.read", 1), lambda p: {**p, "value": p["value"] + "Z"})
    assert upcast("clock.read", 1, {"step": 0, "value": "t"}) == {"step": 0, "value": "tZ"}
    chain = Chain()
    monkeypatch.setattr(ClockRead, "VERSION", 1)
    chain.add(ClockRead(step=0, value="t"))
    monkeypatch.setattr(ClockRead, "VERSION", 2)
    event = decode(chain.raw[0])  # stored as version 1, read by a version-2 reader
    assert event.schema_version == 1
    assert event.body_as(ClockRead).value == "tZ"


def test_json_schema_covers_every_event_type() -> None:
    schemas = json_schemas()
    assert set(schemas) == set(PAYLOADS)
    tool = schemas["tool.called"]
    assert tool["properties"]["type"] == {"const": "tool.called"}
    assert "args_digest" in tool["properties"]["payload"]["required"]
    started = schemas["run.started"]
    # Nested models are hoisted so references resolve from the root.
    refs = json.dumps(started)
    for name in started.get("$defs", {}):
        assert f"#/$defs/{name}" in refs
    assert "$defs" not in started["properties"]["payload"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"ts": "yesterday"}, "not an event envelope: ts"),
        ({"seq": 2**70}, "not an event envelope: seq"),
    ],
)
def test_envelope_bounds_are_checked(change: dict[str, object], reason: str) -> None:
    chain = Chain()
    chain.start()
    with pytest.raises(EventDecodeError, match=reason):
        decode(_mutate(chain.raw[0], **change))


def test_nan_in_a_payload_is_a_decode_error_not_a_crash() -> None:
    chain = Chain()
    chain.add(ToolCalled(step=0, name="t", args=None, args_digest="d", output=1.5))
    raw = chain.raw[0].replace(b'"output":1.5', b'"output":NaN')
    with pytest.raises(EventDecodeError):
        decode(raw)
