"""Resuming a branch: a re-run's branch goes on only in a sandbox, under its own rules.

A branch (the run a re-run opened, written by a worker as ``w``) can stop before its outcome: it
waits for an approval its parent never had, an effect of it is in doubt, its worker died. Resuming
it on the host (``runledger.sdk.lifecycle.resume_run``, ``runledger resume``, the page after an
approval) would drive its agent in the host's process: its tools and effects for real, with the
host's credentials, whatever its mode said. ``resume_run`` refuses a branch (BranchOnHostError)
before it writes anything, and the branch is re-driven here instead, exactly as a redelivered
re-run request is: the request that opened it, recorded in its ``run.forked``
(``RunForked.request``), goes to a ``Rerunner`` again, which resumes the branch fenced
(``run.resumed``) and drives it in a sandbox under the branch's own mode. Effects stay stubbed
unless that request allowed them (``--allow-effects``, which only an operator's request carries:
workers take requests from the operator's queue), and the names it carries are checked against the
operator's allow-list again (``check_names``).

``branch_to_resume`` reads the branch and rebuilds its request (or says there is nothing to do:
it ended, or still waits for a decision); ``resume_branch`` drives it here (``runledger resume``
with the sandbox installed); ``queue_branch_resume`` hands it to a worker (the page, which
queues its re-runs too).

Rejected: resuming a branch with the ``--agent`` the operator names and the flags of the
``resume`` command. A branch's rules are the ones its re-run was given: nothing typed at resume
time may widen them (``--allow-effects`` least of all). A branch recorded before ``run.forked``
held its request is resumed with what ``run.forked`` says (mode, fork step) and effects stubbed;
a counterfactual one cannot be (its change is not recorded whole): re-run its parent.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import ValidationError

from runledger.log.client import LedgerClient
from runledger.log.subjects import RERUN_SUBJECT
from runledger.protect.loading import load_run
from runledger.record.fold import Checkpoint, fold
from runledger.sandbox.errors import RerunRequestError
from runledger.sandbox.rerun import Rerunner, RerunRequest, RerunResult, check_names
from runledger.sdk.agent import CodeAllowList

BRANCH_PREFIX = "br-"  # RerunRequest.branch_run_id: "br-<request id>"


def branch_request(run_id: str, cp: Checkpoint, agent: str | None = None) -> RerunRequest:
    """The re-run request that opened branch ``run_id`` (``cp``: the branch folded), as its
    ``run.forked`` recorded it. A branch recorded before the request was: rebuilt from
    ``run.forked`` (mode, fork step) with ``agent`` (MODULE:ATTR) and effects stubbed.

    Raises RerunRequestError when the run is no branch, its request does not match it, or it
    cannot be rebuilt (a counterfactual recorded before the request was, or no ``agent``)."""
    forked = cp.parent
    if forked is None:
        raise RerunRequestError(f"run {run_id} is not a branch (it has no run.forked)")
    recorded = forked.get("request")
    if recorded is not None:
        try:
            request = RerunRequest.model_validate(recorded)
        except ValidationError as exc:
            raise RerunRequestError(f"branch {run_id} recorded a re-run request that is not valid: {exc}") from exc
        if request.branch_run_id != run_id or request.parent_run_id != forked.get("forked_from"):
            raise RerunRequestError(
                f"branch {run_id} recorded the request of branch {request.branch_run_id} of "
                f"{request.parent_run_id}: not its own, so it is not resumed"
            )
        return request
    mode = forked.get("mode")
    if mode not in ("redrive", "live") or not run_id.startswith(BRANCH_PREFIX):
        raise RerunRequestError(
            f"branch {run_id} ({mode}) was recorded without its re-run request and cannot be resumed under its own "
            f"rules: re-run its parent {forked.get('forked_from')} instead"
        )
    if not agent:
        raise RerunRequestError(f"name the agent that recorded branch {run_id}'s parent: --agent MODULE:ATTR")
    return RerunRequest(
        parent_run_id=str(forked.get("forked_from")), agent=agent, mode=mode, fork_step=forked.get("fork_step"),
        request_id=run_id[len(BRANCH_PREFIX):],
    )  # fmt: skip


def _nothing_to_do(run_id: str, cp: Checkpoint, request: RerunRequest) -> RerunResult | None:
    """The branch's state when resuming it would do nothing: it ended, or waits for a decision."""
    forked = cp.parent or {}
    common: dict[str, Any] = {
        "parent_run_id": request.parent_run_id, "fork_step": int(forked.get("fork_step") or 0),
        "mode": request.mode, "changed": forked.get("changed"), "nothing_to_do": True,
    }  # fmt: skip
    if cp.status in ("completed", "failed"):
        error = (cp.error or {}).get("message") if isinstance(cp.error, dict) else None
        return RerunResult(run_id, cp.status, output=cp.output, reason=cp.failure_reason, error=error, **common)
    if cp.pending_approvals:
        return RerunResult(run_id, "suspended", reason="approval", pending=sorted(cp.pending_approvals), **common)
    return None


async def branch_to_resume(
    client: LedgerClient, run_id: str, agent: str | None = None
) -> tuple[RerunRequest, RerunResult | None]:
    """The request that re-drives branch ``run_id``, and the branch's result when there is nothing
    to do (it ended, or an approval is still pending: resuming would only ask again). Raises
    RunNotFoundError, RerunRequestError (``branch_request``)."""
    log = await load_run(client, run_id, open_content=False)
    cp = fold(log.records)
    request = branch_request(run_id, cp, agent)
    return request, _nothing_to_do(run_id, cp, request)


async def resume_branch(rerunner: Rerunner, run_id: str, agent: str | None = None) -> RerunResult:
    """Resume branch ``run_id`` here: re-driven in a sandbox of ``rerunner``'s pool under its own
    request (``branch_to_resume``), fenced like a redelivered re-run. Returns its result
    (``resumed``; ``nothing_to_do`` when it ended or waits for a decision)."""
    request, done = await branch_to_resume(rerunner.client, run_id, agent)
    if done is not None:
        return done
    result = await rerunner.rerun(request)
    return dataclasses.replace(result, resumed=True)


async def queue_branch_resume(
    client: LedgerClient, run_id: str, agent: str | None = None, allowed: CodeAllowList | None = None
) -> tuple[RerunRequest, RerunResult | None]:
    """Queue branch ``run_id``'s own request for a worker, which resumes the branch in a sandbox (as a
    redelivered request). Nothing is queued when there is nothing to do (the result says why).

    The message id names the branch's position (``rerun:<request id>:resume:<next seq>``): the
    request's first delivery used ``rerun:<request id>``, which the stream would take for a
    duplicate, and a second click on the same suspended branch is one. Raises CodeNotAllowedError,
    queuing nothing, when the request names code outside ``allowed`` (default ``$RUNLEDGER_ALLOW_CODE``,
    as ``submit``); the worker checks it against its own list again."""
    log = await load_run(client, run_id, open_content=False)
    cp = fold(log.records)
    request = branch_request(run_id, cp, agent)
    done = _nothing_to_do(run_id, cp, request)
    if done is not None:
        return request, done
    check_names(request, CodeAllowList.from_env() if allowed is None else allowed)
    await client.js.publish(
        RERUN_SUBJECT, request.model_dump_json().encode(),
        headers={"Nats-Msg-Id": f"rerun:{request.request_id}:resume:{cp.next_seq}"},
    )  # fmt: skip
    return request, None
