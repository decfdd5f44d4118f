"""The public surface of ``runledger`` and what importing it costs.

The public names are a sorted ``__all__`` that loads on first use; the sandbox guest's import
path (the guest, the Run API, an agent module) stays off the NATS client, cryptography and the
analytics stack, which every sandbox container would otherwise load at start.
"""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys
import types
import typing
from pathlib import Path

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
    "Run", "RunResult", "ScriptedModel", "SecretResolver", "StaleClaimError", "SuspendedForApproval",
    "SuspendedForApprovalError", "SyncRun", "Tool",
    "ToolFailedError", "VersionMismatchError", "VersionTuple", "connect", "fold", "load_agent", "resume_run",
    "resume_sync", "run_sync", "start_run", "sync_agent", "tool",
    # What the integrations use (tests/unit/test_imports.py keeps them to these):
    "DEFAULT_RETRY", "RETRYABLE_STATUS", "DeferredTools", "EffectClass", "GraphCheckpointed", "GraphCheckpointsDeleted",
    "GraphWritesSaved", "ModelError",
    "RecordedRun", "RunCompleted", "RunFailed", "RunNotFoundError", "RunSuspended", "erase_run", "error_info",
    "is_subject_token", "ledger_address", "list_runs", "load_run",
    "open_run", "require_extra", "WorkflowCheckpointDeleted", "WorkflowCheckpointed",
    # Where an HTTP adapter sent a model call (model.called's server), host and port only.
    "Server", "server_of",
    "current_run_id", "runledger_home",  # an MCP stdio server's log file, named after the run
    # What a reader of runs needs (the OTLP exporter): a run as read, its steps, content stand-ins, runs live.
    "RunLog", "StepRecord", "follow_events", "is_placeholder",
    # What a service author needs to honour fencing tokens (runledger.sdk.fencing).
    "FencingTokens", "StaleFencingTokenError",
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
        if isinstance(obj, type | types.FunctionType):  # (a type alias, EffectClass, is typing's)
            assert obj.__module__.startswith("runledger"), name


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


# What a module may reach of another: read from the source with ``ast`` (nothing is imported). The
# folders of the repository and the names they install as (pyproject.toml, package-dir).
REPO = Path(__file__).resolve().parents[2]
ROOTS = {"ledger": "runledger", "projections": "runledger.projections", "sandbox": "runledger.sandbox",
         "integrations": "runledger.integrations", "ui": "runledger.ui", "examples": "runledger.examples"}  # fmt: skip


def _library() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, package in ROOTS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


