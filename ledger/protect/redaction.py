"""Redaction: secrets and configured fields replaced by stable tokens before anything is published.

A ``Redactor`` walks a JSON-native value and replaces

- every match of a secret *detector* inside any string (provider API keys and tokens,
  bearer tokens, PEM private keys, passwords in URLs, JWTs, card numbers that pass the
  Luhn check, ``password=...``-style assignments),
- the whole value under a dict key that names a credential (``authorization``,
  ``password``, ``api_key``, ``cookie``...),
- the whole value at a configured *field path* (``args.customer.email``,
  ``request.messages.*.content``, ``**.ssn``),
- every occurrence of a value registered as secret (what a ``secret://NAME`` reference
  resolved to),

by the token ``«redacted:<kind>:<12 hex>»``, where the hex is an HMAC-SHA256 of the value
under the run's token key: the same value gives the same token within a run (analysts can
still join and count on it), different runs give unrelated tokens, and nobody without the
key can confirm a guess.

Design notes. Detection runs over the JSON value, not its serialized bytes, so a match
never straddles a JSON escape and the replacement can never produce invalid JSON.
Detectors are plain regular expressions with an optional validator, applied one after
the other on the progressively redacted string; a token itself contains nothing any
detector matches (checked by a test), so redaction is idempotent. Rejected: entropy-based
detection of "random-looking" strings (high false-positive rate on ids and hashes, which
the ledger is full of) and redacting serialized bytes (escapes split secrets).

Cost. Most strings hold no secret: each detector names literal *hints* one of which every
match contains, and a string up to ``GATE_MAX_CHARS`` is first searched once for all of them
(one trie-shaped regex); longer ones are checked hint by hint with ``str.find`` (CPython's re
tries the alternation at every position, which on long text is slower than ~30 finds: a
single combined regex for every length was measured and not kept). The card detector, which
has no literal, is gated by a cheap regex its matches contain. Long strings are remembered per
run (``redact_text``): the message history re-sent at every model call is scanned once.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import hmac
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runledger.errors import ConfigurationError, SecretNotFoundError
from runledger.record.canonical import canonical_json

TOKEN_OPEN, TOKEN_CLOSE = "«", "»"
_TOKEN_RE = re.compile(r"«redacted:[a-z0-9_:.-]+:[0-9a-f]{12}»")
# Tokens already placed and secret:// references are never looked into (see Redactor._apply).
_PROTECTED_SPLIT = re.compile(r"(«redacted:[a-z0-9_:.-]+:[0-9a-f]{12}»|secret://[A-Za-z_][A-Za-z0-9_.-]{0,127})")
SECRET_SCHEME = "secret://"
# Redaction cache of a run (Redactor.redact_text): texts shorter than this are cheaper to scan
# than to look up; longer than CACHE_MAX_TEXT are documents, not re-sent history.
CACHE_MIN_CHARS = 64
CACHE_MAX_TEXT = 256 * 1024
CACHE_MAX_ENTRIES = 4096
CACHE_MAX_CHARS = 2 * 1024 * 1024  # keys and values: 2-8 MiB of str per run, a worker may hold many runs
# Up to this length one scan for every detector's hints at once (Redactor._any_hint) decides for
# all of them; above it the per-detector ``str.find`` scans are as fast as that one regex scan
# (CPython's re tries the alternation at each position: 2 KiB took 26-180 us, against 50-65 us for
# ~30 finds, while a 13-60 character string took 0.4-0.7 us against 9-16 us).
GATE_MAX_CHARS = 512
_SECRET_REF = re.compile(r"secret://([A-Za-z_][A-Za-z0-9_.-]{0,127})")


def luhn_ok(digits: str) -> bool:
    """True when ``digits`` (only 0-9) passes the Luhn checksum of payment card numbers."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _card_ok(text: str) -> bool:
    digits = re.sub(r"[ -]", "", text)
    return 13 <= len(digits) <= 19 and luhn_ok(digits)


