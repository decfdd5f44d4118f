"""Code identity follows the code that runs: the hash of an agent's import closure (runledger.sdk.code_identity),
the declared version beside it, and what a sandbox mounts for a candidate (its closure, by top-level package).

Each test builds an agent project of its own in ``tmp_path`` (names no other test imports): a package
``<p>`` with the agent, a sibling fix package ``<p>_fix`` that imports it, and a shared utility module."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runledger.record.canonical import canonical_json
from runledger.record.versions import VersionTuple, differing
from runledger.sandbox.containers import CODE_IN_GUEST, code_mounts
from runledger.sdk import code_identity
from runledger.sdk.agent import AgentSpec, load_agent
from runledger.sdk.code_identity import code_hash, import_closure, legacy_code_hash

AGENT = """
import json  # the standard library: not the project's
import pydantic  # an installed distribution: not the project's

from {util} import MARK
from . import helpers


async def agent(run):
    await run.now()
    from .lazy import LATE  # imported when it runs: part of what runs
    return helpers.shout(MARK + LATE)


def spec():
    from runledger import AgentSpec, ScriptedModel
    return AgentSpec("codeid", agent, ScriptedModel([]){declared})
"""
FIX = """
import dataclasses

from {pkg}.agent import spec as original
from {util} import MARK


async def fixed(run):
    await run.now()
    return "fixed " + MARK


def spec():
    return dataclasses.replace(original(), fn=fixed{declared})
"""


@dataclass
class Project:
    root: Path
    pkg: str
    fix: str
    util: str

    def write(self, relative: str, text: str) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        code_identity.forget()  # as a process started after the change would


def make_project(root: Path, declared: str = "") -> Project:
    tag = os.urandom(4).hex()
    project = Project(root, f"rl_cid_{tag}", f"rl_cid_{tag}_fix", f"rl_cid_util_{tag}")
    version = f", agent_version={declared!r}" if declared else ""
    project.write(f"{project.pkg}/__init__.py", "")
    project.write(f"{project.pkg}/agent.py", AGENT.format(util=project.util, declared=version))
    project.write(f"{project.pkg}/helpers.py", "def shout(text):\n    return text.upper()\n")
    project.write(f"{project.pkg}/lazy.py", "LATE = '!'\n")
    project.write(f"{project.util}.py", "MARK = 'original'\n")
    project.write(f"{project.fix}/__init__.py", "")
    project.write(f"{project.fix}/agent.py", FIX.format(pkg=project.pkg, util=project.util, declared=""))
    return project


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    monkeypatch.syspath_prepend(str(tmp_path))
    made = make_project(tmp_path)
    yield made
    code_identity.forget()
    for name in [m for m in sys.modules if m.startswith(("rl_cid_",))]:
        del sys.modules[name]


def names(module: str) -> list[str]:
    return [m.name for m in import_closure(module)]


def test_the_closure_holds_the_projects_modules_the_agent_imports_and_nothing_else(project: Project) -> None:
    p = project.pkg
    assert names(f"{p}.agent") == [f"{p}.agent", p, f"{p}.helpers", f"{p}.lazy", project.util]
    closure = import_closure(f"{p}.agent")
    assert [m.relative for m in closure][:2] == [f"{p}/agent.py", f"{p}/__init__.py"]


def test_a_file_added_beside_the_agent_changes_nothing_a_change_to_an_imported_module_does(project: Project) -> None:
    spec = load_agent(f"{project.pkg}.agent:spec")
    before = code_hash(spec.fn)
    assert before.startswith("code:") and len(before) == len("code:") + 16
    legacy_before = legacy_code_hash(spec.fn)
    project.write(f"{project.pkg}/agent_fixed.py", "async def agent(run):\n    return 'a fix, imported by nobody'\n")
    assert code_hash(spec.fn) == before  # the recorded runs stay this code's
    assert legacy_code_hash(spec.fn) != legacy_before  # the directory rule made them all foreign
    project.write(f"{project.pkg}/lazy.py", "LATE = '?'\n")  # imported only when the agent runs: still its code
    assert code_hash(spec.fn) != before
    changed = code_hash(spec.fn)
    project.write(f"{project.util}.py", "MARK = 'other'\n")  # a shared module outside the package
    assert code_hash(spec.fn) != changed


def test_the_hash_is_of_names_and_bytes_not_of_where_the_project_lies(
    project: Project, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host hashes the code where it lies, the guest the same files mounted at /app: one number."""
    here = code_hash(load_agent(f"{project.pkg}.agent:spec").fn)
    elsewhere = tmp_path_factory.mktemp("copy")
    for path in project.root.rglob("*.py"):
        target = elsewhere / path.relative_to(project.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    for name in [m for m in sys.modules if m.startswith("rl_cid_")]:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(elsewhere))
    code_identity.forget()
    spec = load_agent(f"{project.pkg}.agent:spec")
    assert Path(sys.modules[f"{project.pkg}.agent"].__file__ or "").is_relative_to(elsewhere)
    assert code_hash(spec.fn) == here


