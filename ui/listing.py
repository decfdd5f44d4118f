"""The run list: the projection's ``runs`` with their cost, filtered, sorted and paged in SQL.

Paging is by offset: a page's ids are a top-N over ``runs`` alone (at 100,000 runs, page 100
costs about what page 1 does), and the total is a plain ``count(*)`` of ``runs``. Rejected:
keyset paging (``started_at < last seen``), which makes a page's link depend on the page before it
and cannot jump to a page number, for a saving the top-N does not need at this size.

A page is shown in groups (``group``): a run's forks and child runs that are on the same page go
under it, depth first. Rejected: choosing a page's first runs with a join of ``runs`` against
itself (a run whose parent passes the filters is no group's first run), which put every branch
under its parent whatever its page but cost a hash join over every run twice a request (ten times
the list's time at 100,000 runs, 10% of them branches, measured here); the rows of a page already
name their parents. ``branches=hide`` is a filter (runs that are no branch) and one count of the
listed runs' branches.

Search looks at recorded content, so it cannot be SQL: in the projection content stays sealed.
It reads the newest ``SEARCH_LIMIT`` runs that pass the other filters from the log through the
viewer's own connection, opened where the viewer's credentials can open them
(``runledger.protect.loading.load_run``), and keeps those whose content, ids or names contain the
text; sealed content the viewer cannot open is never searched. The page says when the limit cut
the search short.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from runledger.errors import LedgerError
from runledger.ops.trace import live_status
from runledger.protect.loading import load_run
from runledger.ui.projection import ProjectionFollower
from runledger.ui.render import stand_in
from runledger.ui.viewers import Viewer

SEARCH_LIMIT = 200
PER_PAGE = 50
MAX_DEPTH = 6  # levels of branches listed under a run (a fork of a fork of ...)
MAX_BRANCHES = 500  # branches listed on one page, all groups together
_PARENT = "coalesce(r.parent_run_id, r.child_of_run_id)"  # the run a run was forked from or started by
_NOT_A_BRANCH = "(r.parent_run_id IS NULL AND r.child_of_run_id IS NULL)"
_NEVER = dt.datetime.min.replace(tzinfo=dt.UTC)
STATUSES = ("running", "suspended", "completed", "failed", "broken", "unknown")
# column name on the page -> SQL expression (NULLs last either way)
SORTS: dict[str, str] = {
    "run": "r.run_id",
    "status": "r.status",
    "agent": "r.agent",
    "version": "r.agent_version",
    "started": "r.started_at",
    "duration": "r.duration_s",
    "steps": "r.steps",
    "tokens": "r.tokens",
    "cost": "c.cost_usd",
    "approvals": "len(r.pending_approvals)",
    "doubt": "len(r.in_doubt_keys)",
}

# The keys the run's record leaves in doubt that their own subject still holds claimed by the run: a
# key an operator resolved since is no longer in doubt, though the run records its outcome only on
# its next resume (``runs.in_doubt_keys`` is the record's word).
IN_DOUBT_KEYS = (
    "coalesce((SELECT list(k.key ORDER BY k.key) FROM effect_keys k WHERE k.run_id = r.run_id "
    "AND k.status = 'claimed' AND list_contains(r.in_doubt_keys, k.key)), [])"
)
_COLUMNS = (
    "r.run_id, r.status, r.agent, r.agent_version, r.model, r.started_at, r.ended_at, r.duration_s, r.steps, "
    f"r.tokens, c.cost_usd, coalesce(c.priced, true), r.pending_approvals, {IN_DOUBT_KEYS}, r.parent_run_id, "
    "r.fork_step, r.fork_mode, r.child_of_run_id, r.failure_reason, coalesce(r.forgeries, 0)"
)


@dataclass(frozen=True)
class RunFilter:
    status: str = ""
    agent: str = ""
    version: str = ""
    since: str = ""  # ISO date or date-time, UTC
    until: str = ""
    q: str = ""
    sort: str = "started"
    desc: bool = True
    page: int = 1
    per_page: int = PER_PAGE
    branches: bool = True  # forks and child runs listed under their parent (False: only counted)

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> RunFilter:
        sort = params.get("sort", "started")
        try:
            page = max(1, int(params.get("page", "1")))
        except ValueError:
            page = 1
        return cls(
            status=params.get("status", "") if params.get("status", "") in STATUSES else "",
            agent=params.get("agent", "").strip(), version=params.get("version", "").strip(),
            since=params.get("since", "").strip(), until=params.get("until", "").strip(), q=params.get("q", "").strip(),
            sort=sort if sort in SORTS else "started", desc=params.get("dir", "desc") != "asc", page=page,
            branches=params.get("branches", "") != "hide",
        )  # fmt: skip

    def query(self, **changes: Any) -> str:
        """The URL query string of this filter with ``changes``."""
        from urllib.parse import urlencode

        f = replace(self, **changes)
        values = {"status": f.status, "agent": f.agent, "version": f.version, "since": f.since, "until": f.until,
                  "q": f.q, "sort": f.sort, "dir": "desc" if f.desc else "asc", "page": str(f.page),
                  "branches": "" if f.branches else "hide"}  # fmt: skip
        return urlencode({k: v for k, v in values.items() if v and not (k == "page" and v == "1")})

    def sort_link(self, column: str) -> str:
        desc = not self.desc if column == self.sort else column in ("started", "duration", "tokens", "cost", "steps")
        return self.query(sort=column, desc=desc, page=1)


@dataclass
class RunRow:
    run_id: str
    status: str
    agent: str
    agent_version: str
    model: str
    started_at: Any
    ended_at: Any
    duration_s: float | None
    steps: int
    tokens: int | None
    cost: float | None
    priced: bool
    pending_approvals: list[str]
    in_doubt: list[str]
    parent_run_id: str | None
    fork_step: int | None
    fork_mode: str | None
    child_of: str | None
    failure_reason: str | None
    forgeries: int = 0  # messages under the run's id that are not its own (``runs.forgeries``): an alarm


@dataclass
class Branch:
    """A fork or child run listed under the run its lineage starts from (``depth`` 1: a direct one)."""

    row: RunRow
    depth: int
    parent: str  # the run it was forked from or started by


@dataclass
class RunPage:
    filter: RunFilter
    rows: list[RunRow]  # the groups' first runs: runs whose parent is not listed with them
    total: int
    branches: dict[str, list[Branch]] = field(default_factory=dict)  # a row's run id -> its branches, in tree order
    agents: list[str] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    searched: int = 0  # runs whose content was searched
    search_capped: bool = False  # more runs passed the filters than were searched
    stale: bool = False  # the projection had not caught up with the stream within the wait

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.filter.per_page))


def _timestamp(text: str, end: bool) -> dt.datetime | None:
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    if end and len(text) <= 10:  # a date: the whole day
        value += dt.timedelta(days=1)
    return value


def where(f: RunFilter, viewer: Viewer, run_ids: list[str] | None = None, alias: str = "r") -> tuple[str, list[Any]]:
    clauses, params = ["true"], []  # type: tuple[list[str], list[Any]]
    if viewer.agent is not None:
        clauses.append(f"{alias}.agent = ?")
        params.append(viewer.agent)
    for column, value in (("status", f.status), ("agent", f.agent), ("agent_version", f.version)):
        if value:
            clauses.append(f"{alias}.{column} = ?")
            params.append(value)
    since, until = _timestamp(f.since, False), _timestamp(f.until, True)
    if since is not None:
        clauses.append(f"{alias}.started_at >= ?")
        params.append(since)
    if until is not None:
        clauses.append(f"{alias}.started_at < ?")
        params.append(until)
    if run_ids is not None:
        clauses.append(f"list_contains(?, {alias}.run_id)")
        params.append(run_ids)
    if not f.branches:
        clauses.append(_NOT_A_BRANCH.replace("r.", f"{alias}."))
    return " AND ".join(clauses), params


async def run_page(follower: ProjectionFollower, viewer: Viewer, f: RunFilter) -> RunPage:
    """One page of the list. Unless it is sorted by cost, the page's run ids are chosen on ``runs``
    alone, then read in full with the cost of those runs only: ``run_costs`` aggregates every model
    step of the projection, which at 100,000 runs was most of a request's time (``bench/ui.py``)."""
    stale = not await follower.caught_up()
    run_ids: list[str] | None = None
    searched, capped = 0, False
    if f.q:
        run_ids, searched, capped = await search(follower, viewer, f)
    sql_where, params = where(f, viewer, run_ids)
    total = (await follower.query(f"SELECT count(*) FROM runs r WHERE {sql_where}", params)).rows[0][0]
    direction = "DESC" if f.desc else "ASC"
    order = f"{SORTS[f.sort]} {direction} NULLS LAST, r.run_id {direction}"
    paging = [f.per_page, (f.page - 1) * f.per_page]
    if f.sort == "cost":
        rows = await _by_cost(follower, sql_where, params, order, direction, paging)
    else:
        chosen = await follower.query(
            f"SELECT r.run_id FROM runs r WHERE {sql_where} ORDER BY {order} LIMIT ? OFFSET ?", [*params, *paging]
        )
        rows = await _rows(follower, [run_id for (run_id,) in chosen.rows])
    rows = await _stalled(follower, rows)
    if f.branches:
        rows, branches = group(rows)
    else:
        branches = await _hidden_branches(follower, sql_where.replace(_NOT_A_BRANCH, "true"), params, rows)
    scope, scope_params = ("WHERE agent = ?", [viewer.agent]) if viewer.agent else ("", [])
    agents = (await follower.query(f"SELECT DISTINCT agent FROM runs {scope} ORDER BY 1", scope_params)).rows
    versions = (await follower.query(f"SELECT DISTINCT agent_version FROM runs {scope} ORDER BY 1", scope_params)).rows
    return RunPage(f, rows, int(total), branches, [a for (a,) in agents if a], [v for (v,) in versions if v],
                   searched, capped, stale)  # fmt: skip


