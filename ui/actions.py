"""Operator actions of the page, through exactly the functions the CLI calls, recorded the same way.

==========================  =====================================================================
on the page                 the CLI's code
==========================  =====================================================================
approve / deny              ``runledger.ops.decisions.approve`` (``runledger approve``)
resume after the decision   ``runledger.sdk.lifecycle.resume_run`` (``runledger resume``), for the
                            agents the page was started with (``runledger ui --agent MODULE:ATTR``);
                            a branch, which ``resume_run`` never drives on the host, is queued for a
                            worker under its own request (``runledger.sandbox.resume.queue_branch_resume``)
resolve an in-doubt effect  ``runledger.sdk.effects.resolve_key`` (``runledger effects resolve``),
                            then resumed as after a decision
queue a re-run              ``runledger.sandbox.worker.submit`` of a ``RerunRequest``
                            (``runledger rerun RUN ... `` without ``--local``)
==========================  =====================================================================

A re-run is planned before it is queued (``plan_rerun``): what the branch will be called, and for
each recorded step whether the branch serves it from the record, runs it live, stubs it or refuses
it (``runledger.sandbox.plan.plan_branch``, what ``runledger rerun --plan`` prints), and whether
the agent the page would name has the parent's version tuple (code edited in place since is re-run as
a counterfactual of the agent element; anything else a worker would refuse) or, for a counterfactual,
changes exactly one element (``runledger.sandbox.rerun.branch_spec``), where it forks (``--at-step``,
else the decision) and whether the change will be exercised from there. The plan's request, with its
request id, is what the queue button submits: the branch run id shown is the one the worker creates.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from runledger.errors import BranchOnHostError, ConfigurationError, LedgerError
from runledger.log.client import LedgerClient
from runledger.ops.decisions import approve
from runledger.record.events import Event
from runledger.record.fold import Checkpoint
from runledger.sandbox.plan import BranchPlan, plan_branch
from runledger.sandbox.rerun import RerunRequest
from runledger.sandbox.resume import queue_branch_resume
from runledger.sandbox.worker import submit
from runledger.sdk.agent import AgentSpec, load_agent
from runledger.sdk.effects import KeyState, resolve_key
from runledger.sdk.lifecycle import RunResult, resume_run

logger = logging.getLogger(__name__)

MODES = ("redrive", "live", "counterfactual")
MODE_TEXT = {
    "redrive": "the model runs live; tools, effects, clock and randomness are served from the record by "
    "position; the first call the record cannot answer ends the branch (diverged)",
    "live": "the model and read tools run live; effects go through dry-run stubs (a key committed with the "
    "same arguments returns its recorded result, any other is simulated)",
    "counterfactual": "as the base mode, with exactly one of model / prompt / agent changed",
}


class Resumer:
    """Resumes runs after a decision, in the page's process, for the agents it was given."""

    def __init__(self, refs: list[str]) -> None:
        self.refs: dict[str, str] = {}
        self.specs: dict[str, AgentSpec] = {}
        for ref in refs:
            spec = load_agent(ref)
            self.refs[spec.name] = ref
            self.specs[spec.name] = spec
        self.tasks: set[asyncio.Task[None]] = set()
        self.results: dict[str, RunResult | str] = {}  # run id -> the last resume's result (or error)

    def can_resume(self, agent: str) -> bool:
        return agent in self.specs

    def resume_later(self, client: LedgerClient, run_id: str, agent: str) -> bool:
        spec = self.specs.get(agent)
        if spec is None:
            return False
        task = asyncio.create_task(self._resume(client, spec, run_id), name=f"runledger-ui-resume-{run_id}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def _resume(self, client: LedgerClient, spec: AgentSpec, run_id: str) -> None:
        try:
            try:
                self.results[run_id] = await resume_run(client, spec, run_id)
            except BranchOnHostError:
                # A branch goes on only in a sandbox: its own request, to a worker (as the page's re-runs).
                _, done = await queue_branch_resume(client, run_id, self.refs.get(spec.name))
                self.results[run_id] = done or RunResult(run_id, "running", reason="queued for a worker's sandbox")
        except LedgerError as exc:
            logger.warning("resuming run %s failed: %s", run_id, exc)
            self.results[run_id] = str(exc)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def decide(client: LedgerClient, run_id: str, request_id: str, *, by: str, approved: bool, reason: str) -> Event:
    """``runledger approve RUN REQUEST --by NAME [--deny] [--reason ...]``."""
    return await approve(client, run_id, request_id, by=by.strip(), approved=approved, reason=reason.strip())


async def resolve(
    client: LedgerClient, key: str, *, agent: str | None, committed: bool, by: str, reason: str, result: Any,
    force: bool,
) -> KeyState:  # fmt: skip
    """``runledger effects resolve KEY --committed|--not-committed --by NAME [--force]``."""
    return await resolve_key(client, key, committed=committed, by=by.strip(), reason=reason.strip(), result=result,
                             force=force, agent=agent)  # fmt: skip


@dataclass
class RerunPlan:
    request: RerunRequest
    parent: Checkpoint
    branch: BranchPlan  # each step: from the record, live, stubbed or refused (``runledger rerun --plan``)
    mode_text: str = ""
    changed: str | None = None
    changed_from: Any = None
    changed_to: Any = None

    @property
    def fork_step(self) -> int:
        return self.branch.fork_step

    @property
    def problems(self) -> list[str]:  # why it cannot be queued as it is
        return self.branch.problems

    @property
    def ok(self) -> bool:
        return self.branch.ok


def rerun_request(parent_run_id: str, form: dict[str, str], request_id: str | None = None) -> RerunRequest:
    """The ``RerunRequest`` the CLI's ``rerun`` would build from these flags. Raises ConfigurationError."""
    mode = form.get("mode", "redrive")
    if mode not in MODES:
        raise ConfigurationError(f"mode must be one of {', '.join(MODES)}")
    agent = form.get("agent", "").strip()
    if not agent:
        raise ConfigurationError("name the agent that re-runs it: MODULE:ATTR")
    change: dict[str, str] = {}
    if mode == "counterfactual":
        what, value = form.get("set_what", "").strip(), form.get("set_value", "").strip()
        if not what or not value:
            raise ConfigurationError("a counterfactual changes one of model / prompt / agent: give it and its value")
        change[what] = value
    at = form.get("at_step", "").strip()
    try:
        fork_step = int(at) if at else None
        timeout = float(form.get("timeout", "") or 60.0)
    except ValueError as exc:
        raise ConfigurationError(f"not a number: {exc}") from exc
    base = form.get("base_mode", "redrive")
    live_tools = [t.strip() for t in form.get("live_tools", "").split(",") if t.strip()] or None
    values: dict[str, Any] = {
        "parent_run_id": parent_run_id, "agent": agent, "mode": mode, "fork_step": fork_step,
        "base_mode": base if base in ("redrive", "live") else "redrive", "change": change,
        "allow_effects": form.get("allow_effects") == "on", "live_tools": live_tools, "timeout_s": timeout,
    }  # fmt: skip
    if request_id:
        values["request_id"] = request_id
    try:
        return RerunRequest(**values)
    except ValueError as exc:
        raise ConfigurationError(f"not a valid re-run request: {exc}") from exc


def plan_rerun(parent: Checkpoint, request: RerunRequest) -> RerunPlan:
    """What queuing ``request`` will do step by step, and what would stop a worker from doing it: the
    plan ``runledger rerun --plan`` prints (``runledger.sandbox.plan.plan_branch``)."""
    branch = plan_branch(parent, request)
    plan = RerunPlan(request, parent, branch, mode_text=MODE_TEXT[request.mode])
    if plan.ok:  # code edited in place since the record: the agent counterfactual it is
        plan.changed, plan.changed_from, plan.changed_to = branch.changed, branch.changed_from, branch.changed_to
    return plan


async def queue_rerun(client: LedgerClient, request: RerunRequest) -> None:
    """Queue it for a worker, as ``runledger rerun`` does without ``--local``."""
    await submit(client, request)