@dataclass(frozen=True)
class Detector:
    """One kind of secret: a pattern, the group that holds the secret, an optional check."""

    kind: str
    pattern: re.Pattern[str]
    group: int = 0
    valid: Callable[[str], bool] | None = None
    # Lower-case substrings of which every match contains one: a cheap pre-filter (``str.find``
    # is far faster than a regex scan), so a 50 MB document pays only for what it might hold.
    hints: tuple[str, ...] = ()
    # A pattern every match contains (case-sensitive), for detectors without literal hints: a scan
    # for it is far cheaper than ``pattern`` when ``pattern`` starts with a look-behind, which keeps
    # the regex engine from skipping ahead to a possible first character.
    gate: re.Pattern[str] | None = None


def _d(
    kind: str,
    pattern: str,
    group: int = 0,
    valid: Callable[[str], bool] | None = None,
    hint: str | tuple[str, ...] = (),
    gate: str | None = None,
) -> Detector:
    hints = (hint,) if isinstance(hint, str) else hint
    return Detector(kind, re.compile(pattern), group, valid, hints, re.compile(gate) if gate else None)


# Order matters: multi-line and structured secrets first, so later generic patterns never
# see half of a key that a specific one would have taken whole.
DETECTORS: tuple[Detector, ...] = (
    _d(
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[\s\S]*\Z)",
        hint="private key",
    ),
    # scheme://user:password@host: only the password goes.
    _d("url_password", r"\b[a-zA-Z][a-zA-Z0-9+.-]{1,20}://[^/\s:@\"'<>]{1,256}:([^@\s/\"'<>]{1,256})@", 1, hint="://"),
    _d("slack_webhook", r"https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9/_-]{20,}", hint="hooks.slack"),
    _d("anthropic_key", r"\bsk-ant-[A-Za-z0-9]{2,10}-[A-Za-z0-9_-]{20,}", hint="sk-ant-"),
    _d("openai_key", r"\bsk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_-]{20,}", hint="sk-"),
    _d("stripe_key", r"\b(?:sk|rk|pk)_(?:live|test)_[0-9A-Za-z]{16,}", hint=("_live_", "_test_")),
    _d(
        "aws_access_key_id",
        r"\b(?:AKIA|ASIA|ABIA|ACCA|AROA|AIDA)[0-9A-Z]{16}\b",
        hint=("akia", "asia", "abia", "acca", "aroa", "aida"),
    ),
    _d(
        "aws_secret_key",
        r"(?i)aws.{0,24}?(?:secret|private)[a-z_ -]{0,24}[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
        1,
        hint="aws",
    ),
    _d(
        "github_token",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})",
        hint=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    _d("slack_token", r"\bxox[abposre]-[A-Za-z0-9-]{10,}", hint="xox"),
    _d("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}", hint="aiza"),
    _d("google_oauth_token", r"\bya29\.[0-9A-Za-z_-]{20,}", hint="ya29."),
    _d("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", hint="eyj"),
    _d("bearer_token", r"(?i)\bbearer\s+([A-Za-z0-9._~+/-]{8,}=*)", 1, hint="bearer"),
    _d("basic_auth", r"(?i)\bbasic\s+([A-Za-z0-9+/]{12,}={0,2})(?![A-Za-z0-9+/=])", 1, hint="basic"),
    # key=value / "key": "value" assignments of credentials in free text (logs, configs, tracebacks).
    _d(
        "credential",
        r"(?i)(?:password|passwd|pwd|passphrase|secret|api[_-]?key|access[_-]?token|auth[_-]?token|"
        r"refresh[_-]?token|client[_-]?secret|private[_-]?key|session[_-]?token)"
        r"[\"']?\s*[:=]\s*[\"']?([^\s\"',;&«»]{4,})",
        1,
        hint=("pass", "pwd", "secret", "key", "token"),
    ),
    # 13-19 digits (optionally grouped by spaces or dashes) starting like a card network, Luhn-checked.
    _d(
        "card_number",
        r"(?<![\d-])(?:[3456]\d{3}[ -]?)(?:\d[ -]?){8,14}\d(?![\d-])",
        valid=_card_ok,
        gate=r"[3456]\d{3}",
    ),
)

