"""The catalogue of secrets redaction recognises: detectors in free text, credential-named dict keys.

A ``Detector`` is a regular expression with an optional validator and an optional *extent* (the
secret's span worked out from a match: the value after ``password:``, a PEM key up to its footer).
Where a credential's value ends, and no further, is ``_credential_extent``'s and ``_unquoted_end``'s.
``DETECTORS`` is their order of application (structured secrets first, so that a generic pattern
never sees half of a key a specific one takes whole). How a pattern keeps the scan linear (a literal
first, a bounded ``reach``, possessive tails) is in ``runledger.protect.redaction._redactor``'s notes; how they
are run, in ``runledger.protect.redaction._scan``.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from runledger.protect.redaction._tokens import PROTECTED
from runledger.protect.redaction._wrappers import SEP


def luhn_ok(digits: str) -> bool:
    """True when ``digits`` (only 0-9) passes the Luhn checksum of payment card numbers."""
    # Every second digit from the right doubled (digit sum: 5 -> 1, 6 -> 3...); the sums are those
    # of the ASCII codes, less 48 a digit: C loops over bytes instead of a Python loop over digits.
    raw = digits.encode()
    return (sum(raw[-1::-2]) + sum(raw[-2::-2].translate(_DOUBLED)) - 48 * len(raw)) % 10 == 0


_DOUBLED = bytes.maketrans(b"0123456789", b"0246813579")


@functools.lru_cache(maxsize=4096)  # a table of the same few numbers, or an input made of one
def card_ok(text: str) -> bool:
    raw = text.encode().translate(None, b" -")
    n = len(raw)
    return 13 <= n <= 19 and (sum(raw[-1::-2]) + sum(raw[-2::-2].translate(_DOUBLED)) - 48 * n) % 10 == 0


def _cards_ok(candidates: list[str]) -> list[bool]:
    """``card_ok`` of each candidate, in C loops over the batch: the digits of every candidate
    right-aligned in 20 (zeros in front change no Luhn sum), so that the digits to double are at the
    same places in every block; each block's sums are then two ``sum``s over its 10-byte slices."""
    if not candidates:
        return []
    unique = set(candidates)
    if len(unique) * 2 < len(candidates):  # the same few numbers again and again: check each once
        verdicts = dict(zip(unique, map(card_ok, unique), strict=True))
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
    sep = text.find(SEP, m.end(), stop)
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

# Where an unquoted value ends (``_unquoted_end``). Words are runs of anything but blanks and line
# ends; a token's ``«`` and ``»`` end a word too, so a token is never a password-shaped word. A *prose
# word* is letters only, in brackets or quotes or not, with punctuation after it or not (``next``,
# ``ok.``, ``(then``). What follows a value's end is kept: the value never takes the prose word.
_W = r"[^ \t\n\r\x00\uffff«»]"
_PROSE_NEXT = r"(?=[ \t]++[(\[\"']?+[^\W\d_]++[)\]\"'.,;:!?]*+(?![^ \t\n\r\x00\uffff]))"
# A password-shaped word (a letter and a digit in it: ``Tr0ub4dor&3``, ``hunter2``) followed by a prose
# word. The digit is looked for possessively (a word without one is read once), the letter is
# mostly the first character.
_PASSWORD_WORD = rf"(?=[^0-9 \t\n\r\x00\uffff«»]*+[0-9])(?=[^\W\d_]|{_W}*?[^\W\d_]){_W}++{_PROSE_NEXT}"
_FIRST_WORD_END = re.compile(_PASSWORD_WORD)  # the value's first word, which no blank precedes
# What follows a list separator (``,`` or ``;``) that ends a value: a blank, the end of the line or of
# the text (``pwd=abc123, user=alice``), or the next ``name=`` / ``name:`` glued to it
# (``pwd=abc123,user=alice``; a blank between name and ``=`` is a word boundary, and ``pwd=a1;b =c``
# is one value). The name read is bounded and stops at the next separator: no character is read twice.
_LIST_NEXT = r"(?=[ \t\n\r\x00\uffff]|\Z|[A-Za-z_][A-Za-z0-9_.-]{0,63}+[=:])"
_LIST_SEP = re.compile(rf"[,;]{_LIST_NEXT}")
# Sentence punctuation stuck to a value's last word: it ends the sentence, not the value.
_SENTENCE_STOP = ".!?"
# Every end but the first word's, each at one of the characters of the leading class: CPython's
# engine skips to those in C when a pattern starts with a class (not with an alternation or a
# look-around: 2.5x slower on a line of prose). A match of one character other than ``.!?`` is an end
# before it: the first blank before a comment (``   # from the vault``), the end of the line.
# (A list separator in the same pattern, not searched for apart: a value ended by each ``, `` of a
# 1 MiB line, each then scanned to the line's end, made the scan quadratic, 120 s for 256 KiB.)
_VALUE_END = re.compile(
    r"[ \t.!?,;\n\r\x00\uffff]"
    rf"(?:(?<=[,;]){_LIST_NEXT}"  # a list separator: ``pwd=abc123, user=alice``
    rf"|(?<=[ \t]){_PASSWORD_WORD}"  # a password-shaped word later in the value, before prose
    rf"|(?<=[.!?]){_PROSE_NEXT}"  # the end of a sentence, before prose: ``nine! ok``
    r"|(?<=[ \t])(?<![ \t]{2})(?=[ \t]*+#(?![^ \t\n\r\x00\uffff]))"  # blanks, then a ``#`` alone
    r"|(?<=[\n\r\x00\uffff]))"  # the end of the line
)


