"""Code identity follows the code that runs, and a candidate is any importable code (issue 27, items 1-2),
with an agent project of the test's own in ``tmp_path`` (not the example): a package with the agent, a
sibling fix package that imports it, and a shared utility module outside both.

- a file added to the agent's package keeps its recorded runs resumable (the hash covers the import
  closure, not the directory: the old rule made every recorded run foreign);
- the fix in the sibling package re-drives in the sandbox, which mounts the fix's import closure (the
  original package and the utility module with it) and none of the host's site-packages;
- an agent that declares ``agent_version`` re-runs in the sandbox, also after its code changed under the
  same declared version (never refused because a hash differs), and records its code hash beside it;
- the plan's image check (``check_in_image``) passes the fix and names a candidate that imports a
  package the image lacks, before anything is queued."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runledger.errors import VersionMismatchError
from runledger.log.client import LedgerClient
from runledger.ops.decisions import approve
from runledger.protect.loading import load_run
from runledger.record.fold import fold
from runledger.record.versions import VersionTuple
from runledger.sandbox.candidate import check_in_image
from runledger.sandbox.containers import SandboxPool
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk import code_identity
from runledger.sdk.agent import ALLOW_CODE_ENV, AgentSpec, load_agent
from runledger.sdk.code_identity import code_hash, legacy_code_hash
from runledger.sdk.lifecycle import resume_run, start_run

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(150)]

AGENT = """
from runledger import AgentSpec, ScriptedModel
from {util} import MARK

WAIT = {wait}


async def agent(run):
    await run.now()
    if WAIT:
        await run.approval("ship", {{"mark": MARK}})
    return "{mark} " + MARK


def spec():
    return AgentSpec("{name}", agent, ScriptedModel([]){declared})
"""
FIX = """
import dataclasses

from {pkg}.agent import spec as original
from {util} import MARK


async def fixed(run):
    await run.now()
    return "fixed " + MARK


def spec():
    return dataclasses.replace(original(), fn=fixed)
"""
NEEDS_A_HOST_PACKAGE = """
import dataclasses

import duckdb  # installed on this host (the projections' extra), not in the sandbox image

from {pkg}.agent import spec as original


def spec():
    return dataclasses.replace(original(), fn=original().fn)
