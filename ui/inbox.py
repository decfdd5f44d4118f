"""The approvals inbox: every pending approval and every effect in doubt, across runs, in one place.

Which runs need an operator comes from the projection (``runs.pending_approvals`` and the in-doubt
keys their own subjects still hold claimed, as the run list counts them); what each one asks comes
from the run's log through the viewer's own connection (``runview.read_run``), so the arguments are
opened as the viewer's credentials allow and the state is the fold's, never a projection lagging
behind a decision just made. The forms post to the routes the run page uses (approve / deny,
resolve), which call the CLI's functions: the inbox adds no way to decide.

At most ``INBOX_LIMIT`` runs are read a request (the oldest waiting first: they have waited
longest); the page says when more are waiting.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from runledger.errors import LedgerError
from runledger.ui.listing import IN_DOUBT_KEYS
from runledger.ui.projection import ProjectionFollower
from runledger.ui.runview import Approval, Effect, approvals, effects, read_run, settled
from runledger.ui.viewers import Viewer

INBOX_LIMIT = 100


@dataclass
class InboxRun:
    run_id: str
    agent: str
    status: str
    started_at: Any
    approvals: list[Approval]  # pending only
    effects: list[Effect]  # in doubt only


@dataclass
class Inbox:
    runs: list[InboxRun] = field(default_factory=list)
    waiting: int = 0  # runs the projection lists as waiting for an operator
    unreadable: list[str] = field(default_factory=list)  # runs the viewer's connection could not read

    @property
    def approvals(self) -> int:
        return sum(len(r.approvals) for r in self.runs)

    @property
    def effects(self) -> int:
        return sum(len(r.effects) for r in self.runs)


async def inbox(follower: ProjectionFollower, viewer: Viewer) -> Inbox:
    """What waits for an operator, run by run, oldest first."""
    await follower.caught_up()
    scope, params = ("AND r.agent = ?", [viewer.agent]) if viewer.agent else ("", [])
    waiting = (f"(len(r.pending_approvals) > 0 OR len({IN_DOUBT_KEYS}) > 0) "
               f"AND r.status NOT IN ('completed', 'failed') {scope}")  # fmt: skip
    total = (await follower.query(f"SELECT count(*) FROM runs r WHERE {waiting}", params)).rows[0][0]
    found = await follower.query(
        f"SELECT r.run_id, r.agent, r.started_at FROM runs r WHERE {waiting} "
        "ORDER BY r.started_at NULLS LAST, r.run_id LIMIT ?",
        [*params, INBOX_LIMIT],
    )
    gate = asyncio.Semaphore(8)

    async def read(run_id: str, agent: str, started_at: Any) -> InboxRun | None:
        async with gate:
            try:
                log, cp = await read_run(viewer, run_id)
                doubt = await settled(viewer, [e for e in effects(cp) if e.state == "in_doubt"])
            except LedgerError:
                return None
        asked = [a for a in approvals(cp, log.records)
                 if a.status == "pending" and a.request_id in cp.pending_approvals]  # fmt: skip
        doubt = [e for e in doubt if e.state == "in_doubt"]
        return InboxRun(run_id, agent or cp.agent, cp.status, started_at, asked, doubt)

    read_runs = await asyncio.gather(*(read(*row) for row in found.rows))
    box = Inbox(waiting=int(total))
    for row, got in zip(found.rows, read_runs, strict=True):
        if got is None:
            box.unreadable.append(row[0])
        elif got.approvals or got.effects:
            box.runs.append(got)
    return box
