"""Who may say what: the writer token of a subject, as the fold of a run and of a key judge it."""

from __future__ import annotations

import pytest

from runledger.errors import ChainError
from runledger.log.subjects import effect_subject, fence_filter, parse_run_subject, run_subject, writer_of
from runledger.record.events import (
    GENESIS,
    ApprovalRequested,
    ApprovalResolved,
    BudgetGranted,
    EffectIntended,
    EffectResolved,
    Payload,
    RunStarted,
    make_event,
)
from runledger.record.fold import fold, fold_until_refused
from runledger.record.records import Recorded
from runledger.sdk.effects import fold_key
from tests.unit.projections.chains import VERSION


def _chain(bodies: list[tuple[Payload, str]], run_id: str = "r1", agent: str = "support") -> list[Recorded]:
    out: list[Recorded] = []
    prev = GENESIS
    for seq, (body, subject) in enumerate(bodies):
        event, _ = make_event(body, run_id=run_id, agent=agent, seq=seq, prev_hash=prev)
        prev = event.hash
        out.append(Recorded(event, seq + 1, subject))
    return out


AGENT, WORKER, OPERATOR = (run_subject("support", "r1", w) for w in ("a", "w", "o"))  # type: ignore[arg-type]
STARTED = RunStarted(agent="support", version=VERSION)
ASKED = ApprovalRequested(step=0, request_id="q1", action="ship", args=None, digest="d" * 64)
APPROVED = ApprovalResolved(request_id="q1", digest="d" * 64, approved=True, by="op")


def test_subjects_carry_their_writer_and_fence_on_the_whole_run() -> None:
    assert AGENT == "ledger.run.support.r1.a" and parse_run_subject(OPERATOR) == ("support", "r1")
    assert writer_of(WORKER) == "w" and writer_of("ledger.run.support.r1") is None
    assert fence_filter(AGENT) == fence_filter(OPERATOR) == "ledger.run.support.r1.*"
    key = effect_subject("support", "refund:o1", "o")
    assert key.endswith(".o") and fence_filter(key) == key[:-1] + "*"
    assert fence_filter("ledger.cmd.rerun") is None


def test_an_operators_decision_on_the_operators_subject_is_honoured() -> None:
    cp = fold(_chain([(STARTED, AGENT), (ASKED, AGENT), (APPROVED, OPERATOR)]))
    assert cp.pending_approvals == {} and cp.writer == "a"


@pytest.mark.parametrize(
    ("bodies", "reason"),
    [
        ([(STARTED, AGENT), (ASKED, AGENT), (APPROVED, AGENT)], "forged decision"),  # an agent approving itself
        ([(STARTED, AGENT), (BudgetGranted(tokens=10, by="me"), AGENT)], "forged decision"),
        ([(STARTED, AGENT), (ASKED, AGENT), (APPROVED, WORKER)], "written as 'w'"),  # a worker in an agent's run
        ([(STARTED, AGENT), (ASKED, OPERATOR)], "carries only operator decisions"),
        ([(STARTED, OPERATOR)], "cannot start on the operator's subject"),
    ],
)
def test_a_decision_anywhere_else_is_refused(bodies: list[tuple[Payload, str]], reason: str) -> None:
    with pytest.raises(ChainError, match=reason):
        fold(_chain(bodies))
    _, error = fold_until_refused(_chain(bodies))
    assert error is not None and reason in error


def test_a_branch_copies_its_parents_approval() -> None:
    cp = fold(_chain([(STARTED, WORKER), (ASKED, WORKER), (APPROVED, WORKER)]))
    assert cp.pending_approvals == {} and cp.writer == "w"


def test_a_key_takes_an_operators_resolution_only_from_the_operators_subject() -> None:
    mine, theirs = effect_subject("support", "k", "a"), effect_subject("support", "k", "o")
    claim = EffectIntended(step=0, name="pay", key="k", args={}, args_digest="a" * 64)
    forged = EffectResolved(key="k", outcome="committed", by="alice", result={"paid": True})
    assert fold_key("k", _chain([(claim, mine), (forged, mine)])).status == "claimed"  # stepped over
    real = fold_key("k", _chain([(claim, mine), (forged, theirs)]))
    assert real.status == "committed" and real.result == {"paid": True}
    found = EffectResolved(key="k", outcome="not_committed", by="reconcile")
    assert fold_key("k", _chain([(claim, mine), (found, mine)])).status == "free"  # the agent's own evidence
    assert fold_key("k", _chain([(claim, mine), (claim, theirs)])).attempt == 1  # nothing else from "o"
