"""Where a re-run forks without ``--at-step`` (the decision) and whether a change is exercised from there
(``runledger.sandbox.decision``), from plain checkpoints."""

from __future__ import annotations

import pytest

from runledger.record.fold import Checkpoint, StepRecord
from runledger.sandbox.decision import default_fork, exercise, predict

KINDS = ("model", "tool", "model", "clock", "effect")


def run(status: str, kinds: tuple[str, ...] = KINDS, failed_step: int | None = None) -> Checkpoint:
    cp = Checkpoint(run_id="p", agent="a", status=status, failed_step=failed_step)
    for n, kind in enumerate(kinds):
        cp.steps[n] = StepRecord(n, kind, kind, "d", "ok", n)
    cp.last_step = len(kinds) - 1
    return cp


@pytest.mark.parametrize(
    ("cp", "step", "why"),
    [
        # The agent raised after the model's reply (failed at step 3, the clock): the decision is step 2.
        # Before, the default fork was the last step (3): no model call after it.
        (run("failed", KINDS[:4], failed_step=3), 2, "the last model call at or before step 3, where the run failed"),
        (run("failed", KINDS[:3], failed_step=2), 2, "the last model call at or before step 2, where the run failed"),
        (run("failed", KINDS[:2], failed_step=1), 0, "at or before step 1, where the run failed"),
        (run("completed"), 2, "the last model call at or before step 4, its last"),
        (run("suspended", KINDS[:4]), 2, "step 3, its last"),
        (run("failed", ("tool", "clock"), failed_step=1), 1, "no model call at or before step 1"),
        (run("failed", (), failed_step=None), 0, "the run recorded no step"),
    ],
)  # fmt: skip
def test_without_a_step_a_rerun_forks_at_the_decision(cp: Checkpoint, step: int, why: str) -> None:
    decision = default_fork(cp)
    assert decision.step == step and why in decision.why, decision


def test_the_plan_predicts_a_change_the_model_never_reads() -> None:
    parent = run("failed", KINDS[:4], failed_step=3)
    for changed in ("model", "prompt_hash", "tool_schema_hashes"):
        late = predict(parent, 3, changed)
        assert late is not None and not late.exercised
        assert "no model call from step 3 on" in late.why and "fork at or before step 2" in late.why, late.why
        at_decision = predict(parent, 2, changed)
        assert at_decision is not None and at_decision.exercised and "step 2" in at_decision.why
    code = predict(parent, 3, "agent_version")
    assert code is not None and code.exercised  # the agent's code runs from the fork on, wherever it is
    assert predict(parent, 3, None) is None  # nothing changes: nothing to exercise


def test_what_exercised_means_in_a_branch() -> None:
    kinds = {0: "model", 1: "tool", 2: "model", 3: "clock"}
    assert exercise("model", 2, kinds, "completed", None).exercised  # type: ignore[union-attr]
    unread = exercise("prompt_hash", 3, kinds, "failed", "exception")
    assert unread is not None and not unread.exercised and "the changed prompt was never read" in unread.why
    # A tools change is read by the model only: a model call from the fork is what exercises it.
    assert exercise("tool_schema_hashes", 2, kinds, "failed", "exception").exercised  # type: ignore[union-attr]
    # Agent code: exercised once the branch gets past the record's prefix (steps 0..k-1 served, then it ends
    # or calls on); a branch stopped before its fork by a call the record cannot answer is not.
    assert exercise("agent_version", 4, kinds, "completed", None).exercised  # type: ignore[union-attr]
    assert exercise("agent_version", 4, kinds, "failed", "exception").exercised  # type: ignore[union-attr]
    stopped = exercise("agent_version", 4, {0: "model"}, "failed", "nondeterminism")
    assert stopped is not None and not stopped.exercised and "before its fork at step 4" in stopped.why
    short = exercise("agent_version", 4, {0: "model", 1: "tool"}, "failed", "sandbox")
    assert short is not None and not short.exercised
    # Changed model, branch stopped in the prefix: not exercised either, whatever it called before.
    assert not exercise("model", 3, {0: "model"}, "failed", "nondeterminism").exercised  # type: ignore[union-attr]
    assert exercise(None, 3, kinds, "completed", None) is None
