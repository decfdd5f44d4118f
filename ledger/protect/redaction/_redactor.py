"""Redaction: secrets and configured fields replaced by stable tokens before anything is published.

A ``Redactor`` walks a JSON-native value and replaces

- every match of a secret *detector* inside any string (provider API keys and tokens,
  bearer tokens, PEM private keys, passwords in URLs, JWTs, card numbers that pass the
  Luhn check, ``password=...``-style assignments, whose value goes whole and no more: to the
  end of its quoted string or of its URL query parameter; unquoted, over words to the end of
  the line or of a sentence, or to a password-shaped word before prose: ``pwd=Tr0ub4dor&3
  next`` keeps ``next``; ``_detectors._unquoted_end``),
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
taking the rest of its line after an unquoted password (what the agent read after it was lost);
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

Wrappers. A *probe* is a scan whose tokens are masks as long as the secrets (``Mint``), so
it keeps offsets. URL encoding: the whole text is ``%XX``-decoded in a few C passes and
probed; a masked span is mapped back by counting escapes, and its encoded form goes
(``«redacted:urlencoded:<kind>:...»``). Base64: runs of 16 or more (a block of 64- or
76-column lines is one run; a run is also tried after a short ``key-`` or ``/v1/`` prefix)
are decoded and probed together, their decodings joined by a character no detector matches
across; a run whose part changed goes whole (``«redacted:base64:<kind>:...»``). Of many runs,
one decoding of them all (no offsets kept) is probed first, and only the stretches of text
holding a run it flagged are looked at run by run (``Redactor._base64_suspects``). That probe is
cut in bands of run length (``Redactor._probe_bands``): a decoding shorter than a built-in
detector's shortest match (``MIN_CHARS``; NULs between decodings, which no built-in detector
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

Where things are (private modules of the package ``runledger.protect.redaction``, which exports
their public names): the token's shape in ``_tokens``, the catalogue of detectors and
credential-named keys in ``_detectors``, ``RedactionPolicy`` and field paths in ``_policy``, the
scan of one text in ``_scan``, wrappers found and decoded in ``_wrappers`` and probed in
``_unwrap``, ``off_loop`` in ``_offload``, ``SecretResolver`` in ``_secrets``; here, the
``Redactor`` (tokens, the walk over a value, the per-run caches).
"""

from __future__ import annotations

import hashlib
import operator
import threading
from collections import OrderedDict
from typing import Any

from runledger.errors import ConfigurationError
from runledger.protect.redaction._policy import (
    FieldPaths,
    RedactionPolicy,
    RedactionStats,
    key_form,
    key_pattern,
    normalize_key,
)
from runledger.protect.redaction._scan import Mint, lower_text, mask_char
from runledger.protect.redaction._tokens import (
    KIND_JUNK,
    SECRET_SCHEME,
    TOKEN_CLOSE,
    TOKEN_OPEN,
    TOKEN_RE,
)
from runledger.protect.redaction._unwrap import WrapperOpener
from runledger.record.canonical import canonical_json

# Redaction cache of a run (Redactor.redact_text): texts shorter than this are cheaper to scan
# than to look up; longer than CACHE_MAX_TEXT are documents, not re-sent history.
CACHE_MIN_CHARS = 64
CACHE_MAX_TEXT = 256 * 1024
CACHE_MAX_ENTRIES = 4096
CACHE_MAX_CHARS = 2 * 1024 * 1024  # keys and values: 2-8 MiB of str per run, a worker may hold many runs
# Short texts remembered as holding nothing to redact (Redactor.redact_text): at most ~250 KiB a run.
PLAIN_MAX_ENTRIES = 4096


_MISSING = "\x00"  # not a kind: a key not looked at yet


# HMAC's pads as translation tables (byte b -> b ^ 0x36, b ^ 0x5C): a run's Redactor xors its key in C.
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))