LIBRARY = _library()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_module_outside(target: str, module: str) -> bool:
    """Whether ``target`` is a private module (a ``_name`` in its path) that ``module`` is not inside
    the package of (``runledger.protect.redaction._scan`` is ``runledger.protect.redaction``'s own)."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if _private(part):
            owner = ".".join(parts[:i])
            return not (module == owner or module.startswith(owner + "."))
    return False


def _reaches_into(module: str, tree: ast.AST) -> list[str]:
    """Each place ``module`` uses another module's private name: ``from X import _name``, an import
    of a private module from outside its package, ``alias._name`` on an imported module of ours."""
    found: list[str] = []
    modules: dict[str, str] = {}  # local name -> the module of ours it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in LIBRARY:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if target in LIBRARY:
                    modules[alias.asname or alias.name] = target
                if _private(alias.name) and node.module != module and target not in LIBRARY:
                    found.append(f"{module}:{node.lineno} from {node.module} import {alias.name}")
                elif _private_module_outside(target if target in LIBRARY else node.module, module):
                    found.append(f"{module}:{node.lineno} from {node.module} import {alias.name} (a private module)")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in LIBRARY:
                    if alias.asname:
                        modules[alias.asname] = alias.name
                    if _private_module_outside(alias.name, module):
                        found.append(f"{module}:{node.lineno} import {alias.name} (a private module)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
            target = modules.get(node.value.id)
            if target is not None and target != module:
                found.append(f"{module}:{node.lineno} {node.value.id}.{node.attr} ({target})")
    return found


def test_no_library_module_reaches_into_another_modules_private_names() -> None:
    """A ``_name`` is its module's own; a name two modules share is public (within a private module,
    if only its package uses it). Tests may still reach in."""
    found = [line for module, path in LIBRARY.items() for line in _reaches_into(module, ast.parse(path.read_text()))]
    assert found == [], "imports of another module's private names:\n" + "\n".join(found)


def test_the_private_reach_check_sees_each_form() -> None:
    source = (
        "from runledger.log.server import _tail\n"
        "from runledger.protect.redaction import _scan\n"
        "from runledger.protect.redaction._scan import Mint\n"
        "import runledger.record.events as events\n"
        "from runledger.log import server\n"
        "events._RFC3339\n"
        "server._accepts(1)\n"
        "server.port_accepts(1)\n"
    )
    found = _reaches_into("runledger.sdk.run", ast.parse(source))
    assert [line.split(" ", 1)[1] for line in found] == [
        "from runledger.log.server import _tail",
        "from runledger.protect.redaction import _scan (a private module)",
        "from runledger.protect.redaction._scan import Mint (a private module)",
        "events._RFC3339 (runledger.record.events)",
        "server._accepts (runledger.log.server)",
    ]
    assert _reaches_into("runledger.protect.redaction._redactor", ast.parse(source.split("\n")[2])) == []


# CLI glue: an integration's ``*_cli`` module (an ``export`` mode, registered through the
# ``runledger.export`` entry point) takes the connection options ``export`` parsed and opens the
# client as every command does, through ``runledger.cli.connect`` (as ``runledger.testing.cli``
# does). Those are argparse plumbing of the ``runledger`` program, not a library API, so they stay
# off ``runledger.__all__``; nothing else of the core is reached.
CLI_GLUE = "runledger.cli.connect"


def _outside_the_public_api(tree: ast.AST, *, cli: bool = False) -> list[str]:
    """Each import of ``runledger`` that is neither a public name (``runledger.__all__``) nor a
    module of ``runledger.integrations`` (nor, for a ``*_cli`` module, the CLI's glue)."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "runledger":
                found += [f"{node.lineno}: {a.name}" for a in node.names if a.name not in runledger.__all__]
            elif cli and node.module == CLI_GLUE:
                continue
            elif node.module.startswith("runledger.") and not node.module.startswith("runledger.integrations"):
                found.append(f"{node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("runledger") and not alias.name.startswith("runledger.integrations."):
                    found.append(f"{node.lineno}: import {alias.name}")
    return found


def test_integrations_import_only_the_public_api() -> None:
    """An integration is written as a user's code would be: ``from runledger import ...`` (and its
    own package's modules), so what it needs is public, documented and stable."""
    found = [
        f"{module}:{line}"
        for module, path in LIBRARY.items()
        if module.startswith("runledger.integrations.")
        for line in _outside_the_public_api(ast.parse(path.read_text()), cli=module.endswith("_cli"))
    ]
    assert found == [], "integrations reaching past runledger's public names:\n" + "\n".join(found)
    glue = "from runledger.cli.connect import with_client\n"
    assert _outside_the_public_api(ast.parse(glue), cli=True) == []
    assert _outside_the_public_api(ast.parse(glue)) == ["1: from runledger.cli.connect import with_client"]
    assert _outside_the_public_api(ast.parse("from runledger.cli.commands import main"), cli=True) != []
    assert _outside_the_public_api(ast.parse("from runledger.sdk.run import RecordedRun\nimport runledger.log")) != []
    assert _outside_the_public_api(ast.parse("from runledger import RecordedRun, Nothing")) == ["1: Nothing"]


def test_public_names_are_runledgers_own() -> None:
    """Every public class and function is shown, pickled and documented as ``runledger.<name>``; a
    class keeps its module only where its annotations resolve there alone (``runledger._OWN_MODULE``)."""
    shown = {}
    for name in runledger.__all__:
        obj = getattr(runledger, name)
        if isinstance(obj, type | types.FunctionType):
            shown[name] = obj.__module__
            if isinstance(obj, type) and name not in runledger._OWN_MODULE:
                typing.get_type_hints(obj)  # what pydantic and documentation tools read still resolves
    assert {n for n, m in shown.items() if m != "runledger"} == runledger._OWN_MODULE
    assert {"LedgerError", "Event", "SyncRun", "tool", "open_run"} <= {n for n, m in shown.items() if m == "runledger"}
    error = pickle.loads(pickle.dumps(runledger.RunNotFoundError("r-1")))
    assert type(error) is runledger.RunNotFoundError and error.run_id == "r-1"
    assert runledger.Budgets.model_validate({"turns": 3}) == pickle.loads(pickle.dumps(runledger.Budgets(turns=3)))


def test_a_fresh_interpreter_sees_the_same_modules() -> None:
    statement = (
        "import runledger, pickle\n"
        "from runledger import LedgerError, start_run\n"
        "print(LedgerError.__module__, start_run.__module__, pickle.dumps(LedgerError).count(b'runledger.errors'))"
    )
    done = subprocess.run([sys.executable, "-c", statement], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["runledger", "runledger", "0"]


def _framework_privates(tree: ast.AST) -> list[str]:
    """Imports of a private module or name of another package (``from pydantic_ai._x import y``,
    ``from agents import _y``, ``import mcp._z``): the integrations build on the frameworks' public
    surfaces, which their releases keep, never on what they may change in any release."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in ("runledger", "__future__"):
                continue
            if any(part.startswith("_") for part in node.module.split(".")):
                found.append(f"from {node.module} import ...")
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if any(p.startswith("_") for p in a.name.split("."))]
    return found


def test_the_pydantic_ai_integration_imports_nothing_private_of_pydantic_ai() -> None:
    """Built as Pydantic AI asks durable-execution engines to be built: on ``pydantic_ai.durable_exec``'s
    public surface. (Other integrations still reach into their SDKs' private modules:
    ``agent_framework._workflows``, ``openai.lib._parsing``.)"""
    folder = Path(__file__).resolve().parents[2] / "integrations"
    found = [
        f"{path.name}: {line}"
        for path in sorted(folder.glob("pydantic_ai*.py"))
        for line in _framework_privates(ast.parse(path.read_text()))
    ]
    assert found == [], "private imports of a framework:\n" + "\n".join(found)
    assert _framework_privates(ast.parse("from pydantic_ai._utils import x\nfrom agents import _y\nimport mcp._z")) == [
        "from pydantic_ai._utils import ...",
        "from agents import _y",
        "import mcp._z",
    ]
