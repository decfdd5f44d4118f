"""The sweep's CI gate (runledger.sandbox.gate) from plain checkpoints: verdicts by outcome, user checks of
the decision at the fork and what they may answer, exit codes, and JUnit XML that a parser reads back."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from runledger.cli.exits import Exit
from runledger.errors import CodeNotAllowedError
from runledger.examples.refund_agent.checks import no_refund_without_a_photo
from runledger.ops.prices import Price, PriceTable
from runledger.record.fold import Checkpoint, StepRecord
from runledger.sandbox.gate import (
    Case,
    CheckResult,
    Cost,
    Fork,
    GateReport,
    judge,
    load_check,
    outcome_verdict,
    run_check,
)


@pytest.mark.parametrize(
    ("parent", "branch", "verdict"),
    [("completed", "completed", "pass"), ("failed", "completed", "improved"),
     ("suspended", "completed", "improved"), ("failed", "failed", "still_failing"),
     ("completed", "failed", "regressed"), ("completed", "suspended", "regressed")],
)  # fmt: skip
def test_without_a_check_outcomes_decide(parent: str, branch: str, verdict: str) -> None:
    assert outcome_verdict(parent, branch)[0] == verdict


def _model(step: int, content: str, tokens: int = 10, name: str = "m") -> StepRecord:
    return StepRecord(step=step, kind="model", name=name, args_digest="d", status="ok", seq=step + 1,
                      output={"content": content, "usage": {"input_tokens": tokens, "output_tokens": 0}},
                      tokens=tokens)  # fmt: skip


def _cp(run_id: str, status: str, *steps: StepRecord) -> Checkpoint:
    cp = Checkpoint(run_id=run_id, status=status)
    cp.steps = {s.step: s for s in steps}
    return cp


REFUND = '{"refund": true, "amount": 5, "reply": "refunded"}'
PHOTO = '{"refund": false, "amount": 5, "reply": "Please send a photo"}'


def test_a_check_sees_the_steps_from_the_fork_and_turns_a_diverged_branch_into_improved() -> None:
    parent = _cp("p", "completed", _model(0, "{}"), _model(2, REFUND))
    branch = _cp("b", "failed", _model(0, "{}"), _model(2, PHOTO))
    seen: list[Fork] = []

    def check(fork: Fork) -> Any:
        seen.append(fork)
        return no_refund_without_a_photo(fork)

    assert judge(parent, branch, 0, branch_reason="diverged")[0] == "regressed"
    verdict, message = judge(parent, branch, 2, branch_reason="diverged", check=check)
    assert (verdict, message) == ("improved", "asks for a photo where the recorded run refunded at once")
    (fork,) = seen
    assert [s.step for s in fork.parent_steps] == [2] and [s.step for s in fork.branch_steps] == [2]
    assert fork.branch_reason == "diverged" and fork.step("branch", 2) is branch.steps[2]
    refunds = _cp("b2", "completed", _model(2, REFUND))
    assert judge(parent, refunds, 2, branch_reason=None, check=check)[0] == "fail"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [(CheckResult("pass", "ok"), ("pass", "ok")), ("improved", ("improved", "")), (("fail", "why"), ("fail", "why")),
     ("maybe", ("fail", "the check answered 'maybe': expected 'pass', 'fail' or 'improved'")),
     (None, ("fail", "the check answered None: expected 'pass', 'fail' or 'improved'"))],
)  # fmt: skip
def test_what_a_check_may_answer(answer: Any, expected: tuple[str, str]) -> None:
    fork = Fork("p", "b", 0, [], [], "completed", "completed", None)
    result = run_check(lambda f: answer, fork)
    assert (result.verdict, result.message) == expected


def test_a_check_that_raises_fails_its_case_with_the_error() -> None:
    def boom(fork: Fork) -> str:
        raise KeyError("content")

    result = run_check(boom, Fork("p", "b", 0, [], [], "completed", "completed", None))
    assert (result.verdict, result.message) == ("fail", "the check raised KeyError: 'content'")


def test_a_check_is_loaded_only_from_allowed_code_and_must_take_the_fork() -> None:
    assert load_check("runledger.examples.refund_agent.checks:no_refund_without_a_photo") is no_refund_without_a_photo
    with pytest.raises(CodeNotAllowedError):
        load_check("os:abort")


def _case(verdict: str, run_id: str = "r", usd: float | None = None) -> Case:
    return Case(run_id, agent="a", branch_run_id=f"br-{run_id}", parent_status="completed", branch_status="failed",
                branch_reason="diverged", verdict=verdict, message=f"{verdict} because", first_difference=2,  # type: ignore[arg-type]
                branch_cost=Cost(7, usd, usd is not None))  # fmt: skip


@pytest.mark.parametrize(
    ("verdicts", "code"),
    [([], Exit.OK), (["pass", "improved", "still_failing"], Exit.OK), (["pass", "regressed"], Exit.FAILED),
     (["fail"], Exit.FAILED), (["pass", "error"], Exit.NOT_RERUN), (["error", "regressed"], Exit.FAILED)],
)  # fmt: skip
def test_exit_codes(verdicts: list[str], code: int) -> None:
    assert GateReport([_case(v, str(n)) for n, v in enumerate(verdicts)]).exit_code == code


def test_junit_xml_reads_back_with_one_case_per_run_and_the_right_elements() -> None:
    report = GateReport([_case("pass", "r1", 0.5), _case("regressed", "r2", 0.25), _case("error", "r3"),
                         _case("still_failing", "r4"), _case("fail", "r5")], mode="counterfactual",
                        change={"model": "x:y"}, where="status = 'failed'")  # fmt: skip
    root = ET.fromstring(report.junit())
    suite = root.find("testsuite")
    assert suite is not None
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == \
        {"tests": "5", "failures": "2", "errors": "1", "skipped": "1"}  # fmt: skip
    cases = {tc.get("name"): tc for tc in suite.iter("testcase")}
    assert [tc.find("failure").get("type") for n, tc in cases.items() if tc.find("failure") is not None] == [  # type: ignore[union-attr]
        "regressed", "fail"]  # fmt: skip
    failure = cases["r2"].find("failure")
    assert failure is not None and "compare with: runledger diff r2 br-r2" in (failure.text or "")
    assert "first difference at step 2" in (failure.text or "") and "(diverged)" in (failure.text or "")
    assert cases["r3"].find("error") is not None and cases["r4"].find("skipped") is not None
    assert list(cases["r1"]) == [cases["r1"].find("properties")]
    data = report.to_dict()
    assert data["verdicts"] == {"pass": 1, "improved": 0, "still_failing": 1, "regressed": 1, "fail": 1, "error": 1}
    assert data["cost"]["branches"] == {"tokens": 35, "usd": 0.75, "priced": False}


def test_cost_prices_model_steps_by_their_model() -> None:
    prices = PriceTable({"m": Price(1.0, 2.0)})
    steps = [_model(0, "{}", tokens=1_000_000), _model(1, "{}", tokens=10, name="unpriced")]
    cost = Cost.of(steps, prices)
    assert (cost.tokens, cost.usd, cost.priced) == (1_000_010, 1.0, False)
    assert Cost.of(steps, None) == Cost(1_000_010, None, False)
