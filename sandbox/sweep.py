"""Sweeps for CI: re-drive many recorded runs at once and report what the change did.

``runledger rerun --where "status = 'failed'" --mode counterfactual --set model=...``
selects recorded runs with SQL over the DuckDB ``runs`` projection (caught up first;
branches are excluded), re-drives each in a sandbox with a warm pool, and summarises:
the divergence rate and where runs first diverge, outcome changes (a run that completed
before and does not now is a regression) and token deltas. The exit code is non-zero
when any outcome regressed, so a team can gate a prompt or model change on last
month's failures. Each run is also judged on its own (runledger.sandbox.gate: a verdict, a user
check of the decision at the fork with ``--expect``, its cost), for JSON, JUnit XML and the exit code.

A live (or live-based counterfactual) branch whose effect reuses a committed key with other
arguments simulates it and marks it (``reason: args_differ``, sandbox/branch.py); the summary
counts those effects and names their runs, since such a branch "completed" without the effect
it asked for ever happening.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runledger.errors import LedgerError
from runledger.log.client import LedgerClient
from runledger.ops.prices import PriceTable
from runledger.projections import selection
from runledger.projections.errors import QueryError
from runledger.projections.store import ProjectionStore
from runledger.protect.loading import load_run
from runledger.record.fold import Checkpoint, fold
from runledger.sandbox.containers import SandboxPool
from runledger.sandbox.diff import diff
from runledger.sandbox.errors import RerunRequestError
from runledger.sandbox.gate import Case, Check, Cost, GateReport, error_of, judge, step_args
from runledger.sandbox.rerun import Rerunner, RerunRequest, RerunResult
from runledger.sandbox.responses import ResponseCache
from runledger.sandbox.samples import combine, sample_requests


@dataclass
class SweepSummary:
    total: int = 0
    completed: int = 0
    diverged: int = 0
    failed: int = 0
    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    first_divergence: Counter[int] = field(default_factory=Counter)
    tokens_parent: float = 0.0
    tokens_branch: float = 0.0
    args_differ: int = 0  # effects simulated because their key was committed with other arguments
    args_differ_runs: list[str] = field(default_factory=list)  # the parents whose branch has any
    branches: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    gate: GateReport = field(default_factory=GateReport)  # each run judged: runledger.sandbox.gate
    samples: int = 1  # --samples: branches per run (the counts below are of branches, baselines left out)

    def render(self) -> str:
        branches = self.total * self.samples
        what = (
            f"{self.total} runs x {self.samples} samples ({branches} branches)"
            if self.samples > 1
            else f"{self.total} runs"
        )
        rate = self.diverged / branches if branches else 0.0
        lines = [
            f"{what} re-driven: {self.completed} completed, {self.diverged} diverged ({rate:.0%}), "
            f"{self.failed} failed otherwise",
            f"outcome: {len(self.regressions)} regressed (completed before, not now), "
            f"{len(self.improvements)} improved (failed before, completed now)",
            f"tokens: {self.tokens_parent:g} recorded -> {self.tokens_branch:g} re-driven "
            f"({self.tokens_branch - self.tokens_parent:+g})",
        ]
        changes = Counter(c.change for c in self.gate.cases if c.change)
        for change, runs in sorted(changes.items()):
            lines.append(f"{change} ({runs} run{'s' if runs != 1 else ''})")
        not_exercised = self.gate.count("not_exercised")
        if not_exercised:
            lines.append(f"not exercised: {not_exercised} branches never reached their change from the fork on "
                         "(their verdict is `not_exercised`, never fixed nor still failing)")  # fmt: skip
        if self.first_divergence:
            where = ", ".join(f"step {s}: {n}" for s, n in sorted(self.first_divergence.items()))
            lines.append(f"first differences: {where}")
        if self.args_differ:
            lines.append(f"effects with changed arguments: {self.args_differ} in {len(self.args_differ_runs)} runs "
                         "(key committed with other arguments: simulated, not served as committed)")  # fmt: skip
            for run_id in self.args_differ_runs[:20]:
                lines.append(f"  args differ: {run_id} -> {self.branches.get(run_id)}")
        for error in self.errors[:20]:
            lines.append(f"  not re-run: {error}")
        for run_id in self.regressions[:20]:
            lines.append(f"  regressed: {run_id} -> {self.branches.get(run_id)}")
        return "\n".join(lines)


def projection_prices(db: Path) -> PriceTable:
    """The price table analysts keep in the projection (``model_prices``): empty when it has none."""
    with ProjectionStore(db, writer=False) as store:
        try:
            rows = store.con.execute("SELECT model, usd_per_1m_input, usd_per_1m_output FROM model_prices").fetchall()
        except Exception:  # an older projection without the table: no prices
            return PriceTable()
    return PriceTable.from_rows(rows)


async def select_runs(client: LedgerClient, db: Path, where: str) -> list[str]:
    """Recorded (non-branch) runs matching a SQL condition over the ``runs`` table, oldest first
    (the projection caught up first: ``runledger.projections.selection``)."""
    try:
        return await selection.select_runs(client, where, db)  # recorded runs: branches are not re-driven
    except QueryError as exc:  # say where the condition came from
        raise RerunRequestError(f"--where {where!r} is not a valid condition over runs: {exc.reason}") from exc


async def _judge_case(
    client: LedgerClient, case: Case, result: RerunResult, check: Check | None, prices: PriceTable | None
) -> tuple[Checkpoint, Checkpoint]:
    """Fill ``case`` from its recorded run and its branch (``result``): outcomes, costs, the change,
    each run's exception and the verdict. Returns both checkpoints.

    Content is opened as this caller's connection may (its grant): what a check and the reports see."""
    parent_log, branch_log = await load_run(client, case.parent_run_id), await load_run(client, result.run_id)
    parent = fold(parent_log.records, check_chain=False)
    branch = fold(branch_log.records, check_chain=False)
    case.agent, case.branch_run_id = parent.agent, result.run_id
    case.parent_status, case.branch_status, case.branch_reason = parent.status, result.status, result.reason
    case.parent_cost = Cost.of(parent.steps.values(), prices)
    case.branch_cost = Cost.of(branch.steps.values(), prices)
    case.fork_step, case.change = result.fork_step, result.change_note
    case.parent_error, case.branch_error = error_of(parent), error_of(branch)
    args = (step_args(parent_log.records), step_args(branch_log.records)) if check is not None else ({}, {})
    case.verdict, case.message = judge(parent, branch, result.fork_step, branch_reason=result.reason, check=check,
                                       args=args)  # fmt: skip
    case.checked = check is not None and case.verdict != "not_exercised"
    return parent, branch