def group(rows: list[RunRow]) -> tuple[list[RunRow], dict[str, list[Branch]]]:
    """The page's rows as groups: a row whose parent (the run it was forked from or started by) is on
    the page goes under it, depth first in start order; the others start groups, in the page's order."""
    on_page = {r.run_id: r for r in rows}
    edges = [(r.run_id, parent) for r in sorted(rows, key=_started)
             if (parent := r.parent_run_id or r.child_of) is not None and parent in on_page]  # fmt: skip
    grouped = {run_id for run_id, _ in edges}
    roots = [r for r in rows if r.run_id not in grouped]
    tree = descendants(edges, [r.run_id for r in roots])
    listed = {run_id for kids in tree.values() for run_id, _, _ in kids}
    roots += [r for r in rows if r.run_id in grouped and r.run_id not in listed]  # a lineage that loops
    branches = {root: [Branch(on_page[i], d, parent) for i, d, parent in kids] for root, kids in tree.items()}
    return roots, branches


def _started(row: RunRow) -> tuple[bool, dt.datetime, str]:
    return row.started_at is None, row.started_at or _NEVER, row.run_id


async def _hidden_branches(
    follower: ProjectionFollower, sql_where: str, params: list[Any], rows: list[RunRow]
) -> dict[str, list[Branch]]:
    """With ``branches=hide``: each listed run's forks and child runs that pass the other filters,
    counted (their rows are not read)."""
    if not rows:
        return {}
    marks = ", ".join("?" * len(rows))
    found = await follower.query(
        f"SELECT {_PARENT}, list(r.run_id ORDER BY r.started_at, r.run_id) FROM runs r WHERE {sql_where} "
        f"AND {_PARENT} IN ({marks}) GROUP BY 1", [*params, *(r.run_id for r in rows)],
    )  # fmt: skip
    return {parent: [Branch(_counted(i), 1, parent) for i in kids] for parent, kids in found.rows}