def test_finding_the_closure_runs_no_module(project: Project) -> None:
    witness = project.root / "ran.txt"
    project.write(f"{project.pkg}/noisy.py", f"open({str(witness)!r}, 'w').write('ran')\n")
    project.write(f"{project.pkg}/lazy.py", "LATE = '!'\n\n\ndef later():\n    from . import noisy\n")
    assert f"{project.pkg}.noisy" in names(f"{project.pkg}.agent")
    assert not witness.exists()


def test_a_lazy_import_from_namespace_packages_nobody_imported_yet_is_followed(project: Project) -> None:
    """A function of the agent's module imports ``<ns>.tools.leaf``, where ``<ns>`` and ``<ns>.tools``
    are namespace packages (no ``__init__.py``) that nothing has imported: the closure holds the leaf
    (reading a namespace package's path would look its parent up in ``sys.modules``, which once
    raised KeyError out of ``start_run``), and a change to the leaf changes the hash."""
    ns = f"{project.pkg}_ns"
    project.write(f"{ns}/tools/leaf.py", "VALUE = 1\n")
    project.write(f"{project.pkg}/lazy.py", f"LATE = '!'\n\n\ndef later():\n    from {ns}.tools import leaf\n")
    assert ns not in sys.modules
    assert f"{ns}.tools.leaf" in names(f"{project.pkg}.agent")
    before = code_identity.closure_digest(import_closure(f"{project.pkg}.agent"))
    project.write(f"{ns}/tools/leaf.py", "VALUE = 2\n")
    assert code_identity.closure_digest(import_closure(f"{project.pkg}.agent")) != before
    for name in [m for m in sys.modules if m.startswith(ns)]:
        del sys.modules[name]


def test_a_fix_in_a_sibling_package_closes_over_the_original(project: Project) -> None:
    fix = load_agent(f"{project.fix}.agent:spec")
    assert set(names(f"{project.fix}.agent")) == {
        f"{project.fix}.agent", project.fix, f"{project.pkg}.agent", project.pkg, f"{project.pkg}.helpers",
        f"{project.pkg}.lazy", project.util,
    }  # fmt: skip
    original = load_agent(f"{project.pkg}.agent:spec")
    # A counterfactual on the agent element: the code (and so the version) is the fix's.
    assert differing(original.version().model_dump(), fix.version().model_dump()) == ["agent_version"]


