"""The wrappers a secret may hide in, found and decoded in bulk: base64 runs and URL escapes.

What the ``Redactor`` opens (``Redactor._open_wrappers``): here, where base64-looking
runs are (``b64_runs``: a block of full lines and its short last line as one run, and the tail
after a separator prefix), what many runs decode to (``b64_decode_all``: C ``map``s over the list,
binary decodings left out, ``texty``), which runs may be base64 of text (``mixed_case``), and URL
escapes decoded with their offsets mapped back (``url_decode``, ``url_offsets``). Pure functions
of the text, no detector and no state: the probing (which detector finds what in a decoding, and
the tokens) is the Redactor's. An input can hold 60,000 runs a MiB, so nothing here makes a Python
call per run.
"""

from __future__ import annotations

import binascii
import itertools
import operator
import re
from collections.abc import Callable
from typing import AnyStr, cast

# Joins decoded wrappers in one probe: no detector matches across it, so the probe's output
# splits back into one part per wrapper.
SEP = "\uffff"

# base64 runs are found on a copy of the text mapped to bytes (every base64 character -> "a", "=" and
# line ends kept, anything else -> " "), where a run of 16 is a literal the regex engine searches for.
_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"
B64_MAP = bytes(ord("a") if c in _B64_ALPHABET else c if c in b"=\r\n" else ord(" ") for c in range(256))
B64_RUN = re.compile(b"a" * 16 + rb"a*+={0,2}+")
B64_SHORT = re.compile(r"[A-Za-z0-9+/_-]{16,}")  # the same, for a short text (no copy of it made)
# The text as bytes with only base64 characters and line ends kept (blanks elsewhere).
B64_KEEP = bytes(c if c in _B64_ALPHABET or c in b"\r\n" else ord(" ") for c in range(256))
# "-", "_", "/" and "+" are base64 data, or a separator in front of base64 (``key-<base64>``,
# ``/v1/<base64>``): a run is also tried from after the last of them in its first 17 characters.
B64_PREFIX = 17
_B64_SEPARATORS = bytes.maketrans(b"_/+", b"---")


def b64_tails(runs: list[bytes]) -> list[bytes]:
    """What follows a short prefix ended by a separator, for the runs that have one (C maps)."""
    runs = list(itertools.compress(runs, map(operator.lt, itertools.repeat(B64_PREFIX), map(len, runs))))
    cut_at = cast("Callable[[bytes, slice], bytes]", operator.getitem)
    heads = map(
        bytes.translate, map(cut_at, runs, itertools.repeat(slice(0, B64_PREFIX))), itertools.repeat(_B64_SEPARATORS)
    )
    cuts = list(map(bytes.rfind, heads, itertools.repeat(b"-")))
    tails = list(map(cut_at, runs, map(slice, map(operator.add, cuts, itertools.repeat(1)), itertools.repeat(None))))
    keep = map(
        operator.and_,
        map(operator.le, itertools.repeat(0), cuts),
        map(operator.le, itertools.repeat(16), map(len, tails)),
    )
    return list(itertools.compress(tails, keep))


# A line end inside a block (after a full line of 64 or 76), for joining its lines.
# (Anchored at the line end, which the engine searches for; the look-behinds check the line before.)
B64_BLOCK_LINE = re.compile(
    rb"(?:\n(?:(?<=(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{64}\n)|(?<=(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{76}\n))"
    rb"|\r\n(?:(?<=(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{64}\r\n)|(?<=(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{76}\r\n)))"
    rb"(?=[A-Za-z0-9+/])"
)
URLSAFE_BYTES = bytes.maketrans(b"-_", b"+/")
# Above this many candidate runs, the exact path (every run at its offset) runs over the whole text.
B64_MAX_SUSPECTS = 64
B64_BARE = bytes.maketrans(b"\r\n", b"  ")  # (for B64_KEEP's output: base64 characters or blanks)
# Lines of MIME, PEM and GNU ``base64`` output (64 or 76 characters, a multiple of 4) decode as one.
_B64_LINE = (64, 76)
_URLSAFE = str.maketrans("-_", "+/")
_PADDING = "=="


def b64_runs(text: str) -> list[tuple[int, int]]:
    """The spans of base64-looking runs of 16 characters or more (a block of full lines, and the
    shorter line that ends it, is one run), and of their tails after a short prefix (``b64_tails``)."""
    encoded = text.encode("latin-1", "replace")
    spans = _b64_blocks(text, encoded.translate(B64_MAP))
    if not spans:
        return spans
    # The last separator in each run's first characters: one rfind a run over the text with every
    # separator made "-" (no slice, no Python call a run: an input can hold 60,000 runs a MiB).
    starts, ends = map(list, zip(*spans, strict=True))
    heads = map(min, ends, map(operator.add, starts, itertools.repeat(B64_PREFIX)))
    cuts = list(map(encoded.translate(_B64_SEPARATORS).rfind, itertools.repeat(b"-"), starts, heads))
    has = list(map(operator.le, itertools.repeat(0), cuts))
    if not any(has):
        return spans
    tails = [(cut + 1, e) for cut, e in itertools.compress(zip(cuts, ends, strict=True), has) if e - (cut + 1) >= 16]
    # By start: a run comes before its tail, which it covers.
    return sorted([*spans, *tails]) if tails else spans


