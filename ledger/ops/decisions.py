"""Operator decisions recorded into a run: approvals and budget grants.

The operator is a second writer on the run's subject, so each decision is appended
fenced on the run's last event, exactly like the agent's own steps: a decision
made against a stale view of the run is rejected instead of interleaved.
"""

from __future__ import annotations

from runledger.errors import ConfigurationError, LedgerError
from runledger.log.append import append_to_run
from runledger.log.client import LedgerClient
from runledger.protect.runs import load_run
from runledger.record.events import ApprovalResolved, BudgetGranted, Event
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
