"""One error tree per package: every exception class lives in its package's errors module,
derives from the package's base, is drawn in the module's tree, and survives pickling.

Where the classes are is read from the source with ``ast`` (nothing is imported), so a class
that is never imported by a test is found too.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import pickle
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest

import runledger
import runledger.errors
import runledger.projections.errors
import runledger.sandbox.errors
from runledger.errors import BlobMissingError, LedgerError, ModelError, NondeterminismError, ToolFailedError
from runledger.log.subjects import BLOB_BUCKET
from runledger.projections.errors import ProjectionError
from runledger.sandbox.errors import AgentFailedError, Refusal, RerunDeadLetteredError, RerunRequestError, SandboxError

REPO = Path(__file__).resolve().parents[2]
# Each package's folder, its errors module and the base every error of the package derives from.
PACKAGES: dict[str, tuple[types.ModuleType, type[BaseException]]] = {
    "ledger": (runledger.errors, LedgerError),
    "projections": (runledger.projections.errors, ProjectionError),
    "sandbox": (runledger.sandbox.errors, SandboxError),
}
BUILTIN_EXCEPTIONS = frozenset(
    name for name, obj in vars(builtins).items() if isinstance(obj, type) and issubclass(obj, BaseException)
)
# Third-party bases (``duckdb.Error``, ``docker.errors.APIError``...) cannot be resolved without
# importing them: a base named like an exception counts as one.
EXCEPTION_SUFFIXES = ("Error", "Exception", "Warning")


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):  # Generic[T] and the like
        return _base_name(node.value)
    return None


def _any_exception(bases: list[str], exceptions: set[str]) -> bool:
    return any(b in exceptions or b.endswith(EXCEPTION_SUFFIXES) for b in bases)


def exception_classes(sources: dict[str, str]) -> dict[str, list[str]]:
    """Per file (of ``sources``: name -> text), the classes whose bases resolve to an exception:
    a builtin one, one named like an exception, or (transitively) one of these classes."""
    defined: list[tuple[str, str, list[str]]] = []
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text, name)):
            if isinstance(node, ast.ClassDef):
                bases = [b for b in map(_base_name, node.bases) if b is not None]
                defined.append((name, node.name, bases))
    exceptions = set(BUILTIN_EXCEPTIONS)
    while True:
        found = {cls for _, cls, bases in defined if _any_exception(bases, exceptions)}
        if found <= exceptions:
            break
        exceptions |= found
    result: dict[str, list[str]] = {}
    for name, cls, bases in defined:
        if _any_exception(bases, exceptions):
            result.setdefault(name, []).append(cls)
    return result


def _sources() -> dict[str, str]:
    return {
        str(path.relative_to(REPO)): path.read_text()
        for folder in PACKAGES
        for path in sorted((REPO / folder).rglob("*.py"))
    }


def _defined_in(obj: type, module: types.ModuleType) -> bool:
    # A public error carries runledger's name once runledger has loaded it (runledger.__getattr__):
    # its own module is then the one runledger loads it from.
    own = runledger._MODULE_OF.get(obj.__name__) if obj.__module__ == "runledger" else obj.__module__
    return own == module.__name__


def _classes(module: types.ModuleType) -> list[type[BaseException]]:
    # Each class once: an alias kept for a public old name (SuspendedForApproval) is the same class.
    return list(
        dict.fromkeys(
            obj
            for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, BaseException) and _defined_in(obj, module)
        )
    )


ALL_CLASSES = [cls for module, _ in PACKAGES.values() for cls in _classes(module)]


def test_the_checker_finds_exception_classes() -> None:
    source = (
        "import docker\n"
        "class A(Exception): pass\n"
        "class B(A): pass\n"
        "class C(docker.errors.APIError): pass\n"
        "class D(BaseModel): pass\n"
        "def f():\n"
        "    class E(B, D): pass\n"
        "class F(KeyError, D): pass\n"
    )
    assert exception_classes({"x.py": source}) == {"x.py": ["A", "B", "C", "F", "E"]}


def test_every_exception_class_is_defined_in_an_errors_module() -> None:
    elsewhere = {
        path: names
        for path, names in exception_classes(_sources()).items()
        if Path(path).name != "errors.py" or Path(path).parent.name not in PACKAGES
    }
    assert elsewhere == {}, "define these in the package's errors module (ledger/, projections/ or sandbox/errors.py)"


def test_the_errors_modules_hold_what_the_checker_sees() -> None:
    found = exception_classes(_sources())
    for folder, (module, _) in PACKAGES.items():
        assert sorted(found[f"{folder}/errors.py"]) == sorted(cls.__name__ for cls in _classes(module))


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_every_error_derives_from_its_package_base(folder: str) -> None:
    module, base = PACKAGES[folder]
    assert [cls.__name__ for cls in _classes(module) if not issubclass(cls, base)] == []


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_every_error_is_drawn_in_its_module_tree(folder: str) -> None:
    module, _ = PACKAGES[folder]
    tree = module.__doc__ or ""
    drawn = [cls.__name__ for cls in _classes(module) if re.search(rf"^ +(└── |├── |│ +)*{cls.__name__}\b", tree, re.M)]
    assert sorted(drawn) == sorted(cls.__name__ for cls in _classes(module))


# -- pickling -------------------------------------------------------------------------------------------

# Arguments no annotation can suggest.
SAMPLES: dict[type[BaseException], list[tuple[Any, ...]]] = {
    AgentFailedError: [
        ({"type": "ValueError", "message": "no such order", "traceback": "Traceback (most recent call last):\n..."},),
        ({"message": "no type, no traceback"},),
    ],
    # Keyword-only arguments (the new call's arguments, the side-by-side detail) are set after the
    # positional ones: the round trip must keep them too.
    NondeterminismError: [("run-1", 3, "tool 'a' (args 1)", "tool 'a' (args 2)", False), ("run-1", 3, "x", "y", True)],
    ModelError: [("HTTP 429: slow down",)],
    ToolFailedError: [("lookup", 3, "TimeoutError", "no answer in 5s")],
    # The refusal class travels in the instance's dict, beside the message.
    RerunRequestError: [("the request cannot be honoured",), ("--set NAME=VALUE, got nothing", Refusal.CHANGE)],
}


def test_keyword_only_arguments_survive_pickling() -> None:
    for error in (
        ModelError("HTTP 429: slow down", retryable=True, status=429),
        ToolFailedError("gpt", 3, "ModelError", "HTTP 429", retryable=True, kind="model"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and copy.__dict__ == error.__dict__


def test_a_counterfactual_prefix_error_names_the_change_not_the_recorded_tuple_across_pickling() -> None:
    error = NondeterminismError("br-1", 1, "tool 'a' (args 1)", "tool 'b' (args 2)", changed="prompt_hash", fork_step=3)
    assert "The version tuple is the recorded one" not in str(error)
    assert "before its fork at step 3" in str(error) and "The branch changes prompt_hash" in str(error)
    copy = pickle.loads(pickle.dumps(error.with_detail("-a\n+b")))
    assert (copy.changed, copy.fork_step, "The branch changes prompt_hash" in str(copy)) == ("prompt_hash", 3, True)


def test_a_nondeterminism_error_keeps_its_arguments_and_detail_across_pickling() -> None:
    error = NondeterminismError("run-1", 3, "tool 'a'", "tool 'a'", attempted_args={"q": [1]}).with_detail("-a\n+b")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.attempted_args, copy.detail, str(copy)) == ({"q": [1]}, "-a\n+b", str(error))


def _sample(annotation: Any, index: int) -> Any:
    """A value of ``annotation``, different for each parameter index (so swapped arguments show)."""
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        return _sample(next(a for a in typing.get_args(annotation) if a is not type(None)), index)
    origin = typing.get_origin(annotation) or annotation
    samples: dict[Any, Any] = {
        str: f"value-{index}",
        int: 40 + index,
        float: 2.5 + index,
        bool: True,
        bytes: b"raw-%d" % index,
        dict: {"model": f"m-{index}", "prompt_hash": index},
        list: [f"item-{index}"],
    }
    if origin not in samples:
        raise AssertionError(f"no sample for {annotation!r}: add one to _sample or to SAMPLES")
    return samples[origin]


def _argument_lists(cls: type[BaseException]) -> list[tuple[Any, ...]]:
    """Every parameter given; and only the required ones (defaults taken)."""
    if cls in SAMPLES:
        return SAMPLES[cls]
    init = next(c.__dict__["__init__"] for c in cls.__mro__ if "__init__" in c.__dict__)
    if init in (BaseException.__init__, Exception.__init__):
        return [(f"what went wrong with {cls.__name__}: do this next",)]
    hints = typing.get_type_hints(init)
    params = [p for p in inspect.signature(init).parameters.values() if p.name != "self"]
    every = tuple(_sample(hints[p.name], i) for i, p in enumerate(params))
    required = tuple(_sample(hints[p.name], i) for i, p in enumerate(params) if p.default is inspect.Parameter.empty)
    return [every, required] if required != every else [every]


CASES = [(cls, args) for cls in ALL_CLASSES for args in _argument_lists(cls)]


@pytest.mark.parametrize(("cls", "args"), CASES, ids=[f"{c.__name__}-{len(a)}" for c, a in CASES])
def test_every_error_survives_pickling(cls: type[BaseException], args: tuple[Any, ...]) -> None:
    error = cls(*args)
    error.add_note("a note added on the way")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cls
    assert str(copy) == str(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)


def test_every_class_has_a_pickling_case() -> None:
    assert {cls for cls, _ in CASES} == set(ALL_CLASSES)
    assert len(ALL_CLASSES) > 40  # the three modules were found and read


# -- single classes -------------------------------------------------------------------------------------


def test_a_missing_blob_names_the_bucket_of_the_log() -> None:
    assert f"object store {BLOB_BUCKET} " in str(BlobMissingError("0" * 64))


def test_nondeterminism_names_its_kind() -> None:
    changed = NondeterminismError("r1", 3, "tool 'a'", "tool 'b'")
    assert changed.failure_reason == "nondeterminism" and not changed.diverged
    assert "the agent now calls tool 'b' where the record has tool 'a'" in str(changed)
    diverged = NondeterminismError("parent", 3, "tool 'a'", "tool 'b'", diverged=True)
    assert diverged.failure_reason == "diverged" and diverged.diverged
    assert "re-drive of parent diverged at step 3" in str(diverged)


def test_a_dead_lettered_rerun_names_the_request_the_count_and_the_cause() -> None:
    error = RerunDeadLetteredError("req-1", 3, "RuntimeError: boom")
    assert "re-run request req-1 dead-lettered after 3 deliveries: RuntimeError: boom." in str(error)
    assert "queue a new request" in str(error)  # what to do next
    assert (error.request_id, error.deliveries, error.cause) == ("req-1", 3, "RuntimeError: boom")
