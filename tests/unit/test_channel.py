"""The channel's validation of guest messages (runledger.sandbox.channel): nothing malformed is used."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from runledger.sandbox.channel import MAX_DEPTH, MAX_VALUES, check_request, check_shape, encode, parse
from runledger.sandbox.errors import ChannelError

BAD_LINES = {
    "not json": (b"this is not json\n", "not JSON"),
    "not an object": (b'["x"]\n', "not a JSON object"),
    "invalid utf-8": (b'{"a":"\xff"}\n', "not JSON"),
    "NaN": (b'{"a":NaN}\n', "NaN is not JSON"),
    "Infinity": (b'{"a":-Infinity}\n', "-Infinity is not JSON"),
    "1e999": (b'{"a":1e999}\n', "out of range"),
    "a 5000-digit integer": (b'{"a":' + b"9" * 5000 + b"}\n", "not JSON"),
    "lone high surrogate": (b'{"a":"x\\ud800y"}\n', "lone surrogate"),
    "lone low surrogate, upper case": (b'{"a":["\\uDC00"]}\n', "lone surrogate"),
    "lone surrogate in a key": (b'{"\\ud83d":1}\n', "lone surrogate"),
    "reversed pair": (b'{"a":"\\ude00\\ud83d"}\n', "lone surrogate"),
    "too deep": (b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}\n", f"deeper than {MAX_DEPTH}"),
    "far too deep for the decoder": (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", f"deeper than {MAX_DEPTH}"),
    # Brackets in strings that would make a deep value look shallow to a count that ignored strings.
    "deep behind brackets in strings": (b'{"a":' + b'["]",' * 150 + b"1" + b',"["]' * 150 + b"}\n", "deeper than"),
}


@pytest.mark.parametrize("name", list(BAD_LINES))
def test_a_malformed_line_is_refused(name: str) -> None:
    line, fragment = BAD_LINES[name]
    with pytest.raises(ChannelError, match=fragment):
        parse(line)


@pytest.mark.parametrize(
    "value",
    [
        {"emoji": "😀", "escaped backslash then u": "\\ud800"},
        {"deep": json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))},
        {"brackets in strings": ["]]]}}}", '\\"[[[', "{" * 500]},
        {"numbers": [1, -2.5, 1e300, 2**80]},
    ],
)
def test_a_well_formed_line_is_parsed_as_sent(value: dict[str, Any]) -> None:
    line = json.dumps(value).encode() + b"\n"  # ASCII escapes: how a hostile guest would write them
    assert parse(line) == value
    assert parse(encode(value)) == value  # and as the Run API writes them


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        ({"id": 1, "op": "effect", "name": "pay", "args": {}, "key": "pay:1"}, "named its own idempotency key"),
        ({"id": 1, "op": "now", "also": 1}, "unexpected field 'also'"),
        ({"id": 1, "op": "tool", "name": ["echo"]}, "field 'name' of a tool message has type list"),
        ({"id": 1, "op": "model", "messages": "hi"}, "field 'messages' of a model message has type str"),
        ({"id": 1, "op": "failed", "error": "boom"}, "field 'error' of a failed message has type str"),
        ({"id": 1, "op": "tool", "name": "echo", "tool_call_id": True}, "'tool_call_id' of a tool message has type"),
        ({"id": True, "op": "now"}, "message id must be an integer"),
        ({"id": 1, "op": "exec"}, "unknown op 'exec'"),
    ],
)
def test_a_request_carries_only_its_ops_fields(message: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ChannelError, match=fragment):
        check_request(message)


def test_every_field_the_run_api_sends_is_accepted() -> None:
    for message in (
        {"id": 0, "op": "hello"},
        {"id": 1, "op": "model", "messages": [{"role": "user", "content": "hi"}], "params": {"temperature": 0}},
        {"id": 2, "op": "tool", "name": "echo", "args": None, "tool_call_id": None},
        {"id": 3, "op": "effect", "name": "pay", "args": {"order": "o-1"}, "tool_call_id": "call_1"},
        {"id": 4, "op": "approval", "action": "refund", "args": [1]},
        {"id": 5, "op": "child", "agent": "kid", "input": 2},
        {"id": 6, "op": "now"},
        {"id": 7, "op": "random"},
        {"id": -1, "op": "done", "output": {"x": 1}},
        {"id": -1, "op": "failed", "error": {"type": "ValueError", "message": "no"}},
    ):
        assert check_request(parse(encode(message))) == (message["id"], message["op"])


def test_values_are_counted_outside_strings_and_capped_for_the_host() -> None:
    at_cap = {"a": [0] * (MAX_VALUES - 2)}  # the object, its list, and the list's values: MAX_VALUES
    over = {"a": [0] * (MAX_VALUES - 1)}
    assert parse(encode(at_cap), MAX_VALUES) == at_cap
    with pytest.raises(ChannelError, match=f"more than {MAX_VALUES} values"):
        parse(encode(over), MAX_VALUES)
    assert parse(encode(over)) == over  # the guest reads its host's replies without the cap
    commas = {"a": "," * (3 * MAX_VALUES), "b": ["[,]", '\\",[,', "{,"] * 10}  # commas and brackets in strings
    assert parse(encode(commas), MAX_VALUES) == commas


def test_the_shape_of_a_huge_deep_message_is_refused_in_one_pass_before_any_parse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unit = b"[" * (MAX_DEPTH - 2) + b"0" + b"]" * (MAX_DEPTH - 2)
    line = b'{"id":1,"op":"tool","name":"echo","args":[' + b",".join([unit] * 18_000) + b"]}\n"  # 3.6 MB
    parsed: list[bytes] = []
    monkeypatch.setattr(json, "loads", lambda *a, **k: parsed.append(a[0]))
    cpu = time.process_time()
    with pytest.raises(ChannelError, match="values"):
        parse(line, MAX_VALUES)
    # Measured here ~0.1 s (2 shared cores, loaded); the old check made a pass per level: 2.5 s.
    assert time.process_time() - cpu < 1.0
    assert parsed == []
    with pytest.raises(ChannelError, match=f"deeper than {MAX_DEPTH}"):
        check_shape(b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}\n", MAX_DEPTH, None)
    check_shape(b'{"a":' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}\n", MAX_DEPTH, None)