def _b64_blocks(text: str, mapped: bytes) -> list[tuple[int, int]]:
    spans = list(map(re.Match.span, B64_RUN.finditer(mapped)))
    if b"\n" not in mapped or not spans:
        return spans
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        # (A run may start where the last one ended, after its padding: ``...==QUJD...`` is two runs.)
        if merged:
            ps, pe = merged[-1]
            if s - pe <= 2 and mapped[pe:s] in (b"\n", b"\r\n") and _full_line(text, ps, pe):
                merged[-1] = (ps, e)
                continue
        merged.append((s, e))
    # A block's last line may be shorter than a run: it belongs to the block all the same.
    for i, (s, e) in enumerate(merged):
        if _full_line(text, s, e):
            tail = _B64_TAIL.match(mapped, e)
            if tail is not None:
                merged[i] = (s, tail.end())
    return merged


_B64_TAIL = re.compile(rb"\r?\na{1,15}={0,2}(?![a=])")


def _full_line(text: str, start: int, end: int) -> bool:
    """Whether the run ``text[start:end]`` ends with a full line of a base64 block (and no padding)."""
    return text[end - 1] != "=" and end - max(text.rfind("\n", start, end) + 1, start) in _B64_LINE


def b64_decode_all(runs: list[str]) -> list[str]:
    """What each run decodes to, as text (latin-1: one character a byte), or "" when it is no base64
    of text: not base64 at all, or binary (more than one control character in sixteen; no secret a
    detector knows looks like that, and an image is most of what base64 carries). C calls over the
    whole list (``map``), no Python call a run: an input can hold 60,000 runs a MiB."""
    joined = SEP.join(runs)
    if "\n" in joined:
        joined = joined.replace("\r", "").replace("\n", "")
    if "-" in joined or "_" in joined:
        joined = joined.translate(_URLSAFE)  # a run with both alphabets decodes to junk either way
    stripped = joined.replace("=", "").split(SEP)
    lengths = list(map(operator.mod, map(len, stripped), itertools.repeat(4)))
    if 1 in lengths:  # 4k+1 characters are no base64: decode as empty
        stripped = [r if k != 1 else "" for r, k in zip(stripped, lengths, strict=True)]
    raw = list(map(binascii.a2b_base64, map(str.__add__, stripped, itertools.repeat(_PADDING))))
    # junk * False: ""
    return list(map(operator.mul, map(bytes.decode, raw, itertools.repeat("latin-1")), texty(raw)))


def mixed_case(runs: list[AnyStr]) -> list[bool]:
    """Which runs may be base64 of text: hex digests and ids are of one case (or all digits), base64
    of text never is. C ``map``s over the list."""
    if not runs:
        return []
    kind = type(runs[0])
    one_case = map(
        operator.or_, map(operator.or_, map(kind.islower, runs), map(kind.isupper, runs)), map(kind.isdigit, runs)
    )
    return list(map(operator.not_, one_case))


def texty(decodings: list[bytes]) -> list[bool]:
    """Which decodings may be text: at most one control character in sixteen (else binary)."""
    sizes = list(map(len, decodings))
    kept = map(len, map(bytes.translate, decodings, itertools.repeat(None), itertools.repeat(_CONTROL)))
    controls = map(operator.sub, sizes, kept)
    return list(map(operator.le, map(operator.mul, controls, itertools.repeat(16)), sizes))


_CONTROL = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
CONTROL_TO_NUL = bytes(0 if c in _CONTROL or c == 0xFF else c for c in range(256))


PERCENT = re.compile(r"%(?=[0-9A-Fa-f]{2})")


_NOT_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def url_decode(text: str) -> str:
    """``text`` with every ``%XX`` decoded to one character (U+0000-U+00FF), in a few C passes: each
    ``%`` becomes ``\\x`` (a ``%`` that starts no escape, ``\\x25``) and the codec does the rest."""
    escaped = text.replace("\\", "\\\\")
    if _NOT_PERCENT.search(escaped) is not None:
        escaped = _NOT_PERCENT.sub("%25", escaped)
    escaped = escaped.replace("%", "\\x")
    return escaped.encode("latin-1", "backslashreplace").decode("unicode_escape")


def url_offsets(text: str, decoded_offsets: list[int]) -> list[int]:
    """Where the characters at ``decoded_offsets`` (sorted) of ``url_decode(text)`` start in ``text``.

    Counted in C: a stretch of the text with k escapes decodes to k x 2 fewer characters; each step
    counts the escapes of a new stretch, and the distance left shrinks geometrically."""
    out: list[int] = []
    n = len(text)
    o = d = 0
    for target in decoded_offsets:
        while d < target and o < n:
            step = target - d
            end = min(n, o + step)
            escapes = len(PERCENT.findall(text, o, min(n, end + 2)))  # those starting before ``end``
            for back in (1, 2):  # an escape straddling ``end`` is taken whole
                at = end - back
                if at >= o and text[at] == "%" and PERCENT.match(text, at) is not None:
                    end = at + 3
                    break
            d += (end - o) - 2 * escapes
            o = end
        out.append(o)
    return out
