"""Redaction work grows linearly with its input, whatever the input: counted, not timed.

For each adversarial input of bench/protect.py (near misses built for one detector or wrapper; the
benchmark reports their time) a scan of 1 MiB is compared with a scan of 512 KiB by the work it does:
the Python and C functions it calls (``sys.setprofile``) and the characters it hands to the regex
engine and to the base64 decoder; so is its dense input (every candidate a real secret) at 128 KiB
and 64 KiB. Linear work doubles; a scan that rescans (a window redone for each candidate, a run
decoded once per neighbour) grows about 4x, and a test checks that the counter tells them apart.
And the Python calls stay a few per window: near misses are rejected in C, not one Python call each.
(Not counted: the steps inside one regex call. A pattern that backtracks over what it read shows in
bench/protect.py's times.)
"""

from __future__ import annotations

import binascii
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest

from bench.protect import ADVERSARIAL, DENSE
from runledger.protect import redaction
from runledger.protect.redaction import Redactor, _scan

KEY = b"k" * 32
KIB = 1024


# Every adversarial input the benchmark times (bench/protect.py), here counted.
INPUTS: dict[str, Callable[[int], str]] = {
    f"{kind}: {name}": build for kind, inputs in ADVERSARIAL.items() for name, build in inputs
}
# And its dense inputs: every candidate a real secret, so each match is taken one by one (an
# extent's, a validator's, a token minted), the path near misses seldom reach.
DENSE_INPUTS: dict[str, Callable[[int], str]] = {f"{kind}: {name}": build for kind, (name, build) in DENSE.items()}


@dataclass
class Work:
    """What one scan did: function calls made from Python (a C function that loops in C, a ``map``
    or a regex call, is one call however much it does), and characters given to the regex engine
    and the base64 decoder."""

    calls: int = 0
    regex_chars: int = 0
    decoded_chars: int = 0
    tokens: int = 0  # secrets found (some near misses are real secrets too: ``sk-ant-aa-`` + 19 is an OpenAI key)
    by_name: dict[str, int] = field(default_factory=dict)


_REGEX_CALLS = {"search", "match", "finditer", "findall", "fullmatch", "sub", "split"}


@contextmanager
def _counting() -> Iterator[Work]:
    work = Work()
    previous = sys.getprofile()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if frame.f_code in _OWN_CODE:  # the counters' own wrappers (a decode counted is not a decode more)
            return
        if event == "call":
            work.calls += 1
        elif event == "c_call":
            work.calls += 1
            name = getattr(arg, "__name__", "?")
            work.by_name[name] = work.by_name.get(name, 0) + 1

    sys.setprofile(profile)
    try:
        yield work
    finally:
        sys.setprofile(previous)


def _regex_span(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Characters a regex method call may read: its string, from ``pos`` to ``endpos``."""
    subject = args[0] if args else kwargs.get("string", "")
    n = len(subject)
    pos = args[1] if len(args) > 1 else kwargs.get("pos", 0)
    end = args[2] if len(args) > 2 else kwargs.get("endpos", n)
    return max(0, min(end, n) - max(pos, 0))


_OWN_CODE: set[Any] = set()


class _CountingPattern:
    """A compiled pattern that adds the span of each call to the running scan's work."""

    def __init__(self, pattern: Any, work: list[Work]) -> None:
        self._pattern = pattern
        self._work = work

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pattern, name)
        if name not in _REGEX_CALLS or not self._work:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._work[-1].regex_chars += _regex_span(args, kwargs)
            return attr(*args, **kwargs)

        _OWN_CODE.add(counted.__code__)
        return counted


_OWN_CODE.add(_CountingPattern.__getattr__.__code__)


def _work(monkeypatch: pytest.MonkeyPatch, text: str) -> Work:
    active: list[Work] = []
    detectors = tuple(
        redaction.Detector(
            d.kind,
            _CountingPattern(d.pattern, active),  # type: ignore[arg-type]
            d.group,
            d.valid,
            d.hints,
            _CountingPattern(d.gate, active) if d.gate is not None else None,  # type: ignore[arg-type]
            d.reach,
            d.lower,
            d.extent,
            d.cut,
            d.valid_all,
        )
        for d in redaction.DETECTORS
    )
    decode = binascii.a2b_base64

    def counted_decode(data: Any, *args: Any, **kwargs: Any) -> bytes:
        if active:
            active[-1].decoded_chars += len(data)
        return decode(data, *args, **kwargs)

    _OWN_CODE.add(counted_decode.__code__)
    monkeypatch.setattr(binascii, "a2b_base64", counted_decode)
    redactor = Redactor(KEY, redaction.RedactionPolicy(detectors=detectors))
    with _counting() as work:
        active.append(work)
        out = redactor._scan(text)
    active.clear()
    work.tokens = out.count("«redacted:")
    return work