async def sweep(
    client: LedgerClient,
    pool: SandboxPool,
    run_ids: list[str],
    template: RerunRequest,
    *,
    concurrency: int = 2,
    progress: Callable[[int, int], None] | None = None,
    check: Check | None = None,
    prices: PriceTable | None = None,
    samples: int = 1,
    min_fix_rate: float = 1.0,
    baseline: bool = True,
    responses: ResponseCache | None = None,
) -> SweepSummary:
    """Re-drive ``run_ids`` as ``template`` asks, ``concurrency`` at a time, and summarise.

    ``progress(done, total)`` is called after each run (the CLI draws a bar with it). Each run is judged
    into ``summary.gate`` (runledger.sandbox.gate): by ``check`` at the fork when given, else by outcomes;
    priced with ``prices`` when given. ``samples`` > 1: each run re-driven that many times (and, for a
    counterfactual, as many times unchanged), one case per run with its fix rate (runledger.sandbox.samples).
    ``responses``: identical live model requests answered once (runledger.sandbox.responses); the report
    then carries the calls made and served (``GateReport.model_calls``, ``cached_calls``: the cache's totals)."""
    rerunner = Rerunner(client, pool, responses=responses)
    summary = SweepSummary(total=len(run_ids), samples=samples)
    summary.gate = GateReport(mode=template.mode, change=dict(template.change), min_fix_rate=min_fix_rate)
    drawn: dict[tuple[str, str, int], Case] = {}
    jobs = [
        (parent_id, *job)
        for parent_id in run_ids
        for job in sample_requests(template, parent_id, samples, baseline=baseline)
    ]
    queue: asyncio.Queue[tuple[str, str, int, RerunRequest]] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    done = 0

    async def one(parent_id: str, kind: str, k: int, request: RerunRequest) -> None:
        case = drawn[(parent_id, kind, k)] = Case(parent_id)
        started = time.monotonic()
        try:
            result: RerunResult = await rerunner.rerun(request)
        except LedgerError as exc:  # e.g. a run recorded by another agent: report it, go on
            if kind == "sample" and k == 1:
                summary.errors.append(f"{parent_id}: {exc}")
            case.message = f"not re-run: {exc}"
            return
        case.seconds = time.monotonic() - started
        parent, branch = await _judge_case(client, case, result, check, prices)
        if kind == "sample":
            await _count(client, summary, parent_id, parent, branch, result, case)

    async def worker() -> None:
        nonlocal done
        while not queue.empty():
            await one(*queue.get_nowait())
            done += 1
            if progress is not None:
                progress(done, len(jobs))

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    for run_id in run_ids:  # in the sweep's order
        of_run = sorted(key for key in drawn if key[0] == run_id)
        sampled = [drawn[key] for key in of_run if key[1] == "sample"]
        if samples <= 1:
            summary.gate.cases.extend(sampled)
        else:
            unchanged = [drawn[key] for key in of_run if key[1] == "baseline"]
            summary.gate.cases.append(combine(sampled, unchanged, min_fix_rate))
    if responses is not None:
        summary.gate.model_calls, summary.gate.cached_calls = responses.calls, responses.hits
    return summary


async def _count(
    client: LedgerClient, summary: SweepSummary, parent_id: str, parent: Checkpoint, branch: Checkpoint,
    result: RerunResult, case: Case,
) -> None:  # fmt: skip
    """Count one (sample's) branch into the summary: outcome, tokens, where it first differs."""
    summary.branches.setdefault(parent_id, result.run_id)
    summary.tokens_parent += parent.spent["tokens"]
    summary.tokens_branch += branch.spent["tokens"]
    if result.status == "completed":
        summary.completed += 1
    elif result.reason == "diverged":
        summary.diverged += 1
    else:
        summary.failed += 1
    if parent.status == "completed" and result.status != "completed" and parent_id not in summary.regressions:
        summary.regressions.append(parent_id)
    if parent.status == "failed" and result.status == "completed" and parent_id not in summary.improvements:
        summary.improvements.append(parent_id)
    d = await diff(client, parent_id, result.run_id)
    case.first_difference = d.first_difference
    if d.first_difference is not None:
        summary.first_divergence[d.first_difference] += 1
    if d.args_differ:
        summary.args_differ += len(d.args_differ)
        if parent_id not in summary.args_differ_runs:
            summary.args_differ_runs.append(parent_id)
