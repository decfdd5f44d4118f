"""Where a re-run forks when no step is given, and whether its change is exercised from there.

**The fork at the decision** (``default_fork``). With no ``--at-step``, a re-run forks at the decision
that led to the run's outcome (``runledger.record.failures.decision_step``): the last model call at or
before the failing step. The failing step is the one ``run.failed`` names (the step in flight when the
agent raised: the last one recorded), else the run's last step (a run that completed, or waits on a
human). A run with no model call at or before it forks at that step itself. Forking at the decision is
what makes a changed model or prompt meet the call it should change: forked at the failing step (the
default before), a failure raised by the agent's code after the model's reply ran no model call past the
fork, and every model candidate looked alike.

**Exercised** (``exercise``, ``predict``). The prefix is the record, so a counterfactual's change can
only show from the fork on. What that needs, per element of the version tuple:

=======================  ==========================================================================
``model``, ``prompt``    the branch calls the model at a step >= k (the prompt travels in the
                         model's requests; nothing else reads it)
``tool_schema_hashes``   the same: the model is the only reader of a tool's description and
                         parameters. Whether the tool is then called is not the test: a
                         description that steers the model away from a tool is the change at work
``agent_version``        the branch reaches the fork: every step before k served from the record,
                         the agent's code then makes the calls from k on and ends the run (its
                         return or its exception are the code's too). A candidate that calls
                         otherwise than the record before k stops there (nondeterminism): it never
                         ran at the decision
=======================  ==========================================================================

For every element, a branch that stopped before reaching step k did not exercise its change. A branch
whose change was not exercised is judged ``not_exercised`` (``runledger.sandbox.gate``), never
``improved`` (fixed) nor ``still_failing``: nothing about the change was tested. The plan predicts it
from the parent's record before anything runs: up to its first model call from the fork, a branch
whose change is the model, the prompt or the tool schemas runs the parent's code on the parent's
record, so it makes the parent's calls; a parent with no model call from k on predicts a branch with
none. A code change is judged when it runs.

Rejected: "the changed tool is called" as the test of a tools change (see above); tracing which of the
candidate's lines run past the fork in the guest, for a code change: the record holds one hash of the
whole import closure, not which module changed, so a trace has nothing to be compared with, and past a
reached fork the agent's code always runs (it makes the calls from there and returns).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runledger.record.failures import decision_step
from runledger.record.fold import Checkpoint

# What the model reads: a change to one of these is exercised only by a model call from the fork on.
READ_BY_THE_MODEL = ("model", "prompt_hash", "tool_schema_hashes")
WHAT_CHANGED = {
    "model": "the changed model",
    "prompt_hash": "the changed prompt",
    "tool_schema_hashes": "the changed tool descriptions",
    "agent_version": "the changed agent code",
}


@dataclass(frozen=True)
class Decision:
    """The fork step a re-run takes when none is given, and why (the plan shows it)."""

    step: int
    why: str


@dataclass(frozen=True)
class Exercise:
    """Whether a branch's change is exercised from its fork on (``exercised``), and why."""

    exercised: bool
    why: str

    def to_dict(self) -> dict[str, object]:
        return {"exercised": self.exercised, "why": self.why}


def failing_step(cp: Checkpoint) -> int:
    """The step a run's outcome is judged at: the one its ``run.failed`` names, else its last step
    (-1 for a run with no step)."""
    if cp.status == "failed" and cp.failed_step is not None:
        return int(cp.failed_step)
    return cp.last_step


def default_fork(cp: Checkpoint) -> Decision:
    """The fork step of a re-run of ``cp`` given none: its decision (``runledger.record.failures.decision_step``,
    the one rule the classes of failure and the in-process replayer use too), else its failing step."""
    target = failing_step(cp)
    if target < 0:
        return Decision(0, "the run recorded no step: forked at step 0")
    where = f"step {target}, where the run failed" if cp.status == "failed" else f"step {target}, its last"
    step = decision_step(cp)
    if step is not None:
        return Decision(step, f"the decision: the last model call at or before {where}")
    return Decision(target, f"no model call at or before {where}: forked there")


def _model_calls_from(kinds: Mapping[int, str], fork_step: int) -> list[int]:
    return sorted(n for n, kind in kinds.items() if kind == "model" and n >= fork_step)


def reached_fork(kinds: Mapping[int, str], fork_step: int, status: str, failure_reason: str | None) -> bool:
    """Whether a branch with these steps (number -> kind) and outcome got past the record's prefix: it
    recorded a step numbered ``fork_step`` or later, or it served every step before it and then ended
    (not on a call before the fork that the record cannot answer: ``nondeterminism``)."""
    if any(n >= fork_step for n in kinds):
        return True
    if status not in ("completed", "failed") or failure_reason == "nondeterminism":
        return False
    return max(kinds, default=-1) >= fork_step - 1


def exercise(
    changed: str | None, fork_step: int, kinds: Mapping[int, str], status: str, failure_reason: str | None
) -> Exercise | None:
    """Whether a branch changing ``changed`` (a version-tuple element; None: nothing changed, and
    None is returned) exercised its change, from its steps (number -> kind) and outcome."""
    if changed is None:
        return None
    what = WHAT_CHANGED.get(changed, f"the changed {changed}")
    if not reached_fork(kinds, fork_step, status, failure_reason):
        last = max(kinds, default=-1)
        stopped = f"after step {last}" if last >= 0 else "before its first step"
        return Exercise(False, f"the branch stopped {stopped} ({status}"
                        + (f", {failure_reason}" if failure_reason else "")
                        + f"), before its fork at step {fork_step}: {what} never ran there; "
                        "fork earlier (--at-step)")  # fmt: skip
    if changed not in READ_BY_THE_MODEL:
        return Exercise(True, f"{what} ran from the fork (step {fork_step}) on")
    calls = _model_calls_from(kinds, fork_step)
    if calls:
        return Exercise(True, f"the model was called from the fork on (step {calls[0]})")
    return Exercise(False, f"no model call from the fork (step {fork_step}) on: {what} was never read")


def exercise_of(branch: Checkpoint) -> Exercise | None:
    """``exercise`` of a folded branch (its ``run.forked`` names the change and the fork step)."""
    fork = branch.parent or {}
    kinds = {n: s.kind for n, s in branch.steps.items()}
    return exercise(fork.get("changed"), int(fork.get("fork_step") or 0), kinds, branch.status, branch.failure_reason)


def predict(parent: Checkpoint, fork_step: int, changed: str | None) -> Exercise | None:
    """What ``exercise`` will say of a branch of ``parent`` forked at ``fork_step`` changing ``changed``,
    predicted from the parent's record (module docstring); None when nothing changes."""
    if changed is None:
        return None
    what = WHAT_CHANGED.get(changed, f"the changed {changed}")
    if changed not in READ_BY_THE_MODEL:
        return Exercise(
            True,
            f"{what} runs from the fork on: it makes the calls from step {fork_step} and ends the "
            "run (a call before the fork other than the record's stops it there, unexercised)",
        )
    calls = _model_calls_from({n: s.kind for n, s in parent.steps.items()}, fork_step)
    if calls:
        return Exercise(True, f"the model is called from the fork on (step {calls[0]} in the record)")
    before = [n for n, s in parent.steps.items() if s.kind == "model" and n < fork_step]
    advice = f"; fork at or before step {max(before)}, the last model call" if before else ""
    return Exercise(
        False,
        f"the record has no model call from step {fork_step} on: {what} would never be read "
        f"and the branch is judged `not exercised`{advice} (or leave --at-step out: the decision)",
    )
