"""Erasing a run's content from an immutable log: destroy its key, delete its blobs, record the fact.

The LEDGER stream denies deletes and purges, so content cannot be removed from it; it can
be made unreadable. Every content field of a run is sealed under the run's data key
(``runledger.protect.capture``), which lives only in the key store (``runledger.protect.keystore``). Erasing:

1. destroys the run's keys (secure deletion of the KV message, then a purge marker, so
   the key cannot be re-created for the run either); content sealed under it, in the run's
   events, in its effect claims and in its blobs, is unreadable through every reader; the
   redaction token key goes with it, so tokens can no longer be matched against guesses;
2. deletes the run's blobs from the object store (they are ciphertext already: belt and braces);
3. records ``run.erased`` on the run's subject (fenced like any operator decision), so
   readers know why the content is gone. Structure (types, steps, names, token usage,
   statuses, digests) stays readable and queryable; the hash chain, computed over the
   ciphertext, still verifies.

Idempotent: erasing again finishes a half-done erasure and records the event if missing.

What erasure cannot reach, and says so: content recorded unsealed (``DataPolicy(encrypt=
False)``) stays in the stream until the retention window (stream max age) removes it; the
result counts those events. Projections and Parquet exports hold sealed content as stored
(or whatever they derived): re-project after an erasure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runledger.errors import ConfigurationError
from runledger.log.append import append_to_run
from runledger.log.client import LedgerClient
from runledger.protect.blobs import BlobStore, is_blob_ref
from runledger.protect.capture import content_values, is_marker, is_sealed, is_sealed_text
from runledger.protect.keystore import KVKeyStore, run_kid
from runledger.protect.runs import load_run
from runledger.record.events import RunErased
from runledger.record.fold import fold


@dataclass
class ErasureResult:
    run_id: str
    kid: str
    keys_destroyed: bool
    blobs_deleted: int
    plaintext_events: int
    recorded: bool  # False when an earlier erasure had already recorded run.erased


def _plain(value: Any) -> bool:
    """Content recorded readable without a key (neither sealed nor only a hash)."""
    if is_sealed(value) or is_sealed_text(value):
        return False
    if is_blob_ref(value):
        return not value.get("enc")
    return not is_marker(value) and value not in ("", None, [], {})


async def erase_run(client: LedgerClient, run_id: str, *, reason: str, by: str) -> ErasureResult:
    """Erase the content of ``run_id`` (see the module docstring). Raises RunNotFoundError."""
    if not reason.strip():
        raise ConfigurationError("say why the run is erased: --reason TEXT (it is recorded)")
    if not by.strip():
        raise ConfigurationError("say who erases the run: --by NAME")
    log = await load_run(client, run_id, open_content=False)
    cp = fold(log.records, check_chain=False)
    kid = run_kid(log.agent, run_id)
    shas: set[str] = set()
    plaintext = 0
    for rec in log.records:
        values = content_values(rec.event)
        shas.update(v["sha256"] for v in values if is_blob_ref(v))
        plaintext += any(_plain(v) for v in values)
    destroyed = await KVKeyStore(client.js).destroy(kid)
    blobs = BlobStore(client)
    deleted = 0
    for sha in sorted(shas):
        deleted += await blobs.delete(sha)
    recorded = False
    if cp.erased is None:
        body = RunErased(
            reason=reason,
            by=by,
            kid=kid,
            keys_destroyed=destroyed,
            blobs_deleted=deleted,
            plaintext_events=plaintext,
        )
        await append_to_run(client, run_id, body, log=log)
        recorded = True
    return ErasureResult(run_id, kid, destroyed, deleted, plaintext, recorded)
