"""The run list's queries (``runledger.ui.listing.run_page``) against one plain query, on a real projection.

A page's ids are chosen on ``runs`` alone and their costs summed for those runs only (except when
sorted by cost); that must give exactly the rows, order, costs and totals of the one query that
joins every run's cost, for every sort, both directions, every page and the filters. The runs are
``bench.project``'s synthetic runs (plain events, some failed, some waiting for an approval, five
agents), published to a real nats-server and projected by the page's own follower into a DuckDB file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.project import VERSION, publish_raw, synthetic_run
from runledger.log.client import LedgerClient
from runledger.ui.listing import _COLUMNS, SORTS, RunFilter, run_page, where
from runledger.ui.projection import ProjectionFollower
from runledger.ui.viewers import Viewer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RUNS = 130


async def reference(follower: ProjectionFollower, viewer: Viewer, f: RunFilter) -> tuple[int, list[tuple[Any, ...]]]:
    """The list as one query: every run joined with its cost, sorted, paged."""
    sql_where, params = where(f, viewer)
    base = f"FROM runs r LEFT JOIN run_costs c USING (run_id) WHERE {sql_where}"
    direction = "DESC" if f.desc else "ASC"
    order = f"{SORTS[f.sort]} {direction} NULLS LAST, r.run_id {direction}"
    total = (await follower.query(f"SELECT count(*) {base}", params)).rows[0][0]
    rows = (await follower.query(f"SELECT {_COLUMNS} {base} ORDER BY {order} LIMIT ? OFFSET ?",
                                 [*params, f.per_page, (f.page - 1) * f.per_page])).rows  # fmt: skip
    return int(total), [tuple(r) for r in rows]


async def test_every_sort_page_and_filter_lists_what_one_plain_query_lists(
    client: LedgerClient, tmp_path: Path
) -> None:
    await publish_raw(client, iter([m for i in range(RUNS) for m in synthetic_run(i)]))
    follower = ProjectionFollower(client, tmp_path / "ui.duckdb")
    await follower.start()
    try:
        assert await follower.caught_up(timeout=60)
        viewer = Viewer("local", "local", client)
        unpriced = RunFilter(sort="cost", page=2)  # no prices: every cost is NULL
        assert [tuple(vars(r).values()) for r in (await run_page(follower, viewer, unpriced)).rows] == (
            await reference(follower, viewer, unpriced)
        )[1]
        # The runs' model priced, so costs differ by tokens; runs failed before their second call cost less.
        await follower.query("INSERT INTO model_prices VALUES (?, ?, ?)", [VERSION["model"], 3.0, 15.0])
        filters = [RunFilter(sort=s, desc=d, page=p, per_page=50) for s in SORTS for d in (True, False)
                   for p in (1, 2, 3, 4)]  # fmt: skip
        filters += [RunFilter(status="failed"), RunFilter(status="suspended", sort="steps", desc=False)]
        filters += [RunFilter(agent="agent-3", sort="cost", desc=d, page=p, per_page=10) for d in (True, False)
                    for p in (1, 2, 3)]  # fmt: skip
        priced = 0
        for f in filters:
            total, expected = await reference(follower, viewer, f)
            page = await run_page(follower, viewer, f)
            assert page.total == total, f
            got = [tuple(vars(r).values()) for r in page.rows]
            assert got == expected, f
            priced += sum(1 for r in page.rows if r.cost)
        assert page.total > 0 and priced > 0
        assert (await run_page(follower, viewer, RunFilter(page=9))).rows == []  # past the end: an empty page
    finally:
        await follower.close()
