from __future__ import annotations

import dataclasses

import pytest

from runledger.errors import ChainError
from runledger.record.events import (
    ApprovalRequested,
    ApprovalResolved,
    BudgetGranted,
    Budgets,
    EffectCommitted,
    EffectIntended,
    ErrorInfo,
    ModelCalled,
    RunCompleted,
    RunFailed,
    RunResumed,
    RunSuspended,
    ToolCalled,
    Usage,
)
from runledger.record.fold import Checkpoint, fold
from tests.unit.helpers import Chain


def _model(step: int, tokens_in: int, tokens_out: int) -> ModelCalled:
    return ModelCalled(
        step=step,
        model="m",
        request={"messages": []},
        args_digest="d",
        response={"content": "c"},
        usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out),
    )


def test_spend_is_the_sum_of_recorded_charges() -> None:
    c = Chain()
    c.start(budgets=Budgets(turns=5, tokens=100))
    c.add(_model(0, 30, 10))
    c.add(ToolCalled(step=1, name="t", args={}, args_digest="x", output=1))
    c.add(_model(2, 20, 20))
    cp = fold(c.events)
    assert cp.spent["turns"] == 2
    assert cp.spent["tokens"] == 80
    assert cp.remaining("tokens") == 20
    assert cp.last_step == 2
    assert [m["step"] for m in cp.messages] == [0, 2]


def test_an_attempt_that_is_retried_is_no_turn() -> None:
    """A 429 that runledger retries (``will_retry``) then a reply: one turn; a step whose last
    attempt failed for good: one turn too (the model was asked, and the step ended)."""
    c = Chain()
    c.start(budgets=Budgets(turns=2))
    limited = ErrorInfo(type="ModelError", message="HTTP 429", retryable=True)
    c.add(ModelCalled(step=0, model="m", request={"messages": []}, args_digest="d", error=limited, will_retry=True))
    cp = fold(c.events)
    assert cp.spent["turns"] == 0 and cp.steps[0].status == "retrying"
    c.add(_model(0, 5, 5).model_copy(update={"attempt": 2}))
    c.add(ModelCalled(step=1, model="m", request={"messages": []}, args_digest="d", error=limited, will_retry=True))
    c.add(ModelCalled(step=1, model="m", request={"messages": []}, args_digest="d", error=limited, attempt=2))
    cp = fold(c.events)
    assert cp.spent["turns"] == 2 and cp.spent["tokens"] == 10
    assert cp.remaining("turns") == 0


def test_seconds_count_live_segments_only() -> None:
    c = Chain()
    c.start(ts="2026-01-01T00:00:00.000000Z")
    c.add(_model(0, 1, 1), ts="2026-01-01T00:00:10.000000Z")  # 10 s live, then a crash
    c.add(RunResumed(attempt=2, from_step=0), ts="2026-01-01T05:00:00.000000Z")  # 5 h down: not spend
    c.add(_model(1, 1, 1), ts="2026-01-01T05:00:02.500000Z")
    cp = fold(c.events)
    assert cp.spent["seconds"] == pytest.approx(12.5)
    assert cp.attempts == 2


def test_effect_states_and_committed_keys() -> None:
    c = Chain()
    c.start()
    c.add(EffectIntended(step=0, name="refund", key="refund:o1", args={}, args_digest="a"))
    assert fold(c.events).in_doubt_keys == ["refund:o1"]
    c.add(EffectCommitted(step=0, key="refund:o1", result={"id": 7}))
    cp = fold(c.events)
    assert cp.in_doubt_keys == []
    assert cp.committed_keys == ["refund:o1"]
    assert cp.steps[0].status == "committed"
    assert cp.steps[0].output == {"id": 7}


def test_approval_applies_only_to_the_digest_it_approved() -> None:
    c = Chain()
    c.start()
    c.add(ApprovalRequested(step=0, request_id="r1", action="refund", args={"amount": 900}, digest="d1"))
    c.add(ApprovalResolved(request_id="r1", digest="OTHER", approved=True, by="op"))
    cp = fold(c.events)
    assert list(cp.pending_approvals) == ["r1"]
    assert cp.steps[0].status == "pending"
    c.add(ApprovalResolved(request_id="r1", digest="d1", approved=True, by="op"))
    cp = fold(c.events)
    assert cp.pending_approvals == {}
    assert cp.steps[0].status == "approved"


def test_a_changed_request_supersedes_the_pending_one() -> None:
    c = Chain()
    c.start()
    c.add(ApprovalRequested(step=0, request_id="r1", action="refund", args={"amount": 900}, digest="d1"))
    c.add(ApprovalRequested(step=0, request_id="r2", action="refund", args={"amount": 950}, digest="d2"))
    assert list(fold(c.events).pending_approvals) == ["r2"]


def test_grants_raise_limits_and_reopen_a_budget_failure() -> None:
    c = Chain()
    c.start(budgets=Budgets(tokens=50))
    c.add(_model(0, 40, 20))
    c.add(RunFailed(reason="budget_exhausted", error=ErrorInfo(type="BudgetExhaustedError", message="tokens")))
    assert fold(c.events).status == "failed"
    c.add(BudgetGranted(tokens=100, by="op"))
    cp = fold(c.events)
    assert cp.limits["tokens"] == 150
    assert cp.status == "running"


def test_checkpoint_at_step_stops_before_later_steps() -> None:
    c = Chain()
    c.start()
    for step in range(5):
        c.add(ToolCalled(step=step, name="t", args=step, args_digest=str(step), output=step * 2))
    c.add(RunCompleted(output="done"))
    cp = fold(c.events, upto_step=2)
    assert cp.last_step == 2
    assert sorted(cp.steps) == [0, 1, 2]
    assert cp.status == "running"
    assert fold(c.events).status == "completed"


