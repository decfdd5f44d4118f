"""Build plain lists of events for unit tests (no server)."""

from __future__ import annotations

from typing import Any

from runledger.record.events import GENESIS, Event, Payload, RunStarted, VersionTuple, make_event

VERSION = VersionTuple(agent_version="code:test", model="scripted-1", prompt_hash="p0", tool_schema_hashes={})


class Chain:
    """Appends events to an in-memory hash chain, as a SubjectWriter would on the server."""

    def __init__(self, run_id: str = "R1", agent: str = "a") -> None:
        self.run_id, self.agent = run_id, agent
        self.events: list[Event] = []
        self.raw: list[bytes] = []

    def add(self, body: Payload, ts: str | None = None) -> Event:
        prev = self.events[-1].hash if self.events else GENESIS
        event, data = make_event(
            body, run_id=self.run_id, agent=self.agent, seq=len(self.events), prev_hash=prev, ts=ts
        )
        self.events.append(event)
        self.raw.append(data)
        return event

    def start(self, ts: str | None = None, **kwargs: Any) -> Event:
        return self.add(RunStarted(agent=self.agent, version=VERSION, **kwargs), ts=ts)
