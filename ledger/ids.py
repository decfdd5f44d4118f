"""Sortable unique ids (ULID layout: 48-bit milliseconds + 80 random bits, Crockford base32)."""

from __future__ import annotations

import os
import re
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def new_id() -> str:
    """A 26-character id that sorts by creation time (to the millisecond)."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def is_token(text: str) -> bool:
    """True when ``text`` can stand as one NATS subject token (agent names, run ids)."""
    return bool(_TOKEN.match(text))
