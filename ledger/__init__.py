"""runledger's ledger: events on NATS JetStream, the agent SDK, resume and the effect ledger.

Names are imported on first use (PEP 562): ``import ledger.events`` or ``from ledger import
tool`` loads only what it needs. The sandbox guest depends on this: it imports the Run API
and the fold, and must not pay for the NATS client, cryptography or the analytics stack
in every container it starts (docs/sandbox.md, "Start-up cost").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Eager, unlike the rest: ``fold`` is also the name of a submodule, and importing the submodule
# later would bind the module, not the function, as ``ledger.fold``. Cheap (pydantic, no I/O).
from ledger.fold import Checkpoint, fold

if TYPE_CHECKING:
    from ledger.agent import AgentSpec, load_agent
    from ledger.capture import DataPolicy, PayloadUnavailableError
    from ledger.client import LedgerClient, connect
    from ledger.errors import (
        ApprovalDeniedError,
        BudgetExhaustedError,
        EffectFailedError,
        EffectInDoubtError,
        FencedError,
        LedgerError,
        NondeterminismError,
        PublishError,
        SuspendedForApproval,
        ToolFailedError,
        VersionMismatchError,
    )
    from ledger.events import Budgets, Event, VersionTuple
    from ledger.models import ModelResponse, OpenAIChatModel, ScriptedModel
    from ledger.redaction import RedactionPolicy, SecretResolver
    from ledger.run import Run
    from ledger.runner import RunResult, resume_run, start_run
    from ledger.tools import NOT_FOUND, Tool, tool

_MODULE_OF = {
    "NOT_FOUND": "ledger.tools",
    "AgentSpec": "ledger.agent",
    "ApprovalDeniedError": "ledger.errors",
    "BudgetExhaustedError": "ledger.errors",
    "Budgets": "ledger.events",
    "DataPolicy": "ledger.capture",
    "EffectFailedError": "ledger.errors",
    "EffectInDoubtError": "ledger.errors",
    "Event": "ledger.events",
    "FencedError": "ledger.errors",
    "LedgerClient": "ledger.client",
    "LedgerError": "ledger.errors",
    "ModelResponse": "ledger.models",
    "NondeterminismError": "ledger.errors",
    "OpenAIChatModel": "ledger.models",
    "PayloadUnavailableError": "ledger.capture",
    "PublishError": "ledger.errors",
    "RedactionPolicy": "ledger.redaction",
    "Run": "ledger.run",
    "RunResult": "ledger.runner",
    "ScriptedModel": "ledger.models",
    "SecretResolver": "ledger.redaction",
    "SuspendedForApproval": "ledger.errors",
    "Tool": "ledger.tools",
    "ToolFailedError": "ledger.errors",
    "VersionMismatchError": "ledger.errors",
    "VersionTuple": "ledger.events",
    "connect": "ledger.client",
    "load_agent": "ledger.agent",
    "resume_run": "ledger.runner",
    "start_run": "ledger.runner",
    "tool": "ledger.tools",
}

__all__ = [
    "NOT_FOUND",
    "AgentSpec",
    "ApprovalDeniedError",
    "BudgetExhaustedError",
    "Budgets",
    "Checkpoint",
    "DataPolicy",
    "EffectFailedError",
    "EffectInDoubtError",
    "Event",
    "FencedError",
    "LedgerClient",
    "LedgerError",
    "ModelResponse",
    "NondeterminismError",
    "OpenAIChatModel",
    "PayloadUnavailableError",
    "PublishError",
    "RedactionPolicy",
    "Run",
    "RunResult",
    "ScriptedModel",
    "SecretResolver",
    "SuspendedForApproval",
    "Tool",
    "ToolFailedError",
    "VersionMismatchError",
    "VersionTuple",
    "connect",
    "fold",
    "load_agent",
    "resume_run",
    "start_run",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'ledger' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
