"""The ledger's side of ``EffectContext.check(ledger=True)``: the stream sequence of a key's last message.

An effect function that checks its claim with the ledger asks one thing: does the key's subject
(every writer's, ``ledger.effect.<agent>.<digest>.*``) still end at this attempt's claim? One
direct get of the last message on that wildcard answers it (about 0.4 ms on a quiet single node:
one request-reply, no consumer, nothing decoded); the caller compares its sequence with the
claim's fencing token (runledger.sdk.context).

Rejected: folding the key (``read_key``: a consumer and a decode per message, for one number);
watching the key with a subscription from the claim on (a consumer per effect in flight, for a
question asked once); one get per writer's subject (three requests where the wildcard needs one).

A direct get may be answered by a replica that has not stored the claim yet: it is asked again,
briefly, until an answer holds the claim; one that never does is a read error, not a verdict.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import nats.errors

from runledger.errors import LedgerReadError
from runledger.log.client import LedgerClient
from runledger.log.publish import last_subject_seq
from runledger.log.subjects import effect_filter

# How often, and how far apart, a replica that lags behind the claim is asked again (about 1 s in all).
_READS = 20
_READ_WAIT_S = 0.05


@dataclass(frozen=True)
class KeyProbe:
    """Reads ``agent``'s key ``key`` for the effect function of one attempt, on the run's ``loop``."""

    client: LedgerClient
    agent: str
    key: str
    loop: asyncio.AbstractEventLoop

    async def last_sequence(self, at_least: int) -> int:
        """The stream sequence of the key's last message, once a read shows ``at_least`` (the
        claim) or later. LedgerReadError when the ledger does not answer, or never shows it."""
        subject = effect_filter(self.agent, self.key)
        last = 0
        try:
            for _ in range(_READS):
                last = await last_subject_seq(self.client.js, subject)
                if last >= at_least:
                    return last
                await asyncio.sleep(_READ_WAIT_S)
        except (TimeoutError, nats.errors.Error) as exc:
            raise LedgerReadError(
                f"effect {self.key!r}: the ledger did not say whether this attempt still holds the key "
                f"({type(exc).__name__}); do not act on an unconfirmed claim: raise, and resume the run later"
            ) from exc
        raise LedgerReadError(
            f"effect {self.key!r}: the key's last message is at stream sequence {last}, before this attempt's "
            f"claim at {at_least} (a replica behind, or the key's messages gone); do not act on an unconfirmed claim"
        )
