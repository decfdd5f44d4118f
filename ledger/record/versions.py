"""The version tuple: what made a run behave as it did, recorded in its ``run.started``.

A module of its own, importing nothing but pydantic, so that building an ``AgentSpec``
(``runledger.sdk.agent``, whose ``version()`` returns one) does not build every event model
of ``runledger.record.events``: an agent module, and the sandbox guest that imports one in
every container it starts, needs this model and none of those. ``runledger.record.events``
re-exports it, and embeds it in ``RunStarted``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class VersionTuple(BaseModel):
    """What made the run behave as it did; resume refuses a different one."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    agent_version: str
    model: str
    prompt_hash: str
    tool_schema_hashes: dict[str, str] = Field(default_factory=dict)
