"""Sortable unique ids (ULID layout: 48-bit milliseconds + 80 random bits, Crockford base32)."""

from __future__ import annotations

import os
import re
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


# Two base32 digits at a time (10 bits): 13 lookups instead of 26 shifts, a third of the cost.
_PAIRS = tuple(a + b for a in _ALPHABET for b in _ALPHABET)
_SHIFTS = tuple(range(120, -1, -10))


# The 80 random bits of each id come from os.urandom, drawn 64 ids at a time (a system call per id
# was a sixth of new_id's cost); a forked child draws afresh, so it never repeats its parent's ids.
_POOL_BYTES = 640
_pool_lock = threading.Lock()
_pool = b""
_pool_at = 0


def _forget_pool() -> None:
    global _pool, _pool_at
    _pool, _pool_at = b"", 0


if hasattr(os, "register_at_fork"):  # where processes fork (not Windows)
    os.register_at_fork(after_in_child=_forget_pool)


def _random80() -> int:
    global _pool, _pool_at
    with _pool_lock:
        at = _pool_at
        if at >= len(_pool):
            _pool, at = os.urandom(_POOL_BYTES), 0
        _pool_at = at + 10
        return int.from_bytes(_pool[at : at + 10], "big")


def new_id() -> str:
    """A 26-character id that sorts by creation time (to the millisecond)."""
    value = (time.time_ns() // 1_000_000) << 80 | _random80()
    pairs = _PAIRS
    return "".join([pairs[value >> shift & 1023] for shift in _SHIFTS])


def is_subject_token(text: str) -> bool:
    """True when ``text`` can stand as one NATS subject token (agent names, run ids)."""
    return bool(_TOKEN.match(text))
