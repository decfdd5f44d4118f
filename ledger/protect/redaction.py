"""Redaction: secrets and configured fields replaced by stable tokens before anything is published.

A ``Redactor`` walks a JSON-native value and replaces

- every match of a secret *detector* inside any string (provider API keys and tokens,
  bearer tokens, PEM private keys, passwords in URLs, JWTs, card numbers that pass the
  Luhn check, ``password=...``-style assignments, whose value goes whole: to the end of
  its quoted string, of the line, or of its URL query parameter),
- the same, inside base64 and URL-encoded wrappers: a wrapper whose decoded text holds a
  secret goes whole, as ``«redacted:base64:<kind>:...»`` (``urlencoded:<kind>``),
- the whole value under a dict key that names a credential (``SENSITIVE_KEYS``: patterns,
  ``*password*``, ``*token*``, ``pwd``, ``authorization``... case and ``-_. `` ignored, minus
  ``NON_SENSITIVE_KEYS``: ``max_tokens`` is a count),
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
Detectors are regular expressions with an optional validator and an optional *extent* (the
secret's span worked out from a match: the value after ``password:``, a PEM key up to its
footer), applied one after the other on the progressively redacted string; a token itself
contains nothing any detector matches (checked by a test), so redaction is idempotent.
Rejected: entropy-based detection of "random-looking" strings (high false-positive rate on
ids and hashes, which the ledger is full of); redacting serialized bytes (escapes split
secrets); stopping a password at its first blank or ``&`` (most of a passphrase was stored);
a cap on the text scanned per value (whatever lies past the cap would be stored unscanned:
the caps are on the work per match attempt instead, below).

Linear time, whatever the input. A detector's pattern starts with a literal the regex engine
searches for (``sk-``, ``://``, ``eyJ``, ``password``: a word boundary in front is a
look-behind after the literal, since one before it hides the literal from the engine), what
an attempt reads before it decides is bounded (``Detector.reach``; unbounded only in
possessive tails that lengthen a match), and no attempt reads what another has read
(possessive quantifiers, atomic groups, anchors that cannot recur inside a run: a JWT's
first segment may not run over a later ``-eyJ``, which starts its own attempt; ``-eyJ`` x 256
KiB, which the former pattern rescanned from every ``eyJ``, took 9 s). Texts are scanned in
windows of ``WINDOW_CHARS`` overlapping by ``reach`` (a match a window cuts short is matched
again over the whole text), so no regex call holds the GIL long: a redaction in a worker
thread (``off_loop``, for values of ``OFFLOAD_MIN_CHARS`` or more) leaves the event loop free.
The matches of a window are checked in C ``map``s (card numbers: ``_cards_ok``) and wrappers
are probed in bulk, so Python work grows with the secrets found more than with the candidates
looked at (a ``password:`` that has a value is one Python call, for its extent).
Limits of the bounds: a URL password of more than 256 characters, or more than 256 blanks
between ``password:`` and its value, are not recognised.

Wrappers. A *probe* is a scan whose tokens are masks as long as the secrets (``_Mint``), so
it keeps offsets. URL encoding: the whole text is ``%XX``-decoded in a few C passes and
probed; a masked span is mapped back by counting escapes, and its encoded form goes
(``«redacted:urlencoded:<kind>:...»``). Base64: runs of 16 or more (a block of 64- or
76-column lines is one run; a run is also tried after a short ``key-`` or ``/v1/`` prefix)
are decoded and probed together, their decodings joined by a character no detector matches
across; a run whose part changed goes whole (``«redacted:base64:<kind>:...»``). Of many runs,
one decoding of them all (no offsets kept) is probed first, and only the stretches of text
holding a run it flagged are looked at run by run (``Redactor._base64_suspects``). That probe is
cut in bands of run length (``Redactor._probe_bands``): a decoding shorter than a built-in
detector's shortest match (``_MIN_CHARS``; NULs between decodings, which no built-in detector
matches across) is not scanned for it (16-character runs, 12 bytes, hold no card number, key or
base64), and its masks are one Latin-1 character the decodings lack (the probe stays one byte a
character). Decodings with more than one control character in sixteen are binary and not looked
into. Two wrappers deep at most (``WRAPPER_DEPTH``: base64 of URL-encoded text).

Cost. Most strings hold no secret: each detector names literal *hints* one of which every
match contains (or a cheap *gate* pattern), and a string up to ``GATE_MAX_CHARS`` is first
searched once for all hints (one trie-shaped regex); in one of up to a window, each hint is
looked for once (a C ``in`` each); in longer ones each hint's first place is found once
(``str.find``; not at all when one of its characters is absent, a memchr), and a detector scans
only the windows around its hits (CPython's re tries an alternation at every position, which on
long text is slower than the finds: a single combined regex was measured and not kept). A text
of one window holding no hint is then decided in a few more C calls (``Redactor._plain``: the
card number's pattern, a ``%XX``, a mixed-case base64 run), which are the scan's own first
tests: no detector or wrapper is entered for a role, a key, a status, an id or a sentence. Short
texts found so are remembered per run, as long strings are with what they became
(``redact_text``): the message history re-sent at every model call is scanned once. Rejected for
the gate: one case-insensitive regex over the text as is (``re.I`` loses the literal searches:
3-10x slower than lower-casing first). Tokens are an HMAC from pre-keyed SHA-256 states (half
the cost of ``hmac.new``), remembered per short value. ``bench/protect.py`` measures the normal
path and 1 MiB of adversarial input per detector.

A ``Redactor`` is safe to share between threads: the scans share nothing mutable, and the
stats, the caches and the registered secrets change under a lock.
"""

from __future__ import annotations

import asyncio
import binascii
import bisect
import fnmatch
import functools
import hashlib
import importlib
import itertools
import operator
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from runledger.errors import ConfigurationError, SecretNotFoundError
from runledger.protect.wrappers import (
    _B64_BARE,
    _B64_BLOCK_LINE,
    _B64_KEEP,
    _B64_MAP,
    _B64_MAX_SUSPECTS,
    _B64_PREFIX,
    _B64_RUN,
    _B64_SHORT,
    _CONTROL_TO_NUL,
    _PERCENT,
    _SEP,
    _URLSAFE_BYTES,
    _b64_decode_all,
    _b64_runs,
    _b64_tails,
    _mixed_case,
    _texty,
    _url_decode,
    _url_offsets,
)
from runledger.record.canonical import canonical_json

TOKEN_OPEN, TOKEN_CLOSE = "«", "»"
_TOKEN_RE = re.compile(r"«redacted:[a-z0-9_:.-]+:[0-9a-f]{12}»")
# Tokens already placed and secret:// references are never looked into (see Redactor._find).
_PROTECTED = re.compile(r"«redacted:[a-z0-9_:.-]{1,128}:[0-9a-f]{12}»|secret://[A-Za-z_][A-Za-z0-9_.-]{0,127}")
SECRET_SCHEME = "secret://"
# Redaction cache of a run (Redactor.redact_text): texts shorter than this are cheaper to scan
# than to look up; longer than CACHE_MAX_TEXT are documents, not re-sent history.
CACHE_MIN_CHARS = 64
CACHE_MAX_TEXT = 256 * 1024
CACHE_MAX_ENTRIES = 4096
CACHE_MAX_CHARS = 2 * 1024 * 1024  # keys and values: 2-8 MiB of str per run, a worker may hold many runs
# Short texts remembered as holding nothing to redact (Redactor.redact_text): at most ~250 KiB a run.
PLAIN_MAX_ENTRIES = 4096
# Up to this length one scan for every detector's hints at once (Redactor._any_hint) decides for
# all of them; above it the per-detector ``str.find`` scans are as fast as that one regex scan
# (CPython's re tries the alternation at each position: 2 KiB took 26-180 us, against 50-65 us for
# ~30 finds, while a 13-60 character string took 0.4-0.7 us against 9-16 us).
GATE_MAX_CHARS = 512
# The most text one regex call scans: ~1-3 ms of GIL at the slowest detector's rate.
WINDOW_CHARS = 128 * 1024
# Values holding this much text are redacted in a worker thread (``off_loop``).
OFFLOAD_MIN_CHARS = 64 * 1024
# How many wrappers deep a secret is looked for (base64 of a URL-encoded text: 2).
WRAPPER_DEPTH = 2
_SECRET_REF = re.compile(r"secret://([A-Za-z_][A-Za-z0-9_.-]{0,127})")
_T = TypeVar("_T")


def luhn_ok(digits: str) -> bool:
    """True when ``digits`` (only 0-9) passes the Luhn checksum of payment card numbers."""
    # Every second digit from the right doubled (digit sum: 5 -> 1, 6 -> 3...); the sums are those
    # of the ASCII codes, less 48 a digit: C loops over bytes instead of a Python loop over digits.
    raw = digits.encode()
    return (sum(raw[-1::-2]) + sum(raw[-2::-2].translate(_DOUBLED)) - 48 * len(raw)) % 10 == 0


