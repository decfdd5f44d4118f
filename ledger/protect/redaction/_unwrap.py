"""Secrets inside base64 and URL-encoded text: wrappers decoded in bulk and *probed*.

A probe is a scan whose tokens are masks as long as the secrets (``Mint``), so that what it finds
keeps its offsets and is mapped back to the wrapper, which goes whole. ``runledger.protect.redaction._wrappers``
finds and decodes the wrappers; the bands, the bulk probe of many runs and what was rejected are in
``runledger.protect.redaction._redactor``'s notes.
"""

from __future__ import annotations

import binascii
import bisect
import itertools
import operator
import re

from runledger.protect.redaction._scan import (
    KIND_OF_MASK,
    MASKED,
    WRAPPER_DEPTH,
    Mint,
    Protected,
    Scanner,
    b64_candidates,
    mask_char,
)
from runledger.protect.redaction._wrappers import (
    B64_BARE,
    B64_MAX_SUSPECTS,
    B64_PREFIX,
    CONTROL_TO_NUL,
    PERCENT,
    SEP,
    URLSAFE_BYTES,
    b64_decode_all,
    b64_runs,
    b64_tails,
    mixed_case,
    texty,
    url_decode,
    url_offsets,
)

_Group = tuple[int, int, int, int, int]  # (offset in the probe, bytes a run, first run, size, runs)

# Kind-less masks of a probe that only asks where its secrets are: control characters, the first one
# the probed text does not hold.
# (A literal first, which the regex engine searches for: ``x+`` alone is tried at every position.)
_FLAT_MASKS = {chr(c): re.compile(re.escape(chr(c)) * 2 + "*+") for c in (0x7F, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06)}


class WrapperOpener(Scanner):
    """The scan of ``Scanner`` with what it finds inside base64 and URL-encoded text."""

    def _open_wrappers(self, text: str, depth: int, mint: Mint, piece_max: int | None = None) -> str:
        """Secrets inside base64 and URL-encoded text (``WRAPPER_DEPTH`` wrappers deep).

        A probe is a scan whose tokens are same-length masks (``Mint``): what it finds keeps its
        offsets. Base64: the runs of a text are decoded together (C ``map``s over the list) and probed
        as one text, their decodings joined by ``SEP``, which no detector matches across; a run whose
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

    def _open_base64(self, text: str, depth: int, mint: Mint) -> str:
        suspects = self._base64_suspects(text, depth)
        if suspects is None:
            spans = b64_runs(text)
        else:  # only the stretches that may hold a secret: the runs there are those of the whole text
            spans = [(s + a, e + a) for a, b in suspects for s, e in b64_runs(text[a:b])]
        if not spans:
            return text
        runs = list(map(text.__getitem__, itertools.starmap(slice, spans)))
        keep = list(itertools.compress(range(len(runs)), mixed_case(runs)))
        if not keep:
            return text
        decoded = b64_decode_all(list(map(runs.__getitem__, keep)))
        if not any(decoded):
            return text
        joined = SEP.join(decoded)
        probed = self._scan_with(joined, depth + 1, Mint(probe=True), max(map(len, decoded)))
        if probed == joined:
            return text
        parts = probed.split(SEP)
        if len(parts) != len(decoded):  # an extra detector matched across the separator: all are suspect
            parts = [mask_char("secret")] * len(decoded)
        protected = Protected(text)
        hits: dict[int, str] = {}
        for k in itertools.compress(range(len(keep)), map(operator.ne, parts, decoded)):
            s, e = spans[keep[k]]
            if not protected.overlaps(s, e):
                mask = MASKED.search(parts[k])
                hits[keep[k]] = KIND_OF_MASK.get(mask.group()[0], "secret") if mask else "secret"
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
        them, which end what a detector can match as ``SEP`` does: every class that leaves out one
        leaves out both), so [] is a safe no. Of more than 16 runs (distinct), what the probe found
        is mapped back to the runs it lies in (their decodings' offsets in the probe: a bisect) and
        each such run to the stretches of ``text`` holding it (a ``find``: the whole run of base64
        characters around it, and its padding), which the exact path (``_open_base64``) looks at
        alone: the runs there are the runs of the whole text, as the stretch is cut where no run
        goes on. One secret among 60,000 runs no longer sends every run down the exact path (which
        slices, decodes and probes each at its offset: 300 ms a MiB). None, the whole text, when a
        stretch may be a line of a block (a newline at either end: ``_b64_blocks`` joins lines),
        when the probe changed a length (an extra detector), or past ``B64_MAX_SUSPECTS`` stretches
        (dense secrets: a token each, the exact path's cost either way).

        Rejected: the offsets of every run kept through the probe (``finditer``, slices: what the
        exact path costs); a second probe per run (a Python call each)."""
        found = b64_candidates(text)
        if found is None:
            return []
        encoded, raw, lines_joined, runs = found
        if len(runs[-1]) > B64_PREFIX and (b"-" in raw or b"_" in raw or b"/" in raw or b"+" in raw):
            tails = b64_tails(runs[bisect.bisect_right(runs, B64_PREFIX, key=len) :])
            if tails:
                runs += tails
                runs.sort(key=len)  # (by length still: _base64_suspects_of_many takes them so)
        # URL-safe runs (a run with both alphabets decodes to junk either way)
        urlsafe = b"-" in raw or b"_" in raw
        if len(runs) > 16:
            return self._base64_suspects_of_many(text, encoded, raw, runs, urlsafe, lines_joined, depth)
        if urlsafe:
            runs = list(map(bytes.translate, runs, itertools.repeat(URLSAFE_BYTES)))
        sizes = list(map(len, runs))
        # Each run padded with "A" to whole quanta (zero bits: at most two bytes of junk at its end).
        lengths = map(operator.and_, map(operator.add, sizes, itertools.repeat(3)), itertools.repeat(-4))
        padded = map(bytes.ljust, runs, lengths, itertools.repeat(b"A"))
        # A document, an image: each decoded, binary ones left out (as in b64_decode_all).
        decodings = list(map(binascii.a2b_base64, padded))
        decoded = b"\x00".join(itertools.compress(decodings, texty(decodings)))
        # Control bytes (binary) become NULs, which end what a detector can match as SEP does, and
        # keep the probe Latin-1: one byte a character for the scans, where SEP would make it two.
        probe = decoded.translate(CONTROL_TO_NUL).decode("latin-1")
        piece_max = max(map(len, decodings))
        return None if probe and self._scan_with(probe, depth + 1, Mint(probe=True), piece_max) != probe else []

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
        decoded, groups = _decode_runs(runs, urlsafe)
        masked = self._masked_in_probe(decoded, groups, lines_joined, depth)
        if not masked:
            return masked  # None (the whole text decides) or [] (nothing in the runs)
        held = _runs_holding(masked, groups, runs)
        return None if held is None else _stretches_around(held, encoded, raw)

    def _masked_in_probe(
        self, decoded: bytearray, groups: list[_Group], lines_joined: bool, depth: int
    ) -> list[tuple[int, int]] | None:
        """Where the secrets are in the decodings of ``_decode_runs`` (offsets in ``decoded``), band by
        band; None if a secret may span runs joined from lines (the whole text decides)."""
        text_probe = decoded.decode("latin-1")
        # Only where the secrets are matters here, not their kinds: masked with a character the decodings
        # do not hold, if there is one (binary runs may hold every byte).
        mask = next((ch for ch in _FLAT_MASKS if ord(ch) not in decoded), "")
        masked: list[tuple[int, int]] = []
        for start, end, piece_max in self._probe_bands(groups):
            part = text_probe[start:end]
            probed = self._scan_with(part, depth + 1, Mint(probe=True, mask=mask), piece_max)
            if probed == part:
                continue
            if lines_joined or len(probed) != len(part):
                return None
            finder = _FLAT_MASKS[mask] if mask else MASKED
            masked += [(start + m.start(), start + m.end()) for m in finder.finditer(probed)]
        return masked

    def _probe_bands(self, groups: list[_Group]) -> list[tuple[int, int, int]]:
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

    def _open_urlencoded(self, text: str, depth: int, mint: Mint) -> str:
        if PERCENT.search(text) is None:
            return text
        decoded = url_decode(text)
        probed = self._scan_with(decoded, depth + 1, Mint(probe=True))
        if probed == decoded:
            return text
        masks = list(MASKED.finditer(probed))
        if len(probed) != len(decoded):  # an extra detector's probe changed a length: take the whole text
            return self._token("urlencoded:secret", text, mint)
        offsets = url_offsets(text, [x for m in masks for x in m.span()])
        out: list[str] = []
        prev = 0
        for i, m in enumerate(masks):
            s, e = offsets[2 * i], offsets[2 * i + 1]
            if s < prev or e <= s:
                continue
            out.append(text[prev:s])
            out.append(self._token(f"urlencoded:{KIND_OF_MASK.get(m.group()[0], 'secret')}", text[s:e], mint))
            prev = e
        out.append(text[prev:])
        return "".join(out)


