"""Digests of content: how a run digests the arguments of its steps and, under ``capture="hash-only"``, its content.

A step records a digest of its arguments (``args_digest`` of a model request, a tool's or an effect's
arguments, a child's input; the ``digest`` of an approval's action and arguments), which resume,
re-runs and the projections compare; the content itself is sealed under the run's data key.
Erasure destroys that key, but the digests stay in the log (the hash chain covers them). Two
schemes; a run records its own in ``run.started`` (``digest_scheme``; absent means 1) and every
digest of the run uses it (docs/wire.md, "Digests of content"):

- **1, plain**: sha256 hex of the canonical JSON (in the run's chain format). Runs recorded before
  keyed digests existed, and runs without keys (``capture="full"`` and unsealed: their content is in
  the clear, and erasure cannot reach it anyway).
- **2, keyed**: HMAC-SHA256 hex of the same bytes under the run's *digest key*, derived from its data
  key (``runledger.protect.keystore.RunKeys.digest_key``), so erasure destroys it too. A plain
  digest of a low-entropy value (a card number, an amount, yes or no) confirms a guess for anyone
  who tries every candidate (a million sha256s take about a second); a keyed one, once the key is
  gone, confirms nothing.

Comparisons stay within one scheme and one key: a run compares its calls with its own record
(resume); a branch compares with its parent's record, and with the claim that committed a key,
under *their* scheme and key (``runledger.sandbox.branch``); the in-process replayer, which holds no
key, digests the recording's opened content again (``runledger.testing.replayer``).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Any

from runledger.errors import KeyStoreError
from runledger.record.canonical import LEGACY_CHAIN_FORMAT, canonical_json

PLAIN_DIGESTS = 1
KEYED_DIGESTS = 2
DIGEST_SCHEMES: dict[int, str] = {
    PLAIN_DIGESTS: "sha256 of the canonical JSON",
    KEYED_DIGESTS: "HMAC-SHA256 under the run's digest key",
}


def recorded_digest_scheme(scheme: int) -> int | None:
    """What ``run.started`` records for ``scheme``: nothing for plain digests (a run without keys
    records exactly what it recorded before keyed digests existed), else the number."""
    return None if scheme == PLAIN_DIGESTS else scheme


@dataclass(frozen=True)
class Digester:
    """The digests of one run: canonical JSON in ``chain_format``, then sha256 (``scheme`` 1) or
    HMAC-SHA256 under ``key`` (``scheme`` 2). A keyed digester without its key (a run whose keys were
    destroyed, or cannot be read here) raises KeyStoreError when asked for a digest."""

    chain_format: int = LEGACY_CHAIN_FORMAT
    scheme: int = PLAIN_DIGESTS
    key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.scheme not in DIGEST_SCHEMES:
            known = ", ".join(map(str, DIGEST_SCHEMES))
            raise ValueError(f"unknown digest scheme {self.scheme!r} (known: {known})")

    @property
    def keyed(self) -> bool:
        return self.scheme == KEYED_DIGESTS

    def of_bytes(self, raw: bytes) -> str:
        """The digest of bytes already canonical (what ``encoded`` digests)."""
        if self.scheme == PLAIN_DIGESTS:
            return hashlib.sha256(raw).hexdigest()
        if self.key is None:
            raise KeyStoreError(
                "this run's digests are keyed (digest scheme 2) under its digest key, which is not available "
                "here: the run was erased, or this process cannot read its keys (a master key and read access "
                "to LEDGER_KEYS are needed)"
            )
        # A new HMAC each time: 4.4 us for 1 KB here, against 6.7 for copying a prepared one and 13 for
        # hmac.digest (sha256 alone: 0.9 us; a recorded step: ~700 us).
        return hmac.new(self.key, raw, hashlib.sha256).hexdigest()

    def encoded(self, value: Any) -> tuple[bytes, str]:
        """The canonical JSON of ``value`` and its digest, encoding it once (a step seals the same bytes)."""
        raw = canonical_json(value, self.chain_format)
        return raw, self.of_bytes(raw)

    def digest(self, value: Any) -> str:
        return self.encoded(value)[1]