def _counted(run_id: str) -> RunRow:
    """A branch the list counts but does not show: its id only."""
    return RunRow(run_id, "", "", "", "", None, None, None, 0, None, None, True, [], [], None, None, None, None, None)


def descendants(edges: list[tuple[str, str]], roots: list[str]) -> dict[str, list[tuple[str, int, str]]]:
    """root -> its branches among ``edges`` (run id, parent), depth first in the edges' order (start
    time): (run id, depth, parent). At most ``MAX_DEPTH`` levels and ``MAX_BRANCHES`` runs a page.
    A branch is reached only from a listed run, so its parent passed the filters."""
    kids: dict[str, list[str]] = {}
    for run_id, parent in edges:
        kids.setdefault(parent, []).append(run_id)
    listed = 0
    tree: dict[str, list[tuple[str, int, str]]] = {}
    for root in roots:
        out: list[tuple[str, int, str]] = []
        stack = [(kid, 1, root) for kid in reversed(kids.get(root, []))]
        seen = {root}
        while stack and listed < MAX_BRANCHES:
            run_id, depth, parent = stack.pop()
            if run_id in seen:
                continue  # a lineage that loops (a hand-written record): each run once
            seen.add(run_id)
            out.append((run_id, depth, parent))
            listed += 1
            if depth < MAX_DEPTH:
                stack.extend((kid, depth + 1, run_id) for kid in reversed(kids.get(run_id, [])))
        if out:
            tree[root] = out
    return tree


