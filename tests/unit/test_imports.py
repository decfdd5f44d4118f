"""The public surface of ``runledger`` and what importing it costs.

The public names are a sorted ``__all__`` that loads on first use; the sandbox guest's import
path (the guest, the Run API, an agent module) stays off the NATS client, cryptography and the
analytics stack, which every sandbox container would otherwise load at start.
"""

from __future__ import annotations

import ast
import subprocess
import sys
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
