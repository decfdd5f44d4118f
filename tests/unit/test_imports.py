"""The public surface of ``runledger`` and what importing it costs.

The public names are a sorted ``__all__`` that loads on first use; the sandbox guest's import
path (the guest, the Run API, an agent module) stays off the NATS client, cryptography and the
analytics stack, which every sandbox container would otherwise load at start.
"""

from __future__ import annotations

import subprocess
import sys

import runledger

HEAVY = ("nats", "cryptography", "duckdb", "pyarrow", "docker")

# The public API, as a user imports it. A change here is a change of the library's contract.
PUBLIC = [
    "NOT_FOUND", "AgentSpec", "ApprovalDeniedError", "BudgetExhaustedError", "Budgets", "Checkpoint",
    "ChildFailedError", "ChildSuspendedError", "ClaimTakenOverError", "ConfigurationError", "DataPolicy",
    "EffectContext", "EffectFailedError", "EffectInDoubtError", "EffectResultErasedError", "Event",
    "FencedError", "LeaseExpiredError", "LedgerClient", "LedgerError", "MissingExtraError", "ModelAdapter",
    "ModelResponse",
    "NondeterminismError", "OpenAIChatModel", "PayloadUnavailableError", "PublishError", "RedactionPolicy", "Retry",
    "Run", "RunResult", "ScriptedModel", "SecretResolver", "StaleClaimError", "SuspendedForApproval", "SyncRun", "Tool",
    "ToolFailedError", "VersionMismatchError", "VersionTuple", "connect", "fold", "load_agent", "resume_run",
    "resume_sync", "run_sync", "start_run", "sync_agent", "tool",
]  # fmt: skip


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_all_is_the_sorted_public_api() -> None:
    order = sorted(runledger.__all__, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    assert runledger.__all__ == order
    assert sorted(runledger.__all__) == sorted(PUBLIC)


def test_every_public_name_resolves_to_its_module() -> None:
    for name in runledger.__all__:
        obj = getattr(runledger, name)
        assert obj is not None
        assert name in dir(runledger)
        if isinstance(obj, type) or callable(obj):
            assert getattr(obj, "__module__", "runledger").startswith("runledger"), name


def test_every_public_error_derives_from_the_base() -> None:
    for name in runledger.__all__:
        obj = getattr(runledger, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, runledger.LedgerError), name


def test_fold_is_the_function() -> None:
    _loaded_after("import runledger.record.fold\nfrom runledger import fold\nassert callable(fold), fold")


def test_the_guest_import_path_is_lean() -> None:
    statement = (
        "import runledger.sandbox.guest, runledger.sdk.run, runledger.record.fold\n"
        "import runledger.examples.refund_agent.agent"
    )
    assert _loaded_after(statement) & set(HEAVY) == set()


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        runledger.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_every_module_of_the_package_imports_without_running_anything() -> None:
    """Tools that walk a package (documentation generators, test collectors, a harness looking for
    saver subclasses) import every module: ``runledger.__main__`` included, which must only define."""
    command = [sys.executable, "-c", "import runledger.__main__"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
