"""``combine`` (runledger.sandbox.samples): one case of a run from its samples and its unchanged baseline."""

from __future__ import annotations

from runledger.sandbox.gate import Case, Verdict
from runledger.sandbox.samples import combine


def _case(verdict: Verdict, branch_status: str, n: int, parent_status: str = "failed") -> Case:
    return Case("r1", parent_status=parent_status, branch_status=branch_status, verdict=verdict,
                branch_run_id=f"br-{n}", message=verdict)  # fmt: skip


def test_a_baseline_that_sometimes_completes_marks_the_run_flaky() -> None:
    samples = [_case("improved", "completed", n) for n in range(4)] + [_case("still_failing", "failed", 4)]
    baseline = [_case("still_failing", "completed", 10), *(_case("still_failing", "failed", n) for n in (11, 12))]
    case = combine(samples, baseline, 0.8)
    assert (case.verdict, case.fixes, case.samples, case.fix_rate) == ("improved", 4, 5, 0.8)
    assert (case.baseline_samples, case.baseline_flips, case.flaky) == (3, 1, True)
    assert "FLAKY" in case.sampled and case.sampled.startswith("fixed 4/5")


def test_one_regressed_sample_regresses_the_run_and_a_low_rate_still_fails() -> None:
    ok = [_case("pass", "completed", n, "completed") for n in range(4)]
    broken = combine([*ok, _case("regressed", "failed", 9, "completed")], [], 0.5)
    assert (broken.verdict, broken.branch_run_id, broken.flaky) == ("regressed", "br-9", None)
    low = combine([_case("improved", "completed", 0), _case("still_failing", "failed", 1)], [], 1.0)
    assert (low.verdict, low.branch_run_id) == ("still_failing", "br-1") and "fixed 1/2, below" in low.message
