"""The plan of a re-run (``runledger.sandbox.plan``) from plain checkpoints: each kind of step, each mode."""

from __future__ import annotations

from typing import Any

import pytest

from runledger.record.fold import Checkpoint, StepRecord
from runledger.sandbox.plan import ACTIONS, plan_steps, render_plan
from runledger.sandbox.rerun import RerunRequest

AGENT = "runledger.examples.refund_agent.agent:spec"


def parent(*steps: tuple[str, str, str, str | None]) -> Checkpoint:
    cp = Checkpoint(run_id="p", agent="a", status="completed")
    for number, (kind, name, status, key) in enumerate(steps):
        cp.steps[number] = StepRecord(number, kind, name, "d", status, number, key=key)
    cp.last_step = len(steps) - 1
    return cp


STEPS = parent(
    ("model", "m", "ok", None),
    ("tool", "lookup", "ok", None),
    ("effect", "refund", "committed", "refund:1"),
    ("effect", "email", "simulated", "email:1"),
    ("effect", "charge", "intended", "charge:1"),
    ("approval", "refund", "approved", None),
    ("approval", "refund", "pending", None),
    ("clock", "clock", "ok", None),
    ("child", "helper", "completed", None),
)


def actions(mode: str, fork: int = 0, **extra: Any) -> list[str]:
    request = RerunRequest(parent_run_id="p", agent=AGENT, mode=mode, fork_step=fork, **extra)  # type: ignore[arg-type]
    return [s.action for s in plan_steps(STEPS, request, fork)]


def test_redrive_serves_the_record_and_refuses_what_it_cannot_answer() -> None:
    assert actions("redrive") == ["live", "record", "record", "record", "refused", "record", "live", "record", "record"]


def test_live_runs_tools_stubs_new_effects_and_refuses_children() -> None:
    assert actions("live") == ["live", "live", "record", "stub", "stub", "live", "live", "live", "refused"]
    assert actions("live", allow_effects=True) == [
        "live", "live", "record", "live", "live", "live", "live", "live", "refused",
    ]  # fmt: skip
    assert actions("live", live_tools=["other"])[1] == "refused"


def test_steps_before_the_fork_come_from_the_record_and_a_counterfactual_follows_its_base() -> None:
    # Step 4, an effect with no outcome (intended), cannot be served before the fork either: BranchRun
    # raises NondeterminismError there, as it diverges at it after the fork in a re-drive.
    assert actions("live", fork=5)[:5] == ["record", "record", "record", "record", "refused"]
    assert actions("live", fork=9) == actions("redrive", fork=9)[:1] + actions("redrive")[1:]
    assert actions("counterfactual", change={"model": "x:y"}, base_mode="live") == actions("live")
    assert set(actions("replay")) == {"record"}


@pytest.mark.parametrize("mode", ["redrive", "live"])
def test_every_step_gets_one_of_the_four_actions_and_a_reason(mode: str) -> None:
    request = RerunRequest(parent_run_id="p", agent=AGENT, mode=mode, fork_step=2)  # type: ignore[arg-type]
    steps = plan_steps(STEPS, request, 2)
    assert [s.step for s in steps] == sorted(STEPS.steps)
    assert all(s.action in ACTIONS and s.why for s in steps)


def test_the_rendered_plan_lists_every_step_and_counts_from_the_fork() -> None:
    from runledger.sandbox.plan import BranchPlan

    request = RerunRequest(parent_run_id="p", agent=AGENT, mode="live", fork_step=2)
    plan = BranchPlan("p", request.branch_run_id, "live", "live", 2, False, plan_steps(STEPS, request, 2))
    text = render_plan(plan)
    assert text.count("\n") >= len(STEPS.steps) + 2
    assert "from the fork: 1 served from the record, 3 run live, 2 stubbed, 1 refused" in text
    assert plan.to_dict()["counts"] == {"record": 1, "live": 3, "stub": 2, "refused": 1}


def test_before_the_fork_the_plan_applies_the_record_rules_the_branch_applies() -> None:
    # What BranchRun does below its fork step: a pending approval is asked again (it suspends), a
    # failed effect and a child run without an outcome are not answered by the record.
    cp = parent(
        ("model", "m", "ok", None),
        ("approval", "refund", "denied", None),
        ("effect", "refund", "failed", "refund:1"),
        ("child", "helper", "started", None),
        ("child", "helper", "failed", None),
        ("tool", "lookup", "ok", None),
    )
    request = RerunRequest(parent_run_id="p", agent=AGENT, mode="live", fork_step=6)
    steps = plan_steps(cp, request, 6)
    assert [s.action for s in steps] == ["record", "live", "refused", "refused", "record", "record"]
    assert all(s.why.startswith(("before the fork", "asked again", "the child run")) for s in steps)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--where", "true", "--plan"], "--plan shows the plan of one run's re-run"),
        (["RUN", "--json"], "--json goes with --plan"),
    ],
)
def test_rerun_refuses_plan_flags_it_would_otherwise_ignore(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before the fix, --plan with --where ran the sweep (queueing every re-run --plan promises not to).
    from runledger.cli.app import main

    code = main(["rerun", "--nats", "nats://127.0.0.1:1", "--agent", AGENT, "--mode", "live", *flags])
    assert code == 4  # Exit.ERROR: options that cannot go together
    assert message in capsys.readouterr().err
