"""``runledger runs`` lists recorded runs, and with ``--branches`` each branch under the run it was forked from
(``runledger.ops.trace.with_branches``)."""

from __future__ import annotations

from runledger.ops.trace import RunSummary, with_branches


def summary(run_id: str, parent: str | None = None) -> RunSummary:
    return RunSummary(run_id, "a", "completed", run_id, None, 1, 0, [], [], parent, None)


def test_branches_are_left_out_unless_asked_and_then_listed_under_their_parent() -> None:
    # Before: every branch of every sweep was listed among the recorded runs, in start order.
    runs = [summary("r1"), summary("r2"), summary("br-a", "r1"), summary("br-b", "r2"), summary("br-c", "br-a"),
            summary("br-d", "r1"), summary("br-orphan", "gone"), summary("child")]  # fmt: skip
    assert [(r.run_id, d) for r, d in with_branches(runs, False)] == [("r1", 0), ("r2", 0), ("child", 0)]
    tree = [("r1", 0), ("br-a", 1), ("br-c", 2), ("br-d", 1), ("r2", 0), ("br-b", 1), ("br-orphan", 0), ("child", 0)]
    assert [(r.run_id, d) for r, d in with_branches(runs, True)] == tree
    cycle = [summary("x", "y"), summary("y", "x")]  # forged parents cannot loop the listing
    assert sorted(r.run_id for r, _ in with_branches(cycle, True)) == ["x", "y"]
