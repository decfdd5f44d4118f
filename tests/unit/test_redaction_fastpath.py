"""Redaction's shortcuts change nothing it returns or counts.

Most strings hold nothing to redact, and a few C calls decide so (``Redactor._plain``; a short text
found plain is remembered, ``_untouched``); a probe of decoded base64 runs leaves out the detectors
whose shortest match is longer than any decoding (``piece_max``, in bands of run lengths) and masks
with one Latin-1 character. Here each is compared with the full path: every text through every
detector and wrapper, every probe with every detector and masks of one character per kind.
"""

from __future__ import annotations

import base64
import random
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runledger.protect.redaction import Redactor, _redactor, _unwrap
from runledger.protect.redaction._scan import Mint

KEY = b"k" * 32
REGISTERED = "hunter2-rosebud"


class FullPathRedactor(Redactor):
    """A Redactor without the shortcuts: no gate, no plain texts remembered, probes unbounded."""

    def _untouched(self, text: str) -> bool:
        return False

    def _plain(self, text: str, low: str, depth: int) -> bool:
        return False

    def _present_hints(self, low: str) -> frozenset[str]:
        return frozenset(h for h in self._hint_list if h in low)

    def _scan_with(self, text: str, depth: int, mint: Mint, piece_max: int | None = None) -> str:
        return super()._scan_with(text, depth, mint, None)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


SECRETS = [
    "sk-proj-Abcdefghij0123456789KLMNOPqrstuv",
    "AKIAIOSFODNN7EXAMPLE",
    "ghp_0123456789abcdefghijABCDEFGHIJ012345",
    "xoxb-123456789012-1234567890123-AbCdEfGhIjKl",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "AIzaSyA-0123456789abcdefghijklmnopqrstu",
    "sk_live_0123456789abcdefABCDEF",
    "Authorization: Bearer abc.def-ghi_jkl~123",
    "Basic dXNlcjpwYXNzd29yZA==",
    "password: correct horse",
    "pwd=Tr0ub4dor&3",
    "api_key='x1y2'",
    "auth: abc",
    "4111 1111 1111 1111",
    "378282246310005",
    "postgres://admin:hunter2pw@db",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
    "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    REGISTERED,
]
FRAGMENTS = [
    *SECRETS,
    *(_b64(s) for s in SECRETS[:4]),
    _b64("pwd=abcdefgh"),  # 16 characters, a secret in its 12 bytes
    _b64("4111111111111111"),
    urllib.parse.quote("password=correct horse", safe=""),
    urllib.parse.quote(_b64("AKIAIOSFODNN7EXAMPLE"), safe=""),
    "".join(f"%{b:02X}" for b in b"AKIAIOSFODNN7EXAMPLE"),  # no hint, no base64 run: only the URL probe sees it
    # near misses and hints alone
    "sk-",
    "AKIA",
    "aws ",
    "secret",
    "password",
    "eyJ",
    "%3D",
    "%",
    "Basic ",
    "://",
    "4111",
    "1234-5678",
    "max_tokens: 1",
    "secret://DB_PASS",
    "«redacted:openai_key:0123456789ab»",
    # ordinary text and what looks like base64
    "The quick brown fox",
    "order-8891",
    "0f8fad5b-d9cb-469f-a165-70867728950e",
    "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "/usr/local/lib/python3.12/site-packages",
    "x" * 70,
    "QUJDREVGR0hJSktMTU5PUA",
    "ABCDEFGHIJKLMNOP1234",
    "1234567890+/12345678",
    _b64("just some ordinary text here"),
    # characters that lower-case to ASCII or change length, and separators
    "\u212a",
    "\u0130",
    "«",
    "\x00",
    "\n",
    "\r\n",
    "=",
    "==",
    " ",
    "-",
    "/",
]
fragment = st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12))
texts = st.lists(fragment, max_size=14).map("".join)


def _pair() -> tuple[Redactor, Redactor]:
    fast, full = Redactor(KEY), FullPathRedactor(KEY)
    for r in (fast, full):
        r.add_secret(REGISTERED, "secret:db")
    return fast, full


def _full_outputs(full: Redactor, values: list[Any]) -> list[Any]:
    # The full path's probes mask with one character per kind (no Latin-1 mask), as before.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_unwrap, "_FLAT_MASKS", {})
        return [full.redact(v) for v in values]


@settings(max_examples=400, deadline=None)
@given(st.lists(texts, min_size=1, max_size=6))
def test_short_texts_come_out_of_the_shortcuts_as_out_of_the_full_path(values: list[str]) -> None:
    fast, full = _pair()
    values = [*values, *values]  # twice: the second time, a plain text is one remembered
    assert [fast.redact(v) for v in values] == _full_outputs(full, values)
    assert fast.stats == full.stats


