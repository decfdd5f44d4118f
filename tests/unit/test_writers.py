"""Who may say what: the writer token of a subject, as the fold of a run and of a key judge it."""

from __future__ import annotations

import pytest

from runledger.log.subjects import effect_subject, fence_filter, parse_run_subject, run_subject, writer_of
from runledger.record.events import (
    GENESIS,
    ApprovalRequested,
    ApprovalResolved,
    BudgetGranted,
    EffectCommitted,
    EffectFailed,
    EffectIntended,
    EffectResolved,
    ErrorInfo,
    Payload,
    RunStarted,
    make_event,
)
from runledger.record.fold import fold, fold_until_refused, split_refused
from runledger.record.records import Recorded
from runledger.sdk.effects import agent_view, fold_key
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
    """Refused and stepped over, never folded: the run stays readable (no ChainError, not broken) and
    the refusal is named with its stream sequence."""
    records = _chain(bodies)
    cp = fold(records)
    assert [r.split(": ", 1)[0] for r in cp.refused] == [f"stream seq {records[-1].stream_seq}"]
    assert reason in cp.refused[0]
    assert cp.next_seq == len(bodies) - 1  # the chain goes on without it
    if len(bodies) > 1:
        assert cp.writer == "a" and cp.status == "running" and cp.limits["tokens"] is None
    if any(isinstance(b, ApprovalRequested) for b, _ in bodies[:-1]):
        assert "q1" in cp.pending_approvals  # a forged approval approves nothing
    _, error = fold_until_refused(records)
    assert error is None
    accepted, refused = split_refused(records)
    assert accepted == records[:-1] and [r for r, _ in refused] == records[-1:]


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


PAY_A, PAY_W = effect_subject("support", "k", "a"), effect_subject("support", "k", "w")
CLAIM = EffectIntended(step=0, name="pay", key="k", args={}, args_digest="a" * 64)
PAID = EffectCommitted(step=0, key="k", result={"paid": 1})


@pytest.mark.parametrize(
    "forged",
    [
        EffectResolved(key="k", outcome="not_committed", by="reconcile"),
        EffectFailed(step=0, key="k", error=ErrorInfo(type="E", message="503")),
        EffectCommitted(step=0, key="k", result={"paid": "forged"}),
        EffectIntended(step=0, name="pay", key="k", args={}, args_digest="b" * 64),
    ],
)
def test_a_worker_cannot_move_a_key_its_agent_claimed(forged: Payload) -> None:
    """A committed key of the agent stays committed whatever a worker writes on it (issue 28, item 1)."""
    key = fold_key("k", _chain([(CLAIM, PAY_A), (PAID, PAY_A), (forged, PAY_W)]))
    assert (key.status, key.result, key.writer, key.attempt) == ("committed", {"paid": 1}, "a", 1)
    assert len(key.refused) == 1 and "stream seq 3" in key.refused[0] and "committed" in key.refused[0]
    assert key.next_seq == 3 and key.last_stream_seq == 3  # it still moved the fence


def test_an_outcome_counts_only_for_its_writers_own_claim() -> None:
    bare = fold_key("k", _chain([(PAID, PAY_W)]))  # a result nobody claimed
    assert bare.status == "free" and "where the key is free" in bare.refused[0]
    other_run = fold_key("k", [*_chain([(CLAIM, PAY_A)]), *_chain([(PAID, PAY_A)], run_id="r2")])
    assert other_run.status == "claimed" and "from run 'r2'" in other_run.refused[0]


def test_a_key_only_branches_claimed_is_free_to_its_agent() -> None:
    """A whole forged (or branch) claim and commit on ``w``: folded as the branch's, never the agent's word."""
    branch = fold_key("k", _chain([(CLAIM, PAY_W), (PAID, PAY_W)]))
    assert (branch.status, branch.writer, branch.refused) == ("committed", "w", [])
    seen = agent_view(branch)
    assert (seen.status, seen.result, seen.next_seq) == ("free", None, 2)
    taken = fold_key("k", _chain([(CLAIM, PAY_W), (PAID, PAY_W), (CLAIM, PAY_A), (PAID, PAY_A), (CLAIM, PAY_W)]))
    assert (taken.status, taken.writer, taken.attempt, len(taken.refused)) == ("committed", "a", 2, 1)
    assert agent_view(taken) is taken


def test_a_worker_claims_only_a_free_key() -> None:
    """A branch allowed to act may take a key whose agent's attempt failed (free again), never one that a
    claim holds: its claim would make the agent's own outcome the outcome of no claim."""
    failed = EffectFailed(step=0, key="k", error=ErrorInfo(type="E", message="503"))
    retried = fold_key("k", _chain([(CLAIM, PAY_A), (failed, PAY_A), (CLAIM, PAY_W), (PAID, PAY_W)]))
    assert (retried.status, retried.writer, retried.refused) == ("committed", "w", [])
    held = fold_key("k", _chain([(CLAIM, PAY_A), (CLAIM, PAY_W), (PAID, PAY_A)]))
    assert (held.status, held.writer, held.result) == ("committed", "a", {"paid": 1})
    assert "a worker's claim on a claimed key" in held.refused[0]


@pytest.mark.parametrize(
    ("run_id", "agent", "subject_agent", "reason"),
    [
        ("other", "support", "support", "names run 'other' on the subject of run 'r1'"),
        ("r1", "alpha", "support", "names agent 'alpha' on a subject of agent 'support'"),
    ],
)
def test_an_envelope_must_match_its_subject(run_id: str, agent: str, subject_agent: str, reason: str) -> None:
    """Issue 28, item 6: a run's events are the events whose envelope says what their subject says."""
    records = _chain([(STARTED, AGENT), (ASKED, AGENT)])
    event, _ = make_event(BudgetGranted(tokens=5, by="op"), run_id=run_id, agent=agent, seq=2,
                          prev_hash=records[-1].event.hash)  # fmt: skip
    forged = Recorded(event, 3, run_subject(subject_agent, "r1", "o"))
    cp = fold([*records, forged])
    assert cp.limits["tokens"] is None and cp.next_seq == 2 and reason in cp.refused[0]
    started_as = RunStarted(agent="alpha", version=VERSION)  # a run.started naming another agent
    assert "names agent 'alpha'" in fold(_chain([(started_as, AGENT)])).refused[0]


def test_another_agents_run_with_the_same_id_is_left_out() -> None:
    mine = _chain([(STARTED, AGENT), (ASKED, AGENT)])
    theirs = _chain([(RunStarted(agent="beta", version=VERSION), run_subject("beta", "r1"))], agent="beta")
    squatter = Recorded(theirs[0].event, 9, theirs[0].subject)
    accepted, refused = split_refused([*mine, squatter])
    assert accepted == mine and "which is agent 'support''s" in refused[0][1]
