"""The counterfactual matrix: which single change fixes this class of failure.

``runledger rerun --where SQL --mode counterfactual --set A --set B --set C`` (two or more ``--set``: each
is one candidate, one element of the version tuple changed) re-drives every selected run once per
candidate, as a sweep each (runledger.sandbox.sweep), and reports the table: recorded run x candidate ->
``fixed`` (the run had failed; its branch completed), ``still fails``, ``regressed`` (it had completed;
its branch did not), ``pass``, ``fails check`` (a user check, ``--expect``, said no), ``not exercised``
(the branch never reached its change from the fork on: runledger.sandbox.decision), ``not re-run``;
with each branch's cost and, per candidate, the counts and the total cost. The words are the gate's
verdicts (runledger.sandbox.gate) as a person asks the question.

The answer (``MatrixReport.best``): the candidate that fixes the most runs (``Case.fixed``) with no
regression (no ``regressed`` cell), every candidate tied at that count named; or, when none fixes a run
without a regression, a sentence that says so. A ``not exercised`` cell fixes nothing and regresses
nothing: it was not tested.

With ``--samples N`` a cell is a rate (``fixed 3/5``, ``still fails 1/5``: samples fixed over N), marked
``?`` when the run is flaky (runledger.sandbox.samples), and a candidate counts a run as fixed when its
rate reaches ``--min-fix-rate``.

Every branch is a run of its own (``run.forked`` records the candidate in its request), so the page
draws the same matrix from the projection (runledger.ui.matrix), for these branches and any made since.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runledger.cli.exits import Exit
from runledger.errors import ConfigurationError
from runledger.log.client import LedgerClient
from runledger.ops.prices import PriceTable
from runledger.sandbox.containers import SandboxPool
from runledger.sandbox.gate import Case, Check, GateReport
from runledger.sandbox.rerun import RerunRequest
from runledger.sandbox.responses import ResponseCache
from runledger.sandbox.samples import sample_requests
from runledger.sandbox.sweep import sweep

# The gate's verdicts as the matrix shows them.
CELL = {
    "improved": "fixed",
    "still_failing": "still fails",
    "regressed": "regressed",
    "pass": "pass",
    "fail": "fails check",
    "not_exercised": "not exercised",
    "error": "not re-run",
}


@dataclass(frozen=True)
class Best:
    """The matrix's answer: the candidates (indexes) tied at the most fixes with no regression, and a sentence."""

    candidates: list[int]
    fixed: int
    text: str


def best_of(labels: Sequence[str], fixed: Sequence[int], regressed: Sequence[bool], runs: int) -> Best:
    """The matrix's answer from each candidate's label, number of runs fixed and whether it regressed any
    (module docstring); the page's matrix (runledger.ui.matrix) gives the same answer from the projection."""
    clean = [n for n in range(len(labels)) if not regressed[n]]
    most = max((fixed[n] for n in clean), default=0)
    if most == 0:
        regressing = len(labels) - len(clean)
        why = f" ({regressing} of {len(labels)} regress some run)" if regressing else ""
        return Best([], 0, f"no candidate fixes a run without a regression{why}")
    winners = [n for n in clean if fixed[n] == most]
    names = " and ".join(labels[n] for n in winners)
    tie = f" (tied: {len(winners)} candidates)" if len(winners) > 1 else ""
    return Best(winners, most, f"fixes the most with no regression: {names}, {most} of {runs} runs{tie}")


def candidate_label(change: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(change.items()))


def parse_candidates(values: Sequence[str]) -> list[dict[str, str]]:
    """``NAME=VALUE`` strings, one candidate each. Raises ConfigurationError for a malformed one or a repeat."""
    candidates: list[dict[str, str]] = []
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigurationError(f"--set takes NAME=VALUE, got {item!r}")
        candidate = {name: value}
        if candidate in candidates:
            raise ConfigurationError(f"--set {item!r} is given twice")
        candidates.append(candidate)
    return candidates


