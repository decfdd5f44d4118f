"""The walk over a value (``Redactor.redact``): one walk, with or without the paths field paths need.

Without field paths no value's path is built (``_walk(value, None)``); with them every value's path is
matched. Both must give the same output, the same stats and the same objects back where nothing
changed (capture reuses an unchanged value's canonical bytes), so the one is compared with the other
over random values, and the paths themselves are checked on values whose every path is known.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runledger.protect.redaction import RedactionPolicy, Redactor, is_token

KEY = b"k" * 32

# Strings that hold a secret, a token, a reference, or nothing; keys that name a credential or not.
TEXTS = st.sampled_from(
    [
        "",
        "user",
        "an ordinary sentence of some length, with nothing secret in it at all, none",
        "use sk-proj-Abcdefghij0123456789KLMNOPqrstuv please",
        "password: hunter2 rosebud",
        "secret://DB_PASSWORD",
        "«redacted:openai_key:0123456789ab»",
        "card 4111 1111 1111 1111 ok",
        "aGVsbG8gd29ybGQsIHBhc3N3b3JkOiBodW50ZXIy",
        "a%20b%3Dc",
    ]
) | st.text(max_size=40)
KEYS = st.sampled_from(
    [
        "role",
        "content",
        "args",
        "password",
        "max_tokens",
        "X-Api-Key",
        "email",
        "items",
        "a",
        "b",
        "sk-proj-Abcdefghij0123456789KLMNOPqrstuv",
    ]
) | st.text(max_size=12)
SCALARS = TEXTS | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False, allow_infinity=False)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4), max_leaves=24
)


def _same_objects(before: Any, after: Any) -> list[bool]:
    """For each container of ``after`` (depth first), whether it is the object it came from."""
    out = [after is before]
    if isinstance(after, dict) and isinstance(before, dict) and list(after) == list(before):
        for k in after:
            out += _same_objects(before[k], after[k])
    elif isinstance(after, list) and isinstance(before, list) and len(after) == len(before):
        for b, a in zip(before, after, strict=True):
            out += _same_objects(b, a)
    return out


def _unchanged(before: Any, after: Any) -> bool:
    """Equal, keys in the same order (what a copy that changed nothing would be)."""
    if isinstance(before, dict):
        return (
            isinstance(after, dict)
            and list(before) == list(after)
            and all(_unchanged(before[k], after[k]) for k in before)
        )
    if isinstance(before, list):
        return isinstance(after, list) and len(before) == len(after) and all(map(_unchanged, before, after))
    return type(before) is type(after) and before == after


@settings(max_examples=300, deadline=None)
@given(VALUES, st.sampled_from([(), ("args",), ("request", "messages")]))
def test_the_walk_with_paths_matching_nothing_is_the_walk_without_paths(value: Any, path: tuple[str, ...]) -> None:
    plain = Redactor(KEY)
    pathed = Redactor(KEY, RedactionPolicy(fields=("no.such.field", "**.nowhere")))
    out, out_pathed = plain.redact(value, path), pathed.redact(value, path)
    assert out == out_pathed
    assert _same_objects(value, out) == _same_objects(value, out_pathed)
    assert plain.stats == pathed.stats


@settings(max_examples=300, deadline=None)
@given(VALUES, st.booleans())
def test_a_value_comes_back_itself_exactly_when_nothing_in_it_changed(value: Any, fields: bool) -> None:
    r = Redactor(KEY, RedactionPolicy(fields=("**.email",) if fields else ()))
    out = r.redact(value, ("args",))
    if isinstance(value, dict | list):
        assert (out is value) == _unchanged(value, out)
    # Every container: itself when unchanged, and a copy (the input left as it was) when not.
    stack = [(value, out)]
    while stack:
        before, after = stack.pop()
        if isinstance(before, dict | list) and isinstance(after, type(before)):
            assert (after is before) == _unchanged(before, after)
            if isinstance(before, dict) and list(before) == list(after):
                stack += [(before[k], after[k]) for k in before]
            elif isinstance(before, list) and len(before) == len(after):
                stack += list(zip(before, after, strict=True))


def test_field_paths_see_the_path_from_the_root_given_with_list_indices() -> None:
    r = Redactor(KEY, RedactionPolicy(fields=("args.customer.email", "args.items.*.note", "request.**.ssn")))
    value = {
        "customer": {"email": "ann@example.com", "name": "Ann"},
        "items": [{"note": "n0", "qty": 1}, {"note": {"nested": True}}],
        "ssn": "123-45-6789",  # args.ssn: no path matches it
    }
    out = r.redact(value, ("args",))
    assert is_token(out["customer"]["email"]) and out["customer"]["name"] == "Ann"
    assert [is_token(item["note"]) for item in out["items"]] == [True, True]
    assert out["items"][0]["qty"] == 1 and out["ssn"] == "123-45-6789"
    assert r.stats.replaced == {"field:email": 1, "field:note": 2}
    deep = {"a": [{"b": {"ssn": 1}}], "ssn": None}
    out_deep = r.redact(deep, ("request",))
    assert is_token(out_deep["a"][0]["b"]["ssn"]) and is_token(out_deep["ssn"])
    assert r.stats.replaced["field:ssn"] == 2
    # The root itself, when the path handed in matches; the same value under another root untouched.
    assert is_token(r.redact("x@example.com", ("args", "customer", "email")))
    untouched = {"customer": {"email": "ann@example.com"}}
    assert r.redact(untouched, ("result",)) is untouched


def test_unchanged_values_come_back_themselves_and_are_counted_as_scanned() -> None:
    for policy in (RedactionPolicy(), RedactionPolicy(fields=("args.customer.email",))):
        r = Redactor(KEY, policy)
        value = {"role": "user", "content": ["hello", {"n": 3, "ok": True}], "max_tokens": 5}
        assert r.redact(value, ("args",)) is value
        # "user", "hello", and the key "max_tokens" (keys of 8 characters or more are scanned too)
        assert r.stats.strings_scanned == 3 and r.stats.replaced == {}
        changed = {"keep": {"a": "b"}, "password": "hunter2"}
        out = r.redact(changed, ("args",))
        assert out is not changed and out["keep"] is changed["keep"] and is_token(out["password"])
        assert changed["password"] == "hunter2"  # the input is not modified
        assert r.stats.replaced == {"field:password": 1}
