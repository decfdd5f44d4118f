"""Fencing tokens at the service: keep the highest token per key, refuse a call with an older one.

A holder paused after it checked its claim (``EffectContext.check``) can still make its call once a
resume has taken the key over: the ledger fences its writes, not its HTTP request. Only the service
can close that window. Every attempt at an effect sends the key and its fencing token (the stream
sequence of its claim on the key's subject: a later attempt claims later, so its token is larger)::

    requests.post(url, json=body, headers=ctx.fencing_headers())
    # Idempotency-Key: refund:order-8891
    # Fencing-Token: 42

and the service admits a call only with a token at least the highest it has seen for that key::

    tokens = FencingTokens("fencing.db")            # or FencingTokens() in memory

    def handle(request):
        key, token = read_fencing_headers(request.headers)
        try:
            with tokens.admit(key, token):          # refuses an older token; holds the key meanwhile
                return apply_the_refund(request)
        except StaleFencingTokenError as exc:
            return 409, str(exc)                    # nothing done: a newer attempt holds the key

An equal token is the same attempt calling again (the idempotency key answers it); an older one is
refused for good. Tokens compare only within one key. docs/wire.md ("The key in the world") gives
the rule for a service in any language.

``FencingTokens`` is thread-safe: calls for one key take turns (``admit`` holds the key, within this
process, until its block ends, so a newer attempt waits for an older one's effect instead of racing
it), calls for other keys do not wait. With a ``path`` the tokens are kept in SQLite (the file
created mode 0600): a restart remembers them, and the check and record of ``admit`` is one
transaction, atomic across processes sharing the file too. Keep them as long as the idempotency keys.

Rejected: a token checked without holding the key (a newer attempt admitted while the older one's
effect is still being applied would act too); a lock for every key (memory grows with keys: the key
is hashed onto one of a fixed number of locks).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from runledger.errors import ConfigurationError, StaleFencingTokenError
from runledger.sdk.context import FENCING_TOKEN_HEADER, IDEMPOTENCY_KEY_HEADER

_STRIPES = 64


def read_fencing_headers(headers: Mapping[str, str]) -> tuple[str, int] | None:
    """(key, token) of a call's ``Idempotency-Key`` and ``Fencing-Token`` headers (names compared
    without case); None when it sent no token. Raises ConfigurationError on a malformed one (a token
    without a key, a token that is not a non-negative integer)."""
    found = {name.lower(): value for name, value in headers.items()}
    token = found.get(FENCING_TOKEN_HEADER.lower())
    if token is None:
        return None
    key = found.get(IDEMPOTENCY_KEY_HEADER.lower())
    if not key or not token.strip().isdigit():
        raise ConfigurationError(
            f"a call's {FENCING_TOKEN_HEADER} must be a non-negative integer sent with its {IDEMPOTENCY_KEY_HEADER} "
            f"(got {FENCING_TOKEN_HEADER}: {token!r}, {IDEMPOTENCY_KEY_HEADER}: {key!r}): send both, as "
            "EffectContext.fencing_headers() gives them"
        )
    return key, int(token)


class FencingTokens:
    """The highest fencing token admitted per key (see the module's docstring); in memory, or in
    SQLite at ``path``."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._store = threading.Lock()  # the dict or the connection, one caller at a time
        self._tokens: dict[str, int] = {}
        self._db: sqlite3.Connection | None = None
        if path is not None:
            path = Path(path)
            if not path.exists():
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))  # SQLite's journals take its mode
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
            self._db.execute("CREATE TABLE IF NOT EXISTS fencing_tokens (key TEXT PRIMARY KEY, token INTEGER NOT NULL)")

    def highest(self, key: str) -> int | None:
        """The highest token admitted for ``key``; None when none was."""
        with self._store:
            return self._read(key)

    @contextlib.contextmanager
    def admit(self, key: str, token: int) -> Iterator[None]:
        """Admit a call of ``key`` with ``token`` and hold the key until the block ends: raises
        StaleFencingTokenError (and records nothing) when a higher token was admitted for the key;
        else records ``token`` as the key's highest and runs the block."""
        if not key or isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ConfigurationError(f"a fencing token is a non-negative integer for a key, not {token!r} for {key!r}")
        with self._stripes[zlib.crc32(key.encode()) % _STRIPES]:
            with self._store:
                self._check_and_record(key, token)
            yield

    def close(self) -> None:
        if self._db is not None:
            with self._store:
                self._db.close()
                self._db = None

    def _read(self, key: str) -> int | None:
        if self._db is None:
            return self._tokens.get(key)
        row = self._db.execute("SELECT token FROM fencing_tokens WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def _check_and_record(self, key: str, token: int) -> None:
        if self._db is None:
            highest = self._tokens.get(key)
            if highest is not None and token < highest:
                raise StaleFencingTokenError(key, token, highest)
            self._tokens[key] = token
            return
        # One transaction taking the write lock first: another process sharing the file reads after us.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            highest = self._read(key)
            if highest is not None and token < highest:
                raise StaleFencingTokenError(key, token, highest)
            self._db.execute(
                "INSERT INTO fencing_tokens (key, token) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET token = max(token, excluded.token)",
                (key, token),
            )
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
