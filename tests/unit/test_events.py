from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable

import pytest

from runledger.errors import EventDecodeError, UnknownSchemaVersionError
from runledger.record.canonical import canonical_json
from runledger.record.events import (
    PAYLOADS,
    UPCASTERS,
    Budgets,
    ClockRead,
    Event,
    ModelCalled,
    RunStarted,
    ToolCalled,
    Usage,
    _decode_fast,
    _int_paths,
    chain_hash,
    decode,
    decode_fast,
    json_schemas,
    make_event,
    upcast,
    utc_now,
)
from tests.unit.helpers import VERSION, Chain


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


# -- decode_fast: the same answers as decode -------------------------------------------------------------


def _rehashed(data: dict[str, object]) -> bytes:
    """``data`` as canonical bytes with a hash that matches: the bytes a hostile writer can publish."""
    unhashed = {k: v for k, v in data.items() if k != "hash"}
    digest = hashlib.sha256(str(data.get("prev_hash", "")).encode("ascii", "replace"))
    digest.update(canonical_json(unhashed))
    return canonical_json({**unhashed, "hash": digest.hexdigest()})


def _outcome(fn: Callable[[bytes], Event], raw: bytes) -> tuple[object, ...]:
    try:
        event = fn(raw)
    except Exception as exc:  # the outcome compared is whatever was raised
        return ("raised", type(exc).__name__, str(exc))
    # repr, not ==: a hostile writer can hash a NaN, and NaN != NaN
    return ("event", repr(event), list(event.__dict__), event.__pydantic_fields_set__, event.model_dump_json())


