"""A run's budgets: the limits on its spend, recorded in its ``run.started``.

A module of its own, importing nothing but pydantic, for the reason ``runledger.record.versions``
gives: an ``AgentSpec`` holds one, and an agent module should not have to build every event
model to make it. ``runledger.record.events`` re-exports it, and embeds it in ``RunStarted``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Budgets(BaseModel):
    """Limits on a run's spend; None means unlimited."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    turns: int | None = None
    tokens: int | None = None
    seconds: float | None = None
