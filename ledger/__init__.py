"""runledger: a flight recorder and re-drive bench for AI-agent runs.

The public surface is this module's ``__all__``; everything else is an implementation
detail that may move. The package is cut by concern into layers, and each layer imports only
the layers the table in docs/architecture.md ("Packages and layers") lets it
(``tests/unit/test_layers.py`` enforces that table and checks the drawing below against it)::

    runledger
    ├── errors, extras   the error tree of the core, the optional parts and what each needs
    ├── record           the record format, pure: events, canonical JSON, ids, the fold
    ├── log              the log on NATS JetStream: client, embedded server and cluster,
    │                    streams and buckets, fenced publishing, readers, subject names,
    │                    private (0600/0700) files
    ├── protect          data protection: redaction, content capture and sealing, run keys,
    │                    blobs by reference, erasure, roles and their permissions
    ├── sdk              the agent SDK: the Run API, start and resume, agents, tools,
    │                    model adapters, effects, the sync facade
    ├── ops              what operators read and decide: traces, verification, approvals, grants
    ├── cli              the ``runledger`` program (also ``python -m runledger``) and the core's sub-commands
    ├── testing          recorded runs replayed in-process for unit tests: recordings (``export jsonl``),
    │                    the replayer, the pytest plugin (not a sandbox: trusted recordings only)
    ├── projections      [projections] DuckDB read models of the log, SQL for analysts (projections/)
    ├── integrations     [langgraph] [agent-framework] [openai] [pydantic-ai] [otel] frameworks as runs; runs as traces
    │                    (integrations/)
    ├── sandbox          [sandbox] re-runs in Docker sandboxes, workers, diffs of branches (sandbox/)
    ├── ui               [ui] the page: runs, timelines, the matrix, operator actions (ui/)
    └── examples         the example agents and the ``runledger demo`` command (examples/)

    errors ◀── record ◀── log ◀── protect ◀── sdk ◀── ops ◀── cli
    projections ──▶ core
    integrations ──▶ core
    testing ──▶ core
    sandbox ──▶ core, projections
    ui ──▶ core, projections, sandbox
    examples ──▶ anything

The first seven layers are the core, each on the ones before it (``errors`` holds ``extras`` and ``cpu`` too);
``testing`` lives in the core's folder (``ledger/testing``) but sits beside ``projections`` and
``integrations``, which import nothing of each other.

Names are imported on first use (PEP 562): ``from runledger import tool`` loads only what it
needs. The sandbox guest depends on this: it imports the Run API and the fold, and must not
pay for the NATS client, cryptography or the analytics stack in every container it starts
(docs/sandbox.md, "Start-up cost").

Each package has one error tree, in its ``errors`` module, and every error class ends in ``Error``;
``SuspendedForApproval`` is the documented alias of ``SuspendedForApprovalError``, the name it had
before, kept because it is public. The library logs to the ``runledger``
loggers (``logging.getLogger(__name__)``) and never writes to the terminal; programs do (the CLI,
the sandbox guest, the example's payments service).
"""

from __future__ import annotations

import importlib
import logging
import os
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runledger.errors import (
        ApprovalDeniedError,
        BudgetExhaustedError,
        ChildFailedError,
        ChildSuspendedError,
        ClaimTakenOverError,
        ConfigurationError,
        EffectFailedError,
        EffectInDoubtError,
        EffectResultErasedError,
        FencedError,
        LeaseExpiredError,
        LedgerError,
        MissingExtraError,
        ModelError,
        NondeterminismError,
        PayloadUnavailableError,
        PublishError,
        RunNotFoundError,
        StaleClaimError,
        StaleFencingTokenError,
        SuspendedForApproval,
        SuspendedForApprovalError,
        ToolFailedError,
        VersionMismatchError,
    )
    from runledger.extras import require_extra
    from runledger.log.client import LedgerClient, connect
    from runledger.log.reader import RunLog, follow_events
    from runledger.log.server import runledger_home
    from runledger.ops.trace import list_runs
    from runledger.protect.capture import is_placeholder
    from runledger.protect.data_policy import DataPolicy
    from runledger.protect.erasure import erase_run
    from runledger.protect.loading import load_run
    from runledger.protect.redaction import RedactionPolicy, SecretResolver
    from runledger.record.budgets import Budgets
    from runledger.record.events import (
        Event,
        GraphCheckpointed,
        GraphWritesSaved,
        RunCompleted,
        WorkflowCheckpointDeleted,
        WorkflowCheckpointed,
    )
    from runledger.record.fold import Checkpoint, StepRecord, fold
    from runledger.record.ids import is_subject_token
    from runledger.record.payloads import Server
    from runledger.record.versions import VersionTuple
    from runledger.sdk.agent import AgentSpec, load_agent
    from runledger.sdk.context import EffectContext, current_run_id
    from runledger.sdk.deferred_tools import DeferredTools
    from runledger.sdk.fencing import FencingTokens
    from runledger.sdk.lifecycle import RunResult, open_run, resume_run, start_run
    from runledger.sdk.models import (
        DEFAULT_RETRY,
        RETRYABLE_STATUS,
        ModelAdapter,
        ModelResponse,
        OpenAIChatModel,
        ScriptedModel,
        server_of,
    )
    from runledger.sdk.protocol import Run
    from runledger.sdk.retry import Retry
    from runledger.sdk.run import RecordedRun
    from runledger.sdk.sync import SyncRun, resume_sync, run_sync, sync_agent
    from runledger.sdk.tools import NOT_FOUND, EffectClass, Tool, tool