def _hostile_corpus() -> list[bytes]:
    chain = Chain()
    chain.start(input={"ticket": "T-1", "text": "ünïcode ✓ \u2028 \x7f"}, labels={"a": "b"})
    chain.add(ToolCalled(step=0, name="lookup", args={"b": 1, "a": [1.5, None, 1e-7, 1e22]}, args_digest="d",
                         output="x"))  # fmt: skip
    chain.add(ClockRead(step=1, value="2026-01-01T00:00:00+00:00"))
    corpus = list(chain.raw)
    base = json.loads(chain.raw[1])
    envelope_values: list[object] = ["3", 3, 3.0, -1, 2**63, 2**63 - 1, True, None, [], {}, "", "x\n", "٣"]
    for key in base:
        for value in envelope_values:
            changed = {**base, key: value}
            corpus.append(_rehashed(changed))
            corpus.append(canonical_json(changed))  # hash left as it was
    for ts in ["2026-01-01T00:00:00Z\n", "2026-01-01T00:00:00.1234567891Z", "2026-01-01t00:00:00Z",
               "2026-01-01T00:00:00", "٢٠٢٦-01-01T00:00:00Z", "2026-01-01T00:00:00+0000",
               "2026-01-01T00:00:00.5-05:00"]:  # fmt: skip
        corpus.append(_rehashed({**base, "ts": ts}))
    payload = base["payload"]
    assert isinstance(payload, dict)
    for change in [{"step": "0"}, {"step": 0.0}, {"step": True}, {"step": None}, {"extra": 1}, {"duration_ms": 3},
                   {"duration_ms": "1.5"}, {"name": 5}, {"error": {"type": "E", "message": "m", "x": 1}},
                   {"error": {"type": "E", "message": "m"}}, {"args": {"deep": [[[[]]]]}}]:  # fmt: skip
        corpus.append(_rehashed({**base, "payload": {**payload, **change}}))
    # Strictness and the 64-bit bound of typed integers (content, e.g. "output", is unbounded).
    for change in [{"step": 2**63}, {"step": 2**63 - 1}, {"step": -(2**63)}, {"step": -(2**63) - 1}, {"step": 10**30},
                   {"step": -0.0}, {"step": "1e3"}, {"duration_ms": 10**30}, {"duration_ms": 10**400},
                   {"duration_ms": True}, {"duration_ms": "NaN"}, {"output": 10**30}, {"output": [2**64, -(2**70)]},
                   {"args_digest": b"d".decode()}, {"name": ["lookup"]}]:  # fmt: skip
        corpus.append(_rehashed({**base, "payload": {**payload, **change}}))
    model = json.loads(_model_event())
    usage = model["payload"]["usage"]
    for change in [{"input_tokens": "3"}, {"input_tokens": 3.0}, {"input_tokens": 2**63}, {"output_tokens": -(2**63)},
                   {"input_tokens": False}, {"input_tokens": 2**63 - 1}]:  # fmt: skip
        corpus.append(_rehashed({**model, "payload": {**model["payload"], "usage": {**usage, **change}}}))
    started = json.loads(chain.raw[0])
    for budgets in [{"turns": "3"}, {"turns": "3.0"}, {"turns": 3.0}, {"turns": 2**63}, {"tokens": 2**63 - 1},
                    {"seconds": 30}, {"seconds": "30"}, {"seconds": 10**30}, {"seconds": None}]:  # fmt: skip
        corpus.append(_rehashed({**started, "payload": {**started["payload"], "budgets": budgets}}))
    without_step = {k: v for k, v in payload.items() if k != "step"}
    corpus.append(_rehashed({**base, "payload": without_step}))
    corpus.append(_rehashed({k: v for k, v in base.items() if k != "ts"}))
    corpus.append(_rehashed({**base, "extra": 1}))
    corpus.append(_rehashed({**base, "type": "run.exploded"}))
    corpus.append(_rehashed({**base, "schema_version": 2}))
    corpus.append(_rehashed({**base, "schema_version": 0}))
    good = chain.raw[1]
    corpus += [
        good.replace(b'"output":"x"', b'"output":NaN'),
        good.replace(b'"output":"x"', b'"output":Infinity'),
        good.replace(b'"output":"x"', b'"output":1e400'),
        good.replace(b'"output":"x"', b'"output":"\\ud800"'),
        good.replace(b'"output":"x"', b'"output":"x","output":"y"'),
        json.dumps(json.loads(good), indent=1).encode(),  # not canonical layout: the slow hash path
        json.dumps(json.loads(good), ensure_ascii=True).encode(),
        good + b" ",
        good + b"x",
        b"\xef\xbb\xbf" + good,
        good[:-1],
        b"",
        b"null",
        b"[1]",
        b"\xff\xfe not json",
    ]
    # A hostile writer hashes bytes no JSON encoder makes: NaN with a matching hash.
    nan = good.replace(b'"output":"x"', b'"output":NaN')
    parsed = json.loads(nan)
    at = nan.index(b'"hash":"')
    spliced_out = nan[:at] + nan[at + len(b'"hash":"') + 64 + 2 :]
    digest = hashlib.sha256(parsed["prev_hash"].encode("ascii"))
    digest.update(spliced_out)
    corpus.append(nan[: at + 8] + digest.hexdigest().encode() + nan[at + 8 + 64 :])
    return corpus


def _model_event() -> bytes:
    chain = Chain()
    chain.start()
    request = {"messages": [{"role": "user", "content": "hi"}]}
    chain.add(ModelCalled(step=0, model="m", request=request, args_digest="d", response={"content": "x"},
                          usage=Usage(input_tokens=3, output_tokens=4), duration_ms=1.5))  # fmt: skip
    return chain.raw[1]


def test_decode_fast_answers_exactly_as_decode() -> None:
    corpus = _hostile_corpus()
    accepted = 0
    for raw in corpus:
        expected = _outcome(decode, raw)
        assert _outcome(decode_fast, raw) == expected, raw
        accepted += expected[0] == "event"
    assert accepted >= 10  # the corpus exercises both answers


def test_decode_fast_takes_the_fast_path_for_canonical_events() -> None:
    chain = Chain()
    chain.start(input={"x": 1})
    chain.add(ToolCalled(step=0, name="t", args=None, args_digest="d", output=1.5))
    for raw in chain.raw:
        assert _decode_fast(raw) is not None
    assert _decode_fast(canonical_json({**json.loads(chain.raw[1]), "seq": "1"})) is None  # coerced: decode's call