# Twice the input, at most this much more work (a little less than 2x is linear: per-scan constants);
# a quadratic scan does about 4x (a scan that redoes its window or its text for each candidate).
LINEAR_GROWTH = 2.3


def _faster_than_linear(half: Work, whole: Work) -> list[str]:
    """Each measure of ``whole`` (twice ``half``'s input) that grew more than linear work does, with
    its growth: empty for a linear scan."""
    slack = {"calls": 50, "regex_chars": 4096, "decoded_chars": 4096}
    return [
        f"{measure} grew {getattr(whole, measure) / max(1, getattr(half, measure)):.2f}x "
        f"({getattr(half, measure)} -> {getattr(whole, measure)})"
        for measure, extra in slack.items()
        if getattr(whole, measure) > LINEAR_GROWTH * getattr(half, measure) + extra
    ]


@pytest.mark.parametrize("name", list(INPUTS))
def test_adversarial_input_costs_twice_the_work_for_twice_the_input(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    build = INPUTS[name]
    half, whole = _work(monkeypatch, build(512 * KIB)), _work(monkeypatch, build(1024 * KIB))
    # Linear: twice the input, twice the work, never 4x.
    assert _faster_than_linear(half, whole) == [], name
    # The regex engine is handed each character a few times (once per detector whose hint or gate is
    # there, the windows' overlaps, the wrappers' probes), not once per candidate.
    assert whole.regex_chars <= 40 * 1024 * KIB, (name, whole.regex_chars)
    # Near misses cost no Python call each: at 1 MiB, tens of thousands of candidates, a few
    # thousand calls (per window, per detector, per wrapper and its probe), and a few per secret found.
    top = sorted(whole.by_name.items(), key=lambda kv: -kv[1])[:5]
    assert whole.calls <= 6000 + 8 * whole.tokens, (name, whole.calls, whole.tokens, top)


@pytest.mark.parametrize("name", list(DENSE_INPUTS))
def test_dense_input_costs_twice_the_work_for_twice_the_input(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    build = DENSE_INPUTS[name]
    # Smaller than the near misses (a token each ~20 characters is most of the time): one window.
    half, whole = _work(monkeypatch, build(64 * KIB)), _work(monkeypatch, build(128 * KIB))
    assert _faster_than_linear(half, whole) == [], name
    assert whole.tokens >= 1.9 * half.tokens > 100, (name, half.tokens, whole.tokens)


def test_the_work_counter_tells_a_quadratic_scan_from_a_linear_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counter is not blind: the same input, scanned by the redactor as it is and by one that
    reads the text again from its start at every window, passes and fails the growth check."""
    build = INPUTS["anthropic_key: `sk-ant-aa-` + 19 chars"]  # every window of it is scanned
    monkeypatch.setattr(_scan, "WINDOW_CHARS", 16 * KIB)  # 32 windows in 512 KiB, so the rescans weigh
    half, whole = _work(monkeypatch, build(512 * KIB)), _work(monkeypatch, build(1024 * KIB))
    assert _faster_than_linear(half, whole) == []
    assert 1.8 <= whole.regex_chars / half.regex_chars <= LINEAR_GROWTH, (half.regex_chars, whole.regex_chars)
    window_spans = _scan._window_spans

    def rescanning(det: Any, text: str, subject: str, pos: int, window_end: int, limit: int) -> Any:
        det.pattern.findall(subject, 0, pos)  # the text read again up to this window: quadratic
        return window_spans(det, text, subject, pos, window_end, limit)

    monkeypatch.setattr(_scan, "_window_spans", rescanning)
    slow_half, slow_whole = _work(monkeypatch, build(512 * KIB)), _work(monkeypatch, build(1024 * KIB))
    # (2.00x as it is, 3.70x rescanning: 3.5 -> 7.0 and 19.8 -> 73.1 million characters read)
    assert slow_whole.regex_chars / slow_half.regex_chars > 3, (slow_half.regex_chars, slow_whole.regex_chars)
    assert [f.split()[0] for f in _faster_than_linear(slow_half, slow_whole)] == ["regex_chars"]
    assert _regex_span(("x" * 10, 3, 8), {}) == 5 and _regex_span(("x" * 10,), {"pos": 4}) == 6
