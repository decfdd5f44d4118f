"""The counterfactual matrix on the page: recorded run x candidate change -> fixed, still fails, regressed,
pass, with each branch's tokens and cost (docs/ui.md).

Drawn from the projection, not from a sweep's memory: every counterfactual branch records the change it
was opened with (``run.forked``'s ``request.change``), so ``runledger rerun --where ... --set A --set B``
(runledger.sandbox.matrix), branches queued from the page and any made since all land in one table. A run
with several branches under one candidate shows its latest. The words are the CLI's
(runledger.sandbox.matrix.CELL, by outcome: runledger.sandbox.gate, and ``not exercised`` from the
branch's steps as the CLI judges it: runledger.sandbox.decision), and so is the answer under the table
(``runledger.sandbox.matrix.best_of``); a user check's verdicts are the CLI's alone (the check runs
there). An agent's credentials see their own agent's runs only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from runledger.sandbox.decision import exercise
from runledger.sandbox.gate import Verdict, outcome_verdict
from runledger.sandbox.matrix import CELL, Best, best_of, candidate_label
from runledger.ui.projection import ProjectionFollower
from runledger.ui.viewers import Viewer

_BRANCHES = """
SELECT b.parent_run_id, b.run_id, b.status, p.status, p.agent, b.fork_step,
       json_extract(e.payload, '$.request.change') AS change, coalesce(b.tokens, 0), c.cost_usd, c.priced,
       b.fork_changed, b.failure_reason
FROM runs b
JOIN runs p ON p.run_id = b.parent_run_id
JOIN events e ON e.run_id = b.run_id AND e.type = 'run.forked'
LEFT JOIN run_costs c ON c.run_id = b.run_id
WHERE b.fork_mode = 'counterfactual' {scope}
ORDER BY b.started_at, b.run_id
"""
# The steps of those branches, by kind: whether each exercised its change (runledger.sandbox.decision).
_STEPS = """
SELECT s.run_id, s.step, s.kind FROM steps s JOIN runs b ON b.run_id = s.run_id
WHERE b.fork_mode = 'counterfactual'
"""


@dataclass(frozen=True)
class MatrixCell:
    branch: str
    result: str  # a word of runledger.sandbox.matrix.CELL
    status: str
    fork_step: int | None
    tokens: int
    cost_usd: float | None


@dataclass
class MatrixView:
    candidates: list[str] = field(default_factory=list)
    runs: list[tuple[str, str]] = field(default_factory=list)  # (run id, its recorded status), first forked first
    cells: dict[tuple[str, str], MatrixCell] = field(default_factory=dict)  # (run id, candidate) -> its branch
    agent: str = ""
    parent_status: str = ""
    failure_class: str = ""  # the recorded runs of one class of failure only (runledger.projections.failures)

    def tally(self, candidate: str) -> dict[str, Any]:
        cells = [c for (_, cand), c in self.cells.items() if cand == candidate]
        counts = {word: sum(1 for c in cells if c.result == word) for word in dict.fromkeys(CELL.values())}
        priced = [c.cost_usd for c in cells if c.cost_usd is not None]
        return {"counts": {k: v for k, v in counts.items() if v}, "tokens": sum(c.tokens for c in cells),
                "usd": sum(priced) if priced else None}  # fmt: skip

    def best(self) -> Best:
        """The candidate that fixes the most runs with no regression, as the CLI's matrix names it."""
        tallies = [self.tally(c)["counts"] for c in self.candidates]
        return best_of(self.candidates, [t.get(CELL["improved"], 0) for t in tallies],
                       [bool(t.get(CELL["regressed"])) for t in tallies], len(self.runs))  # fmt: skip


def _label(change: Any) -> str:
    if isinstance(change, str):
        try:
            change = json.loads(change)
        except ValueError:
            return str(change)
    return candidate_label({str(k): str(v) for k, v in change.items()}) if isinstance(change, dict) else "?"


async def matrix_view(
    follower: ProjectionFollower, viewer: Viewer, agent: str = "", parent_status: str = "", *, failure_class: str = ""
) -> MatrixView:
    """Every counterfactual branch the viewer may see, as the matrix (filtered by the recorded runs' agent,
    status and class of failure when given)."""
    scope, params = "", list[Any]()
    if viewer.agent is not None:
        scope, params = scope + " AND p.agent = ?", [*params, viewer.agent]
    if agent:
        scope, params = scope + " AND p.agent = ?", [*params, agent]
    if parent_status:
        scope, params = scope + " AND p.status = ?", [*params, parent_status]
    if failure_class:
        scope, params = scope + " AND p.failure_class = ?", [*params, failure_class]
    rows = (await follower.query(_BRANCHES.format(scope=scope), params)).rows
    kinds: dict[str, dict[int, str]] = {}
    for run_id, step_no, kind in (await follower.query(_STEPS)).rows:
        kinds.setdefault(str(run_id), {})[int(step_no)] = str(kind)
    view = MatrixView(agent=agent, parent_status=parent_status, failure_class=failure_class)
    runs: dict[str, str] = {}
    candidates: dict[str, None] = {}
    for row in rows:
        parent, branch, status, recorded, _agent, fork_step, change, tokens, cost, priced, changed, reason = row
        label = _label(change)
        runs.setdefault(str(parent), str(recorded))
        candidates.setdefault(label)
        verdict: Verdict = outcome_verdict(str(recorded), str(status))[0]
        done = exercise(changed, int(fork_step or 0), kinds.get(str(branch), {}), str(status), reason)
        if done is not None and not done.exercised:
            verdict = "not_exercised"
        view.cells[(str(parent), label)] = MatrixCell(
            branch=str(branch), result=CELL[verdict], status=str(status),
            fork_step=None if fork_step is None else int(fork_step), tokens=int(tokens),
            cost_usd=float(cost) if cost is not None and priced else None,
        )  # fmt: skip
    view.runs, view.candidates = list(runs.items()), list(candidates)
    return view
