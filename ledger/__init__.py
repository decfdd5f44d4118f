"""runledger's ledger: events on NATS JetStream, the agent SDK, resume and the effect ledger."""

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
from ledger.fold import Checkpoint, fold
from ledger.models import ModelResponse, OpenAIChatModel, ScriptedModel
from ledger.redaction import RedactionPolicy, SecretResolver
from ledger.run import Run
from ledger.runner import RunResult, resume_run, start_run
from ledger.tools import NOT_FOUND, Tool, tool

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