def test_decode_fast_upcasts_through_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    chain = Chain()
    chain.add(ClockRead(step=0, value="t"))
    assert decode_fast(chain.raw[0]) == decode(chain.raw[0])  # the version-1 validator is now cached
    monkeypatch.setattr(ClockRead, "VERSION", 2)
    monkeypatch.setitem(UPCASTERS, ("clock.read", 1), lambda p: {**p, "value": p["value"] + "Z"})
    assert decode_fast(chain.raw[0]).body_as(ClockRead).value == "tZ"


@pytest.mark.parametrize("agent", ["bench", "ägent-✓", 'quo"te\\back', "a\u2028b"])
def test_make_event_bytes_are_the_canonical_json_of_the_validated_envelope(agent: str) -> None:
    body = ToolCalled(step=3, name="lookup", args={"b": [1.5, None], "a": "ünï"}, args_digest="d" * 64, output="x")
    event, raw = make_event(body, run_id="r1", agent=agent, seq=7, prev_hash="f" * 64)
    envelope = {k: v for k, v in json.loads(raw).items() if k != "hash"}
    assert event.hash == chain_hash("f" * 64, envelope)
    assert raw == canonical_json({**envelope, "hash": event.hash}) == event.to_bytes()
    assert event == Event.model_validate(json.loads(raw))
    assert event.model_fields_set == set(Event.model_fields)
    assert decode(raw) == event
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", utc_now())


@pytest.mark.parametrize("token", [b"NaN", b"-Infinity", b"1e400", b'[1,{"a":NaN}]'])
def test_a_hashed_non_finite_number_is_refused_by_both_decoders(token: bytes) -> None:
    # A hostile writer can compute a matching hash over bytes no JSON encoder makes.
    chain = Chain()
    chain.add(ToolCalled(step=0, name="t", args=None, args_digest="d", output="x"))
    bad = chain.raw[0].replace(b'"output":"x"', b'"output":' + token)
    at = bad.index(b'"hash":"')
    digest = hashlib.sha256(json.loads(bad)["prev_hash"].encode("ascii"))
    digest.update(bad[:at] + bad[at + len(b'"hash":"') + 64 + 2 :])
    hostile = bad[: at + 8] + digest.hexdigest().encode() + bad[at + 8 + 64 :]
    for fn in (decode, decode_fast):
        with pytest.raises(EventDecodeError, match=r"NaN or infinity|not canonical"):
            fn(hostile)


# -- strict decoding: no coercion, 64-bit integers -----------------------------------------------------


def _payload_changed(raw: bytes, **change: object) -> bytes:
    data = json.loads(raw)
    return _rehashed({**data, "payload": {**data["payload"], **change}})


def _tool_event() -> bytes:
    chain = Chain()
    chain.start()
    chain.add(ToolCalled(step=0, name="t", args={"q": 1}, args_digest="d", output="x", duration_ms=2.5))
    return chain.raw[1]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"step": "0"}, "step: Input should be a valid integer"),  # a string is not an integer
        ({"step": 0.0}, "step: Input should be a valid integer"),  # nor is an integral float
        ({"step": True}, "step: Input should be a valid integer"),  # nor a bool
        ({"step": 2**63}, "step: an integer of 19 digits, beyond 64 bits (-2**63..2**63-1)"),
        ({"step": -(2**63) - 1}, "step: an integer of 19 digits, beyond 64 bits (-2**63..2**63-1)"),
        ({"step": 10**30}, "step: an integer of 31 digits, beyond 64 bits (-2**63..2**63-1)"),
        ({"step": 10**200}, "step: an integer of over 100 digits, beyond 64 bits (-2**63..2**63-1)"),
        ({"duration_ms": "1.5"}, "duration_ms: Input should be a valid number"),
        ({"duration_ms": False}, "duration_ms: Input should be a valid number"),
        ({"name": 5}, "name: Input should be a valid string"),
        ({"error": {"type": "E", "message": 5}}, "error.message: Input should be a valid string"),
    ],
)
def test_strict_decoding_refuses_what_lax_validation_would_coerce(change: dict[str, object], reason: str) -> None:
    raw = _payload_changed(_tool_event(), **change)
    for fn in (decode, decode_fast):
        with pytest.raises(EventDecodeError) as info:
            fn(raw)
        assert info.value.reason == f"invalid tool.called payload: {reason}", fn


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (_payload_changed(_model_event(), usage={"input_tokens": "3", "output_tokens": 4}),
         "invalid model.called payload: usage.input_tokens: Input should be a valid integer"),
        (_payload_changed(_model_event(), usage={"input_tokens": 3, "output_tokens": 2**64}),
         "invalid model.called payload: usage.output_tokens: an integer of 20 digits, beyond 64 bits "
         "(-2**63..2**63-1)"),
    ],
)  # fmt: skip
def test_nested_integers_are_strict_and_bounded_too(raw: bytes, reason: str) -> None:
    for fn in (decode, decode_fast):
        with pytest.raises(EventDecodeError) as info:
            fn(raw)
        assert info.value.reason == reason