@dataclass
class MatrixReport:
    """One gate report per candidate, over the same recorded runs."""

    runs: list[str] = field(default_factory=list)
    candidates: list[dict[str, str]] = field(default_factory=list)
    reports: list[GateReport] = field(default_factory=list)  # in the order of ``candidates``

    def cell(self, candidate: int, run_id: str) -> Case | None:
        return next((c for c in self.reports[candidate].cases if c.parent_run_id == run_id), None)

    @property
    def exit_code(self) -> Exit:
        """0 when every run was re-run under every candidate, 3 when some were not: a matrix explores, it
        does not gate (a candidate's own gate is ``runledger rerun --where ... --set`` with one ``--set``)."""
        if any(c.verdict == "error" for r in self.reports for c in r.cases):
            return Exit.NOT_RERUN
        return Exit.OK

    def tally(self, candidate: int) -> dict[str, Any]:
        report = self.reports[candidate]
        counts = {word: sum(1 for c in report.cases if CELL[c.verdict] == word) for word in CELL.values()}
        cost = report.cost("branch")
        return {"counts": counts, "tokens": cost.tokens, "usd": cost.usd}

    def best(self) -> Best:
        """The candidate that fixes the most runs with no regression, or a sentence saying none does."""
        fixed = [sum(1 for c in r.cases if c.fixed) for r in self.reports]
        regressed = [any(c.verdict == "regressed" for c in r.cases) for r in self.reports]
        return best_of([candidate_label(c) for c in self.candidates], fixed, regressed, len(self.runs))

    def to_dict(self) -> dict[str, Any]:
        best = self.best()
        return {
            "runs": self.runs,
            "exit_code": int(self.exit_code),
            "best": {"candidates": [candidate_label(self.candidates[n]) for n in best.candidates],
                     "fixed": best.fixed, "text": best.text},
            "candidates": [
                {"change": cand, "label": candidate_label(cand), **self.tally(n),
                 "cells": {c.parent_run_id: {"result": CELL[c.verdict], **c.to_dict()} for c in report.cases}}
                for n, (cand, report) in enumerate(zip(self.candidates, self.reports, strict=True))
            ],
        }  # fmt: skip

    def render(self) -> str:
        labels = [candidate_label(c) for c in self.candidates]
        width = max([len("recorded run"), *(len(r) for r in self.runs)])
        cols = [max(len(label), 24) for label in labels]
        head = [label.ljust(w) for label, w in zip(labels, cols, strict=True)]
        lines = ["  ".join(["recorded run".ljust(width), *head])]
        for run_id in self.runs:
            cells = []
            for n, w in enumerate(cols):
                case = self.cell(n, run_id)
                text = "-" if case is None else CELL[case.verdict] + (f" {case.fixes}/{case.samples}" if case.samples
                                                                      else "") + ("?" if case.flaky else "") + (
                    f" ${case.branch_cost.usd:.4f}" if case.branch_cost.usd is not None
                    else f" {case.branch_cost.tokens} tok")  # fmt: skip
                cells.append(text.ljust(w))
            lines.append("  ".join([run_id.ljust(width), *cells]))
        for n, label in enumerate(labels):
            t = self.tally(n)
            counts = ", ".join(f"{k} {v}" for k, v in t["counts"].items() if v)
            cost = f"{t['tokens']} tokens" + (f", ${t['usd']:.4f}" if t["usd"] is not None else "")
            lines.append(f"{label}: {counts or 'no runs'}; {cost}")
        lines.append(self.best().text)
        return "\n".join(lines)


async def matrix(
    client: LedgerClient,
    pool: SandboxPool,
    run_ids: list[str],
    template: RerunRequest,
    candidates: Sequence[dict[str, str]],
    *,
    concurrency: int = 2,
    check: Check | None = None,
    prices: PriceTable | None = None,
    progress: Callable[[int, int], None] | None = None,
    samples: int = 1,
    min_fix_rate: float = 1.0,
    responses: ResponseCache | None = None,
) -> MatrixReport:
    """Re-drive ``run_ids`` once per candidate (``template`` with the candidate as its change), as sweeps.
    Each candidate's branches have request ids of their own, so none resumes another's. With ``samples``
    > 1, ``samples`` times each (runledger.sandbox.samples); the unchanged baseline, the same for every
    candidate, is re-driven with the first candidate only and shown in every column."""
    report = MatrixReport(runs=list(run_ids), candidates=[dict(c) for c in candidates])
    per_run = [len(sample_requests(template, "-", samples)) - (samples if samples > 1 and n else 0)
               for n in range(len(candidates))]  # fmt: skip
    total, done = len(run_ids) * sum(per_run), 0

    def step(n: int, _total: int) -> None:
        if progress is not None:
            progress(done + n, total)

    for index, candidate in enumerate(candidates):
        request = template.model_copy(
            update={"change": dict(candidate), "request_id": f"{template.request_id}-c{index}"}
        )
        summary = await sweep(client, pool, run_ids, request, concurrency=concurrency, progress=step, check=check,
                              prices=prices, samples=samples, min_fix_rate=min_fix_rate,
                              baseline=index == 0, responses=responses)  # fmt: skip
        report.reports.append(summary.gate)
        done += len(run_ids) * per_run[index]
    for first in report.reports[0].cases if report.reports else []:  # the baseline, measured once
        for other in report.reports[1:]:
            for case in other.cases:
                if case.parent_run_id == first.parent_run_id:
                    case.baseline_samples, case.baseline_flips = first.baseline_samples, first.baseline_flips
    return report
