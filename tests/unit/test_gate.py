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
from runledger.record.events import ClockRead, EffectCommitted, EffectIntended, ModelCalled, ToolCalled
from runledger.record.fold import Checkpoint, StepRecord, fold
from runledger.record.records import Recorded
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
    step_args,
)
from tests.unit.helpers import Chain


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
    seen_step = fork.step("branch", 2)
    assert fork.branch_reason == "diverged" and seen_step is not None
    assert {k: v for k, v in vars(seen_step).items() if k != "args"} == vars(branch.steps[2])
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
    [([], Exit.OK), (["pass", "improved"], Exit.OK), (["pass", "regressed"], Exit.FAILED),
     (["fail"], Exit.FAILED), (["pass", "error"], Exit.NOT_RERUN), (["error", "regressed"], Exit.FAILED)],
)  # fmt: skip
def test_exit_codes(verdicts: list[str], code: int) -> None:
    assert GateReport([_case(v, str(n)) for n, v in enumerate(verdicts)]).exit_code == code


def test_a_failure_that_still_fails_closes_the_gate_unless_allowed() -> None:
    # Before: still_failing was a `skipped` and the gate stayed open: a fix that fixed nothing passed CI.
    still = _case("still_failing", "f1")
    still.parent_status, still.parent_error = (
        "failed",
        {"type": "ValueError", "message": "too many values to unpack (expected 2)", "step": 3, "reason": "exception"},
    )
    still.branch_error = dict(still.parent_error)
    unexercised = _case("not_exercised", "f2")
    unexercised.parent_status = "failed"
    for cases in ([still, _case("pass", "ok")], [unexercised, _case("improved", "ok")]):
        assert GateReport(list(cases)).exit_code == Exit.FAILED
        assert GateReport(list(cases), allow_still_failing=True).exit_code == Exit.OK
    done = _case("not_exercised", "c1")  # a completed run whose branch never reached its change: nothing fails
    done.parent_status = "completed"
    assert GateReport([done]).exit_code == Exit.OK

    report = GateReport([still, _case("pass", "ok")], where="status = 'failed'")
    assert "closed by 1 still failing" in report.render()
    assert "ValueError: too many values to unpack (expected 2)" in report.render()
    data = report.to_dict()
    assert data["gate"] == "closed" and data["still_failing"] == ["f1"]
    (case,) = [c for c in data["cases"] if c["parent_run_id"] == "f1"]
    assert case["branch_error"]["type"] == "ValueError" and case["message"] == "still_failing because"
    suite = ET.fromstring(report.junit()).find("testsuite")
    assert suite is not None and (suite.get("failures"), suite.get("skipped")) == ("1", "0")
    failure = next(tc for tc in suite.iter("testcase") if tc.get("name") == "f1").find("failure")
    assert failure is not None and failure.get("type") == "still_failing"
    assert "ValueError: too many values to unpack (expected 2)" in (failure.get("message") or "")
    text = failure.text or ""
    assert "recorded run f1 failed at step 3 (exception): ValueError: too many values to unpack" in text
    assert "branch br-f1 failed at step 3 (exception): ValueError" in text
    allowed = GateReport([still], allow_still_failing=True)
    suite = ET.fromstring(allowed.junit()).find("testsuite")
    assert suite is not None and (suite.get("failures"), suite.get("skipped")) == ("0", "1")
    assert "1 still failing, allowed" in allowed.render()


