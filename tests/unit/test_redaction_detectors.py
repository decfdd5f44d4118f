"""Where each detector's secret ends: the token takes the secret and nothing around it.

A secret is planted in random text that cannot itself look like a secret (letters no detector's hint
can be spelled from, no digits, no ``%``, no base64 run), and the text after it starts at a boundary
the detector defines (for an unquoted credential: ``_detectors._unquoted_end``). The
redacted text must be the text before, the token, and the text after, byte for byte.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runledger.protect.redaction import Redactor

KEY = b"k" * 32

# No a, e, o, k or p: no detector's hint can be spelled ("pass", "pwd", "secret", "token", "api",
# "auth", "cookie", "sk-", "aws", "eyJ", "xox", "bearer", "basic", "AKIA", "ya29."...).
LETTERS = "bcdfghijlmnqrstuvwxyzBCDFGHIJLMNQRSTUVWXYZ"
WORDS = st.text(LETTERS, min_size=1, max_size=12)  # no run of 16: no base64 candidate
SEPARATORS = st.sampled_from([" ", "  ", "\t", ", ", ". ", "! ", "? ", ": ", "; ", " - ", " (", ") ", "\n", "\r\n"])
PROSE = st.lists(st.tuples(WORDS, SEPARATORS), max_size=8).map(lambda parts: "".join(w + s for w, s in parts))
# The prefix ends with a separator: a planted name or key starts a word (a scheme or a key glued to the
# letters before it is another string), and not after ``?`` or ``&`` (a query parameter ends elsewhere). A word
# of 3 letters at least: a text under 8 characters is not scanned (``redaction_scan``).
PREFIX = st.tuples(
    PROSE, st.text(LETTERS, min_size=3, max_size=12), st.sampled_from([" ", "\n", "\t", ". ", ": ", ", ", "("])
).map("".join)
BLANKS = st.sampled_from([" ", "  ", "\t", " \t "])
LINE_END = st.sampled_from(["\n", "\r\n"])


def _word_end() -> st.SearchStrategy[str]:
    """The end of a word: the end of the text, or a blank or a line end and then anything."""
    return st.just("") | st.tuples(st.sampled_from([" ", "\t", "\n"]), PROSE).map("".join)


@st.composite
def _after(draw: st.DrawFn, boundary: str) -> str:
    """Text that starts at ``boundary``: then anything prose may say."""
    if boundary == "end":
        return ""
    if boundary == "line":  # the end of the line: the next line is anything
        return draw(LINE_END) + draw(PROSE)
    if boundary == "blank":  # a blank or a line end after a key of fixed shape
        return draw(st.sampled_from([" ", "\t", "\n"])) + draw(PROSE)
    if boundary == "prose":  # blanks, then a word of letters only (in brackets or quotes, punctuation after)
        opening, closing = draw(st.sampled_from(["", "(", '"', "'"])), draw(st.sampled_from(["", ".", ",", "!", ")"]))
        return draw(BLANKS) + opening + draw(WORDS) + closing + draw(_word_end())
    if boundary == "comment":  # blanks, then a ``#`` alone
        return draw(BLANKS) + "#" + draw(_word_end())
    if boundary == "query":  # the next parameter, a fragment or a blank
        return draw(st.sampled_from(["&", "#", " "])) + draw(PROSE)
    assert boundary == "any", boundary
    return draw(PROSE)


@dataclass(frozen=True)
class Planted:
    kind: str
    lead: str  # what comes right before the secret and stays: the credential's name, ``Bearer ``, ``://user:``
    secret: str  # exactly what the token replaces
    trail: str = ""  # what must come right after it and stays: a closing quote, ``@host``
    boundaries: tuple[str, ...] = ("blank", "end")


UNQUOTED = ("line", "comment", "end")
PLANTED = [
    # Unquoted credentials: to the end of the line, before a comment, before a list separator, or before
    # prose that follows a password-shaped word (a letter and a digit) or the end of a sentence; the
    # sentence's punctuation and the list's separator stay.
    Planted("credential", "pwd=", "Tr0ub4dor&3", boundaries=(*UNQUOTED, "prose")),
    Planted("credential", "passphrase=", "lima-bravo nine", "!", boundaries=(*UNQUOTED, "prose")),
    Planted("credential", "password: ", "correct horse battery staple", boundaries=UNQUOTED),
    Planted("credential", "password: ", "correct horse battery staple", ".", boundaries=(*UNQUOTED, "prose")),
    Planted("credential", "password: ", "hunter2", ".", boundaries=(*UNQUOTED, "prose")),
    Planted("credential", "PASSWORD = ", "Tr0ub4dor&3 p@ss w0rd!#$%^*()_+{}|:<>?~", boundaries=(*UNQUOTED, "prose")),
    Planted("credential", "X-Auth-Token: ", "nebula-otter 44 tamarind", "; aubergine", boundaries=UNQUOTED),
    Planted("credential", "pwd=", "abc123", ", user=alice, role=admin", boundaries=("any",)),
    Planted("credential", "pwd=", "abc123", ",user=alice,role=admin", boundaries=("any",)),
    Planted("credential", "client_secret=", "Vortex#9 plinth&quasar !jubilee", boundaries=UNQUOTED),
    Planted("credential", "Authorization: Digest ", "username=ann, response=6629fae4", boundaries=("line", "end")),
    # Quoted, escaped, in a query.
    Planted("credential", '{"password": "', "correct horse battery staple", '"', ("any",)),
    Planted("credential", "export DB_PASSWORD='", "correct horse battery staple", "'", ("any",)),
    Planted("credential", r"{\"client_secret\": \"", r"correct horse \\\"battery\\\" staple", r"\"", ("any",)),
    Planted("credential", "https://x/login?user=ann&passwd=", "correct+horse", boundaries=("query", "end")),
    # Every other kind: a key of fixed shape ends where its pattern does.
    Planted("openai_key", "use ", "sk-proj-Abcdefghij0123456789KLMNOPqrstuv"),
    Planted("anthropic_key", "x-api: ", "sk-ant-api03-AAAAbbbbCCCCddddEEEEffffGGGGhhhh-0123"),
    Planted("aws_access_key_id", "key ", "AKIAIOSFODNN7EXAMPLE"),
    Planted("aws_secret_key", "aws_secret_access_key = ", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    Planted("github_token", "token ", "ghp_0123456789abcdefghijABCDEFGHIJ012345"),
    Planted("github_token", "pat ", "github_pat_11ABCDEFG0123456789_abcdefghijkl"),
    Planted("slack_token", "", "xoxb-123456789012-1234567890123-AbCdEfGhIjKl"),
    Planted(
        "slack_webhook", "post to ", "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX"
    ),
    Planted("google_api_key", "key=", "AIzaSyA-0123456789abcdefghijklmnopqrstu"),
    Planted("google_oauth_token", "", "ya29.a0AfH6SMBx0123456789abcdefghij"),
    Planted("stripe_key", "", "sk_live_0123456789abcdefABCDEF"),
    Planted("bearer_token", "Authorization: Bearer ", "abc.def-ghi_jkl~123"),
    Planted("basic_auth", "Authorization: Basic ", "dXNlcjpwYXNzd29yZA=="),
    Planted(
        "jwt",
        "cookie ",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ),
    Planted("url_password", "postgres://admin:", "hunter2pw", "@db.internal:5432/app", ("blank", "end")),
    Planted("card_number", "card ", "4111 1111 1111 1111"),
    Planted("card_number", "amex ", "378282246310005"),
    Planted(
        "private_key",
        "key:\n",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB\n"
        "-----END RSA PRIVATE KEY-----",
        boundaries=("any",),
    ),
    Planted(
        "private_key",
        "",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA (truncated",
        boundaries=("end",),
    ),
]


def _redacts_exactly(planted: Planted, before: str, after: str) -> None:
    r = Redactor(KEY)
    text = before + planted.lead + planted.secret + planted.trail + after
    out = r.redact_text(text)
    token = r.token(planted.kind, planted.secret)
    assert out == before + planted.lead + token + planted.trail + after
    # Nowhere in the output, unless the text around it says it too (a random word may: "b" is no secret).
    if planted.secret not in f"{before}{planted.lead}\x00{planted.trail}{after}":
        assert planted.secret not in out.replace(token, "\x00")


@settings(max_examples=40, deadline=None)
@pytest.mark.parametrize("planted", PLANTED, ids=[f"{p.kind}-{i}" for i, p in enumerate(PLANTED)])
@given(data=st.data())
def test_the_text_around_every_planted_secret_survives_byte_for_byte(planted: Planted, data: st.DataObject) -> None:
    before = data.draw(PREFIX, label="before")
    after = data.draw(st.sampled_from(planted.boundaries).flatmap(_after), label="after")
    _redacts_exactly(planted, before, after)


# -- unquoted credentials of any shape ----------------------------------------------------------------------

DIGITS = "0123456789"
SYMBOLS = "!#$^&*()+=~|<>{}@;:,.?_-"


def _has_letter_and_digit(word: str) -> bool:
    return any(c in LETTERS for c in word) and any(c in DIGITS for c in word)


# A list separator inside a word: before a ``name=`` or ``name:`` (the end of a list item).
_GLUED_SEPARATOR = re.compile(r"[,;][A-Za-z_][A-Za-z0-9_.-]*[=:]")


def _one_word_of_a_value(word: str) -> bool:
    """Neither a list separator nor sentence punctuation at its end, nor a separator before a name in it:
    the word does not end its value there."""
    return not word.endswith((",", ";", ".", "!", "?")) and _GLUED_SEPARATOR.search(word) is None


# A password-shaped word: a letter and a digit in it (12 characters at most: no card number). Not ``>``
# first: after ``=``, ``=>`` is the separator.
PASSWORD_WORDS = st.text(LETTERS + DIGITS + SYMBOLS, min_size=2, max_size=12).filter(
    lambda w: _has_letter_and_digit(w) and not w.startswith(">") and _one_word_of_a_value(w)
)
# A word with a symbol between its letters: no prose word, and no password-shaped one either.
SYMBOL_WORDS = st.tuples(WORDS, st.sampled_from("@&#$*+=~^|"), WORDS).map("".join)
NAMES = st.sampled_from(["pwd=", "password: ", "db_password = ", "passphrase:\t", "client_secret=", "X-Auth-Token: "])


@settings(max_examples=300, deadline=None)
@given(
    before=PREFIX,
    name=NAMES,
    first=PASSWORD_WORDS,
    more=st.lists(SYMBOL_WORDS | PASSWORD_WORDS, max_size=3),
    last=PASSWORD_WORDS,
    data=st.data(),
)
def test_a_password_ends_with_its_last_password_shaped_word_before_prose(
    before: str, name: str, first: str, more: list[str], last: str, data: st.DataObject
) -> None:
    secret = " ".join([first, *more, last]) if more else first
    after = data.draw(st.sampled_from(["prose", "line", "comment", "end"]).flatmap(_after), label="after")
    _redacts_exactly(Planted("credential", name, secret), before, after)


@settings(max_examples=300, deadline=None)
@given(
    before=PREFIX,
    name=NAMES,
    words=st.lists(WORDS, min_size=1, max_size=6),
    stop=st.sampled_from(["", ".", "!", "?"]),
    data=st.data(),
)
def test_a_passphrase_of_words_goes_to_the_end_of_its_line_or_sentence(
    before: str, name: str, words: list[str], stop: str, data: st.DataObject
) -> None:
    secret = " ".join(words)
    boundaries = ["line", "comment", "end"] + (["prose"] if stop else [])
    after = data.draw(st.sampled_from(boundaries).flatmap(_after), label="after")
    _redacts_exactly(Planted("credential", name, secret, stop), before, after)


# What follows a value in a list: the separator, then the next item (with a blank or a line end
# between them, any item: ``name=value``, ``name: value`` or words; glued to it, a ``name=``); and
# after the list, any boundary of a value.
NAMED_ITEMS = st.tuples(WORDS, st.sampled_from(["=", ":", ": ", " = "]), WORDS).map("".join)
GLUED_ITEMS = st.tuples(WORDS, st.sampled_from(["=", ":", ": "]), WORDS).map("".join)  # ``=`` or ``:`` at the name
LIST_ITEMS = st.one_of(
    st.tuples(st.sampled_from([", ", "; ", ",\t", ",  ", ",\n", ";\r\n"]), NAMED_ITEMS | PROSE.map(str.strip)),
    st.tuples(st.sampled_from([",", ";"]), GLUED_ITEMS),
).map("".join)
# A value of any shape that ends only where the list does: one word, a passphrase of plain words, or
# words with symbols and digits (no password-shaped word before a prose word).
LIST_VALUES = st.one_of(
    PASSWORD_WORDS,
    SYMBOL_WORDS,
    st.lists(WORDS, min_size=1, max_size=4).map(" ".join),
    st.lists(SYMBOL_WORDS | PASSWORD_WORDS, min_size=2, max_size=3).map(" ".join),
)


@settings(max_examples=300, deadline=None)
@given(
    before=PREFIX,
    name=NAMES,
    value=LIST_VALUES,
    items=st.lists(LIST_ITEMS, min_size=1, max_size=4).map("".join),
    stop=st.sampled_from(["", ".", "!", "?"]),
    data=st.data(),
)
def test_a_value_in_a_list_ends_at_its_separator_and_the_list_survives(
    before: str, name: str, value: str, items: str, stop: str, data: st.DataObject
) -> None:
    """``pwd=abc123, user=alice, role=admin``: the value goes, the separator and every item after it
    stay, whatever the value's shape; so does the punctuation that ends the sentence."""
    after = data.draw(st.sampled_from(["line", "comment", "end"]).flatmap(_after), label="after")
    _redacts_exactly(Planted("credential", name, value, items + stop), before, after)


