"""The GC pause around a resume: nested pauses, idempotent ends, the collector's prior state kept."""

from __future__ import annotations

import gc

from runledger.sdk.lifecycle import _pause_gc


def test_the_collector_comes_back_when_the_last_pause_ends() -> None:
    assert gc.isenabled()
    end_a = _pause_gc()
    end_b = _pause_gc()
    assert not gc.isenabled()
    end_a()
    end_a()  # idempotent: the first run's live step and its finally both end it
    assert not gc.isenabled()
    end_b()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        _pause_gc()()
        assert not gc.isenabled()
    finally:
        gc.enable()