_DOUBLED = bytes.maketrans(b"0123456789", b"0246813579")


@functools.lru_cache(maxsize=4096)  # a table of the same few numbers, or an input made of one
def _card_ok(text: str) -> bool:
    raw = text.encode().translate(None, b" -")
    n = len(raw)
    return 13 <= n <= 19 and (sum(raw[-1::-2]) + sum(raw[-2::-2].translate(_DOUBLED)) - 48 * n) % 10 == 0


def _cards_ok(candidates: list[str]) -> list[bool]:
    """``_card_ok`` of each candidate, in C loops over the batch: the digits of every candidate
    right-aligned in 20 (zeros in front change no Luhn sum), so that the digits to double are at the
    same places in every block; each block's sums are then two ``sum``s over its 10-byte slices."""
    if not candidates:
        return []
    unique = set(candidates)
    if len(unique) * 2 < len(candidates):  # the same few numbers again and again: check each once
        verdicts = dict(zip(unique, map(_card_ok, unique), strict=True))
        return list(map(verdicts.__getitem__, candidates))
    digits = list(map(bytes.translate, map(str.encode, candidates), itertools.repeat(None), itertools.repeat(b" -")))
    blocks = b"".join(map(bytes.rjust, digits, itertools.repeat(20), itertools.repeat(b"0")))
    size = len(blocks)
    starts, ends = range(0, size // 2, 10), range(10, size // 2 + 10, 10)
    kept, doubled = blocks[1::2], blocks[0::2].translate(_DOUBLED)
    kept_sums = map(sum, map(kept.__getitem__, map(slice, starts, ends)))
    doubled_sums = map(sum, map(doubled.__getitem__, map(slice, starts, ends)))
    # 20 ASCII digits add 20 x 48 = 960 to each sum, which is 0 mod 10.
    luhn = map(operator.not_, map(operator.mod, map(operator.add, kept_sums, doubled_sums), itertools.repeat(10)))
    lengths = map(len, digits)
    sized = map(
        operator.and_,
        map(operator.le, itertools.repeat(13), lengths),
        map(operator.ge, itertools.repeat(19), map(len, digits)),
    )
    return list(map(operator.and_, luhn, sized))


Extent = Callable[[str, "re.Match[str]"], "tuple[int, int] | None"]


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
    # The most characters a match attempt reads from where it starts before it succeeds or fails
    # (a possessive tail that only lengthens a match excepted), and the farthest a hint or a gate
    # match lies from the start of the match holding it. Windows overlap by this much.
    reach: int = 1024
    # Match against the text lower-cased (ASCII letters; same length and offsets): case-insensitive
    # detection that keeps a literal prefix for the regex engine to search for.
    lower: bool = False
    # The secret's span from a match, over the whole text (it may run past the match: the value
    # after ``password:``); None: no secret there. Default: the span of ``group``.
    extent: Extent | None = None
    # Window ends go to a match of this pattern (a character no match contains) instead of
    # overlapping by ``reach``: for detectors whose matches are unbounded runs (a JWT).
    cut: re.Pattern[str] | None = None
    # ``valid`` for all the candidates of a window at once (C loops over the batch instead of a
    # Python call each: an input can hold 50,000 candidate card numbers a MiB).
    valid_all: Callable[[list[str]], Iterable[bool]] | None = None


def _d(
    kind: str,
    pattern: str,
    group: int = 0,
    valid: Callable[[str], bool] | None = None,
    hint: str | tuple[str, ...] = (),
    gate: str | None = None,
    *,
    reach: int = 1024,
    lower: bool = False,
    extent: Extent | None = None,
    cut: str | None = None,
    valid_all: Callable[[list[str]], Iterable[bool]] | None = None,
) -> Detector:
    hints = (hint,) if isinstance(hint, str) else hint
    return Detector(
        kind,
        re.compile(pattern),
        group,
        valid,
        hints,
        re.compile(gate) if gate else None,
        reach,
        lower,
        extent,
        re.compile(cut) if cut else None,
        valid_all,
    )


# -- extents: where a secret ends, past what its pattern matched ------------------------------------------

_PEM_END = re.compile(r"-----END (?:[A-Z0-9]{1,24} ){0,6}PRIVATE KEY(?: BLOCK)?-----")


def _pem_extent(text: str, m: re.Match[str]) -> tuple[int, int]:
    """A PEM key: from its header to its footer, or to the end of the text (a truncated key)."""
    footer = _PEM_END.search(text, m.end())  # a literal-prefix search, once per key
    stop = footer.start() if footer else len(text)
    sep = text.find(_SEP, m.end(), stop)
    if sep >= 0:
        return m.start(), sep
    return m.start(), footer.end() if footer else len(text)


_SCHEME = re.compile(r"(?<!\w)[a-zA-Z][a-zA-Z0-9+.-]{1,20}\Z")


def _url_password_extent(text: str, m: re.Match[str]) -> tuple[int, int] | None:
    """``scheme://user:PASSWORD@``: the match starts at ``://`` (a literal the engine jumps to);
    the scheme before it is checked here, on the few matches that get this far."""
    start = m.start()
    if _SCHEME.search(text, max(0, start - 21), start) is None:
        return None
    return m.span(2)


def _aws_secret_extent(text: str, m: re.Match[str]) -> tuple[int, int] | None:
    low = m.string  # the lower-cased text
    start = m.start()
    aws = low.rfind("aws", max(0, start - 27), start)
    if aws < 0 or "\n" in low[aws:start]:
        return None
    return m.span(1)


_BLANKS = re.compile(r"[ \t]*+")
_LINE_REST = re.compile(r"[^\n\r\x00\uffff]*+")
_QUERY_VALUE = re.compile(r"[^&#\s\"'<>\x00\uffff]*+")
# A quoted value: up to the closing quote (escapes skipped) or the end of the line.
_QUOTED = {q: re.compile(rf"(?:[^{q}\\\n\r\x00\uffff]++|\\[^\n\r\x00\uffff])*+") for q in "\"'`"}
# A value quoted with escaped quotes (JSON inside a string: ``\"password\": \"...\"``): up to a
# quote behind exactly one backslash; ``\\\"`` is a quote inside the value.
_ESCAPED_QUOTED = {q: re.compile(rf"(?:[^\\\n\r\x00\uffff]++|\\{{2,}}+{q}?|\\(?!{q}))*+") for q in "\"'"}
_AUTH_SCHEME = re.compile(r"(?i)(?:bearer|basic|digest|negotiate|ntlm|token)[ \t]++")
_IDENT_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"


def _run_end(pattern: re.Pattern[str], text: str, start: int) -> int:
    """Where a pattern that matches the empty string too (``x*+``) stops, from ``start``."""
    m = pattern.match(text, start)
    return m.end() if m is not None else start


def _credential_extent(text: str, m: re.Match[str]) -> tuple[int, int] | None:
    """The value of ``name = value`` / ``"name": "value"``, whole.

    Quoted: up to the closing quote (or the end of the line, if it never closes). In a URL query
    (``?password=...&next=``): up to the next ``&``, ``#`` or blank. Otherwise to the end of the
    line: a passphrase has spaces and any symbol, so nothing short of the line end is known to end
    it. An HTTP auth scheme in front (``Authorization: Bearer ...``) is not part of the secret; a
    value that starts with a token (an API key a specific detector took whole) ends with it."""
    n = len(text)
    j = _run_end(_BLANKS, text, m.end())
    if j >= n:
        return None
    c = text[j]
    if c == "\\" and j + 1 < n and text[j + 1] in "\"'":
        start = j + 2
        end = _run_end(_ESCAPED_QUOTED[text[j + 1]], text, start)
    elif c in "\"'`":
        start = j + 1
        end = _run_end(_QUOTED[c], text, start)
    else:
        start = j
        name_at = m.start()
        before = text[max(0, name_at - 64) : name_at]
        ident = name_at - (len(before) - len(before.rstrip(_IDENT_CHARS)))
        query = ident > 0 and text[ident - 1] in "?&"
        end = _run_end(_QUERY_VALUE if query else _LINE_REST, text, start)
        end = start + len(text[start:end].rstrip(" \t"))
    scheme = _AUTH_SCHEME.match(text, start, end)
    if scheme is not None and scheme.end() < end:
        start = scheme.end()
    placed = _PROTECTED.match(text, start, end)
    if placed is not None:  # a detector that knew where this secret ends took it (or it is a reference)
        end = placed.end()
    return (start, end) if end > start else None


# Names of credentials in free text (matched on the lower-cased text), one pattern per family so
# that each starts with a literal the regex engine searches for (an alternation in front makes it
# try every position: 90 ms a MiB of prose, against ~3 for a literal). Any identifier holding one
# counts (``db_password``, ``x-auth-token``), except counts and kinds of tokens (``max_tokens``).
_CREDENTIAL_NAMES: tuple[tuple[str, str], ...] = (  # (the literal it starts with, the rest of the name)
    ("pass", r"(?:word|wd|phrase)"),
    ("pwd", ""),
    ("secret", ""),
    ("token", r"(?!s(?![a-z0-9])|s[_.-]|[_.-]?(?:izer|type|count|limit|budget|usage))"),
    ("api", r"[_-]?key"),
    ("private", r"[_-]?key"),
    ("credential", ""),
    ("cookie", ""),
    ("auth", "orization"),
)
# After the name: the rest of the identifier, a closing quote, the separator, and something after it
# (not only blanks, not an empty quoted string: no Python work for what cannot be a value).
_CREDENTIAL_TAIL = (
    r"(?:\\?[\"'`])?[ \t]{0,16}+(?::=|=>|[:=])(?![0-9a-f]{12}»)"
    r"(?=[ \t]{0,256}+(?:[^ \t\n\r\x00\uffff\"'`\\]|\\?([\"'`])(?!\1)|\Z))"
)


def _credential(literal: str, rest: str) -> Detector:
    # Not the kind inside a token (``«redacted:secret:db:...»``): the look-behind follows the literal.
    return _d(
        "credential",
        rf"{literal}(?<!«redacted:{literal}){rest}[a-z0-9_.-]{{0,40}}+{_CREDENTIAL_TAIL}",
        hint=literal,
        reach=400,
        lower=True,
        extent=_credential_extent,
    )


# Order matters: multi-line and structured secrets first, so later generic patterns never
# see half of a key that a specific one would have taken whole.
DETECTORS: tuple[Detector, ...] = (
    _d(
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]{1,24} ){0,6}PRIVATE KEY(?: BLOCK)?-----",
        hint="private",
        reach=256,
        extent=_pem_extent,
    ),
    # scheme://user:password@host: only the password goes.
    _d(
        "url_password",
        r"://([^/\s:@\"'<>«»\x00\uffff]{1,256}+):([^@\s/\"'<>«»\x00\uffff]{1,256}+)@",
        hint="://",
        reach=544,
        extent=_url_password_extent,
    ),
    _d(
        "slack_webhook",
        r"https://hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9/_-]{20,}+",
        hint="hooks.slack",
        reach=96,
    ),
    # ``\b`` in front of a literal would hide the literal from the engine's prefix search: the word
    # boundary is a look-behind after it instead (``sk-`` not preceded by a word character + ``sk-``).
    _d("anthropic_key", r"sk-ant-(?<!\wsk-ant-)[A-Za-z0-9]{2,10}+-[A-Za-z0-9_-]{20,}+", hint="sk-", reach=64),
    _d("openai_key", r"sk-(?<!\wsk-)(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_-]{20,}+", hint="sk-", reach=64),
    _d(
        "stripe_key",
        r"[srp]k_(?:live|test)_(?<!\w.{8})[0-9A-Za-z]{16,}+",
        hint=("_live_", "_test_"),
        gate=r"_(?:live|test)_",
        reach=64,
    ),
    _d(
        "aws_access_key_id",
        r"A(?<!\wA)(?:KIA|SIA|BIA|CCA|ROA|IDA)[0-9A-Z]{16}\b",
        hint=("akia", "asia", "abia", "acca", "aroa", "aida"),
        gate=r"A(?:KIA|SIA|BIA|CCA|ROA|IDA)",  # in a long text one regex scan, not six finds
        reach=64,
    ),
    # Anchored at "secret"/"private" (rarer than "aws", which an input can repeat); the "aws" at
    # most 24 characters before it, on the same line, is checked on the few full matches.
    _d(
        "aws_secret_key",
        r"(?:secret|private)[a-z_ -]{0,24}+[\"']?[ \t]{0,16}+[:=][ \t]{0,16}+[\"']?([a-z0-9/+=]{40})(?![a-z0-9/+=])",
        1,
        hint="aws",
        reach=160,
        lower=True,
        extent=_aws_secret_extent,
    ),
    _d(
        "github_token",
        r"g(?<!\wg)(?:h[pousr]_[A-Za-z0-9]{36,}+|ithub_pat_[A-Za-z0-9_]{22,}+)",
        hint=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        gate=r"g(?:h[pousr]_|ithub_pat_)",
        reach=64,
    ),
    _d("slack_token", r"xox(?<!\wxox)[abposre]-[A-Za-z0-9-]{10,}+", hint="xox", reach=64),
    _d("google_api_key", r"AIza(?<!\wAIza)[0-9A-Za-z_-]{35}", hint="aiza", reach=64),
    _d("google_oauth_token", r"ya29\.(?<!\wya29\.)[0-9A-Za-z_-]{20,}+", hint="ya29.", reach=64),
    # Anchored at the literal ``eyJ`` after a word boundary. The first segment may not run over a
    # later ``-eyJ`` (that one starts its own attempt), so no character is read by two attempts:
    # ``-eyJ`` x 256 KiB, which made ``eyJ[A-Za-z0-9_-]{8,}\.`` rescan the run from every ``eyJ``
    # (9 s), is ~20 ms a MiB. (A header holding ``-eyJ`` would leave the part before it: a header is
    # no secret, and base64url of ASCII JSON puts ``-`` there only for ``>`` or ``~`` before ``{"``.)
    _d(
        "jwt",
        r"eyJ(?<!\weyJ)(?:[A-Za-z0-9_]|-(?!eyJ)){8}(?:[A-Za-z0-9_]++|-(?!eyJ))*+"
        r"\.eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+",
        hint="eyj",
        reach=64,
        cut=r"[^A-Za-z0-9_.-]",
    ),
    _d("bearer_token", r"bearer(?<!\wbearer)\s{1,64}+([a-z0-9._~+/-]{8,}+=*+)", 1, hint="bearer", reach=96, lower=True),
    _d(
        "basic_auth",
        r"basic(?<!\wbasic)\s{1,64}+([a-z0-9+/]{12,}+={0,2}+)(?![a-z0-9+/=])",
        1,
        hint="basic",
        reach=96,
        lower=True,
    ),
    # key=value / "key": "value" assignments of credentials in free text (logs, configs, tracebacks).
    *(_credential(literal, rest) for literal, rest in _CREDENTIAL_NAMES),
    # ``auth`` alone (``auth: ...``, not ``author``).
    _d(
        "credential",
        rf"auth(?<![a-z0-9]auth)(?![a-z0-9_.-]){_CREDENTIAL_TAIL}",
        hint="auth",
        reach=400,
        lower=True,
        extent=_credential_extent,
    ),
    # 13-19 digits (optionally grouped by spaces or dashes) starting like a card network, Luhn-checked.
    _d(
        "card_number",
        r"[3456](?<![\d-][3456])\d{3}(?:[ -]?\d){9,15}(?![\d-])",
        valid=_card_ok,
        valid_all=_cards_ok,
        gate=r"[3456]\d{3}",
        reach=64,
    ),
)


