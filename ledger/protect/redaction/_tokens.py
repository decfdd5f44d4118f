"""The token that stands for a redacted value: ``«redacted:<kind>:<12 hex>»``.

The hex is an HMAC-SHA256 of the value under the run's token key (``Redactor._token``). A token
contains nothing any detector matches (a test checks it), so redaction is idempotent; tokens already
placed and ``secret://`` references are never looked into again (``PROTECTED``: a reference names a
credential, it is not one, and replays must see it unchanged).
"""

from __future__ import annotations

import re

TOKEN_OPEN, TOKEN_CLOSE = "«", "»"
TOKEN_RE = re.compile(r"«redacted:[a-z0-9_:.-]+:[0-9a-f]{12}»")
# Tokens already placed and secret:// references are never looked into (see Redactor._find).
PROTECTED = re.compile(r"«redacted:[a-z0-9_:.-]{1,128}:[0-9a-f]{12}»|secret://[A-Za-z_][A-Za-z0-9_.-]{0,127}")
SECRET_SCHEME = "secret://"
KIND_JUNK = re.compile(r"[^a-z0-9_:.-]")  # what a token's kind may not hold


def is_token(text: str) -> bool:
    return bool(TOKEN_RE.fullmatch(text))


def contains_token(text: str) -> bool:
    return bool(TOKEN_RE.search(text))


_TOKEN_HEX = re.compile(r"(«redacted:[a-z0-9_:.-]+):[0-9a-f]{12}»")


def without_token_keys(text: str) -> str:
    """``text`` with each token's hex dropped (``«redacted:card_number»``): what two runs' records of one
    value have in common, since each run's tokens are keyed under its own token key (``runledger diff``
    compares a branch's arguments with its parent's so)."""
    return _TOKEN_HEX.sub(r"\1»", text) if TOKEN_OPEN in text else text
