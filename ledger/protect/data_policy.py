"""A run's content policy (``DataPolicy``): what the record keeps of content, and how.

What each field means, and what the SDK does with it, is ``runledger.protect.capture``'s to say
(capture modes, sealing, blobs by reference); this module only holds the policy, so that an
``AgentSpec`` can carry one without loading the protection stack. An agent module builds its
spec at import, and the sandbox guest imports an agent module in every container it starts:
importing ``capture`` there (the key store, blobs, the redaction detectors, the event models)
was most of the guest's start-up CPU, for a policy the guest never applies (the host records
a re-run's steps). ``runledger.protect.capture`` re-exports all of it.

The default ``redaction`` (``RedactionPolicy()``, runledger.protect.redaction) is made when it is
first read, for the same reason: a ``DataPolicy()`` made at import compares, hashes, prints and
reads exactly as one whose ``RedactionPolicy()`` was made at construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

if TYPE_CHECKING:
    from runledger.protect.redaction import RedactionPolicy

Capture = Literal["full", "redacted", "hash-only"]
DEFAULT_BLOB_THRESHOLD = 64 * 1024


class _Redaction:
    """The ``redaction`` field of ``DataPolicy``: the policy given, or ``RedactionPolicy()`` made
    at the first read of a policy given none (and kept: every read returns the same object).

    A data descriptor, so the frozen dataclass's ``__init__`` passes what it was given through
    ``__set__``; the class-level default (``__get__`` without an instance) is the descriptor itself,
    which stands for "none given"."""

    _slot = "_redaction"

    def __repr__(self) -> str:  # how the default reads in DataPolicy's signature
        return "RedactionPolicy()"

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> _Redaction: ...
    @overload
    def __get__(self, obj: object, owner: type[Any] | None = None) -> RedactionPolicy: ...
    def __get__(self, obj: object | None, owner: type[Any] | None = None) -> RedactionPolicy | _Redaction:
        if obj is None:
            return self
        policy: RedactionPolicy | None = obj.__dict__[self._slot]
        if policy is None:
            from runledger.protect.redaction import RedactionPolicy

            policy = obj.__dict__[self._slot] = RedactionPolicy()
        return policy

    def __set__(self, obj: object, value: RedactionPolicy | _Redaction) -> None:
        # Reached only from __init__: the dataclass is frozen, so any later assignment raises
        # FrozenInstanceError before it gets here.
        obj.__dict__[self._slot] = None if isinstance(value, _Redaction) else value


@dataclass(frozen=True)
class DataPolicy:
    """A run's content policy: capture mode, redaction, sealing, and the by-reference threshold."""

    capture: Capture = "redacted"
    redaction: _Redaction = _Redaction()
    encrypt: bool = True
    blob_threshold: int = DEFAULT_BLOB_THRESHOLD