def _min_chars(pattern: re.Pattern[str]) -> int:
    """The fewest characters a match of ``pattern`` spans (look-arounds read more, and count nothing);
    0 where CPython's regex parser (private, ``re._parser`` since 3.11) cannot say: nothing is left out."""
    try:
        width = importlib.import_module("re._parser").parse(pattern.pattern, pattern.flags).getwidth()
    except (ImportError, AttributeError):
        return 0
    return int(width[0])


# The shortest match of each built-in detector, by id: a probe of pieces shorter than that (the decodings
# of short base64 runs, NULs between them) leaves the detector out. Built-in only: none of them matches
# across a NUL (an extra detector might, over pieces: it always runs).
_MIN_CHARS: dict[int, int] = {id(det): _min_chars(det.pattern) for det in DETECTORS}

# Dict keys whose value is a credential whatever it looks like: fnmatch patterns over the key
# lower-cased, without ``-``, ``_``, ``.`` and blanks (``X-Api-Key`` is ``xapikey``).
SENSITIVE_KEYS: frozenset[str] = frozenset(
    {
        "*password*",
        "*passwd*",
        "*passphrase*",
        "*pwd",
        "*secret*",
        "*token*",
        "*apikey*",
        "*privatekey*",
        "*credential*",
        "*authorization*",
        "auth",
        "*cookie*",
        "*cardnumber*",
        "cvv",
        "cvc",
    }
)
# Keys that match a pattern above but name no credential: counts and kinds of model tokens.
NON_SENSITIVE_KEYS: frozenset[str] = frozenset(
    {"*tokens*", "*tokenizer*", "*tokentype*", "*tokencount*", "*tokenlimit*", "*tokenbudget*", "*tokenusage*"}
)


# -- wrappers: base64 and URL-encoded text, decoded and probed in bulk (runledger.protect.wrappers finds
# and decodes them) -------------------------------------------------------------------------------------------