def test_fold_is_pure_and_repeatable() -> None:
    c = Chain()
    c.start()
    c.add(_model(0, 1, 2))
    assert fold(c.events).to_dict() == fold(list(c.events)).to_dict()


def test_gap_and_broken_link_are_chain_errors() -> None:
    c = Chain()
    c.start()
    c.add(_model(0, 1, 1))
    c.add(_model(1, 1, 1))
    with pytest.raises(ChainError, match="expected seq 1"):
        fold([c.events[0], c.events[2]])
    other = Chain()
    other.start()
    other.add(_model(0, 9, 9))
    with pytest.raises(ChainError, match="prev_hash"):
        fold([c.events[0], other.events[1]])


def test_waiting_for_an_operator_is_not_spend() -> None:
    c = Chain()
    c.start(ts="2026-01-01T00:00:00.000000Z", budgets=Budgets(seconds=120))
    c.add(_model(0, 1, 1), ts="2026-01-01T00:00:05.000000Z")
    c.add(ApprovalRequested(step=1, request_id="r1", action="refund", args={}, digest="d"),
          ts="2026-01-01T00:00:06.000000Z")  # fmt: skip
    c.add(RunSuspended(step=1, request_id="r1"), ts="2026-01-01T00:00:07.000000Z")
    c.add(ApprovalResolved(request_id="r1", digest="d", approved=True, by="op"), ts="2026-01-01T01:00:00.000000Z")
    c.add(BudgetGranted(seconds=60, by="op"), ts="2026-01-01T01:30:00.000000Z")
    assert fold(c.events).spent["seconds"] == pytest.approx(7.0)
    c.add(RunResumed(attempt=2, from_step=1), ts="2026-01-01T02:00:00.000000Z")
    c.add(_model(2, 1, 1), ts="2026-01-01T02:00:03.000000Z")
    c.add(RunCompleted(output=None), ts="2026-01-01T02:00:04.000000Z")
    cp = fold(c.events)
    assert cp.spent["seconds"] == pytest.approx(11.0)
    assert cp.limits["seconds"] == 180


def _busy_checkpoint() -> Checkpoint:
    c = Chain()
    c.start(budgets=Budgets(turns=5), input={"ticket": "T-1", "items": [1, {"a": None}]})
    c.add(_model(0, 3, 4))
    c.add(ToolCalled(step=1, name="t", args={"x": 1}, args_digest="d", output={"rows": [1, 2]}))
    c.add(EffectIntended(step=2, name="refund", key="refund:1", args={"amount": 5}, args_digest="e"))
    c.add(EffectCommitted(step=2, key="refund:1", result={"id": "rf"}))
    c.add(ApprovalRequested(step=3, request_id="r1", action="a", args={"y": 2}, digest="g"))
    c.add(RunSuspended(step=3, request_id="r1"))
    return fold(c.events)


def test_to_dict_is_the_dataclass_as_a_dict_with_steps_in_order() -> None:
    for cp in (_busy_checkpoint(), Checkpoint()):
        expected = dataclasses.asdict(cp)
        expected["steps"] = [dataclasses.asdict(s) for _, s in sorted(cp.steps.items())]
        assert cp.to_dict() == expected
        assert list(cp.to_dict()) == list(expected)


def test_from_dict_inverts_to_dict() -> None:
    for cp in (_busy_checkpoint(), Checkpoint()):
        assert Checkpoint.from_dict(cp.to_dict()) == cp
        assert Checkpoint.from_dict({**cp.to_dict(), "a_field_from_a_newer_version": 1}) == cp


def test_a_child_step_is_started_then_completed_or_failed() -> None:
    from runledger.record.events import ChildCompleted, ChildFailed, ChildStarted

    c = Chain(run_id="P")
    c.start()
    c.add(ChildStarted(step=0, run_id="P-c0", agent="kid", args_digest="d0"), ts="2026-01-01T00:00:00.000000Z")
    cp = fold(c.events)
    rec = cp.steps[0]
    assert (rec.kind, rec.name, rec.args_digest, rec.status) == ("child", "kid", "d0", "started")
    assert rec.child_run_id == "P-c0"
    c.add(ChildCompleted(step=0, run_id="P-c0", output={"n": 1}), ts="2026-01-01T00:00:02.000000Z")
    c.add(ChildStarted(step=1, run_id="P-c1", agent="kid", args_digest="d1"))
    c.add(ChildCompleted(step=1, run_id="P-other", output="not this step's child"))  # changes nothing
    c.add(ChildFailed(step=1, run_id="P-c1", reason="budget_exhausted", error=ErrorInfo(type="E", message="m")))
    cp = fold(c.events)
    assert (cp.steps[0].status, cp.steps[0].output, cp.steps[0].duration_ms) == ("completed", {"n": 1}, 2000.0)
    assert (cp.steps[1].status, cp.steps[1].output) == ("failed", None)
    error = cp.steps[1].error or {}
    assert (error["type"], error["message"], error["reason"]) == ("E", "m", "budget_exhausted")
    assert cp.last_step == 1 and cp.child_of_run_id is None


def test_a_child_run_knows_its_parent_and_others_record_no_parent_fields() -> None:
    c = Chain(run_id="P-c3")
    started = c.start(parent_run_id="P", parent_step=3)
    cp = fold(c.events)
    assert (cp.child_of_run_id, cp.child_of_step) == ("P", 3)
    assert started.payload["parent_run_id"] == "P" and started.payload["parent_step"] == 3
    plain = Chain().start()
    assert "parent_run_id" not in plain.payload and "parent_step" not in plain.payload  # bytes as before children
    assert fold([plain]).child_of_run_id is None