_MODULE_OF: dict[str, str] = {
    **dict.fromkeys(
        [
            "ApprovalDeniedError",
            "BudgetExhaustedError",
            "ChildFailedError",
            "ChildSuspendedError",
            "ClaimTakenOverError",
            "ConfigurationError",
            "EffectFailedError",
            "EffectInDoubtError",
            "EffectResultErasedError",
            "FencedError",
            "LeaseExpiredError",
            "LedgerError",
            "MissingExtraError",
            "NondeterminismError",
            "PayloadUnavailableError",
            "PublishError",
            "StaleClaimError",
            "StaleFencingTokenError",
            "SuspendedForApproval",
            "SuspendedForApprovalError",
            "ToolFailedError",
            "VersionMismatchError",
        ],
        "runledger.errors",
    ),
    **dict.fromkeys(["LedgerClient", "connect"], "runledger.log.client"),
    **dict.fromkeys(["DataPolicy"], "runledger.protect.data_policy"),
    **dict.fromkeys(["RedactionPolicy", "SecretResolver"], "runledger.protect.redaction"),
    **dict.fromkeys(["Budgets"], "runledger.record.budgets"),
    **dict.fromkeys(["Event"], "runledger.record.events"),
    **dict.fromkeys(["VersionTuple"], "runledger.record.versions"),
    **dict.fromkeys(["Checkpoint", "fold"], "runledger.record.fold"),
    **dict.fromkeys(["AgentSpec", "load_agent"], "runledger.sdk.agent"),
    **dict.fromkeys(["RunResult", "resume_run", "start_run"], "runledger.sdk.lifecycle"),
    **dict.fromkeys(
        ["ModelAdapter", "ModelResponse", "OpenAIChatModel", "ScriptedModel", "server_of"], "runledger.sdk.models"
    ),
    **dict.fromkeys(["Run"], "runledger.sdk.protocol"),
    **dict.fromkeys(["EffectContext", "current_run_id"], "runledger.sdk.context"),
    **dict.fromkeys(["runledger_home"], "runledger.log.server"),
    **dict.fromkeys(["FencingTokens"], "runledger.sdk.fencing"),
    **dict.fromkeys(["Retry"], "runledger.sdk.retry"),
    **dict.fromkeys(["SyncRun", "resume_sync", "run_sync", "sync_agent"], "runledger.sdk.sync"),
    **dict.fromkeys(["NOT_FOUND", "Tool", "tool"], "runledger.sdk.tools"),
    **dict.fromkeys(["DeferredTools"], "runledger.sdk.deferred_tools"),
    **dict.fromkeys(["ModelError", "RunNotFoundError"], "runledger.errors"),
    **dict.fromkeys(["require_extra"], "runledger.extras"),
    **dict.fromkeys(["list_runs"], "runledger.ops.trace"),
    **dict.fromkeys(["erase_run"], "runledger.protect.erasure"),
    **dict.fromkeys(["load_run"], "runledger.protect.loading"),
    **dict.fromkeys(
        [
            "GraphCheckpointed",
            "GraphCheckpointsDeleted",
            "GraphWritesSaved",
            "RunCompleted",
            "RunFailed",
            "RunSuspended",
            "WorkflowCheckpointDeleted",
            "WorkflowCheckpointed",
        ],
        "runledger.record.events",
    ),
    **dict.fromkeys(["error_info"], "runledger.sdk.errorinfo"),
    **dict.fromkeys(["is_subject_token"], "runledger.record.ids"),
    **dict.fromkeys(["open_run"], "runledger.sdk.lifecycle"),
    **dict.fromkeys(["RecordedRun"], "runledger.sdk.run"),
    **dict.fromkeys(["DEFAULT_RETRY", "RETRYABLE_STATUS"], "runledger.sdk.models"),
    **dict.fromkeys(["EffectClass"], "runledger.sdk.tools"),
    **dict.fromkeys(["RunLog", "follow_events"], "runledger.log.reader"),
    **dict.fromkeys(["StepRecord"], "runledger.record.fold"),
    **dict.fromkeys(["Server"], "runledger.record.payloads"),
    **dict.fromkeys(["is_placeholder"], "runledger.protect.capture"),
    **dict.fromkeys(["ledger_address"], "runledger.cli.connect"),
}

