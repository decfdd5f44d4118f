"""Samples: verdicts that survive a model that does not take the same path twice.

``runledger rerun --where SQL ... --samples N`` re-drives each selected run N times with the same change
(each sample a branch of its own, drawn fresh from the live model) and judges each branch as the gate
does (runledger.sandbox.gate). One case per run then holds the samples (``combine``):

- its fix rate: the samples judged ``improved`` over N (``fixed 3/5``);
- its verdict: ``regressed`` (or ``fail``) when any sample regressed (or failed its check): a change that
  breaks a run once in N breaks it; else, for a run that had not completed (or one a check judged
  ``improved`` in some sample), ``improved`` when the fix rate reaches ``--min-fix-rate`` (default 1.0:
  every sample), else ``still_failing`` (the gate closes, unless ``--allow-still-failing``; ``fail``
  for a completed run the check improved too seldom); else the first sample's (``pass``,
  ``not_exercised``); ``error`` when no sample could be re-run;
- flaky or not: a counterfactual's baseline is the same re-drive with nothing changed (its base mode,
  ``redrive`` or ``live``, the recorded model, prompt, tools and agent), N times too. The run is flaky
  when some baseline sample ends otherwise than the record did (a failure that completes, or a
  completion that fails, with the recorded element): its fix rate then says less of the change than of
  the model's luck. Other modes have no unchanged element to re-drive (the change is the code itself,
  or nothing): their baseline is not measured and ``flaky`` is None.

A sample's branch id ends with ``-sK`` (sample K, from 1), a baseline's with ``-bK``, so every sample
is a run of its own that ``runledger diff`` and the page show like any branch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from runledger.sandbox.gate import Case
from runledger.sandbox.rerun import RerunRequest

OUTCOME_IS = ("completed",)


def sample_requests(
    template: RerunRequest, parent_id: str, samples: int, *, baseline: bool = True
) -> list[tuple[str, int, RerunRequest]]:
    """The re-runs of ``parent_id`` for ``samples`` samples: (``"sample"`` | ``"baseline"``, K, request).
    One plain re-run when ``samples`` is 1; a counterfactual's baseline beside its samples (module docstring)."""
    base = f"{template.request_id}-{parent_id}"[:112]
    if samples <= 1:
        return [("sample", 1, template.model_copy(update={"parent_run_id": parent_id, "request_id": base}))]
    out = [("sample", k, template.model_copy(update={"parent_run_id": parent_id, "request_id": f"{base}-s{k}"}))
           for k in range(1, samples + 1)]  # fmt: skip
    if template.mode == "counterfactual" and baseline:
        unchanged: dict[str, Any] = {"mode": template.base_mode, "change": {}, "parent_run_id": parent_id}
        out += [("baseline", k, template.model_copy(update={**unchanged, "request_id": f"{base}-b{k}"}))
                for k in range(1, samples + 1)]  # fmt: skip
    return out


def combine(samples: list[Case], baseline: list[Case], min_fix_rate: float) -> Case:
    """One case of a run from its samples' cases and its baseline's (module docstring)."""
    ran = [s for s in samples if s.verdict != "error"]
    first = ran[0] if ran else samples[0]
    case = dataclasses.replace(first)
    case.samples = len(samples)
    case.fixes = sum(1 for s in samples if s.fixed)
    case.sample_branches = [s.branch_run_id for s in samples if s.branch_run_id]
    case.seconds = sum(s.seconds for s in samples)
    case.branch_cost = dataclasses.replace(
        first.branch_cost,
        tokens=sum(s.branch_cost.tokens for s in samples),
        usd=None if any(s.branch_cost.usd is None for s in ran) or not ran
        else sum(s.branch_cost.usd or 0.0 for s in ran),
    )  # fmt: skip
    measured = [b for b in baseline if b.verdict != "error"]
    case.baseline_samples = len(measured)
    case.baseline_flips = sum(1 for b in measured if (b.branch_status in OUTCOME_IS) != (b.parent_status in OUTCOME_IS))
    rate = f"fixed {case.fixes}/{case.samples}"
    for bad in ("regressed", "fail"):
        hit = [s for s in samples if s.verdict == bad]
        if hit:
            case.verdict, case.message = bad, f"{len(hit)}/{case.samples} samples {bad}: {hit[0].message}"
            case.branch_run_id, case.branch_error, case.branch_status = (
                hit[0].branch_run_id, hit[0].branch_error, hit[0].branch_status)  # fmt: skip
            return case
    if not ran:
        return case  # no sample could be re-run: the first one's error
    exercised = [s for s in ran if s.verdict != "not_exercised"]
    failed_before = case.parent_status not in ("completed", "")
    if (failed_before or case.fixes) and exercised:  # a failure, or a run a check found improved
        if case.fixes / case.samples >= min_fix_rate:
            case.verdict, case.message = "improved", f"{rate}, at least --min-fix-rate {min_fix_rate:g}"
        else:
            miss = next((s for s in samples if not s.fixed), first)
            case.verdict = "still_failing" if failed_before else "fail"
            case.message = f"{rate}, below --min-fix-rate {min_fix_rate:g}: {miss.message}"
            case.branch_run_id, case.branch_error, case.branch_status = (
                miss.branch_run_id, miss.branch_error, miss.branch_status)  # fmt: skip
        return case
    case.message = f"{rate}: {first.message}" if case.parent_status not in ("completed", "") else first.message
    return case