def _b64_candidates(text: str) -> tuple[bytes, bytes, bool, list[bytes]] | None:
    """The runs of ``text`` that may be base64 of text: of 16 characters or more, of mixed case (as
    ``_mixed_case`` keeps), the lines of a block joined, each once, by length; with the text as Latin-1
    bytes, its base64 characters (blanks elsewhere, block lines joined) and whether lines were joined.
    None: no such run (most texts: C passes, a few Python calls)."""
    encoded = text.encode("latin-1", "replace")
    if _B64_RUN.search(encoded.translate(_B64_MAP)) is None:
        return None
    if len(text) <= GATE_MAX_CHARS:  # a few runs: find them in place, and let one-case ones go
        short_runs = _B64_SHORT.findall(text)
        if all(r.islower() or r.isupper() or r.isdigit() for r in short_runs):
            return None
    raw = encoded.translate(_B64_KEEP)
    lines_joined = False
    if b"\n" in raw:  # the lines of a block are one run
        joined = _B64_BLOCK_LINE.sub(b"", raw)
        lines_joined, raw = len(joined) != len(raw), joined
    runs = sorted(set(raw.split()), key=len)  # a run repeated is probed once
    runs = runs[bisect.bisect_left(runs, 16, key=len) :]
    # Mixed case only, as in _open_base64 (what ``_mixed_case`` keeps; filters: fewer C passes).
    filters = (bytes.islower, bytes.isupper, bytes.isdigit)
    runs = list(functools.reduce(lambda kept, one_case: itertools.filterfalse(one_case, kept), filters, iter(runs)))
    return (encoded, raw, lines_joined, runs) if runs else None


def _alternation(literals: Iterable[str]) -> re.Pattern[str]:
    """One regex that finds any of ``literals``, alternatives shared as a trie (``a(?:ws|kia|...)``).

    Used as a search-only gate: where one literal is a prefix of another, the shorter one stands
    for both (whatever contains the longer contains the shorter). No literals: never matches."""
    return _alternation_of(frozenset(literals))


# Every run builds a Redactor; its patterns depend on the policy only (the same one in most runs),
# so they are built once per set of literals, not once per run (~0.5 ms of a run's start).
@functools.lru_cache(maxsize=64)
def _alternation_of(literals: frozenset[str]) -> re.Pattern[str]:
    trie: dict[str, Any] = {}
    for word in literals:
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


def _lower(text: str) -> str:
    """``text`` lower-cased with the same length, so offsets carry over (only U+0130 grows).

    Only ASCII letters matter (the patterns matched on it are ASCII, and ``\\w``/``\\s`` take a letter
    in either case): a Latin-1 text that is not ASCII (a probe of decoded bytes) is lower-cased as
    bytes, ~10x faster than ``str.lower``'s per-character Unicode lookup, which only Latin-1
    letters would tell apart (no Latin-1 letter lower-cases to ASCII)."""
    if not text.isascii():
        try:
            return text.encode("latin-1").lower().decode("latin-1")
        except UnicodeEncodeError:
            pass
    low = text.lower()
    if len(low) != len(text):
        low = text.replace("\u0130", "\u0131").lower()
    return low


@functools.lru_cache(maxsize=4096)  # the same few keys (role, content, args...) at every step
def _normalize_key(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "")


_KIND_JUNK = re.compile(r"[^a-z0-9_:.-]")  # what a token's kind may not hold


def _key_form(key: str) -> str:
    return key.lower().replace("-", "").replace("_", "").replace(".", "").replace(" ", "")


def _key_pattern(patterns: Iterable[str]) -> re.Pattern[str]:
    return _key_pattern_of(frozenset(patterns))


@functools.lru_cache(maxsize=64)  # per policy, not per run (as _alternation_of)
def _key_pattern_of(patterns: frozenset[str]) -> re.Pattern[str]:
    alternatives = sorted({fnmatch.translate(_key_form(p)) for p in patterns if p})
    return re.compile("|".join(alternatives)) if alternatives else re.compile(r"(?!)")


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


WRAPPERS = ("base64", "urlencoded")  # the encodings redaction looks inside, in this order


@dataclass(frozen=True)
class RedactionPolicy:
    """What to redact: field paths, detectors, credential-named keys, and which wrappers to open."""

    fields: tuple[str, ...] = ()
    detectors: tuple[Detector, ...] = DETECTORS
    extra_detectors: tuple[Detector, ...] = ()
    sensitive_keys: frozenset[str] = SENSITIVE_KEYS
    non_sensitive_keys: frozenset[str] = NON_SENSITIVE_KEYS
    unwrap: tuple[str, ...] = WRAPPERS

    def __post_init__(self) -> None:
        unknown = [w for w in self.unwrap if w not in WRAPPERS]
        if unknown:
            raise ConfigurationError(f"unknown wrapper(s) {unknown}: use some of {list(WRAPPERS)}")


@dataclass
class RedactionStats:
    strings_scanned: int = 0
    replaced: dict[str, int] = field(default_factory=dict)


class _Mint:
    """Where the tokens of one scan go: their kinds (for the stats and the cache); or, for a probe (a
    look inside a wrapper), nowhere: a probe's "token" is a mask as long as the secret, of one
    private-use character per kind, so the probed text keeps its offsets (no HMAC, nothing counted);
    or of ``mask`` whatever the kind, a character the probed text does not hold (a Latin-1 text stays
    Latin-1: one byte a character for the detectors that run after the first mask, not four)."""

    __slots__ = ("kinds", "mask", "probe")

    def __init__(self, probe: bool = False, mask: str = "") -> None:
        self.probe = probe
        self.mask = mask
        self.kinds: list[str] = []


# Masks of a probe: one character of Unicode plane 15 (private use) per kind.
_MASK_BASE = 0xF0000
_MASK_KINDS: dict[str, str] = {}
_KIND_OF_MASK: dict[str, str] = {}
_MASKED = re.compile("[\U000f0000-\U000ffffd]+")
# Kind-less masks of a probe that only asks where its secrets are: control characters, the first one
# the probed text does not hold.
# (A literal first, which the regex engine searches for: ``x+`` alone is tried at every position.)
_FLAT_MASKS = {chr(c): re.compile(re.escape(chr(c)) * 2 + "*+") for c in (0x7F, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06)}


_MASK_LOCK = threading.Lock()


def _mask_char(kind: str) -> str:
    ch = _MASK_KINDS.get(kind)
    if ch is None:
        with _MASK_LOCK:
            ch = _MASK_KINDS.get(kind)
            if ch is None:
                ch = _MASK_KINDS[kind] = chr(_MASK_BASE + min(len(_MASK_KINDS), 0xFFFD))
                _KIND_OF_MASK.setdefault(ch, kind)
    return ch


class _Hints:
    """Where the hints are in one version of a lower-cased text: each hint's first offset is searched
    once, whatever the number of detectors sharing it, and a hint one of whose characters is not in
    the text at all (a memchr, ~20x faster than ``str.find`` of a word over letters) is not searched."""

    __slots__ = ("_chars", "_first", "low")

    def __init__(self, low: str) -> None:
        self.low = low
        self._first: dict[str, int] = {}
        self._chars: dict[str, bool] = {}

    def _has(self, ch: str) -> bool:
        has = self._chars.get(ch)
        if has is None:
            has = self._chars[ch] = ch in self.low
        return has

    def find(self, hint: str, pos: int) -> int:
        first = self._first.get(hint)
        if first is None:
            present = all(self._has(ch) for ch in hint)
            first = self._first[hint] = self.low.find(hint) if present else -1
        if first < 0 or first >= pos:
            return first
        return self.low.find(hint, pos)