@settings(max_examples=60, deadline=None)
@given(st.lists(fragment, min_size=1, max_size=8), st.integers(0, 2**32), st.sampled_from([8, 40, 120]))
def test_long_texts_and_many_runs_come_out_of_the_shortcuts_as_out_of_the_full_path(
    inserts: list[str], seed: int, n_runs: int
) -> None:
    # Many distinct base64 runs of text (``_base64_suspects_of_many``: bands, bounds, masks) of mixed
    # lengths, prose, and the fragments put in at random places.
    rng = random.Random(seed)
    words = ["the", "order", "shipped", "to", "customer", "note:", "id", "ok", "4", "ref"]
    pieces = [_b64(" ".join(rng.choices(words, k=rng.randint(2, 9)))) for _ in range(n_runs)]
    pieces += [" ".join(rng.choices(words, k=rng.randint(1, 30))) for _ in range(n_runs // 2)]
    for item in inserts:
        pieces.insert(rng.randrange(len(pieces) + 1), item)
    text = rng.choice([" ", "\n", ", "]).join(pieces)
    fast, full = _pair()
    assert fast.redact_text(text) == _full_outputs(full, [text])[0]
    assert fast.stats == full.stats


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(fragment, st.sampled_from(Redactor(KEY)._hint_list)), max_size=8), st.integers(0, 2**32))
def test_the_hints_a_long_text_is_found_to_hold_are_the_ones_it_holds(inserts: list[str], seed: int) -> None:
    # Long texts (over GATE_MAX_CHARS) rule hints out by their characters first (``_present_hints``).
    rng = random.Random(seed)
    words = ["the", "order", "shipped", "to", "customer", "note", "id", "ok", "4", "ref", "key", "x_y", "a-b", "v2.9"]
    pieces = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(60)]
    for item in inserts:
        pieces.insert(rng.randrange(len(pieces) + 1), item)
    low = rng.choice([" ", "", ":"]).join(pieces).lower()
    fast = Redactor(KEY)
    for _ in range(2):  # the second time from the remembered candidates
        assert fast._present_hints(low) == frozenset(h for h in fast._hint_list if h in low)


def test_a_short_plain_text_remembered_is_redacted_once_its_secret_is_registered() -> None:
    r = Redactor(KEY)
    text = "vault says rosebud-42"
    assert r.redact_text(text) == text and text in r._plain_texts
    assert r.redact_text(text) == text
    r.add_secret("rosebud-42", "secret:vault")
    assert r.redact_text(text) == "vault says " + r.token("secret:vault", "rosebud-42")
    assert r.stats.strings_scanned == 3


def test_the_plain_texts_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_redactor, "PLAIN_MAX_ENTRIES", 8)
    r = Redactor(KEY)
    for i in range(100):
        assert r.redact_text(f"ordinary note {i}") == f"ordinary note {i}"
        assert len(r._plain_texts) <= 8


def test_most_short_strings_are_decided_without_a_detector_or_a_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counted(name: str) -> Callable[..., Any]:
        original = getattr(Redactor, name)

        def call(self: Redactor, *args: Any) -> Any:
            calls.append(name)
            return original(self, *args)

        return call

    for name in ("_find", "_open_base64", "_open_urlencoded"):
        monkeypatch.setattr(Redactor, name, counted(name))
    r = Redactor(KEY)
    ordinary = ["user", "assistant", "finish_reason", "order-8891", "n" * 60, "The quick brown fox, twice."]
    ordinary += ["0f8fad5b-d9cb-469f-a165-70867728950e", "/usr/local/lib/python3.12/site-packages/x.py", "y" * 200]
    assert [r.redact_text(t) for t in ordinary] == ordinary
    assert calls == []
    assert "«redacted:" in r.redact_text("key AKIAIOSFODNN7EXAMPLE") and "_find" in calls


def _runs_of_16(n: int) -> list[str]:
    rng = random.Random(7)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .,"
    return [_b64("".join(rng.choices(alphabet, k=12))) for _ in range(n)]


def test_many_runs_of_16_are_probed_without_the_longer_detectors_and_still_give_up_every_secret() -> None:
    runs = _runs_of_16(3000)
    card, short = _b64("4111 1111 1111 1111"), _b64("pwd=abcdefgh")
    assert len(short) == 16
    text = " ".join([*runs[:1000], card, *runs[1000:2000], short, *runs[2000:]])
    r = Redactor(KEY)
    bands: list[tuple[int, int, int]] = []
    original = r._probe_bands

    def probe_bands(groups: list[tuple[int, int, int, int, int]]) -> list[tuple[int, int, int]]:
        bands.extend(original(groups))
        return original(groups)

    r._probe_bands = probe_bands  # type: ignore[method-assign]
    out = r.redact_text(text)
    assert card not in out and "«redacted:base64:card_number:" in out
    assert short not in out and "«redacted:base64:credential:" in out
    assert all(run in out for run in runs)
    # One band for the runs of 16 (12 bytes: no card number fits), one for the card's run.
    assert [piece for _, _, piece in bands] == [12, 21]
    assert out == _full_outputs(FullPathRedactor(KEY), [text])[0]


def test_a_probe_of_runs_holding_every_byte_masks_by_kind_and_finds_the_secret() -> None:
    # Binary runs hold every byte value: no Latin-1 character is left for a mask.
    binary = [base64.b64encode(bytes(range(i, 256)) + bytes(range(i))).decode() for i in range(0, 40)]
    secret = _b64("key AKIAIOSFODNN7EXAMPLE")
    out = Redactor(KEY).redact_text(" ".join([*binary[:20], secret, *binary[20:]]))
    assert secret not in out and "«redacted:base64:aws_access_key_id:" in out
    assert all(run in out for run in binary)