class Redactor(WrapperOpener):
    """Applies a RedactionPolicy under one run's token key. Thread-safe: the scans share nothing
    mutable; the stats, the caches and the registered secrets change under a lock."""

    def __init__(self, token_key: bytes, policy: RedactionPolicy | None = None) -> None:
        if len(token_key) < 16:
            raise ConfigurationError("a redaction token key needs at least 16 bytes")
        self._key = token_key
        # HMAC-SHA256 = H(k ^ opad || H(k ^ ipad || m)): both keyed states made once, copied per token.
        block = (hashlib.sha256(token_key).digest() if len(token_key) > 64 else token_key).ljust(64, b"\0")
        self._inner = hashlib.sha256(block.translate(_IPAD))
        self._outer = hashlib.sha256(block.translate(_OPAD))
        super().__init__(policy or RedactionPolicy())
        self._fields = FieldPaths(self.policy.fields)
        self._key_re = key_pattern(self.policy.sensitive_keys)
        self._not_key_re = key_pattern(self.policy.non_sensitive_keys)
        self._key_kinds: dict[str, str | None] = {}  # dict key -> "field:<key>" when it names a credential
        self._lock = threading.Lock()
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

    def _token(self, kind: str, value: str, mint: Mint) -> str:
        if mint.probe:
            return (mint.mask or mask_char(kind)) * len(value)
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
        mint = Mint()
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
            known = {**self._known, value: KIND_JUNK.sub("_", kind.lower())}
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
            form = key_form(key)
            sensitive = self._key_re.match(form) is not None and self._not_key_re.match(form) is None
            kind = "field:" + KIND_JUNK.sub("_", normalize_key(key)) if sensitive else None
            if len(self._key_kinds) >= 4096:
                self._key_kinds.clear()
            self._key_kinds[key] = kind
        return kind

    def redact(self, value: Any, path: tuple[str, ...] = ()) -> Any:
        """A copy of JSON-native ``value`` with secrets and configured fields tokenized: ``value``
        itself when nothing in it is (callers may then reuse what they derived from it, such as its
        canonical bytes: runledger.protect.capture). ``path``: where ``value`` sits, for field paths."""
        return self._walk(value, path if self._fields else None)

    def _walk(self, value: Any, path: tuple[str, ...] | None) -> Any:
        # ``path`` None: no field paths configured (the default policy), so no value's path is built.
        if path and self._fields.match(path):
            # The matched key as a token kind may hold (a wildcard matches any key, "Card Number" too),
            # so the token is one is_token knows and redacting the output again leaves it as it is.
            return self._whole("field:" + KIND_JUNK.sub("_", path[-1].lower()), value)
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
                    if path is None and type(v) is str:  # (a string leaf, no call: the path argument
                        new = out[new_key] = self.redact_text(v)  # cost the walk 3-4% otherwise)
                    else:
                        new = out[new_key] = self._walk(v, None if path is None else (*path, key))
                    same = same and new is v and new_key is k
            return value if same else out
        if isinstance(value, list):
            if path is None:
                items = [self._walk(v, None) for v in value]
            else:
                items = [self._walk(v, (*path, str(i))) for i, v in enumerate(value)]
            return value if all(map(operator.is_, items, value)) else items
        return value

    def _whole(self, kind: str, value: Any) -> str:
        if isinstance(value, str):
            if TOKEN_RE.fullmatch(value):
                return value
            if value.startswith(SECRET_SCHEME):
                return value  # a reference is not the secret; keeping it keeps the args meaningful
            return self.token(kind, value)
        return self.token(kind, canonical_json(value).decode("utf-8"))

    def redact_known(self, text: str) -> str:
        """``text`` with only the registered secret values replaced (capture=full)."""
        mint = Mint()
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
            mint = Mint()
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
        mint = Mint()
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
        low = text.lower() if text.isascii() else lower_text(text)
        return self._any_hint.search(low) is None and self._plain(text, low, 0)

    def _scan(self, text: str) -> str:
        """``text`` redacted, not cached (counts its tokens, not a string scanned)."""
        mint = Mint()
        out = self._scan_with(text, 0, mint)
        if mint.kinds:
            self._count(mint.kinds)
        return out

    # -- the scan ---------------------------------------------------------------------------------------
