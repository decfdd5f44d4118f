"""The scan of one text by the detectors: hints first, then windows, then each detector's spans tokenized.

``Scanner`` is the part of a ``Redactor`` that finds secrets in a string: the per-policy tables that
decide most texts in a few C calls (``_plain``), the window-by-window search of one detector
(``_find``), and the replacement of its spans (``_apply``). What a scan looks for inside wrappers is
``runledger.protect.redaction._unwrap``'s (``_open_wrappers``); tokens are the ``Redactor``'s (``_token``).
The reasoning behind the bounds is in ``runledger.protect.redaction._redactor``'s notes.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import re
import threading
from collections.abc import Iterable
from typing import Any

from runledger.protect.redaction._detectors import MIN_CHARS, Detector
from runledger.protect.redaction._policy import RedactionPolicy
from runledger.protect.redaction._tokens import PROTECTED, SECRET_SCHEME, TOKEN_OPEN
from runledger.protect.redaction._wrappers import (
    B64_BLOCK_LINE,
    B64_KEEP,
    B64_MAP,
    B64_RUN,
    B64_SHORT,
    PERCENT,
)

# Up to this length one scan for every detector's hints at once (Redactor._any_hint) decides for
# all of them; above it the per-detector ``str.find`` scans are as fast as that one regex scan
# (CPython's re tries the alternation at each position: 2 KiB took 26-180 us, against 50-65 us for
# ~30 finds, while a 13-60 character string took 0.4-0.7 us against 9-16 us).
GATE_MAX_CHARS = 512
# The most text one regex call scans: ~1-3 ms of GIL at the slowest detector's rate.
WINDOW_CHARS = 128 * 1024
# How many wrappers deep a secret is looked for (base64 of a URL-encoded text: 2).
WRAPPER_DEPTH = 2


def b64_candidates(text: str) -> tuple[bytes, bytes, bool, list[bytes]] | None:
    """The runs of ``text`` that may be base64 of text: of 16 characters or more, of mixed case (as
    ``mixed_case`` keeps), the lines of a block joined, each once, by length; with the text as Latin-1
    bytes, its base64 characters (blanks elsewhere, block lines joined) and whether lines were joined.
    None: no such run (most texts: C passes, a few Python calls)."""
    encoded = text.encode("latin-1", "replace")
    if B64_RUN.search(encoded.translate(B64_MAP)) is None:
        return None
    if len(text) <= GATE_MAX_CHARS:  # a few runs: find them in place, and let one-case ones go
        short_runs = B64_SHORT.findall(text)
        if all(r.islower() or r.isupper() or r.isdigit() for r in short_runs):
            return None
    raw = encoded.translate(B64_KEEP)
    lines_joined = False
    if b"\n" in raw:  # the lines of a block are one run
        joined = B64_BLOCK_LINE.sub(b"", raw)
        lines_joined, raw = len(joined) != len(raw), joined
    runs = sorted(set(raw.split()), key=len)  # a run repeated is probed once
    runs = runs[bisect.bisect_left(runs, 16, key=len) :]
    # Mixed case only, as in _open_base64 (what ``mixed_case`` keeps; filters: fewer C passes).
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


def lower_text(text: str) -> str:
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


class Mint:
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
KIND_OF_MASK: dict[str, str] = {}
MASKED = re.compile("[\U000f0000-\U000ffffd]+")
# Kind-less masks of a probe that only asks where its secrets are: control characters, the first one
# the probed text does not hold.
# (A literal first, which the regex engine searches for: ``x+`` alone is tried at every position.)


_MASK_LOCK = threading.Lock()


def mask_char(kind: str) -> str:
    ch = _MASK_KINDS.get(kind)
    if ch is None:
        with _MASK_LOCK:
            ch = _MASK_KINDS.get(kind)
            if ch is None:
                ch = _MASK_KINDS[kind] = chr(_MASK_BASE + min(len(_MASK_KINDS), 0xFFFD))
                KIND_OF_MASK.setdefault(ch, kind)
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


class Protected:
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
            self._spans = [m.span() for m in PROTECTED.finditer(text)] if has else []
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


class Scanner:
    """The detectors of one policy run over a text (``_scan_with``). Builds, once, what decides most
    texts without entering a detector: the hints of all detectors as one regex, the detectors without
    hints and their patterns, the widths a probe's pieces need. Holds the registered secrets (replaced
    whole before the detectors run), which only ``Redactor.add_secret`` changes."""

    def __init__(self, policy: RedactionPolicy) -> None:
        self.policy = policy
        self._detectors = policy.detectors + policy.extra_detectors
        self._unwrap = tuple(policy.unwrap)
        self._any_hint = _alternation(h for det in self._detectors for h in det.hints)
        # What a short text without any hint still goes through: the detectors without hints. With
        # hints, the ones present are found once (``in``) and each detector's are a set to compare.
        self._unhinted = tuple(det for det in self._detectors if not det.hints)
        self._hint_list = tuple(sorted({h for det in self._detectors for h in det.hints}))
        self._hint_sets = {id(det): frozenset(det.hints) for det in self._detectors}
        # The characters the hints are made of, and the hints each one is absent from: a hint one of
        # whose characters the text lacks is not in it (``_present_hints``; a memchr a character).
        self._hint_chars = tuple(sorted({ch for h in self._hint_list for ch in h}))
        self._hints_without: dict[tuple[str, ...], tuple[str, ...]] = {}
        # What else decides that a text holds nothing (``_plain``): each unhinted detector's pattern
        # (the card number's, not its gate: ``[3456]\d{3}`` is in most ids and dates, 13 digits are not).
        self._unhinted_patterns = tuple((det.pattern, det.lower) for det in self._unhinted)
        self._opens_base64 = "base64" in self._unwrap
        self._opens_urlencoded = "urlencoded" in self._unwrap
        # Where a probe of decoded runs is cut in bands (``_probe_bands``): the shortest match of each
        # built-in detector, and what a wrapper inside needs (a %XX escape; a base64 run).
        widths = {MIN_CHARS[id(det)] for det in self._detectors if id(det) in MIN_CHARS}
        widths |= {3} if self._opens_urlencoded else set()
        widths |= {16} if self._opens_base64 else set()
        self._piece_widths = tuple(sorted(widths))
        # Registered secrets (replaced, never mutated: a scan reads one consistent pair).
        self._known: dict[str, str] = {}  # secret value -> kind
        self._known_order: tuple[str, ...] = ()  # longest first

    # What the classes built on this one provide: a token (or a probe's mask) for a value, the
    # Redactor's; and what a scan finds inside wrappers, runledger.protect.redaction._unwrap's.

    def _token(self, kind: str, value: str, mint: Mint) -> str:
        raise NotImplementedError

    def _open_wrappers(self, text: str, depth: int, mint: Mint, piece_max: int | None = None) -> str:
        raise NotImplementedError

    def _scan_with(self, text: str, depth: int, mint: Mint, piece_max: int | None = None) -> str:
        """``text`` with its secrets replaced (tokens, or a probe's masks), looking ``depth`` wrappers deep
        already. ``piece_max``: ``text`` is pieces of at most that many characters, NULs or ``SEP``
        between them (a probe of decoded runs), so a built-in detector whose shortest match is longer,
        and a wrapper that needs more, is left out."""
        if self._known_order:
            text = self._replace_known(text, mint)
        if len(text) < 8:
            return text
        hints: _Hints | None = None
        protected: Protected | None = None
        detectors = self._detectors
        # The hints the text holds, found at once (None: a text of several windows, whose detectors look
        # their hints up one by one and skip to them, ``_Hints``). Up to GATE_MAX_CHARS one scan for all
        # of them decides first; in a longer text a C ``in`` each (a ``filter``, no Python call a hint).
        present: frozenset[str] | None = None
        if len(text) <= WINDOW_CHARS:
            low = text.lower() if text.isascii() else lower_text(text)
            if len(text) > GATE_MAX_CHARS:
                present = self._present_hints(low)
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
            if piece_max is not None and MIN_CHARS.get(id(det), 0) > piece_max:
                continue
            if det.hints:
                if present is not None:
                    if hint_sets[id(det)].isdisjoint(present):
                        continue
                elif det.gate is None:  # (a long text is searched for a detector's gate, if it has one)
                    if hints is None:
                        hints = _Hints(lower_text(text))
                    if all(hints.find(h, 0) < 0 for h in det.hints):
                        continue
            if det.lower and hints is None:
                # (Also after an earlier detector's tokens reset the hints: a short text's hints are not
                # looked up again, and ``_find`` would match the lower-cased pattern on the text as is,
                # missing "Bearer ..." after an AWS key id.)
                hints = _Hints(lower_text(text))
            if det.gate is not None and present is not None and not det.hints and det.gate.search(text) is None:
                continue
            if protected is None:
                protected = Protected(text)
            spans = self._find(det, text, hints, protected)
            if spans:
                text = self._apply(det.kind, text, spans, protected if det.extent is not None else None, mint)
                hints, protected = None, None
        return self._open_wrappers(text, depth, mint, piece_max)

    def _present_hints(self, low: str) -> frozenset[str]:
        """The hints ``low`` (a lower-cased text of more than ``GATE_MAX_CHARS``) holds. A hint is
        searched (``in``, ~1 ns a character) only when each of its characters is in the text: one
        ``in`` a character of the hints' alphabet (a memchr, that stops at the first one found)
        rules out most hints of a text without digits, ``_``, ``-``, ``.`` or ``:`` at once."""
        absent = tuple(itertools.filterfalse(low.__contains__, self._hint_chars))
        candidates = self._hints_without.get(absent)
        if candidates is None:
            candidates = tuple(h for h in self._hint_list if not any(ch in h for ch in absent))
            if len(self._hints_without) >= 1024:
                self._hints_without.clear()
            self._hints_without[absent] = candidates
        return frozenset(filter(low.__contains__, candidates))

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
        if self._opens_urlencoded and "%" in text and PERCENT.search(text) is not None:
            return False
        return not (self._opens_base64 and len(text) >= 16 and b64_candidates(text) is not None)

    def _find(self, det: Detector, text: str, hints: _Hints | None, protected: Protected) -> list[tuple[int, int]]:
        """The spans of ``det``'s secrets in ``text`` (sorted, not overlapping), window by window.

        A match that starts inside a token or a secret:// reference is not one (a token's kind,
        e.g. "secret:", would be taken for the start of a credential assignment; a reference names
        a credential, it is not one, and replays must see it unchanged); nor is a span running into
        one, except an extent's (a credential's value holding a token: see ``_apply``)."""
        subject = hints.low if det.lower and hints is not None else text
        if len(text) <= WINDOW_CHARS and det.pattern.search(subject) is None:
            return []  # one window and no match: no more to do
        # Skipping to hints (or gate matches) is for texts of more than one window; a gate wins.
        own = det.hints if hints is not None and len(text) > WINDOW_CHARS and det.gate is None else ()
        skip = _Skip(det, text, hints, own)
        guarded: bool | None = None  # whether the text holds tokens or references (asked at the first match)
        n = len(text)
        found: list[tuple[int, int]] = []
        last = 0  # end of the last secret: the next starts after it
        pos = 0
        while pos < n:
            if own or det.gate is not None:
                pos = skip.to_next(pos)
                if pos < 0:
                    break
            if det.cut is not None:
                c = det.cut.search(subject, pos + WINDOW_CHARS) if pos + WINDOW_CHARS < n else None
                window_end = limit = c.start() if c is not None else n
            else:
                window_end = min(n, pos + WINDOW_CHARS)
                limit = min(n, window_end + max(1, det.reach))
            if guarded is None:
                guarded = protected.any()
            if det.extent is None and not guarded:
                # A plain pattern in a text without tokens: the whole window's matches at once. (Not
                # for extents: a secret that runs past its match restarts the window from its end,
                # and listing a window's matches each time would be quadratic.)
                spans = _window_spans(det, text, subject, pos, window_end, limit)
                if spans:
                    found.extend(spans)
                    last = spans[-1][1]
                pos = max(window_end, last)
                continue
            last, resume = _window_matches(
                det, text, subject, (pos, window_end, limit), last, guarded, protected, found
            )
            pos = max(resume, last)
        return found

    def _apply(
        self, kind: str, text: str, spans: list[tuple[int, int]], protected: Protected | None, mint: Mint
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

    def _replace_known(self, text: str, mint: Mint) -> str:
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


class _Skip:
    """Where ``Scanner._find``'s next window starts in a text of many windows: at ``reach`` before
    the next of the detector's own hints, or before the next match of its gate."""

    def __init__(self, det: Detector, text: str, hints: _Hints | None, own: tuple[str, ...]) -> None:
        self.det, self.text, self.hints, self.own = det, text, hints, own
        self.reach = max(1, det.reach)
        self.next_hint: dict[str, int] = {}  # hint -> its next offset at or after pos - reach (-1: none left)

    def to_next(self, pos: int) -> int:
        """The next window's start at or after ``pos``; -1 if the text holds no more to look at."""
        reach, n = self.reach, len(self.text)
        if self.own:
            assert self.hints is not None
            back, hit = max(0, pos - reach), -1
            for h in self.own:
                i = self.next_hint.get(h, -2)
                if i == -1:
                    continue
                if i < back:
                    i = self.next_hint[h] = self.hints.find(h, back)
                    if i < 0:
                        continue
                if hit < 0 or i < hit:
                    hit = i
            return -1 if hit < 0 else max(pos, hit - reach)
        gate = self.det.gate
        assert gate is not None
        while pos < n:
            g = gate.search(self.text, pos, min(n, pos + WINDOW_CHARS + reach))
            if g is not None:
                return max(pos, g.start() - reach)
            pos += WINDOW_CHARS
        return -1