def test_a_separator_inside_a_word_is_part_of_the_value() -> None:
    """A ``,`` or ``;`` between characters of one word, no ``name=`` after it, is the value's own."""
    r = Redactor(KEY)
    assert r.redact_text("pwd=a1,b2;c3 next") == f"pwd={r.token('credential', 'a1,b2;c3')} next"
    # A name glued to the separator ends the value only with its ``=`` or ``:`` glued to it too.
    assert r.redact_text("pwd=0;B =0B 0B") == f"pwd={r.token('credential', '0;B =0B 0B')}"
    assert r.redact_text("password: ???") == f"password: {r.token('credential', '???')}"


# -- the cases of the issue, and the limits the docs state ----------------------------------------------------


def test_the_word_after_a_password_and_after_a_passphrase_is_kept() -> None:
    r = Redactor(KEY)
    assert r.redact_text("pwd=Tr0ub4dor&3 next") == f"pwd={r.token('credential', 'Tr0ub4dor&3')} next"
    token = r.token("credential", "lima-bravo nine")
    assert r.redact_text("passphrase=lima-bravo nine! ok") == f"passphrase={token}! ok"
    out = r.redact_text("login with password=Tr0ub4dor&3 ok, then passphrase=lima-bravo nine! ok")
    assert out == f"login with password={r.token('credential', 'Tr0ub4dor&3')} ok, then passphrase={token}! ok"


