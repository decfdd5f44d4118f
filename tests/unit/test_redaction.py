"""Redaction: every detector finds its secret, ordinary ledger content is left alone, tokens are stable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runledger.errors import SecretNotFoundError
from runledger.protect import redaction
from runledger.protect.redaction import (
    FieldPaths,
    RedactionPolicy,
    Redactor,
    SecretResolver,
    contains_token,
    is_token,
    luhn_ok,
)

KEY = b"k" * 32

# (kind, text containing the secret, the secret itself)
SECRETS = [
    ("openai_key", "use sk-proj-Abcdefghij0123456789KLMNOPqrstuv please", "sk-proj-Abcdefghij0123456789KLMNOPqrstuv"),
    ("openai_key", "OPENAI_API_KEY=sk-0123456789abcdefghijABCDEFGHIJ", "sk-0123456789abcdefghijABCDEFGHIJ"),
    (
        "anthropic_key",
        "x-api: sk-ant-api03-AAAAbbbbCCCCddddEEEEffffGGGGhhhh-0123",
        "sk-ant-api03-AAAAbbbbCCCCddddEEEEffffGGGGhhhh-0123",
    ),
    ("aws_access_key_id", "key AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
    (
        "aws_secret_key",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    ("github_token", "token ghp_0123456789abcdefghijABCDEFGHIJ012345 ok", "ghp_0123456789abcdefghijABCDEFGHIJ012345"),
    ("github_token", "pat github_pat_11ABCDEFG0123456789_abcdefghijkl", "github_pat_11ABCDEFG0123456789_abcdefghijkl"),
    ("slack_token", "xoxb-123456789012-1234567890123-AbCdEfGhIjKl", "xoxb-123456789012-1234567890123-AbCdEfGhIjKl"),
    (
        "slack_webhook",
        "post to https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX now",
        "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    ),
    ("google_api_key", "key=AIzaSyA-0123456789abcdefghijklmnopqrstu", "AIzaSyA-0123456789abcdefghijklmnopqrstu"),
    ("google_oauth_token", "ya29.a0AfH6SMBx0123456789abcdefghij", "ya29.a0AfH6SMBx0123456789abcdefghij"),
    ("stripe_key", "sk_live_0123456789abcdefABCDEF", "sk_live_0123456789abcdefABCDEF"),
    ("bearer_token", "Authorization: Bearer abc.def-ghi_jkl~123", "abc.def-ghi_jkl~123"),
    ("basic_auth", "Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    (
        "jwt",
        "cookie eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U;",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ),
    ("url_password", "postgres://admin:hunter2pw@db.internal:5432/app", "hunter2pw"),
    ("credential", 'config: {"password": "correct horse"}', "correct"),
    ("credential", "login with password=Tr0ub4dor&3 ok", "Tr0ub4dor"),
    ("card_number", "card 4111 1111 1111 1111 exp 12/30", "4111 1111 1111 1111"),
    ("card_number", "amex 378282246310005.", "378282246310005"),
    (
        "private_key",
        "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB\n"
        "-----END RSA PRIVATE KEY-----\ndone",
        "MIIEowIBAAKCAQEA0Z3VS5JJcds3xfn",
    ),
    ("private_key", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA (truncated", "b3BlbnNzaC1rZXk"),
]


@pytest.mark.parametrize(("kind", "text", "secret"), SECRETS, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(SECRETS)])
def test_each_detector_replaces_its_secret(kind: str, text: str, secret: str) -> None:
    r = Redactor(KEY)
    out = r.redact_text(text)
    assert secret not in out
    assert f"«redacted:{kind}:" in out


def test_ordinary_ledger_content_is_left_alone() -> None:
    texts = [
        "run 01JD3V6W8Y0Q9ZK4XH5M2N7P8R step 12 tokens 4096 max_tokens 512",
        "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "at 2026-11-29T17:25:00.123456Z order-8891 refund 10.50 EUR",
        "call +49 30 1234567 or 0049301234567",
        "invoice 1234567890123456 is not a card (fails Luhn)",
        "ms timestamp 1732900000000 and id 20261129172500123",
        "see https://example.com/path?q=1 and ftp://host/file",
        "the user typed the word password but gave none",
        "Bearer",
        "sk-short",
    ]
    r = Redactor(KEY)
    for text in texts:
        assert r.redact_text(text) == text, text


def test_luhn() -> None:
    assert luhn_ok("4111111111111111") and luhn_ok("378282246310005")
    assert not luhn_ok("4111111111111112")


def test_tokens_are_stable_within_a_run_and_differ_across_runs() -> None:
    a, b = Redactor(b"a" * 32), Redactor(b"b" * 32)
    text = "AKIAIOSFODNN7EXAMPLE"
    assert a.redact_text(text) == a.redact_text(f"{text}") and is_token(a.redact_text(text))
    assert a.redact_text(text) != b.redact_text(text)
    assert a.redact_text("AKIAIOSFODNN7EXAMPLF") != a.redact_text(text)


def test_redaction_is_idempotent_and_leaves_tokens_alone() -> None:
    r = Redactor(KEY)
    everything = "\n".join(text for _, text, _ in SECRETS)
    once = r.redact_text(everything)
    assert r.redact_text(once) == once
    tokens = re.findall(r"«[^»]+»", once)
    assert len(tokens) >= len(SECRETS)
    for token in tokens:
        assert is_token(token) and r.redact_text(f"x {token} y") == f"x {token} y"


def _history(secret_text: str) -> str:
    return f"{'earlier turns of the conversation ' * 4}then: {secret_text}"


def test_the_cache_of_repeated_texts_changes_nothing_it_returns_or_counts() -> None:
    cached, fresh = Redactor(KEY), Redactor(KEY)
    texts = [_history(text) for _, text, _ in SECRETS] + ["an ordinary turn of the conversation, " * 3]
    for _ in range(3):  # a message history re-sent at every model call
        for text in texts:
            assert len(text) >= redaction.CACHE_MIN_CHARS
            out = cached.redact_text(text)
            assert out == fresh._scan(text)
    for (_, _, secret), text in zip(SECRETS, texts, strict=False):
        assert secret not in cached.redact_text(text)
    # The same stats as scanning every time: a hit counts the tokens its scan minted.
    assert cached.stats.strings_scanned == 3 * len(texts) + len(SECRETS)
    assert sum(cached.stats.replaced.values()) == 4 * sum(fresh.stats.replaced.values()) // 3


def test_the_cache_is_per_run_so_tokens_stay_per_run() -> None:
    text = _history("AKIAIOSFODNN7EXAMPLE")
    a, b = Redactor(b"a" * 32), Redactor(b"b" * 32)
    first_a, first_b = a.redact_text(text), b.redact_text(text)
    assert a.redact_text(text) == first_a and b.redact_text(text) == first_b
    assert first_a != first_b and "AKIAIOSFODNN7EXAMPLE" not in first_a + first_b


def test_a_secret_registered_later_is_redacted_from_texts_seen_before() -> None:
    r = Redactor(KEY)
    text = _history("the vault said hunter2-rosebud")
    assert r.redact_text(text) == text
    r.add_secret("hunter2-rosebud", "secret:db")
    assert "hunter2-rosebud" not in r.redact_text(text) and "«redacted:secret:db:" in r.redact_text(text)


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "CACHE_MAX_ENTRIES", 8)
    monkeypatch.setattr(redaction, "CACHE_MAX_CHARS", 2_000)
    r = Redactor(KEY)
    for i in range(100):
        r.redact_text(_history(f"turn {i} sk-proj-Abcdefghij0123456789KLMNOP{i:04d}"))
        assert len(r._cache) <= 8 and r._cached_chars <= 2_000
    assert r._cached_chars == sum(len(k) + len(v) for k, (v, _) in r._cache.items())


def test_the_one_scan_for_all_hints_decides_as_the_per_detector_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [text for _, text, _ in SECRETS] + ["ordinary text, no marker at all", "a key", "AKIA", "x" * 600]
    texts += [f"{a} {b}" for a in texts[:6] for b in texts[-4:]]
    gated = [Redactor(KEY)._scan(t) for t in texts]
    monkeypatch.setattr(redaction, "GATE_MAX_CHARS", -1)  # every text takes the per-detector scans
    assert [Redactor(KEY)._scan(t) for t in texts] == gated


def test_credential_named_keys_and_field_paths_replace_whole_values() -> None:
    r = Redactor(KEY, RedactionPolicy(fields=("customer.email", "messages.*.content", "**.ssn")))
    value = {
        "headers": {"Authorization": "whatever-format", "X-Api-Key": "k1", "Accept": "json"},
        "customer": {"email": "ann@example.com", "name": "Ann"},
        "messages": [{"role": "user", "content": "my text"}],
        "deep": {"a": [{"ssn": 123456789}]},
        "password": {"nested": "structure"},
        "token": None,
        "usage": {"input_tokens": 3},
    }
    out = r.redact(value)
    assert is_token(out["headers"]["Authorization"]) and is_token(out["headers"]["X-Api-Key"])
    assert out["headers"]["Accept"] == "json"
    assert is_token(out["customer"]["email"]) and out["customer"]["name"] == "Ann"
    assert is_token(out["messages"][0]["content"]) and out["messages"][0]["role"] == "user"
    assert is_token(out["deep"]["a"][0]["ssn"]) and is_token(out["password"])
    assert out["token"] is None and out["usage"] == {"input_tokens": 3}
    keyed = r.redact({"AKIAIOSFODNN7EXAMPLE": "user"})
    assert list(keyed.values()) == ["user"] and is_token(next(iter(keyed)))
    assert r.redact(out) == out


def test_secret_references_are_kept_and_resolved_values_redacted_everywhere(tmp_path: Path) -> None:
    (tmp_path / "DB_PASSWORD").write_text("file-secret-value\n")
    resolver = SecretResolver(
        {"GIVEN": "given-secret-value"}, env={"RUNLEDGER_SECRET_API": "env-secret-value"}, directory=tmp_path
    )
    r = Redactor(KEY)
    resolver.on_resolve = lambda name, value: r.add_secret(value, f"secret:{name}")
    args = {"auth": "secret://API", "dsn": "pg://u@h/db?password=secret://DB_PASSWORD", "x": ["secret://GIVEN"]}
    assert resolver.resolve(args) == {
        "auth": "env-secret-value",
        "dsn": "pg://u@h/db?password=file-secret-value",
        "x": ["given-secret-value"],
    }
    assert r.redact({"api_key": "secret://API"}) == {"api_key": "secret://API"}
    echoed = r.redact_text("the tool said env-secret-value and given-secret-value")
    assert "secret-value" not in echoed and "«redacted:secret:api:" in echoed
    with pytest.raises(SecretNotFoundError, match="secret://NOPE"):
        resolver.resolve("secret://NOPE")
    assert not contains_token(resolver.resolve("plain"))


def test_field_paths() -> None:
    paths = FieldPaths(["a.*.c", "**.ssn", "x_*"])
    assert paths.match(("a", "0", "c")) and paths.match(("q", "r", "ssn")) and paths.match(("x_email",))
    assert not paths.match(("a", "c")) and not paths.match(("b",))
    assert paths.could_match_below(("a",)) and paths.could_match_below(("zzz",))


def test_the_walk_without_field_paths_redacts_as_the_walk_with_them() -> None:
    value = {
        "messages": [{"role": "user", "content": text} for _, text, _ in SECRETS],
        "headers": {"Authorization": "Bearer abcdefgh12345678", "X-Api-Key": "k1", "token": None, "cookie": ""},
        "nested": [[{"api_key": {"deep": 1}, "sk-proj-Abcdefghij0123456789KLMNOPqrstuv": 2}], 3.5, None, True],
    }
    plain, pathed = Redactor(KEY), Redactor(KEY, RedactionPolicy(fields=("no.such.field",)))
    assert plain.redact(value) == pathed.redact(value)
    assert plain.stats == pathed.stats
