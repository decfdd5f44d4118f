"""The optional parts: what each extra needs, which commands it owns, and the one line a user
sees when it is missing (runledger.extras, runledger.errors.MissingExtraError, runledger.cli.app)."""

from __future__ import annotations

import argparse
import importlib.util
import pickle
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import runledger.extras
from runledger.cli.app import main
from runledger.cli.connect import common_parser
from runledger.errors import LedgerError, MissingExtraError
from runledger.extras import COMMANDS_OF_EXTRA, MODULES_OF_EXTRA, require_extra

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# The import name of a distribution, where it is not the distribution's own name.
MODULE_OF_DISTRIBUTION: dict[str, str] = {
    "opentelemetry-sdk": "opentelemetry.sdk",
    "opentelemetry-exporter-otlp-proto-http": "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry-proto": "opentelemetry.proto",
    "langgraph-checkpoint": "langgraph.checkpoint",
    "pydantic-ai-slim": "pydantic_ai",
    "agent-framework-core": "agent_framework",
    "openai-agents": "agents",
}


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    """``_missing`` is functools.cache'd: each test asks find_spec afresh and leaves no answer behind."""
    runledger.extras._missing.cache_clear()
    yield
    runledger.extras._missing.cache_clear()


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """Make ``modules`` look uninstalled to ``importlib.util.find_spec``."""
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name in modules else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def registered(register: Callable[[Any, argparse.ArgumentParser], None]) -> set[str]:
    """The sub-commands a package's ``register(sub, common)`` adds to a fresh parser."""
    sub = argparse.ArgumentParser().add_subparsers()
    register(sub, common_parser())
    return set(sub.choices)


def test_the_projections_extra_owns_exactly_the_commands_its_package_registers() -> None:
    from runledger.projections.cli import register

    assert set(COMMANDS_OF_EXTRA["projections"]) == registered(register), (
        "runledger.extras.COMMANDS_OF_EXTRA['projections'] must name every sub-command "
        "runledger.projections.cli.register adds: without the extra, the others would be unknown commands "
        "instead of saying what to install"
    )
    assert len(set(COMMANDS_OF_EXTRA["projections"])) == len(COMMANDS_OF_EXTRA["projections"])


def test_the_commands_of_an_extra_do_not_shadow_the_core_or_another_package() -> None:
    from runledger.cli import register as core
    from runledger.examples.cli import register as examples
    from runledger.sandbox.cli import register as sandbox

    others = registered(core) | registered(examples) | registered(sandbox)
    for extra, commands in COMMANDS_OF_EXTRA.items():
        assert extra in MODULES_OF_EXTRA
        assert not set(commands) & others, f"{extra}: {sorted(set(commands) & others)} are registered elsewhere"


def _distribution(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _extra_requirements(extras: dict[str, list[str]], extra: str) -> set[str]:
    """The distributions an extra installs, following ``runledger[other]`` to the other extras."""
    found: set[str] = set()
    for requirement in extras[extra]:
        name = _distribution(requirement)
        if name == "runledger":
            inner = re.search(r"\[(.*?)\]", requirement)
            assert inner is not None, requirement
            for other in inner.group(1).split(","):
                found |= _extra_requirements(extras, other.strip())
        else:
            found.add(name)
    return found


@pytest.mark.parametrize("extra", sorted(MODULES_OF_EXTRA))
def test_the_modules_checked_for_an_extra_are_the_ones_pyproject_installs_with_it(extra: str) -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    wanted = {MODULE_OF_DISTRIBUTION.get(d, d.replace("-", "_")) for d in _extra_requirements(extras, extra)}
    assert set(MODULES_OF_EXTRA[extra]) == wanted, (
        f"pyproject.toml's [{extra}] installs {sorted(wanted)}; runledger.extras checks {MODULES_OF_EXTRA[extra]}"
    )


def test_require_extra_passes_when_everything_is_installed() -> None:
    for extra in MODULES_OF_EXTRA:
        require_extra(extra, "a test")  # the dev environment has every extra


@pytest.mark.parametrize(
    ("extra", "hidden", "named"),
    [
        ("projections", ("duckdb",), "duckdb"),
        ("projections", ("pytz",), "pytz"),
        ("sandbox", ("docker",), "docker"),
        ("sandbox", ("pyarrow",), "pyarrow"),  # the sandbox extra includes projections
    ],
)
def test_require_extra_names_the_extra_and_the_line_that_installs_it(
    monkeypatch: pytest.MonkeyPatch, extra: str, hidden: tuple[str, ...], named: str
) -> None:
    hide(monkeypatch, *hidden)
    with pytest.raises(MissingExtraError) as info:
        require_extra(extra, "`runledger thing`")
    error = info.value
    assert (error.extra, error.missing, error.feature) == (extra, named, "`runledger thing`")
    assert f"pip install 'runledger[{extra}]'" in str(error)
    assert "`runledger thing`" in str(error) and named in str(error)
    assert "\n" not in str(error)
    # Callers catch it as what it is: a LedgerError (the CLI), an ImportError (optional imports).
    assert isinstance(error, LedgerError) and isinstance(error, ImportError)
    again = pickle.loads(pickle.dumps(error))  # it crosses process boundaries (projection workers)
    assert type(again) is MissingExtraError and str(again) == str(error)


def test_the_answer_is_cached_until_cleared(monkeypatch: pytest.MonkeyPatch) -> None:
    require_extra("projections", "warm")
    hide(monkeypatch, "duckdb")
    require_extra("projections", "cached: find_spec is not asked again")
    runledger.extras._missing.cache_clear()
    with pytest.raises(MissingExtraError):
        require_extra("projections", "asked again")


def _without_projections(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI as a core install sees it: importing runledger.projections raises MissingExtraError."""
    hide(monkeypatch, "duckdb")
    for name in [m for m in sys.modules if m == "runledger.projections" or m.startswith("runledger.projections.")]:
        monkeypatch.delitem(sys.modules, name)  # imported afresh, so that the check at its top runs


def _says_what_to_install(capsys: pytest.CaptureFixture[str], command: str, argv: list[str]) -> None:
    assert main(argv) == 4  # Exit.ERROR: the command cannot run without its extra
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err], err
    assert f"`runledger {command}`" in err and "pip install 'runledger[projections]'" in err, err


def test_without_the_projections_extra_its_commands_say_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_projections(monkeypatch)
    for command in COMMANDS_OF_EXTRA["projections"]:
        _says_what_to_install(capsys, command, [command])
        _says_what_to_install(capsys, command, [command, "x", "--db", "y"])
    assert "runledger.projections" not in sys.modules


def test_without_the_projections_extra_its_commands_say_what_to_install_whatever_their_options(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_projections(monkeypatch)
    for argv in (["project", "--follow"], ["sql", "--format", "json", "SELECT 1"], ["export", "--parquet", "out"],
                 ["quarantine", "--json"], ["project", "-h"]):  # fmt: skip
        _says_what_to_install(capsys, argv[0], argv)