def _decode_runs(runs: list[bytes], urlsafe: bool) -> tuple[bytearray, list[_Group]]:
    """``runs`` (sorted by length) decoded in one call, and where each length's runs are in the result."""
    # The runs of one length are joined by one separator, their padding with "A" and "AAAA" (three
    # NULs): no C pass a run. In a run's decoding, the byte past its last whole one (from the
    # padding and its last character's low bits) is set to NUL, as a junk letter there could hide
    # a secret a detector bounds ("AKIA..." then "P" is no key id).
    pieces: list[bytes] = []
    groups: list[_Group] = []
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
    decoded = bytearray(binascii.a2b_base64(joined.translate(URLSAFE_BYTES) if urlsafe else joined))
    for offset, slot, _, size, count in groups:
        if size & 3:  # 4k + r characters: 3k + r - 1 bytes (r = 1: 3k, and 4k decode as extra text)
            junk = offset + size // 4 * 3 + (size & 3) - 1
            decoded[junk : junk + slot * count : slot] = bytes(count)
    return decoded, groups


def _runs_holding(masked: list[tuple[int, int]], groups: list[_Group], runs: list[bytes]) -> set[bytes] | None:
    """The runs that hold the secrets found at ``masked`` (offsets in the decodings of ``_decode_runs``);
    None if there are more than ``B64_MAX_SUSPECTS``."""
    group_starts = [g[0] for g in groups]
    held: set[bytes] = set()
    for m_start, m_end in masked:
        ends = []  # the runs holding its first and its last character
        for pos in (m_start, m_end - 1):
            offset, slot, first, _, _ = groups[bisect.bisect_right(group_starts, pos) - 1]
            ends.append(first + (pos - offset) // slot)
        held.update(runs[ends[0] : ends[1] + 1])
        if len(held) > B64_MAX_SUSPECTS:
            return None
    return held


def _stretches_around(held: set[bytes], encoded: bytes, raw: bytes) -> list[tuple[int, int]] | None:
    """The stretch around each place a held run is in: the run of base64 characters, its padding
    (sorted); None where the whole text decides (a line of a block, too many stretches)."""
    bare = raw.translate(B64_BARE)
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
            if len(stretches) > B64_MAX_SUSPECTS:
                return None
            at = encoded.find(run, stop)
    return sorted(stretches.items())
