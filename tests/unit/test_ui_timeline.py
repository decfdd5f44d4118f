"""The timeline's rows (``runledger.ui.timeline.bar_rows``, ``gist``): each step's input and output in one
escaped line under its bar, the failing step marked; recorded markup is text, never HTML."""

from __future__ import annotations

from runledger.ui.timeline import Bar, Timeline, bar_rows, gist


def bar(step: int, status: str, given: str, gave: str) -> Bar:
    return Bar(step, "tool", "parse", status, 0.0, 1.0, 1.0, 0, None, given, gave)


def test_inputs_and_outputs_are_escaped_text_and_the_failing_step_is_marked() -> None:
    bars = [bar(0, "ok", '{"a": 1}', "fine"), bar(1, "error", "<script>x()</script>", "ValueError: a & <b>")]
    html = str(bar_rows(Timeline(bars), "r-1", 1))
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;script&gt;x()&lt;/script&gt;" in html and "ValueError: a &amp; &lt;b&gt;" in html
    assert '{"a": 1}' in html  # text: quotes stay as they are
    assert html.count('id="failing-step"') == 1 and '<div class="row failing" data-step="1"' in html
    assert html.count("failed here") == 1


def test_gist_says_a_step_in_one_short_line() -> None:
    request = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "refund it"}]}
    assert gist(request) == "refund it"
    assert gist({"content": None, "tool_calls": [{"function": {"name": "lookup"}}]}) == "calls lookup"
    assert gist({"order": "o-1", "amount": 5}) == '{"amount": 5, "order": "o-1"}'
    assert len(gist("x" * 500)) == 90 and gist(None) == ""