async def _by_cost(
    follower: ProjectionFollower, sql_where: str, params: list[Any], order: str, direction: str, paging: list[int]
) -> list[RunRow]:
    """A page sorted by cost. Every run's cost is needed to sort, but not every run's row: the ids
    and costs come from ``run_costs`` alone (runs with a cost: NULLs sort last either way, so they
    are needed only when the page reaches past the priced runs, and then one query over the join
    answers), then the rows of those ids are read from ``runs``."""
    if not (await follower.query("SELECT count(*) FROM model_prices")).rows[0][0]:
        return await _by_cost_joined(follower, sql_where, params, order, paging)  # no prices: every cost is NULL
    scope = "" if sql_where == "true" else f" AND c.run_id IN (SELECT r.run_id FROM runs r WHERE {sql_where})"
    chosen = await follower.query(
        f"SELECT c.run_id, c.cost_usd, c.priced FROM run_costs c WHERE c.cost_usd IS NOT NULL{scope} "
        f"ORDER BY c.cost_usd {direction}, c.run_id {direction} LIMIT ? OFFSET ?",
        [*params, *paging] if scope else paging,
    )
    if len(chosen.rows) == paging[0]:
        return await _rows(follower, [run_id for run_id, _, _ in chosen.rows], {r: (c, p) for r, c, p in chosen.rows})
    return await _by_cost_joined(follower, sql_where, params, order, paging)


async def _by_cost_joined(
    follower: ProjectionFollower, sql_where: str, params: list[Any], order: str, paging: list[int]
) -> list[RunRow]:
    result = await follower.query(f"SELECT {_COLUMNS} FROM runs r LEFT JOIN run_costs c USING (run_id) WHERE "
                                  f"{sql_where} ORDER BY {order} LIMIT ? OFFSET ?", [*params, *paging])  # fmt: skip
    return [RunRow(*row) for row in result.rows]


async def _rows(
    follower: ProjectionFollower, ids: list[str], costs: dict[str, tuple[float, bool]] | None = None
) -> list[RunRow]:
    """The rows of ``ids``, in that order, with the cost of those runs only (or the ``costs`` given)."""
    if not ids:
        return []
    marks = ", ".join("?" * len(ids))
    if costs is None:
        result = await follower.query(
            # The filter reaches the view's scan of steps: only these runs' model steps are summed.
            f"SELECT {_COLUMNS} FROM runs r LEFT JOIN (SELECT * FROM run_costs WHERE run_id IN ({marks})) c "
            f"USING (run_id) WHERE r.run_id IN ({marks})",
            [*ids, *ids],
        )
    else:
        columns = _COLUMNS.replace("c.cost_usd, coalesce(c.priced, true)", "NULL, true")
        result = await follower.query(f"SELECT {columns} FROM runs r WHERE r.run_id IN ({marks})", ids)
    by_id = {row[0]: RunRow(*row) for row in result.rows}
    for run_id, (cost, priced) in (costs or {}).items():
        if run_id in by_id:
            by_id[run_id].cost, by_id[run_id].priced = cost, priced
    return [by_id[run_id] for run_id in ids if run_id in by_id]


async def _stalled(follower: ProjectionFollower, rows: list[RunRow]) -> list[RunRow]:
    """``rows`` with a running run whose holder is gone shown as ``stalled`` (runledger.ops.trace.live_status):
    the holder is the projected checkpoint's (``checkpoints.checkpoint->>'holder'``)."""
    running = [r.run_id for r in rows if r.status == "running"]
    if not running:
        return rows
    marks = ", ".join("?" * len(running))
    found = await follower.query(
        f"SELECT run_id, checkpoint->>'holder' FROM checkpoints WHERE run_id IN ({marks})", running
    )
    holders = dict(found.rows)
    for r in rows:
        if r.status == "running":
            r.status = live_status(r.status, holders.get(r.run_id))
    return rows


async def search(follower: ProjectionFollower, viewer: Viewer, f: RunFilter) -> tuple[list[str], int, bool]:
    """(ids of runs whose record contains ``f.q``, runs searched, whether the limit cut it short)."""
    sql_where, params = where(f, viewer)
    result = await follower.query(
        f"SELECT r.run_id, r.agent FROM runs r WHERE {sql_where} ORDER BY r.started_at DESC NULLS LAST LIMIT ?",
        [*params, SEARCH_LIMIT + 1],
    )
    candidates = result.rows[:SEARCH_LIMIT]
    needle = f.q.casefold()
    gate = asyncio.Semaphore(8)

    async def matches(run_id: str, agent: str | None) -> bool:
        if needle in run_id.casefold() or needle in (agent or "").casefold():
            return True
        async with gate:
            try:
                log = await load_run(viewer.client, run_id, agent=viewer.agent, open_content=True)
            except LedgerError:
                return False
        for rec in log.records:
            text = json.dumps(stand_in(rec.event.payload), ensure_ascii=False, default=str)
            if needle in text.casefold():
                return True
        return False

    found = await asyncio.gather(*(matches(r, a) for r, a in candidates))
    hits = [r for (r, _), hit in zip(candidates, found, strict=True) if hit]
    return hits, len(candidates), len(result.rows) > SEARCH_LIMIT