@pytest.mark.parametrize(
    ("change", "reason"),
    [({"seq": "1"}, "seq"), ({"seq": 1.0}, "seq"), ({"schema_version": "1"}, "schema_version"),
     ({"schema_version": 1.0}, "schema_version"), ({"seq": True}, "seq")],
)  # fmt: skip
def test_the_envelope_is_strict_too(change: dict[str, object], reason: str) -> None:
    raw = _rehashed({**json.loads(_tool_event()), **change})
    for fn in (decode, decode_fast):
        with pytest.raises(EventDecodeError, match=f"not an event envelope: {reason}"):
            fn(raw)


@pytest.mark.parametrize(
    "change",
    [
        {"step": 2**63 - 1},
        {"step": -(2**63)},
        {"duration_ms": 3},  # an integer where a float is declared: a JSON number without a fraction
        {"duration_ms": 10**30},
        {"output": 10**30},  # content is not a column: any JSON number
        {"args": {"n": [2**64, -(2**70), 1.0]}},
    ],
)
def test_strict_decoding_accepts_json_numbers_where_they_belong(change: dict[str, object]) -> None:
    raw = _payload_changed(_tool_event(), **change)
    assert _decode_fast(raw) is not None  # the fast path takes it
    assert decode_fast(raw) == decode(raw)
    assert {k: decode(raw).payload[k] for k in change} == change  # as stored


def test_what_runledger_writers_build_from_loose_values_decodes_strictly() -> None:
    # Writers validate leniently and store the validated values (canonical JSON of the model):
    # an int budget for a float field is written 30.0, a float token count 3.
    chain = Chain()
    chain.add(RunStarted(agent="a", version=VERSION, budgets=Budgets(turns=3, seconds=30)))  # type: ignore[arg-type]
    loose = {"step": 0, "model": "m", "request": {}, "args_digest": "d", "usage": {"input_tokens": 3.0},
             "duration_ms": 1}  # fmt: skip
    chain.add(ModelCalled.model_validate(loose))
    for raw in chain.raw:
        assert _decode_fast(raw) is not None
        assert decode(raw) == decode_fast(raw)
    assert b'"seconds":30.0' in chain.raw[0]
    assert b'"input_tokens":3,' in chain.raw[1] and b'"duration_ms":1.0' in chain.raw[1]


def test_the_bound_covers_every_typed_integer() -> None:
    # Found from the models (a new integer field is bounded without a change here), nested ones too.
    assert {("step",), ("usage", "input_tokens"), ("usage", "output_tokens")} <= set(_int_paths(ModelCalled))
    assert {("budgets", "turns"), ("budgets", "tokens")} <= set(_int_paths(RunStarted))
    assert ("step",) in _int_paths(ToolCalled) and ("duration_ms",) not in _int_paths(ToolCalled)
    for cls in PAYLOADS.values():
        declared = {name for name, info in cls.model_fields.items() if info.annotation in (int, int | None)}
        assert declared == {path[0] for path in _int_paths(cls) if len(path) == 1}, cls
