"""The version tuple: what made a run behave as it did, recorded in its ``run.started``.

A module of its own, importing nothing but pydantic, so that building an ``AgentSpec``
(``runledger.sdk.agent``, whose ``version()`` returns one) does not build every event model
of ``runledger.record.events``: an agent module, and the sandbox guest that imports one in
every container it starts, needs this model and none of those. ``runledger.record.events``
re-exports it, and embeds it in ``RunStarted``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

# Recorded, never compared: which code ran (runledger.sdk.code_identity), beside the identity.
RECORDED_ONLY = ("code_hash",)


class VersionTuple(BaseModel):
    """What made the run behave as it did; resume refuses a different one.

    ``agent_version`` is the code's identity: the version the operator declared
    (``AgentSpec(agent_version=...)``: a package version, a git describe), else the code hash.
    ``code_hash`` is the hash of the code's import closure (``runledger.sdk.code_identity``),
    recorded beside it whether a version was declared or not, and never compared: a run whose
    agent declared a version is the code that declares that version, whatever its hash. Absent
    from runs recorded before it existed (their ``agent_version``, when not declared, is the hash
    of the agent's directory: ``code_identity.legacy_code_hash``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    agent_version: str
    model: str
    prompt_hash: str
    tool_schema_hashes: dict[str, str] = Field(default_factory=dict)
    code_hash: str | None = None

    @model_serializer(mode="wrap")
    def _without_absent_code_hash(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("code_hash", 0) is None:
            del data["code_hash"]  # runs recorded before it existed keep their bytes
        return data

    def identity(self) -> dict[str, Any]:
        """The elements a resume or a re-run compares (all but ``code_hash``)."""
        return identity(self.model_dump())


def identity(version: Mapping[str, Any]) -> dict[str, Any]:
    """The compared elements of a recorded version tuple (a ``run.started``'s ``version``)."""
    return {k: v for k, v in version.items() if k not in RECORDED_ONLY}


def differing(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The compared elements in which ``current`` differs from ``recorded``, in tuple order."""
    a, b = identity(recorded), identity(current)
    return [k for k in VersionTuple.model_fields if k not in RECORDED_ONLY and a.get(k) != b.get(k)]
