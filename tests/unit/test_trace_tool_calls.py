"""``runledger show``'s timeline line of a model turn: its tool calls as ``name(arguments)``, in
OpenAI's shape and a framework's, and whatever else is there as JSON (the CLI itself:
tests/integration/test_openai_complete.py)."""

from __future__ import annotations

from typing import Any

from runledger.ops.trace import _detail


def out(response: dict[str, Any] | None, error: dict[str, Any] | None = None) -> Any:
    payload = {"model": "m", "request": {"messages": [{"role": "user", "content": "q"}]}, "response": response}
    return _detail("model.called", payload | {"error": error})[2]


def test_a_turn_that_only_asks_for_tools_shows_them() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"order": "o-1"}'}}
    assert out({"content": "", "tool_calls": [call, call]}) == '→ lookup({"order": "o-1"}), lookup({"order": "o-1"})'


def test_text_and_calls_show_both_and_a_framework_s_calls_read_too() -> None:
    langchain = {"name": "refund", "args": {"order": "o-2"}, "id": "c2", "type": "tool_call"}
    assert out({"content": "checking", "tool_calls": [langchain]}) == 'checking → refund({"order": "o-2"})'


def test_plain_text_errors_and_unknown_shapes() -> None:
    assert out({"content": "hi", "tool_calls": []}) == "hi"
    assert out(None, {"type": "ModelError", "message": "HTTP 500"}) == '{"type": "ModelError", "message": "HTTP 500"}'
    assert out({"content": "", "tool_calls": {"$enc": "x"}}) == '→ {"$enc": "x"}'
    assert out({"content": "", "tool_calls": [7]}) == "→ 7"
