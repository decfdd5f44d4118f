"""The run list's groups (``runledger.ui.listing.group``, ``descendants``): a page's branches under the
listed run they came from, depth first in start order, each run once, within the depth and count limits."""

from __future__ import annotations

import datetime as dt

import pytest

from runledger.ui import listing
from runledger.ui.listing import RunRow, descendants, group


def test_branches_go_depth_first_under_the_run_they_came_from() -> None:
    edges = [("f1", "root"), ("c1", "other"), ("f2", "root"), ("f1a", "f1"), ("f1a1", "f1a")]
    tree = descendants(edges, ["root", "other", "lonely"])
    assert tree == {
        "root": [("f1", 1, "root"), ("f1a", 2, "f1"), ("f1a1", 3, "f1a"), ("f2", 1, "root")],
        "other": [("c1", 1, "other")],
    }


def test_only_branches_of_listed_runs_and_each_run_once() -> None:
    assert descendants([("b", "not-listed")], ["root"]) == {}
    looped = [("a", "root"), ("root", "a")]  # a hand-written record whose lineage loops
    assert descendants(looped, ["root"]) == {"root": [("a", 1, "root")]}


def test_the_limits_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    chain = [(f"r{i + 1}", f"r{i}") for i in range(20)]
    assert [d for _, d, _ in descendants(chain, ["r0"])["r0"]] == list(range(1, listing.MAX_DEPTH + 1))
    monkeypatch.setattr(listing, "MAX_BRANCHES", 3)
    wide = [(f"k{i}", "root") for i in range(10)]
    assert len(descendants(wide, ["root"])["root"]) == 3


def row(run_id: str, minute: int, fork_of: str | None = None, child_of: str | None = None) -> RunRow:
    started = dt.datetime(2026, 12, 7, 5, minute, tzinfo=dt.UTC)
    return RunRow(run_id, "completed", "a", "v1", "m", started, None, None, 1, None, None, True, [], [], fork_of,
                  0 if fork_of else None, "redrive" if fork_of else None, child_of, None)  # fmt: skip


def test_a_page_groups_the_branches_whose_parent_it_lists() -> None:
    # Newest first, as the list shows them: a fork of a fork, a child, their runs, a fork of a run not on the page.
    rows = [row("ff", 5, fork_of="f"), row("stray", 4, fork_of="elsewhere"), row("kid", 3, child_of="p"),
            row("f", 2, fork_of="p"), row("p", 1)]  # fmt: skip
    roots, branches = group(rows)
    assert [r.run_id for r in roots] == ["stray", "p"]  # page order; "stray"'s parent is on another page
    assert [(b.row.run_id, b.depth, b.parent) for b in branches["p"]] == [
        ("f", 1, "p"),
        ("ff", 2, "f"),
        ("kid", 1, "p"),
    ]
    assert "stray" not in branches
