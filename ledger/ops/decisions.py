"""Operator decisions recorded into a run: approvals, budget grants, accepted versions, retries.

A decision travels on the run's operator subject (``ledger.run.<agent>.<run_id>.o``), which only
operators may publish to (runledger.protect.roles), and the fold honours a decision only from
there (runledger.record.fold.check_writer): an agent cannot approve its own approval, grant
itself budget or retry its own failed run, a worker cannot decide at all. It continues the run's
one chain, appended fenced on the run's last event whoever wrote it: a decision made against a
stale view of the run is rejected instead of interleaved.
"""

from __future__ import annotations

from runledger.errors import ConfigurationError, LedgerError
from runledger.log.append import append_to_run
from runledger.log.client import LedgerClient
from runledger.protect.loading import load_run
from runledger.record.events import ApprovalResolved, BudgetGranted, Event, RunRetried, VersionAccepted
from runledger.record.fold import fold


async def approve(
    client: LedgerClient, run_id: str, request_id: str, *, by: str, approved: bool = True, reason: str = ""
) -> Event:
    """Record a decision on a pending approval (bound to the digest that was requested)."""
    if not by:
        raise ConfigurationError("say who decides: --by NAME")
    log = await load_run(client, run_id, open_content=False)
    cp = fold(log.records)
    pending = cp.pending_approvals.get(request_id)
    if pending is None:
        known = ", ".join(sorted(cp.pending_approvals)) or "none"
        raise LedgerError(f"run {run_id} has no pending approval {request_id!r} (pending: {known})")
    body = ApprovalResolved(request_id=request_id, digest=pending["digest"], approved=approved, by=by, reason=reason)
    event, _ = await append_to_run(client, run_id, body, log=log)
    return event


async def grant_budget(
    client: LedgerClient,
    run_id: str,
    *,
    by: str,
    turns: int = 0,
    tokens: int = 0,
    seconds: float = 0.0,
    reason: str = "",
) -> Event:
    """Record extra budget for a run: the only way a limit grows."""
    if not by:
        raise ConfigurationError("say who grants the budget: --by NAME")
    if turns < 0 or tokens < 0 or seconds < 0 or not (turns or tokens or seconds):
        raise ConfigurationError("grant a positive amount: --turns N, --tokens N or --seconds S")
    event, _ = await append_to_run(
        client, run_id, BudgetGranted(turns=turns, tokens=tokens, seconds=seconds, by=by, reason=reason)
    )
    return event


async def accept_version(client: LedgerClient, run_id: str, agent_version: str, *, by: str, reason: str = "") -> Event:
    """Accept ``agent_version`` (the version of code with a fix) for a recorded run, so that it can be
    resumed with that code: ``resume`` then compares against it. Only the code's version can be
    accepted; journal replay still checks every recorded step against the new code."""
    if not by:
        raise ConfigurationError("say who accepts the version: --by NAME")
    if not agent_version:
        raise ConfigurationError("name the version to accept")
    log = await load_run(client, run_id, open_content=False)
    cp = fold(log.records)
    if cp.version is None:
        raise LedgerError(f"run {run_id} has no run.started event: there is no version to replace")
    if cp.status in ("completed", "failed") and not cp.failure_retryable:
        raise LedgerError(f"run {run_id} is {cp.status}: there is nothing to continue")
    previous = str(cp.version.get("agent_version"))
    if previous == agent_version:
        raise LedgerError(f"run {run_id} already runs version {agent_version!r}")
    body = VersionAccepted(agent_version=agent_version, previous=previous, by=by, reason=reason)
    event, _ = await append_to_run(client, run_id, body, log=log)
    return event


async def retry_run(client: LedgerClient, run_id: str, *, by: str, reason: str = "") -> Event:
    """Let a run that failed on a retryable error (``run.failed`` ``retryable``: a rate limit, a
    timeout) go on: records ``run.retried`` naming its failed step, after which the agent's next
    ``resume`` runs that step again, live. A final failure cannot be retried (fork a branch)."""
    if not by:
        raise ConfigurationError("say who retries the run: --by NAME")
    log = await load_run(client, run_id, open_content=False)
    cp = fold(log.records)
    if cp.status != "failed" or not cp.failure_retryable:
        state = f"{cp.status} ({cp.failure_reason}, a final failure)" if cp.status == "failed" else cp.status
        raise LedgerError(
            f"run {run_id} is {state}: a retry continues only a run that failed on a retryable error (a rate "
            "limit, a timeout); fork a branch to try something else"
        )
    body = RunRetried(step=cp.failed_step, by=by, reason=reason)
    event, _ = await append_to_run(client, run_id, body, log=log)
    return event