def test_the_sandbox_mounts_the_candidates_closure_by_top_level_package(project: Project) -> None:
    fix = load_agent(f"{project.fix}.agent:spec")
    mounts = dict((guest, host) for host, guest in code_mounts(fix.fn))
    assert mounts == {
        f"{CODE_IN_GUEST}/{project.fix}": str((project.root / project.fix).resolve()),
        f"{CODE_IN_GUEST}/{project.pkg}": str((project.root / project.pkg).resolve()),
        f"{CODE_IN_GUEST}/{project.util}.py": str((project.root / f"{project.util}.py").resolve()),
    }
    site = [p for p in sys.path if p.endswith("site-packages")]
    assert site and not any(host.startswith(tuple(site)) for host in mounts.values())  # never the host's packages


def test_the_example_agent_mounts_over_the_images_copy_of_its_subpackage() -> None:
    spec = load_agent("runledger.examples.refund_agent.agent:spec")
    assert [guest for _, guest in code_mounts(spec.fn)] == ["/opt/runledger/runledger/examples"]
    assert {m.name for m in import_closure(spec.fn.__module__)} >= {
        "runledger.examples.refund_agent.agent", "runledger.examples", "runledger.examples.refund_agent",
    }  # fmt: skip
    assert not any(m.name.startswith("runledger.sdk") for m in import_closure(spec.fn.__module__))


def test_a_declared_version_is_the_identity_and_the_code_hash_is_recorded_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    project = make_project(tmp_path, declared="1.0.0")
    spec = load_agent(f"{project.pkg}.agent:spec")
    version = spec.version()
    assert version.agent_version == "1.0.0"
    assert version.code_hash == code_hash(spec.fn) and version.code_hash.startswith("code:")
    recorded = version.model_dump()
    project.write(f"{project.pkg}/helpers.py", "def shout(text):\n    return text\n")
    now = spec.version()
    assert now.code_hash != version.code_hash
    assert differing(recorded, now.model_dump()) == []  # a declared version is never refused for its hash
    assert spec.version_like(recorded) == now


def test_an_undeclared_version_is_the_code_hash() -> None:
    spec = load_agent("runledger.examples.refund_agent.agent:spec")
    assert spec.version().agent_version == spec.version().code_hash == code_hash(spec.fn)


def test_a_tuple_recorded_before_code_hashes_keeps_its_bytes() -> None:
    old = {"agent_version": "code:0123456789abcdef", "model": "m", "prompt_hash": "p", "tool_schema_hashes": {}}
    assert VersionTuple(**old).model_dump() == old
    assert canonical_json(VersionTuple(**old).model_dump()) == canonical_json(old)
    new = VersionTuple(**old, code_hash="code:fedcba9876543210")
    assert json.loads(new.model_dump_json())["code_hash"] == "code:fedcba9876543210"
    assert differing(old, new.model_dump()) == []


def test_a_run_recorded_under_the_directory_rule_is_compared_by_that_rule(project: Project) -> None:
    spec = load_agent(f"{project.pkg}.agent:spec")
    legacy = {**spec.version().model_dump(exclude={"code_hash"}), "agent_version": legacy_code_hash(spec.fn)}
    assert differing(legacy, spec.version().model_dump()) == ["agent_version"]  # hash rules differ
    assert differing(legacy, spec.version_like(legacy).model_dump()) == []  # compared like with like
    declared_legacy = {**legacy, "agent_version": "2.0"}
    assert spec.version_like(declared_legacy) == spec.version()


def test_agent_spec_names_the_rule() -> None:
    assert "import closure" in (AgentSpec.__doc__ or "")


async def test_a_langgraph_threads_runs_record_the_graph_agents_code_hash() -> None:
    """The saver's spec is never driven (its function refuses), but its runs record which code ran: the graph's."""

    from runledger.integrations.langgraph import RunledgerSaver
    from tests.unit.test_langgraph_values import unconnected_client

    graph_spec = load_agent("runledger.examples.refund_agent.agent:spec")
    saver = RunledgerSaver(unconnected_client(), agent=graph_spec)  # nothing connects until a thread is written
    assert saver.spec.version().code_hash == graph_spec.version().code_hash
    assert saver.spec.version().agent_version == graph_spec.version().agent_version