__all__ = [
    "DEFAULT_RETRY",
    "NOT_FOUND",
    "RETRYABLE_STATUS",
    "AgentSpec",
    "ApprovalDeniedError",
    "BudgetExhaustedError",
    "Budgets",
    "Checkpoint",
    "ChildFailedError",
    "ChildSuspendedError",
    "ClaimTakenOverError",
    "ConfigurationError",
    "DataPolicy",
    "DeferredTools",
    "EffectClass",
    "EffectContext",
    "EffectFailedError",
    "EffectInDoubtError",
    "EffectResultErasedError",
    "Event",
    "FencedError",
    "FencingTokens",
    "GraphCheckpointed",
    "GraphCheckpointsDeleted",
    "GraphWritesSaved",
    "LeaseExpiredError",
    "LedgerClient",
    "LedgerError",
    "MissingExtraError",
    "ModelAdapter",
    "ModelError",
    "ModelResponse",
    "NondeterminismError",
    "OpenAIChatModel",
    "PayloadUnavailableError",
    "PublishError",
    "RecordedRun",
    "RedactionPolicy",
    "Retry",
    "Run",
    "RunCompleted",
    "RunFailed",
    "RunLog",
    "RunNotFoundError",
    "RunResult",
    "RunSuspended",
    "ScriptedModel",
    "SecretResolver",
    "Server",
    "StaleClaimError",
    "StaleFencingTokenError",
    "StepRecord",
    "SuspendedForApproval",
    "SuspendedForApprovalError",
    "SyncRun",
    "Tool",
    "ToolFailedError",
    "VersionMismatchError",
    "VersionTuple",
    "WorkflowCheckpointDeleted",
    "WorkflowCheckpointed",
    "connect",
    "current_run_id",
    "erase_run",
    "error_info",
    "fold",
    "follow_events",
    "is_placeholder",
    "is_subject_token",
    "ledger_address",
    "list_runs",
    "load_agent",
    "load_run",
    "open_run",
    "require_extra",
    "resume_run",
    "resume_sync",
    "run_sync",
    "runledger_home",
    "server_of",
    "start_run",
    "sync_agent",
    "tool",
]


# A library logs and leaves the terminal to the program: records of the ``runledger`` loggers
# reach nowhere (not even Python's last-resort stderr handler for warnings) until the program
# configures logging, as the CLI's main does.
logging.getLogger(__name__).addHandler(logging.NullHandler())

# The folders pyproject.toml's package-dir installs as sub-packages of runledger. A wheel puts them in
# runledger/; an editable install leaves them in their own folders, shown to walkers (runledger.editable).
# The probe is sandbox/, in every copy but an editable one (the sandbox guest's leaves projections/ and ui/ out).
_SUB_PACKAGE_FOLDERS = ("projections", "sandbox", "integrations", "ui", "examples")
if not os.path.isdir(os.path.join(__path__[0], "sandbox")):
    from runledger.editable import show_siblings

    show_siblings(__path__, __name__, _SUB_PACKAGE_FOLDERS)


# The public classes and functions are shown, pickled and documented as ``runledger.<name>`` (as
# httpx does): set for every public name of a module when this module first loads it (a pickle names
# ``runledger.<name>``, which loads it again). Not for these classes: their annotations are strings
# that resolve only in their own module, which ``typing.get_type_hints`` (and pydantic, building a
# model that holds one) reads from ``sys.modules[cls.__module__]``.
_OWN_MODULE = frozenset(
    {"AgentSpec", "Checkpoint", "DataPolicy", "EffectContext", "LedgerClient", "RecordedRun", "RedactionPolicy",
     "RunFailed", "RunLog", "Tool"}
)  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'runledger' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    for public, where in _MODULE_OF.items():
        value = getattr(loaded, public) if where == module else None
        if isinstance(value, type | types.FunctionType) and public not in _OWN_MODULE:
            value.__module__ = __name__
    value = getattr(loaded, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