def _run_end(pattern: re.Pattern[str], text: str, start: int) -> int:
    """Where a pattern that matches the empty string too (``x*+``) stops, from ``start``."""
    m = pattern.match(text, start)
    return m.end() if m is not None else start


def _unquoted_end(text: str, start: int) -> int:
    """Where an unquoted value that starts at ``start`` ends: over blank-separated words, up to the
    first of

    - a list separator (``,`` or ``;``) before a blank, the end of the line or a ``name=``: the value
      ends before it (``pwd=abc123, user=alice, role=admin``: ``, user=alice, role=admin`` is kept);
    - a password-shaped word (a letter and a digit in it) followed by a prose word: the value ends
      with that word (``pwd=Tr0ub4dor&3 next``: ``next`` is kept);
    - a word ending in ``.``, ``!`` or ``?`` followed by a prose word (``passphrase=lima-bravo nine!
      ok``: ``! ok`` is kept);
    - a ``#`` alone after blanks (a comment: ``password: a b c   # from the vault``);
    - the end of the line (or of the text), blanks before it left out;

    and sentence punctuation stuck to the value's last word (``.``, ``!``, ``?``) is the sentence's,
    not the value's (``password: hunter2.`` keeps its period), unless the value is nothing else.

    A value of plain words (``correct horse battery staple``), or of words with symbols and no
    password-shaped word before a prose word (``Vortex#9 plinth&quasar !jubilee``), goes to the end
    of its line, sentence, list item or comment. Nothing in the text says where an unquoted passphrase
    ends, so the rule guesses, on the safe side where it can: prose after plain words goes with them.
    Where it cuts, it may cut a passphrase short: one that goes on in prose words after a
    password-shaped word (``hunter2 rosebud``), after a sentence end (``correct horse! battery``),
    after a list separator (``tamarind; aubergine``) or after a ``#`` alone leaves those words in the
    record, and a password that ends in ``.``, ``!`` or ``?`` leaves that character (the docs say so,
    and say to quote such a value or pass it as a ``secret://`` reference).
    Rejected: the first blank (most of a passphrase was stored); the end of the line (what the
    agent wrote after a password on its line was lost: ``pwd=Tr0ub4dor&3 next``, ``pwd=abc123,
    user=alice``); one word for some names and the line for others (``pwd=``, ``X-Auth-Token:`` hold
    passphrases too, and ``passphrase=`` one word: the name says nothing of the value's shape).

    Linear: a word is read a few times at most (the password-word test starts only at a blank, the
    comment test only at the first blank of a run, the list separator test once over the value)."""
    m = _FIRST_WORD_END.match(text, start) or _VALUE_END.search(text, start)
    if m is None:
        end = len(text)
    elif m.end() - m.start() == 1:  # a list separator, a blank before a comment, a line end: before it
        end = m.end() if text[m.start()] in ".!?" else m.start()
    else:
        # A password-shaped word before prose. A list separator at its end or inside it, before a name,
        # ends the value first (``pwd=a1, next``, ``pwd=a1,user=ann next``): the search reads the one
        # word (``endpos``: a separator at its end sees ``\Z``).
        end = m.end()
        sep = _LIST_SEP.search(text, m.start(), end)
        if sep is not None:
            end = sep.start()
    value = text[start:end].rstrip(" \t")
    kept = value.rstrip(_SENTENCE_STOP)
    if kept.strip(" \t"):  # (a value of punctuation only stays whole)
        value = kept
    return start + len(value.rstrip(" \t"))


def _credential_extent(text: str, m: re.Match[str]) -> tuple[int, int] | None:
    """The value of ``name = value`` / ``"name": "value"``, whole, and no more.

    Quoted: up to the closing quote (or the end of the line, if it never closes). In a URL query
    (``?password=...&next=``): up to the next ``&``, ``#`` or blank. After an HTTP auth scheme
    (``Authorization: Digest ...``): to the end of the line (a header's value). Otherwise where
    ``_unquoted_end`` says: a passphrase has blanks and any symbol, so a value runs over words until a
    password-shaped word or the end of a sentence is followed by prose, a comment starts, or the line
    ends. The auth scheme itself is not part of the secret; a value that starts with a token (an API
    key a specific detector took whole) ends with it."""
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
        if ident > 0 and text[ident - 1] in "?&":
            end = _run_end(_QUERY_VALUE, text, start)
        elif _AUTH_SCHEME.match(text, start) is not None:
            end = _run_end(_LINE_REST, text, start)
            end = start + len(text[start:end].rstrip(" \t"))
        else:
            end = _unquoted_end(text, start)
    scheme = _AUTH_SCHEME.match(text, start, end)
    if scheme is not None and scheme.end() < end:
        start = scheme.end()
    placed = PROTECTED.match(text, start, end)
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
    # Neither glued to a hex digit or a dash on either side: a run of digits inside a UUID or a hex
    # digest (``40795395-7434-3c22-...``: 13 digits up to the ``c``, Luhn-valid one time in ten) is
    # part of an id, never a card number. Every fragment of a UUID touches a dash or a hex digit at one
    # end at least, and a whole one is 32 digits or letters, too long for a card.
    _d(
        "card_number",
        r"[3456](?<![0-9A-Fa-f-][3456])\d{3}(?:[ -]?\d){9,15}(?![0-9A-Fa-f-])",
        valid=card_ok,
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
MIN_CHARS: dict[int, int] = {id(det): _min_chars(det.pattern) for det in DETECTORS}

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