def _window_spans(
    det: Detector, text: str, subject: str, pos: int, window_end: int, limit: int
) -> list[tuple[int, int]]:
    """The spans of ``det``'s secrets starting in one window ``[pos, window_end)`` of a text without
    tokens or references, all at once (a plain pattern: no extent), the last match's tail read up
    to ``limit`` or further."""
    pattern, group, valid, n = det.pattern, det.group, det.valid, len(text)
    if det.valid_all is not None and group == 0 and pattern.groups == 0:
        # Candidates as strings first (no match objects): most windows hold no valid one.
        # (A batch-checked detector's matches are shorter than its reach: none is cut.)
        candidates = pattern.findall(subject, pos, limit)
        if not candidates or not any(det.valid_all(candidates)):
            return []
    matches = list(pattern.finditer(subject, pos, limit))
    starts = list(map(re.Match.start, matches))
    del matches[bisect.bisect_left(starts, window_end) :]
    if matches and det.cut is None and matches[-1].end() >= limit and limit < n:
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
    return spans


def _window_matches(
    det: Detector,
    text: str,
    subject: str,
    window: tuple[int, int, int],
    last: int,
    guarded: bool,
    protected: Protected,
    found: list[tuple[int, int]],
) -> tuple[int, int]:
    """The secrets of one window ``(pos, window_end, limit)`` match by match (an extent, or a text
    holding tokens), appended to ``found``: (the end of the last secret, where the next window starts)."""
    pos, window_end, limit = window
    pattern, extent, n = det.pattern, det.extent, len(text)
    resume = window_end
    for m in pattern.finditer(subject, pos, limit):
        start = m.start()
        if start >= window_end:
            break
        if start < last or (guarded and protected.holds(start)):
            continue
        if det.cut is None and m.end() >= limit and limit < n:
            m = pattern.match(subject, start, n) or m  # a tail the window cut short
        span = extent(text, m) if extent is not None else m.span(det.group)
        if span is None:
            continue
        s, e = span
        if s < last or e <= s or (guarded and extent is None and protected.overlaps(s, e)):
            continue
        if det.valid is not None and not det.valid(text[s:e]):
            continue
        found.append(span)
        last = e
        if e > m.end() + 1024:  # the secret runs far past its match (a long value, a key's body):
            resume = e  # go on from its end rather than skip the matches inside it one by one
            break
    return last, resume