def test_the_list_after_a_password_and_the_period_after_it_are_kept() -> None:
    """The cases of the issue: the neighbours in a list and the sentence's period stay."""
    r = Redactor(KEY)
    token = r.token("credential", "abc123")
    assert r.redact_text("pwd=abc123, user=alice, role=admin") == f"pwd={token}, user=alice, role=admin"
    assert r.redact_text("pwd=abc123;user=alice") == f"pwd={token};user=alice"
    assert r.redact_text("password: hunter2.") == f"password: {r.token('credential', 'hunter2')}."
    out = r.redact_text("Use password: correct horse battery staple. Then log in.")
    assert out == f"Use password: {r.token('credential', 'correct horse battery staple')}. Then log in."


def test_the_boundary_cannot_know_what_prose_looks_like_a_passphrase_and_takes_the_safe_side() -> None:
    """What docs/data-protection.md says the rule cannot know: plain words after a value of plain words
    go with it to the end of the line; a plain word after a password-shaped word is taken for prose."""
    r = Redactor(KEY)
    out = r.redact_text("password: correct horse battery staple and then some\nnext")
    assert out == f"password: {r.token('credential', 'correct horse battery staple and then some')}\nnext"
    assert r.redact_text("pwd=hunter2 rosebud") == f"pwd={r.token('credential', 'hunter2')} rosebud"
    # A placed token is no password-shaped word: the words around it stay one value.
    out = r.redact_text("password: correct sk-proj-Abcdefghij0123456789KLMNOPqrstuv horse battery")
    assert not re.search(r"correct|horse|battery", out)