class _Protected:
    """The tokens and secret:// references of a text, found when first asked about (most texts,
    and most detectors, never ask)."""

    __slots__ = ("_spans", "_starts", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._spans: list[tuple[int, int]] | None = None
        self._starts: list[int] = []

    def _load(self) -> list[tuple[int, int]]:
        if self._spans is None:
            text = self._text
            has = TOKEN_OPEN in text or SECRET_SCHEME in text
            self._spans = [m.span() for m in _PROTECTED.finditer(text)] if has else []
            self._starts = [p[0] for p in self._spans]
        return self._spans

    def any(self) -> bool:
        return bool(self._load())

    def holds(self, at: int) -> bool:
        spans = self._load()
        if not spans:
            return False
        i = bisect.bisect_right(self._starts, at) - 1
        return i >= 0 and spans[i][1] > at

    def within(self, s: int, e: int) -> list[tuple[int, int]]:
        """The protected spans overlapping [s, e), clipped to it."""
        spans = self._load()
        if not spans:
            return []
        i = max(0, bisect.bisect_right(self._starts, s) - 1)
        out = []
        while i < len(spans) and spans[i][0] < e:
            p0, p1 = spans[i]
            if p1 > s:
                out.append((max(p0, s), min(p1, e)))
            i += 1
        return out

    def overlaps(self, s: int, e: int) -> bool:
        spans = self._load()
        if not spans:
            return False
        i = bisect.bisect_left(self._starts, e) - 1
        return i >= 0 and spans[i][1] > s


_MISSING = "\x00"  # not a kind: a key not looked at yet


class Redactor:
    """Applies a RedactionPolicy under one run's token key. Thread-safe: the scans share nothing
    mutable; the stats, the caches and the registered secrets change under a lock."""

    def __init__(self, token_key: bytes, policy: RedactionPolicy | None = None) -> None:
        if len(token_key) < 16:
            raise ConfigurationError("a redaction token key needs at least 16 bytes")
        self._key = token_key
        # HMAC-SHA256 = H(k ^ opad || H(k ^ ipad || m)): both keyed states made once, copied per token.
        block = (hashlib.sha256(token_key).digest() if len(token_key) > 64 else token_key).ljust(64, b"\0")
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))
        self.policy = policy or RedactionPolicy()
        self._fields = FieldPaths(self.policy.fields)
        self._detectors = self.policy.detectors + self.policy.extra_detectors
        self._key_re = _key_pattern(self.policy.sensitive_keys)
        self._not_key_re = _key_pattern(self.policy.non_sensitive_keys)
        self._key_kinds: dict[str, str | None] = {}  # dict key -> "field:<key>" when it names a credential
        self._unwrap = tuple(self.policy.unwrap)
        self._any_hint = _alternation(h for det in self._detectors for h in det.hints)
        # What a short text without any hint still goes through: the detectors without hints. With
        # hints, the ones present are found once (``in``) and each detector's are a set to compare.
        self._unhinted = tuple(det for det in self._detectors if not det.hints)
        self._hint_list = tuple(sorted({h for det in self._detectors for h in det.hints}))
        self._hint_sets = {id(det): frozenset(det.hints) for det in self._detectors}
        # What else decides that a text holds nothing (``_plain``): each unhinted detector's pattern
        # (the card number's, not its gate: ``[3456]\d{3}`` is in most ids and dates, 13 digits are not).
        self._unhinted_patterns = tuple((det.pattern, det.lower) for det in self._unhinted)
        self._opens_base64 = "base64" in self._unwrap
        self._opens_urlencoded = "urlencoded" in self._unwrap
        # Where a probe of decoded runs is cut in bands (``_probe_bands``): the shortest match of each
        # built-in detector, and what a wrapper inside needs (a %XX escape; a base64 run).
        widths = {_MIN_CHARS[id(det)] for det in self._detectors if id(det) in _MIN_CHARS}
        widths |= {3} if self._opens_urlencoded else set()
        widths |= {16} if self._opens_base64 else set()
        self._piece_widths = tuple(sorted(widths))
        self._lock = threading.Lock()
        # Registered secrets (replaced, never mutated: a scan reads one consistent pair).
        self._known: dict[str, str] = {}  # secret value -> kind
        self._known_order: tuple[str, ...] = ()  # longest first
        self.stats = RedactionStats()
        # text -> (redacted text, kinds of the tokens it minted): see redact_text.
        self._cache: OrderedDict[str, tuple[str, tuple[str, ...]]] = OrderedDict()
        self._cached_chars = 0
        self._tokens: dict[tuple[str, str], str] = {}  # (kind, value) -> token, for short values
        # Short texts a scan leaves as they are (role names, keys, statuses, ids come back at every step).
        self._plain_texts: set[str] = set()

    # -- tokens -----------------------------------------------------------------------------------------

    def _mac(self, value: str) -> str:
        inner = self._inner.copy()
        inner.update(value.encode("utf-8", "surrogatepass"))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()[:12]

    def _token(self, kind: str, value: str, mint: _Mint) -> str:
        if mint.probe:
            return (mint.mask or _mask_char(kind)) * len(value)
        mint.kinds.append(kind)
        key = (kind, value)
        tok = self._tokens.get(key)
        if tok is None:
            tok = f"{TOKEN_OPEN}redacted:{kind}:{self._mac(value)}{TOKEN_CLOSE}"
            if len(value) <= 256:
                if len(self._tokens) >= 4096:
                    self._tokens.clear()
                self._tokens[key] = tok
        return tok

    def _count(self, kinds: list[str], scanned: int = 0) -> None:
        with self._lock:
            self.stats.strings_scanned += scanned
            if kinds:
                replaced = self.stats.replaced
                for kind in kinds:
                    replaced[kind] = replaced.get(kind, 0) + 1

    def token(self, kind: str, value: str) -> str:
        """The stable token of ``value`` in this run."""
        mint = _Mint()
        tok = self._token(kind, value, mint)
        self._count(mint.kinds)
        return tok

    @property
    def has_known_secrets(self) -> bool:
        """Whether any secret value was registered (``add_secret``): else ``redact_known`` changes nothing."""
        return bool(self._known_order)

    def add_secret(self, value: str, kind: str = "secret") -> None:
        """Redact every later occurrence of ``value`` (e.g. what a secret:// reference resolved to)."""
        if len(value) < 4 or value in self._known:
            return  # too short to search for without destroying ordinary text
        with self._lock:
            known = {**self._known, value: _KIND_JUNK.sub("_", kind.lower())}
            self._known_order = tuple(sorted(known, key=len, reverse=True))
            self._known = known
            self._cache.clear()  # a text redacted before may hold the new secret
            self._cached_chars = 0
            self._plain_texts = set()

    # -- values -----------------------------------------------------------------------------------------

    def _sensitive(self, key: str) -> str | None:
        """The token kind of a credential-named dict key (``field:apikey``), None for other keys."""
        kind = self._key_kinds.get(key, _MISSING)
        if kind == _MISSING:
            form = _key_form(key)
            sensitive = self._key_re.match(form) is not None and self._not_key_re.match(form) is None
            kind = "field:" + _KIND_JUNK.sub("_", _normalize_key(key)) if sensitive else None
            if len(self._key_kinds) >= 4096:
                self._key_kinds.clear()
            self._key_kinds[key] = kind
        return kind

    def redact(self, value: Any, path: tuple[str, ...] = ()) -> Any:
        """A copy of JSON-native ``value`` with secrets and configured fields tokenized: ``value``
        itself when nothing in it is (callers may then reuse what they derived from it, such as its
        canonical bytes: runledger.protect.capture)."""
        if not self._fields:
            return self._walk(value)
        if path and self._fields.match(path):
            return self._whole(f"field:{path[-1]}", value)
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            same = True
            key_kinds = self._key_kinds
            for k, v in value.items():
                key = str(k)
                kind = key_kinds.get(key, _MISSING)
                if kind == _MISSING:
                    kind = self._sensitive(key)
                if kind is not None and v is not None and v != "" and not isinstance(v, bool):
                    new = out[key] = self._whole(kind, v)
                    same = same and new is v and key is k
                else:
                    # Keys are scanned too (a token used as a dict key); the path keeps the original.
                    new_key = self.redact_text(key) if len(key) >= 8 else key
                    new = out[new_key] = self.redact(v, (*path, key))
                    same = same and new is v and new_key is k
            return value if same else out
        if isinstance(value, list):
            items = [self.redact(v, (*path, str(i))) for i, v in enumerate(value)]
            return value if all(map(operator.is_, items, value)) else items
        return value

    def _walk(self, value: Any) -> Any:
        # ``redact`` without field paths (the default policy): the same walk, minus the path of
        # every value, which only field paths look at.
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            same = True
            key_kinds = self._key_kinds
            for k, v in value.items():
                key = str(k)
                kind = key_kinds.get(key, _MISSING)
                if kind == _MISSING:
                    kind = self._sensitive(key)
                if kind is not None and v is not None and v != "" and not isinstance(v, bool):
                    new = out[key] = self._whole(kind, v)
                    same = same and new is v and key is k
                else:
                    new_key = self.redact_text(key) if len(key) >= 8 else key
                    new = out[new_key] = self._walk(v)
                    same = same and new is v and new_key is k
            return value if same else out
        if isinstance(value, list):
            items = [self._walk(v) for v in value]
            return value if all(map(operator.is_, items, value)) else items
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
        mint = _Mint()
        out = self._replace_known(text, mint)
        if mint.kinds:
            self._count(mint.kinds)
        return out

    def redact_text(self, text: str) -> str:
        """``text`` with every detected secret replaced by its token.

        Texts of ``CACHE_MIN_CHARS`` or more are remembered (a bounded LRU, this run's only):
        an agent re-sends its whole message history at every model call, so the same long
        strings come back step after step. A hit returns exactly what a scan would (the
        detectors are fixed, tokens are a pure function of the run's key and the value) and
        counts the same stats; registering a secret empties the cache.

        Shorter texts that hold nothing a detector or a wrapper could take (most of them: roles,
        keys, statuses, ids, short sentences) are decided by a few C calls (``_untouched``) and
        remembered as such (a bounded set of this run's, emptied too by a registered secret)."""
        n = len(text)
        if n < CACHE_MIN_CHARS:
            plain = self._plain_texts
            if text in plain:
                with self._lock:
                    self.stats.strings_scanned += 1
                return text
            known = self._known
            if self._untouched(text):
                with self._lock:
                    self.stats.strings_scanned += 1
                    if known is self._known and plain is self._plain_texts:  # no secret registered meanwhile
                        if len(plain) >= PLAIN_MAX_ENTRIES:
                            plain.clear()
                        plain.add(text)
                return text
        if n < CACHE_MIN_CHARS or n > CACHE_MAX_TEXT:
            mint = _Mint()
            out = self._scan_with(text, 0, mint)
            self._count(mint.kinds, 1)
            return out
        with self._lock:
            hit = self._cache.get(text)
            if hit is not None:
                self._cache.move_to_end(text)
                self.stats.strings_scanned += 1
                replaced = self.stats.replaced
                for kind in hit[1]:
                    replaced[kind] = replaced.get(kind, 0) + 1
                return text if hit[0] == text else hit[0]  # a text left as it was is returned itself
        known = self._known
        mint = _Mint()
        out = self._scan_with(text, 0, mint)
        with self._lock:
            self.stats.strings_scanned += 1
            replaced = self.stats.replaced
            for kind in mint.kinds:
                replaced[kind] = replaced.get(kind, 0) + 1
            if known is self._known and text not in self._cache:  # no secret registered meanwhile
                self._cache[text] = (out, tuple(mint.kinds))
                self._cached_chars += len(text) + len(out)
                while len(self._cache) > CACHE_MAX_ENTRIES or self._cached_chars > CACHE_MAX_CHARS:
                    old, (old_out, _) = self._cache.popitem(last=False)
                    self._cached_chars -= len(old) + len(old_out)
        return out

    def _untouched(self, text: str) -> bool:
        """Whether ``text`` (short) would come out of a scan as it is: no registered secret in it, and too
        short for any detector or with nothing a detector or a wrapper could take (``_plain``)."""
        known = self._known_order
        if known and any(map(text.__contains__, known)):
            return False
        if len(text) < 8:
            return True
        low = text.lower() if text.isascii() else _lower(text)
        return self._any_hint.search(low) is None and self._plain(text, low, 0)

    def _scan(self, text: str) -> str:
        """``text`` redacted, not cached (counts its tokens, not a string scanned)."""
        mint = _Mint()
        out = self._scan_with(text, 0, mint)
        if mint.kinds:
            self._count(mint.kinds)
        return out

    # -- the scan ---------------------------------------------------------------------------------------

    def _scan_with(self, text: str, depth: int, mint: _Mint, piece_max: int | None = None) -> str:
        """``text`` with its secrets replaced (tokens, or a probe's masks), looking ``depth`` wrappers deep
        already. ``piece_max``: ``text`` is pieces of at most that many characters, NULs or ``_SEP``
        between them (a probe of decoded runs), so a built-in detector whose shortest match is longer,
        and a wrapper that needs more, is left out."""
        if self._known_order:
            text = self._replace_known(text, mint)
        if len(text) < 8:
            return text
        hints: _Hints | None = None
        protected: _Protected | None = None
        detectors = self._detectors
        # The hints the text holds, found at once (None: a text of several windows, whose detectors look
        # their hints up one by one and skip to them, ``_Hints``). Up to GATE_MAX_CHARS one scan for all
        # of them decides first; in a longer text a C ``in`` each (a ``filter``, no Python call a hint).
        present: frozenset[str] | None = None
        if len(text) <= WINDOW_CHARS:
            low = text.lower() if text.isascii() else _lower(text)
            if len(text) > GATE_MAX_CHARS:
                present = frozenset(filter(low.__contains__, self._hint_list))
            elif self._any_hint.search(low) is None:
                present = frozenset()
            else:
                present = frozenset([h for h in self._hint_list if h in low])
            if not present:
                if self._plain(text, low, depth):
                    return text  # the common case: nothing any detector or wrapper could take
                detectors = self._unhinted
            hints = _Hints(low)
        hint_sets = self._hint_sets
        for det in detectors:
            if piece_max is not None and _MIN_CHARS.get(id(det), 0) > piece_max:
                continue
            if det.hints:
                if present is not None:
                    if hint_sets[id(det)].isdisjoint(present):
                        continue
                elif det.gate is None:  # (a long text is searched for a detector's gate, if it has one)
                    if hints is None:
                        hints = _Hints(_lower(text))
                    if all(hints.find(h, 0) < 0 for h in det.hints):
                        continue
            if det.lower and hints is None:
                # (Also after an earlier detector's tokens reset the hints: a short text's hints are not
                # looked up again, and ``_find`` would match the lower-cased pattern on the text as is,
                # missing "Bearer ..." after an AWS key id.)
                hints = _Hints(_lower(text))
            if det.gate is not None and present is not None and not det.hints and det.gate.search(text) is None:
                continue
            if protected is None:
                protected = _Protected(text)
            spans = self._find(det, text, hints, protected)
            if spans:
                text = self._apply(det.kind, text, spans, protected if det.extent is not None else None, mint)
                hints, protected = None, None
        return self._open_wrappers(text, depth, mint, piece_max)

    def _plain(self, text: str, low: str, depth: int) -> bool:
        """Whether a scan at ``depth`` leaves ``text``, of one window and holding no detector's hint
        (``low``: it lower-cased), as it is: no detector without hints matches (its pattern finds
        nothing) and no wrapper has anything to open (no ``%XX``; no base64-looking run but of one
        case, which ``_base64_suspects`` lets go). A few C calls instead of the detectors' and the
        wrappers' Python work: most strings (a role, a key, a status, an id, a sentence) are decided
        here. Exact, not a heuristic: each test is the one the scan itself makes first."""
        for pattern, lower in self._unhinted_patterns:
            if pattern.search(low if lower else text) is not None:
                return False
        if depth >= WRAPPER_DEPTH:
            return True
        if self._opens_urlencoded and "%" in text and _PERCENT.search(text) is not None:
            return False
        return not (self._opens_base64 and len(text) >= 16 and _b64_candidates(text) is not None)

    def _find(self, det: Detector, text: str, hints: _Hints | None, protected: _Protected) -> list[tuple[int, int]]:
        """The spans of ``det``'s secrets in ``text`` (sorted, not overlapping), window by window.

        A match that starts inside a token or a secret:// reference is not one (a token's kind,
        e.g. "secret:", would be taken for the start of a credential assignment; a reference names
        a credential, it is not one, and replays must see it unchanged); nor is a span running into
        one, except an extent's (a credential's value holding a token: see ``_apply``)."""
        subject = hints.low if det.lower and hints is not None else text
        pattern, reach, cut, extent, valid = det.pattern, max(1, det.reach), det.cut, det.extent, det.valid
        if len(text) <= WINDOW_CHARS and pattern.search(subject) is None:
            return []  # one window and no match: no more to do
        # Skipping to hints (or gate matches) is for texts of more than one window; a gate wins.
        own = det.hints if hints is not None and len(text) > WINDOW_CHARS and det.gate is None else ()
        group = det.group
        guarded: bool | None = None  # whether the text holds tokens or references (asked at the first match)
        n = len(text)
        found: list[tuple[int, int]] = []
        last = 0  # end of the last secret: the next starts after it
        next_hint: dict[str, int] = {}  # hint -> its next offset at or after pos - reach (-1: none left)
        pos = 0
        while pos < n:
            if own:
                assert hints is not None
                back, hit = max(0, pos - reach), -1
                for h in own:
                    i = next_hint.get(h, -2)
                    if i == -1:
                        continue
                    if i < back:
                        i = next_hint[h] = hints.find(h, back)
                        if i < 0:
                            continue
                    if hit < 0 or i < hit:
                        hit = i
                if hit < 0:
                    break
                pos = max(pos, hit - reach)
            elif det.gate is not None:
                g = det.gate.search(text, pos, min(n, pos + WINDOW_CHARS + reach))
                if g is None:
                    pos += WINDOW_CHARS
                    continue
                pos = max(pos, g.start() - reach)
            if cut is not None:
                c = cut.search(subject, pos + WINDOW_CHARS) if pos + WINDOW_CHARS < n else None
                window_end = limit = c.start() if c is not None else n
            else:
                window_end = min(n, pos + WINDOW_CHARS)
                limit = min(n, window_end + reach)
            resume = window_end
            if guarded is None:
                guarded = protected.any()
            if extent is None and not guarded:
                # A plain pattern in a text without tokens: the whole window's matches at once. (Not
                # for extents: a secret that runs past its match restarts the window from its end,
                # and listing a window's matches each time would be quadratic.)
                if det.valid_all is not None and group == 0 and pattern.groups == 0:
                    # Candidates as strings first (no match objects): most windows hold no valid one.
                    # (A batch-checked detector's matches are shorter than its reach: none is cut.)
                    candidates = pattern.findall(subject, pos, limit)
                    if not candidates or not any(det.valid_all(candidates)):
                        pos = max(resume, last)
                        continue
                matches = list(pattern.finditer(subject, pos, limit))
                starts = list(map(re.Match.start, matches))
                del matches[bisect.bisect_left(starts, window_end) :]
                if matches and cut is None and matches[-1].end() >= limit and limit < n:
                    matches[-1] = pattern.match(subject, matches[-1].start(), n) or matches[-1]
                spans = list(map(re.Match.span, matches, itertools.repeat(group)))
                if group:  # an optional group may be empty
                    spans = list(itertools.compress(spans, map(operator.lt, map(min, spans), map(max, spans))))
                if spans and (det.valid_all is not None or valid is not None):
                    if group == 0 and subject is text:
                        secrets = list(map(re.Match.group, matches))
                    else:
                        secrets = list(map(text.__getitem__, itertools.starmap(slice, spans)))
                    verdicts = det.valid_all(secrets) if det.valid_all is not None else map(valid, secrets)  # type: ignore[arg-type]
                    spans = list(itertools.compress(spans, verdicts))
                if spans:
                    found.extend(spans)
                    last = spans[-1][1]
                pos = max(resume, last)
                continue
            for m in pattern.finditer(subject, pos, limit):
                start = m.start()
                if start >= window_end:
                    break
                if start < last or (guarded and protected.holds(start)):
                    continue
                if cut is None and m.end() >= limit and limit < n:
                    m = pattern.match(subject, start, n) or m  # a tail the window cut short
                span = extent(text, m) if extent is not None else m.span(group)
                if span is None:
                    continue
                s, e = span
                if s < last or e <= s or (guarded and extent is None and protected.overlaps(s, e)):
                    continue
                if valid is not None and not valid(text[s:e]):
                    continue
                found.append(span)
                last = e
                if e > m.end() + 1024:  # the secret runs far past its match (a long value, a key's body):
                    resume = e  # go on from its end rather than skip the matches inside it one by one
                    break
            pos = max(resume, last)
        return found

    def _apply(
        self, kind: str, text: str, spans: list[tuple[int, int]], protected: _Protected | None, mint: _Mint
    ) -> str:
        """``text`` with each span replaced by its token. A span that runs over tokens placed before
        (a credential's value holding an API key) leaves them be and tokenizes the text between."""
        out: list[str] = []
        prev = 0
        for s, e in spans:
            out.append(text[prev:s])
            inside = protected.within(s, e) if protected is not None else ()
            if not inside:
                out.append(self._token(kind, text[s:e], mint))
            else:
                at = s
                for p0, p1 in (*inside, (e, e)):
                    piece = text[at:p0]
                    core = piece.strip()
                    if core:
                        lead = len(piece) - len(piece.lstrip())
                        out.append(piece[:lead] + self._token(kind, core, mint) + piece[lead + len(core) :])
                    else:
                        out.append(piece)
                    out.append(text[p0:p1])
                    at = p1
            prev = e
        out.append(text[prev:])
        return "".join(out)

    def _replace_known(self, text: str, mint: _Mint) -> str:
        order = self._known_order
        if not order or len(text) < 4:
            return text
        known = self._known
        spans: list[tuple[int, int, str]] = []
        for value in order:  # one C-speed find loop per secret (linear, whatever the secret looks like)
            i = text.find(value)
            while i >= 0:
                spans.append((i, i + len(value), value))
                i = text.find(value, i + len(value))
        if not spans:
            return text
        spans.sort(key=lambda s: (s[0], s[0] - s[1]))  # leftmost, then longest: as one alternation would
        out: list[str] = []
        prev = 0
        for s, e, value in spans:
            if s < prev:
                continue
            out.append(text[prev:s])
            out.append(self._token(known.get(value, "secret"), value, mint))
            prev = e
        out.append(text[prev:])
        return "".join(out)

    def _open_wrappers(self, text: str, depth: int, mint: _Mint, piece_max: int | None = None) -> str:
        """Secrets inside base64 and URL-encoded text (``WRAPPER_DEPTH`` wrappers deep).

        A probe is a scan whose tokens are same-length masks (``_Mint``): what it finds keeps its
        offsets. Base64: the runs of a text are decoded together (C ``map``s over the list) and probed
        as one text, their decodings joined by ``_SEP``, which no detector matches across; a run whose
        part the probe changed is replaced whole (``«redacted:base64:<kind>:...»``). URL encoding: the
        whole text is decoded at once and probed; a masked span is mapped back to the text by counting
        escapes, and the encoded span goes (``«redacted:urlencoded:<kind>:...»``). Base64 first: a
        base64 run whose ``+/=`` are escaped is found by the URL probe, which looks inside it."""
        if depth >= WRAPPER_DEPTH:
            return text
        for name in self._unwrap:
            if name == "base64" and len(text) >= 16 and (piece_max is None or piece_max >= 16):
                text = self._open_base64(text, depth, mint)
            elif name == "urlencoded" and "%" in text and (piece_max is None or piece_max >= 3):
                text = self._open_urlencoded(text, depth, mint)
        return text

    def _open_base64(self, text: str, depth: int, mint: _Mint) -> str:
        suspects = self._base64_suspects(text, depth)
        if suspects is None:
            spans = _b64_runs(text)
        else:  # only the stretches that may hold a secret: the runs there are those of the whole text
            spans = [(s + a, e + a) for a, b in suspects for s, e in _b64_runs(text[a:b])]
        if not spans:
            return text
        runs = list(map(text.__getitem__, itertools.starmap(slice, spans)))
        keep = list(itertools.compress(range(len(runs)), _mixed_case(runs)))
        if not keep:
            return text
        decoded = _b64_decode_all(list(map(runs.__getitem__, keep)))
        if not any(decoded):
            return text
        joined = _SEP.join(decoded)
        probed = self._scan_with(joined, depth + 1, _Mint(probe=True), max(map(len, decoded)))
        if probed == joined:
            return text
        parts = probed.split(_SEP)
        if len(parts) != len(decoded):  # an extra detector matched across the separator: all are suspect
            parts = [_mask_char("secret")] * len(decoded)
        protected = _Protected(text)
        hits: dict[int, str] = {}
        for k in itertools.compress(range(len(keep)), map(operator.ne, parts, decoded)):
            s, e = spans[keep[k]]
            if not protected.overlaps(s, e):
                mask = _MASKED.search(parts[k])
                hits[keep[k]] = _KIND_OF_MASK.get(mask.group()[0], "secret") if mask else "secret"
        out: list[str] = []
        prev = 0
        for i in sorted(hits):  # by start: a run comes before its sub-runs, which it covers
            s, e = spans[i]
            if s < prev:
                continue
            out.append(text[prev:s])
            out.append(self._token(f"base64:{hits[i]}", runs[i], mint))
            prev = e
        out.append(text[prev:])
        return "".join(out)

    def _base64_may_hold(self, text: str, depth: int) -> bool:
        """Whether some base64 run of ``text`` may hold a secret (``_base64_suspects`` finds some)."""
        return self._base64_suspects(text, depth) != []

    def _base64_suspects(self, text: str, depth: int) -> list[tuple[int, int]] | None:
        """The stretches of ``text`` whose base64 runs may hold a secret, sorted and apart ([]: none;
        None: any run may, the exact path looks at every one).

        All runs are decoded and probed at once, without their offsets (C passes: split, filter, pad,
        join, one ``a2b_base64``). A run whose decoding holds a secret makes the probe find something
        (a probe finds at least what it would in the run alone: the runs are apart, NULs between
        them, which end what a detector can match as ``_SEP`` does: every class that leaves out one
        leaves out both), so [] is a safe no. Of more than 16 runs (distinct), what the probe found
        is mapped back to the runs it lies in (their decodings' offsets in the probe: a bisect) and
        each such run to the stretches of ``text`` holding it (a ``find``: the whole run of base64
        characters around it, and its padding), which the exact path (``_open_base64``) looks at
        alone: the runs there are the runs of the whole text, as the stretch is cut where no run
        goes on. One secret among 60,000 runs no longer sends every run down the exact path (which
        slices, decodes and probes each at its offset: 300 ms a MiB). None, the whole text, when a
        stretch may be a line of a block (a newline at either end: ``_b64_blocks`` joins lines),
        when the probe changed a length (an extra detector), or past ``_B64_MAX_SUSPECTS`` stretches
        (dense secrets: a token each, the exact path's cost either way).

        Rejected: the offsets of every run kept through the probe (``finditer``, slices: what the
        exact path costs); a second probe per run (a Python call each)."""
        found = _b64_candidates(text)
        if found is None:
            return []
        encoded, raw, lines_joined, runs = found
        if len(runs[-1]) > _B64_PREFIX and (b"-" in raw or b"_" in raw or b"/" in raw or b"+" in raw):
            tails = _b64_tails(runs[bisect.bisect_right(runs, _B64_PREFIX, key=len) :])
            if tails:
                runs += tails
                runs.sort(key=len)  # (by length still: _base64_suspects_of_many takes them so)
        # URL-safe runs (a run with both alphabets decodes to junk either way)
        urlsafe = b"-" in raw or b"_" in raw
        if len(runs) > 16:
            return self._base64_suspects_of_many(text, encoded, raw, runs, urlsafe, lines_joined, depth)
        if urlsafe:
            runs = list(map(bytes.translate, runs, itertools.repeat(_URLSAFE_BYTES)))
        sizes = list(map(len, runs))
        # Each run padded with "A" to whole quanta (zero bits: at most two bytes of junk at its end).
        lengths = map(operator.and_, map(operator.add, sizes, itertools.repeat(3)), itertools.repeat(-4))
        padded = map(bytes.ljust, runs, lengths, itertools.repeat(b"A"))
        # A document, an image: each decoded, binary ones left out (as in _b64_decode_all).
        decodings = list(map(binascii.a2b_base64, padded))
        decoded = b"\x00".join(itertools.compress(decodings, _texty(decodings)))
        # Control bytes (binary) become NULs, which end what a detector can match as _SEP does, and
        # keep the probe Latin-1: one byte a character for the scans, where _SEP would make it two.
        probe = decoded.translate(_CONTROL_TO_NUL).decode("latin-1")
        piece_max = max(map(len, decodings))
        return None if probe and self._scan_with(probe, depth + 1, _Mint(probe=True), piece_max) != probe else []

    def _base64_suspects_of_many(
        self,
        text: str,
        encoded: bytes,
        raw: bytes,
        runs: list[bytes],
        urlsafe: bool,
        lines_joined: bool,
        depth: int,
    ) -> list[tuple[int, int]] | None:
        """``_base64_suspects`` of more than 16 distinct runs (as ``text`` holds them, by length),
        decoded in one call: binary ones too (they only add to what is probed)."""
        # The runs of one length are joined by one separator, their padding with "A" and "AAAA" (three
        # NULs): no C pass a run. In a run's decoding, the byte past its last whole one (from the
        # padding and its last character's low bits) is set to NUL, as a junk letter there could hide
        # a secret a detector bounds ("AKIA..." then "P" is no key id).
        pieces: list[bytes] = []
        groups: list[tuple[int, int, int, int, int]] = []  # (offset in the probe, bytes a run, first run, size, runs)
        first = offset = 0
        while first < len(runs):
            size = len(runs[first])
            end = bisect.bisect_right(runs, size, first, key=len)
            padded = (size + 3) & -4
            gap = b"A" * (padded - size + 4)
            pieces.append(gap.join(runs[first:end]) + gap)
            slot = (padded // 4 + 1) * 3
            groups.append((offset, slot, first, size, end - first))
            offset += slot * (end - first)
            first = end
        joined = b"".join(pieces)
        decoded = bytearray(binascii.a2b_base64(joined.translate(_URLSAFE_BYTES) if urlsafe else joined))
        for offset, slot, _, size, count in groups:
            if size & 3:  # 4k + r characters: 3k + r - 1 bytes (r = 1: 3k, and 4k decode as extra text)
                junk = offset + size // 4 * 3 + (size & 3) - 1
                decoded[junk : junk + slot * count : slot] = bytes(count)
        text_probe = decoded.decode("latin-1")
        # Only where the secrets are matters here, not their kinds: masked with a character the decodings
        # do not hold, if there is one (binary runs may hold every byte).
        mask = next((ch for ch in _FLAT_MASKS if ord(ch) not in decoded), "")
        masked: list[tuple[int, int]] = []
        for start, end, piece_max in self._probe_bands(groups):
            part = text_probe[start:end]
            probed = self._scan_with(part, depth + 1, _Mint(probe=True, mask=mask), piece_max)
            if probed == part:
                continue
            if lines_joined or len(probed) != len(part):
                return None
            finder = _FLAT_MASKS[mask] if mask else _MASKED
            masked += [(start + m.start(), start + m.end()) for m in finder.finditer(probed)]
        if not masked:
            return []
        group_starts = [g[0] for g in groups]
        held: set[bytes] = set()
        for m_start, m_end in masked:
            ends = []  # the runs holding its first and its last character
            for pos in (m_start, m_end - 1):
                offset, slot, first, _, _ = groups[bisect.bisect_right(group_starts, pos) - 1]
                ends.append(first + (pos - offset) // slot)
            held.update(runs[ends[0] : ends[1] + 1])
            if len(held) > _B64_MAX_SUSPECTS:
                return None
        # The stretch around each place a held run is in: the run of base64 characters, its padding.
        bare = raw.translate(_B64_BARE)
        n = len(encoded)
        stretches: dict[int, int] = {}
        for run in held:
            at = encoded.find(run)
            if at < 0:
                return None  # (a run is text of ``text``; not a case that occurs)
            while at >= 0:
                start = bare.rfind(b" ", 0, at) + 1
                end = bare.find(b" ", at + len(run))
                end = n if end < 0 else end
                stop = end
                while stop < n and stop - end < 2 and encoded[stop] == 0x3D:  # "="
                    stop += 1
                if (start > 0 and encoded[start - 1] in b"\r\n") or (stop < n and encoded[stop] in b"\r\n"):
                    return None  # maybe a line of a block, which the whole text decides
                stretches[start] = stop
                if len(stretches) > _B64_MAX_SUSPECTS:
                    return None
                at = encoded.find(run, stop)
        return sorted(stretches.items())

    def _probe_bands(self, groups: list[tuple[int, int, int, int, int]]) -> list[tuple[int, int, int]]:
        """The probe of ``_base64_suspects_of_many`` cut where its runs' decodings grow long enough for
        another built-in detector (or a wrapper) to fit: (start, end, longest decoding) each, scanned
        apart with that bound (``_scan_with``'s ``piece_max``). 16-character runs decode to 12 bytes,
        too short for a card number, most keys and base64 inside: the many of them that an input can
        hold are not scanned for those. At most one band per distinct width (~20), whatever the input."""
        bands: list[tuple[int, int, int]] = []
        level = -1
        for offset, slot, _, size, count in groups:  # (by size: the bands by their bound)
            piece = (size + 3) // 4 * 3  # the most bytes a run of ``size`` decodes to
            end = offset + slot * count
            fits = bisect.bisect_right(self._piece_widths, piece)
            if fits == level:
                bands[-1] = (bands[-1][0], end, piece)
            else:
                bands.append((offset, end, piece))
                level = fits
        return bands

    def _open_urlencoded(self, text: str, depth: int, mint: _Mint) -> str:
        if _PERCENT.search(text) is None:
            return text
        decoded = _url_decode(text)
        probed = self._scan_with(decoded, depth + 1, _Mint(probe=True))
        if probed == decoded:
            return text
        masks = list(_MASKED.finditer(probed))
        if len(probed) != len(decoded):  # an extra detector's probe changed a length: take the whole text
            return self._token("urlencoded:secret", text, mint)
        offsets = _url_offsets(text, [x for m in masks for x in m.span()])
        out: list[str] = []
        prev = 0
        for i, m in enumerate(masks):
            s, e = offsets[2 * i], offsets[2 * i + 1]
            if s < prev or e <= s:
                continue
            out.append(text[prev:s])
            out.append(self._token(f"urlencoded:{_KIND_OF_MASK.get(m.group()[0], 'secret')}", text[s:e], mint))
            prev = e
        out.append(text[prev:])
        return "".join(out)


def is_token(text: str) -> bool:
    return bool(_TOKEN_RE.fullmatch(text))


def contains_token(text: str) -> bool:
    return bool(_TOKEN_RE.search(text))


# -- off the event loop ------------------------------------------------------------------------------------


def text_size(value: Any, limit: int = OFFLOAD_MIN_CHARS) -> int:
    """How many characters of text ``value`` (JSON-native) holds in its strings, counting stopped at ``limit``."""
    if isinstance(value, str):
        return len(value)
    if not isinstance(value, dict | list):
        return 0  # a number, a boolean, None
    total = 0
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        for item in node.values() if type(node) is dict else node:
            kind = type(item)
            if kind is str:
                total += len(item)
                if total >= limit:
                    return total
            elif kind is dict or kind is list or isinstance(item, dict | list):
                stack.append(item)
            elif isinstance(item, str):
                total += len(item)
    return total


async def off_loop(value: Any, fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)``, in a worker thread when ``value`` (what ``fn`` will redact) holds
    ``OFFLOAD_MIN_CHARS`` of text or more, so that the event loop goes on meanwhile; else here.

    Redaction is linear but a 20 MiB tool output still takes a second or two: in the loop it would
    stall every other run of the process. The detectors scan in windows (``WINDOW_CHARS``), so the
    worker gives the GIL back every few milliseconds."""
    if text_size(value, OFFLOAD_MIN_CHARS) < OFFLOAD_MIN_CHARS:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)


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

    @staticmethod
    def references(value: Any) -> set[str]:
        """The NAMEs of every ``secret://NAME`` in ``value`` (strings, dict values, lists), resolving
        nothing: what a caller that allows only some names checks before ``resolve``."""
        if isinstance(value, str):
            return set(_SECRET_REF.findall(value)) if SECRET_SCHEME in value else set()
        found: set[str] = set()
        if isinstance(value, dict | list):
            for item in value.values() if isinstance(value, dict) else value:
                found |= SecretResolver.references(item)
        return found

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