def test_junit_xml_reads_back_with_one_case_per_run_and_the_right_elements() -> None:
    report = GateReport([_case("pass", "r1", 0.5), _case("regressed", "r2", 0.25), _case("error", "r3"),
                         _case("still_failing", "r4"), _case("fail", "r5")], mode="counterfactual",
                        change={"model": "x:y"}, where="status = 'failed'")  # fmt: skip
    root = ET.fromstring(report.junit())
    suite = root.find("testsuite")
    assert suite is not None
    assert {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped")} == \
        {"tests": "5", "failures": "3", "errors": "1", "skipped": "0"}  # fmt: skip
    cases = {tc.get("name"): tc for tc in suite.iter("testcase")}
    assert [tc.find("failure").get("type") for n, tc in cases.items() if tc.find("failure") is not None] == [  # type: ignore[union-attr]
        "regressed", "still_failing", "fail"]  # fmt: skip
    failure = cases["r2"].find("failure")
    assert failure is not None and "compare with: runledger diff r2 br-r2" in (failure.text or "")
    assert "first difference at step 2" in (failure.text or "") and "(diverged)" in (failure.text or "")
    assert cases["r3"].find("error") is not None and cases["r4"].find("failure") is not None
    assert list(cases["r1"]) == [cases["r1"].find("properties")]
    data = report.to_dict()
    assert data["verdicts"] == {"pass": 1, "improved": 0, "still_failing": 1, "regressed": 1, "fail": 1,
                                "not_exercised": 0, "error": 1}  # fmt: skip
    assert data["cost"]["branches"] == {"tokens": 35, "usd": 0.75, "priced": False}


def test_cost_prices_model_steps_by_their_model() -> None:
    prices = PriceTable({"m": Price(1.0, 2.0)})
    steps = [_model(0, "{}", tokens=1_000_000), _model(1, "{}", tokens=10, name="unpriced")]
    cost = Cost.of(steps, prices)
    assert (cost.tokens, cost.usd, cost.priced) == (1_000_010, 1.0, False)
    assert Cost.of(steps, None) == Cost(1_000_010, None, False)


def _branch(status: str, changed: str, fork_step: int, *steps: StepRecord, reason: str | None = None) -> Checkpoint:
    cp = _cp("b", status, *steps)
    cp.parent = {"forked_from": "p", "fork_step": fork_step, "changed": changed, "mode": "counterfactual"}
    cp.last_step, cp.failure_reason = max(cp.steps, default=-1), reason
    return cp


def _clock(step: int) -> StepRecord:
    return StepRecord(step=step, kind="clock", name="clock", args_digest="d", status="ok", seq=step + 1)


def test_a_change_never_exercised_from_the_fork_on_is_not_exercised_never_fixed() -> None:
    """Forked after the last model call, a changed model is never called: before, the outcome decided
    (a branch that completed by chance was `improved`, one that failed `still_failing`)."""
    parent = _cp("p", "failed", _model(0, "{}"), _model(2, REFUND), _clock(3))
    for status in ("completed", "failed"):
        late = _branch(status, "model", 3, _model(0, "{}"), _model(2, REFUND), _clock(3))
        verdict, message = judge(parent, late, 3, branch_reason=None)
        assert verdict == "not_exercised", message
        assert "no model call from the fork (step 3) on: the changed model was never read" in message
        # A check judges nothing that was not exercised either.
        assert judge(parent, late, 3, branch_reason=None, check=lambda f: "improved")[0] == "not_exercised"
    at_the_decision = _branch("completed", "model", 2, _model(0, "{}"), _model(2, PHOTO), _clock(3))
    assert judge(parent, at_the_decision, 2, branch_reason=None) == (
        "improved",
        "failed before the change, completed after it",
    )
    # Agent code is exercised once the branch reaches its fork; one that stopped before it is not.
    code = _branch("completed", "agent_version", 3, _model(0, "{}"), _model(2, REFUND), _clock(3))
    assert judge(parent, code, 3, branch_reason=None)[0] == "improved"
    stopped = _branch("failed", "agent_version", 3, _model(0, "{}"), reason="nondeterminism")
    verdict, message = judge(parent, stopped, 3, branch_reason="nondeterminism")
    assert verdict == "not_exercised" and "before its fork at step 3" in message, message
    # Nothing changed (a re-drive of the same code): outcomes decide, as before.
    same = _cp("b", "failed", _model(0, "{}"))
    assert judge(parent, same, 3, branch_reason=None)[0] == "still_failing"


def test_a_check_receives_each_steps_arguments_from_the_events() -> None:
    chain = Chain("p")
    chain.start()
    request = {"messages": [{"role": "user", "content": "PRICE 120 CHF"}], "params": {}}
    chain.add(ModelCalled(step=0, model="m", request=request, args_digest="d0", response={"content": "x"}))
    chain.add(ToolCalled(step=1, name="find_hotel", args={"city": "Bern"}, args_digest="d1", output={"n": 1}))
    chain.add(EffectIntended(step=2, name="book", key="book:T1", args={"amount": 108.0}, args_digest="d2"))
    chain.add(EffectCommitted(step=2, key="book:T1", result={"ok": True}))
    chain.add(ClockRead(step=3, value="2026-01-01T00:00:00+00:00"))
    records = [Recorded(e) for e in chain.events]
    args = step_args(records)
    assert args == {0: request, 1: {"city": "Bern"}, 2: {"amount": 108.0}}
    parent = fold(records, check_chain=False)
    branch = _cp("b", "completed", *parent.steps.values())
    seen: list[Fork] = []
    judge(parent, branch, 1, branch_reason=None, check=lambda f: seen.append(f) or "pass", args=(args, args))
    (fork,) = seen
    assert [(s.step, s.args) for s in fork.branch_steps] == [(1, {"city": "Bern"}), (2, {"amount": 108.0}), (3, None)]
    book = fork.step("parent", 2)
    assert book is not None and book.output == {"ok": True} and book.args == {"amount": 108.0}
    assert fork.parent_error is None and fork.branch_error is None