# Dict keys whose value is a credential whatever it looks like (compared lower-case, without - and _).
SENSITIVE_KEYS: frozenset[str] = frozenset(
    {
        "auth",
        "authorization",
        "proxyauthorization",
        "credential",
        "credentials",
        "secretkey",
        "apisecret",
        "cookie",
        "setcookie",
        "xapikey",
        "apikey",
        "apitoken",
        "xauthtoken",
        "authtoken",
        "accesstoken",
        "refreshtoken",
        "idtoken",
        "sessiontoken",
        "bearertoken",
        "token",
        "password",
        "passwd",
        "passphrase",
        "secret",
        "clientsecret",
        "privatekey",
        "awssecretaccesskey",
        "secretaccesskey",
        "cardnumber",
        "cvv",
        "cvc",
    }
)


def _alternation(literals: Iterable[str]) -> re.Pattern[str]:
    """One regex that finds any of ``literals``, alternatives shared as a trie (``a(?:ws|kia|...)``).

    Used as a search-only gate: where one literal is a prefix of another, the shorter one stands
    for both (whatever contains the longer contains the shorter). No literals: never matches."""
    trie: dict[str, Any] = {}
    for word in set(literals):
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}
    if not trie:
        return re.compile(r"(?!)")

    def build(node: dict[str, Any]) -> str:
        if "" in node:
            return ""
        alts = [re.escape(ch) + build(child) for ch, child in sorted(node.items())]
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return re.compile(build(trie))


@functools.lru_cache(maxsize=4096)  # the same few keys (role, content, args...) at every step
def _normalize_key(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


class FieldPaths:
    """Dotted field paths with wildcards: ``*`` one segment (a key or a list index), ``**`` any number.

    Segments may use fnmatch patterns (``*_email``). Paths are matched against the path of
    a value from the root it is handed (an event payload: ``args.card``, ``request.messages.3.content``).
    """

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self.paths = tuple(tuple(p.split(".")) for p in paths if p)
        for p in self.paths:
            if any(seg == "" for seg in p):
                raise ConfigurationError(f"field path {'.'.join(p)!r} has an empty segment")

    def __bool__(self) -> bool:
        return bool(self.paths)

    def match(self, path: tuple[str, ...]) -> bool:
        return any(_match(p, path) for p in self.paths)

    def could_match_below(self, path: tuple[str, ...]) -> bool:
        """Whether some configured path might match a descendant of ``path`` (prunes the walk)."""
        return any(_prefix_match(p, path) for p in self.paths)


def _match(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], head) and _match(rest, path[1:])


