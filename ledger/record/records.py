"""Records: events and raw bytes together with where the stream stored them."""

from __future__ import annotations

from dataclasses import dataclass

from runledger.record.events import Event


@dataclass(frozen=True)
class RawRecord:
    stream_seq: int
    subject: str
    data: bytes
    headers: dict[str, str] | None = None


@dataclass(frozen=True)
class Recorded:
    """A decoded event with where the stream stored it."""

    event: Event
    stream_seq: int = 0
    subject: str = ""


@dataclass(frozen=True)
class Quarantined:
    """Bytes on a ledger subject that are not a valid event, and why."""

    stream_seq: int
    subject: str
    raw: bytes
    reason: str