# -- ids are not card numbers -----------------------------------------------------------------------------------


def _digit_heavy_uuids(seed: int, n: int = 40) -> list[str]:
    """``n`` hex strings of 32: random UUIDs, and UUIDs with most of their hex letters turned into digits
    (a random UUID holds a Luhn-valid run of 13-19 digits next to a hex letter about one time in 150)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        density = rng.choice([0.625, 0.85, 0.95])  # 10/16: uniform hex
        out.append(
            "".join(rng.choice("0123456789") if rng.random() < density else rng.choice("abcdef") for _ in range(32))
        )
    return out


def _uuid_forms(hex32: str) -> list[str]:
    dashed = f"{hex32[:8]}-{hex32[8:12]}-{hex32[12:16]}-{hex32[16:20]}-{hex32[20:]}"
    return [dashed, dashed.upper(), "{" + dashed + "}", hex32, f"urn:uuid:{dashed}"]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    lead=st.sampled_from(["id ", "order ", "", "(", '"']),
    tail=st.sampled_from(["", " ok", ".", ")"]),
)
def test_no_fragment_of_a_uuid_is_taken_for_a_card_number(seed: int, lead: str, tail: str) -> None:
    r = Redactor(KEY)
    for hex32 in _digit_heavy_uuids(seed):
        for form in _uuid_forms(hex32):
            text = f"{lead}{form}{tail}"
            assert "card_number" not in r.redact_text(text), text


def test_the_uuid_fragments_the_card_detector_took_are_left_alone_and_cards_still_go() -> None:
    """Luhn-valid runs of 13-19 digits that end at a hex letter inside a UUID (found by the former
    pattern) stay; a card number next to prose, punctuation or a dash-less separator still goes."""
    r = Redactor(KEY)
    for uuid in ("40795395-7434-3c22-f500-029621903571", "65372033-1426-174c-2051-92d126188b1d"):
        assert r.redact_text(f"id {uuid} ok") == f"id {uuid} ok"
    for text in ("card 4111111111111111.", "card:4111-1111-1111-1111", "(4111 1111 1111 1111)", "n=4111111111111111;"):
        assert "«redacted:card_number:" in r.redact_text(text), text