def _prefix_match(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    if not path:
        return True
    if not pattern:
        return False
    head = pattern[0]
    if head == "**":
        return True
    return fnmatch.fnmatchcase(path[0], head) and _prefix_match(pattern[1:], path[1:])


@dataclass(frozen=True)
class RedactionPolicy:
    """What to redact: field paths, extra detectors, and whether credential-named keys count."""

    fields: tuple[str, ...] = ()
    detectors: tuple[Detector, ...] = DETECTORS
    extra_detectors: tuple[Detector, ...] = ()
    sensitive_keys: frozenset[str] = SENSITIVE_KEYS


@dataclass
class RedactionStats:
    strings_scanned: int = 0
    replaced: dict[str, int] = field(default_factory=dict)


class Redactor:
    """Applies a RedactionPolicy under one run's token key. Not thread-safe (stats)."""

    def __init__(self, token_key: bytes, policy: RedactionPolicy | None = None) -> None:
        if len(token_key) < 16:
            raise ConfigurationError("a redaction token key needs at least 16 bytes")
        self._key = token_key
        self.policy = policy or RedactionPolicy()
        self._fields = FieldPaths(self.policy.fields)
        self._detectors = self.policy.detectors + self.policy.extra_detectors
        self._keys = frozenset(_normalize_key(k) for k in self.policy.sensitive_keys)
        self._any_hint = _alternation(h for det in self._detectors for h in det.hints)
        self._known: dict[str, str] = {}  # secret value -> kind
        self._known_re: re.Pattern[str] | None = None
        self.stats = RedactionStats()
        # text -> (redacted text, kinds of the tokens it minted): see redact_text.
        self._cache: OrderedDict[str, tuple[str, tuple[str, ...]]] = OrderedDict()
        self._cached_chars = 0
        self._minted: list[str] | None = None

    # -- tokens -----------------------------------------------------------------------------------------

    def token(self, kind: str, value: str) -> str:
        """The stable token of ``value`` in this run."""
        mac = hmac.new(self._key, value.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:12]
        self.stats.replaced[kind] = self.stats.replaced.get(kind, 0) + 1
        if self._minted is not None:
            self._minted.append(kind)
        return f"{TOKEN_OPEN}redacted:{kind}:{mac}{TOKEN_CLOSE}"

    def add_secret(self, value: str, kind: str = "secret") -> None:
        """Redact every later occurrence of ``value`` (e.g. what a secret:// reference resolved to)."""
        if len(value) < 4 or value in self._known:
            return  # too short to search for without destroying ordinary text
        self._known[value] = re.sub(r"[^a-z0-9_:.-]", "_", kind.lower())
        alternatives = sorted(self._known, key=len, reverse=True)
        self._known_re = re.compile("|".join(re.escape(v) for v in alternatives))
        self._cache.clear()  # a text redacted before may hold the new secret
        self._cached_chars = 0

    # -- values -----------------------------------------------------------------------------------------

    def redact(self, value: Any, path: tuple[str, ...] = ()) -> Any:
        """A copy of JSON-native ``value`` with secrets and configured fields tokenized."""
        if not self._fields:
            return self._walk(value)
        if path and self._fields.match(path):
            return self._whole(f"field:{path[-1]}", value)
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for k, v in value.items():
                key = str(k)
                if _normalize_key(key) in self._keys and v is not None and v != "":
                    out[key] = self._whole(f"field:{_normalize_key(key)}", v)
                else:
                    # Keys are scanned too (a token used as a dict key); the path keeps the original.
                    out[self.redact_text(key) if len(key) >= 8 else key] = self.redact(v, (*path, key))
            return out
        if isinstance(value, list):
            return [self.redact(v, (*path, str(i))) for i, v in enumerate(value)]
        return value

    def _walk(self, value: Any) -> Any:
        # ``redact`` without field paths (the default policy): the same walk, minus the path of
        # every value, which only field paths look at.
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for k, v in value.items():
                key = str(k)
                norm = _normalize_key(key)
                if norm in self._keys and v is not None and v != "":
                    out[key] = self._whole(f"field:{norm}", v)
                else:
                    out[self.redact_text(key) if len(key) >= 8 else key] = self._walk(v)
            return out
        if isinstance(value, list):
            return [self._walk(v) for v in value]
        return value

    def _whole(self, kind: str, value: Any) -> str:
        if isinstance(value, str):
            if _TOKEN_RE.fullmatch(value):
                return value
            if value.startswith(SECRET_SCHEME):
                return value  # a reference is not the secret; keeping it keeps the args meaningful
            return self.token(kind, value)
        return self.token(kind, canonical_json(value).decode("utf-8"))

    def redact_known(self, text: str) -> str:
        """``text`` with only the registered secret values replaced (capture=full)."""
        if self._known_re is None or len(text) < 4:
            return text
        known = self._known
        return self._known_re.sub(lambda m: self.token(known[m.group(0)], m.group(0)), text)

    def redact_text(self, text: str) -> str:
        """``text`` with every detected secret replaced by its token.

        Texts of ``CACHE_MIN_CHARS`` or more are remembered (a bounded LRU, this run's only):
        an agent re-sends its whole message history at every model call, so the same long
        strings come back step after step. A hit returns exactly what a scan would (the
        detectors are fixed, tokens are a pure function of the run's key and the value) and
        counts the same stats; registering a secret empties the cache."""
        self.stats.strings_scanned += 1
        if len(text) < CACHE_MIN_CHARS or len(text) > CACHE_MAX_TEXT:
            return self._scan(text)
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            replaced = self.stats.replaced
            for kind in hit[1]:
                replaced[kind] = replaced.get(kind, 0) + 1
            return hit[0]
        minted: list[str] = []
        self._minted = minted
        try:
            out = self._scan(text)
        finally:
            self._minted = None
        self._cache[text] = (out, tuple(minted))
        self._cached_chars += len(text) + len(out)
        while len(self._cache) > CACHE_MAX_ENTRIES or self._cached_chars > CACHE_MAX_CHARS:
            old, (old_out, _) = self._cache.popitem(last=False)
            self._cached_chars -= len(old) + len(old_out)
        return out

    def _scan(self, text: str) -> str:
        text = self.redact_known(text)
        if len(text) < 8:
            return text
        lower: str | None = None
        hinted = True  # whether some detector's hint may be in ``lower``
        for det in self._detectors:
            if det.hints:
                if lower is None:
                    lower = text.lower()
                    hinted = len(lower) > GATE_MAX_CHARS or self._any_hint.search(lower) is not None
                if not hinted or not any(h in lower for h in det.hints):
                    continue
            elif det.gate is not None and det.gate.search(text) is None:
                continue
            new = self._apply(det, text)
            if new != text:
                text, lower = new, None
        return text

    def _apply(self, det: Detector, text: str) -> str:
        def sub(part: str) -> str:
            return det.pattern.sub(lambda m: self._replace(det, m), part)

        if TOKEN_OPEN not in text and SECRET_SCHEME not in text:
            return sub(text)
        # Never look inside a token already placed (its kind names, e.g. "secret:" or "password",
        # would be taken for the start of a credential assignment) or a secret:// reference
        # (it names a credential, it is not one, and replays must see it unchanged).
        parts = _PROTECTED_SPLIT.split(text)
        return "".join(part if i % 2 else sub(part) for i, part in enumerate(parts))

    def _replace(self, det: Detector, m: re.Match[str]) -> str:
        secret = m.group(det.group)
        if secret is None or _TOKEN_RE.search(secret):
            return m.group(0)
        if det.valid is not None and not det.valid(secret):
            return m.group(0)
        tok = self.token(det.kind, secret)
        if det.group == 0:
            return tok
        start, end = m.start(det.group) - m.start(0), m.end(det.group) - m.start(0)
        whole = m.group(0)
        return whole[:start] + tok + whole[end:]


def is_token(text: str) -> bool:
    return bool(_TOKEN_RE.fullmatch(text))


def contains_token(text: str) -> bool:
    return bool(_TOKEN_RE.search(text))


# -- credentials by reference ----------------------------------------------------------------------------


class SecretResolver:
    """Resolves ``secret://NAME`` references where a tool runs; values never reach the record.

    Looks NAME up, in order, in ``values`` (given in code), the environment
    (``RUNLEDGER_SECRET_<NAME>`` then ``<NAME>``) and a directory of files named after the
    secret (``RUNLEDGER_SECRETS_DIR``, Docker/Kubernetes style, trailing newline stripped).
    Every resolved value is handed to ``on_resolve`` (the run's redactor registers it, so
    a tool that echoes a credential back has it redacted from its output too).
    """

    def __init__(
        self,
        values: Mapping[str, str] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        directory: str | Path | None = None,
    ) -> None:
        self._values = dict(values or {})
        self._env = env if env is not None else os.environ
        found_dir = directory or self._env.get("RUNLEDGER_SECRETS_DIR")
        self._dir = Path(found_dir) if found_dir else None
        self.on_resolve: Callable[[str, str], None] | None = None

    def lookup(self, name: str) -> str:
        value = self._values.get(name)
        if value is None:
            value = self._env.get(f"RUNLEDGER_SECRET_{name}") or self._env.get(name)
        if value is None and self._dir is not None:
            path = self._dir / name
            if path.is_file():
                value = path.read_text().rstrip("\n")
        if value is None:
            raise SecretNotFoundError(name, f" in {self._dir}" if self._dir else "")
        if self.on_resolve is not None:
            self.on_resolve(name, value)
        return value

    def resolve(self, value: Any) -> Any:
        """A copy of ``value`` with every ``secret://NAME`` (whole string or inside one) resolved."""
        if isinstance(value, str):
            if SECRET_SCHEME not in value:
                return value
            return _SECRET_REF.sub(lambda m: self.lookup(m.group(1)), value)
        if isinstance(value, dict):
            return {k: self.resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v) for v in value]
        return value