"""


@dataclass
class Project:
    root: Path
    pkg: str
    fix: str
    util: str
    name: str

    def agent(self, *, mark: str = "original", declared: str = "", wait: bool = False) -> None:
        version = f", agent_version={declared!r}" if declared else ""
        source = AGENT.format(util=self.util, wait=wait, mark=mark, name=self.name, declared=version)
        (self.root / self.pkg / "agent.py").write_text(source)
        code_identity.forget()

    @property
    def ref(self) -> str:
        return f"{self.pkg}.agent:spec"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    tag = os.urandom(4).hex()
    root = tmp_path / "code"
    made = Project(root, f"rl_own_{tag}", f"rl_own_{tag}_fix", f"rl_own_util_{tag}", f"own{tag}")
    for package in (made.pkg, made.fix):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / f"{made.util}.py").write_text("MARK = 'shared'\n")
    (root / made.fix / "agent.py").write_text(FIX.format(pkg=made.pkg, util=made.util))
    (root / made.fix / "needs_host.py").write_text(NEEDS_A_HOST_PACKAGE.format(pkg=made.pkg))
    made.agent()
    monkeypatch.syspath_prepend(str(root))
    # Outside the working directory: allowed as an operator would (re-runs load only allowed code).
    monkeypatch.setenv(ALLOW_CODE_ENV, f".,runledger.examples,{made.pkg},{made.fix}")
    yield made
    code_identity.forget()
    for name in [m for m in sys.modules if m.startswith("rl_own_")]:
        del sys.modules[name]


def fresh(ref: str) -> AgentSpec:
    """The agent ``ref`` names as a new process would load it: its modules imported again, hashes recomputed."""
    for name in [m for m in sys.modules if m.startswith("rl_own_")]:
        del sys.modules[name]
    code_identity.forget()
    return load_agent(ref)


async def test_adding_a_file_to_the_agents_package_keeps_its_recorded_runs_resumable(
    client: LedgerClient, project: Project
) -> None:
    project.agent(wait=True)
    spec = load_agent(project.ref)
    started = await start_run(client, spec, None, run_id=f"{project.name}-added")
    assert started.status == "suspended"
    legacy_before = legacy_code_hash(spec.fn)

    unrelated = "async def agent(run):\n    return 'imported by nobody'\n"
    (project.root / project.pkg / "agent_fixed.py").write_text(unrelated)
    again = fresh(project.ref)
    assert legacy_code_hash(again.fn) != legacy_before  # the directory rule would have refused the resume
    cp = fold((await load_run(client, started.run_id)).records)
    await approve(client, started.run_id, next(iter(cp.pending_approvals)), by="test")
    resumed = await resume_run(client, again, started.run_id)
    assert (resumed.status, resumed.output) == ("completed", "original shared")

    # The control: a change to a module the agent imports is another version of the code.
    project.agent(wait=True, mark="edited")
    other = await start_run(client, load_agent(project.ref), None, run_id=f"{project.name}-edited")
    assert other.status == "suspended"
    (project.root / f"{project.util}.py").write_text("MARK = 'changed'\n")
    with pytest.raises(VersionMismatchError, match="agent_version"):
        await resume_run(client, fresh(project.ref), other.run_id)


async def test_a_fix_in_a_sibling_package_that_imports_the_original_redrives_in_the_sandbox(
    client: LedgerClient, pool: SandboxPool, project: Project
) -> None:
    parent = await start_run(client, load_agent(project.ref), None, run_id=f"{project.name}-parent")
    assert (parent.status, parent.output) == ("completed", "original shared")
    fix_ref = f"{project.fix}.agent:spec"
    fix = load_agent(fix_ref)
    # What the plan checks before queueing: the candidate loads in the image, as the same version.
    assert await check_in_image(pool, fix, fix_ref) is None
    request = RerunRequest(parent_run_id=parent.run_id, agent=project.ref, mode="counterfactual", fork_step=0,
                           change={"agent": fix_ref})  # fmt: skip
    result = await Rerunner(client, pool).rerun(request)
    assert (result.status, result.output) == ("completed", "fixed shared"), result.error
    branch = fold((await load_run(client, result.run_id)).records)
    assert branch.parent is not None and branch.parent["changed"] == "agent_version"
    assert branch.version is not None and branch.version["agent_version"] == fix.version().agent_version
    assert branch.version["code_hash"] == fix.version().code_hash


async def test_the_plan_names_a_candidate_that_does_not_load_in_the_image(pool: SandboxPool, project: Project) -> None:
    ref = f"{project.fix}.needs_host:spec"
    problem = await check_in_image(pool, load_agent(ref), ref)
    assert problem is not None and "does not load in the sandbox image" in problem, problem
    assert "duckdb" in problem, problem


async def test_an_agent_with_a_declared_version_reruns_in_the_sandbox(
    client: LedgerClient, pool: SandboxPool, project: Project
) -> None:
    project.agent(declared="1.0.0")
    spec = load_agent(project.ref)
    parent = await start_run(client, spec, None, run_id=f"{project.name}-declared")
    assert parent.status == "completed"
    recorded = fold((await load_run(client, parent.run_id)).records).version
    assert recorded is not None and recorded["agent_version"] == "1.0.0"
    assert recorded["code_hash"] == spec.version().code_hash != "1.0.0"  # both recorded
    rerunner = Rerunner(client, pool)
    same = await rerunner.rerun(RerunRequest(parent_run_id=parent.run_id, agent=project.ref, mode="redrive",
                                             fork_step=0))  # fmt: skip
    assert (same.status, same.output) == ("completed", "original shared"), same.error

    # The code on disk changes under the same declared version, after this worker loaded the agent:
    # the sandbox gets the new code, and runs it: a declared version is compared with a declared version.
    project.agent(declared="1.0.0", mark="hotfixed")
    changed = await rerunner.rerun(RerunRequest(parent_run_id=parent.run_id, agent=project.ref, mode="redrive",
                                                fork_step=0))  # fmt: skip
    assert (changed.status, changed.output) == ("completed", "hotfixed shared"), changed.error


async def test_runs_recorded_under_the_directory_rule_still_resume_and_rerun(
    client: LedgerClient, pool: SandboxPool, project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade orphans no run: a version tuple recorded before code hashes covered import closures (no
    ``code_hash``; ``agent_version`` the hash of the agent's directory) is compared by that rule."""
    current = AgentSpec.version

    def as_recorded_before(self: AgentSpec) -> VersionTuple:
        return current(self).model_copy(update={"agent_version": legacy_code_hash(self.fn), "code_hash": None})

    async def record_legacy(run_id: str) -> Any:
        with monkeypatch.context() as m:
            m.setattr(AgentSpec, "version", as_recorded_before)  # as the code before import closures recorded it
            return await start_run(client, fresh(project.ref), None, run_id=run_id)

    done = await record_legacy(f"{project.name}-legacy-done")
    recorded = fold((await load_run(client, done.run_id)).records).version
    assert recorded is not None and "code_hash" not in recorded
    fn = load_agent(project.ref).fn
    assert recorded["agent_version"] == legacy_code_hash(fn) != code_hash(fn)
    result = await Rerunner(client, pool).rerun(
        RerunRequest(parent_run_id=done.run_id, agent=project.ref, mode="redrive", fork_step=0)
    )
    assert (result.status, result.output) == ("completed", "original shared"), result.error

    project.agent(wait=True)
    waiting = await record_legacy(f"{project.name}-legacy-waits")
    assert waiting.status == "suspended"
    cp = fold((await load_run(client, waiting.run_id)).records)
    await approve(client, waiting.run_id, next(iter(cp.pending_approvals)), by="test")
    resumed = await resume_run(client, fresh(project.ref), waiting.run_id)
    assert (resumed.status, resumed.output) == ("completed", "original shared")
