"""`runledger diff` on plain checkpoints: the alignment at the fork, the fork decision, args_differ."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runledger.record.fold import Checkpoint, StepRecord
from runledger.sandbox.branch import ARGS_DIFFER, args_differ_marker
from runledger.sandbox.diff import align, diff_runs, render
from runledger.sandbox.errors import SandboxError
from runledger.sandbox.sweep import SweepSummary

ORDER = {"order": "order-8891", "amount": 49.9, "item": "blender"}


def model(step: int, content: str, name: str = "scripted-1") -> StepRecord:
    return StepRecord(step, "model", name, f"m{step}", "ok", step, output={"content": content, "usage": {}})


def tool(step: int, name: str, output: Any, args_digest: str = "t") -> StepRecord:
    return StepRecord(step, "tool", name, args_digest, "ok", step, output=output)


def effect(
    step: int, name: str, key: str, args_digest: str = "e", status: str = "committed", output: Any = None
) -> StepRecord:
    return StepRecord(step, "effect", name, args_digest if status != "simulated" else "", status, step,
                      output={"ok": True} if output is None else output, key=key)  # fmt: skip


def run(run_id: str, steps: list[StepRecord], *, fork: int | None = None, parent: str = "P") -> Checkpoint:
    cp = Checkpoint(run_id=run_id, status="completed", steps={s.step: s for s in steps})
    cp.last_step = max(cp.steps, default=-1)
    if fork is not None:
        cp.parent = {"forked_from": parent, "fork_step": fork, "mode": "live", "changed": None}
    return cp


def parent_run() -> Checkpoint:
    return run("P", [
        model(0, '{"intent": "refund"}'),
        tool(1, "lookup_order", ORDER),
        model(2, '{"refund": true}'),
        effect(3, "refund", "refund:order-8891", "r1"),
        effect(4, "send_email", "email:T-1", "m1"),
    ])  # fmt: skip


def test_an_inserted_tool_call_after_the_fork_leaves_the_rest_aligned() -> None:
    branch = run("B", [
        model(0, '{"intent": "refund"}'),
        tool(1, "lookup_order", ORDER),
        model(2, '{"refund": true}'),
        tool(3, "check_warranty", {"valid": True}),  # the extra call
        effect(4, "refund", "refund:order-8891", "r1"),
        effect(5, "send_email", "email:T-1", "m1"),
    ], fork=2)  # fmt: skip
    d = diff_runs(parent_run(), branch)
    assert [(s.op, s.parent_step, s.branch_step) for s in d.steps] == [
        ("equal", 2, 2), ("inserted", None, 3), ("equal", 3, 4), ("equal", 4, 5),
    ]  # fmt: skip
    assert d.first_difference == 3
    assert d.alignment == {"equal": 3, "changed": 0, "inserted": 1, "removed": 0}
    assert d.fork_decision is not None and d.fork_decision.same
    assert (d.fork_decision.parent_step, d.fork_decision.branch_step) == (2, 2)
    text = render(d)
    assert "+ parent:" in text and "check_warranty" in text
    assert "first difference at step 3 (inserted)" in text
    # By step number alone, every step after the insertion would have differed.
    assert sum(1 for s in d.steps if not s.same) == 1


def test_a_dropped_effect_is_removed_and_a_changed_decision_comes_first() -> None:
    branch = run("B", [
        model(0, '{"intent": "refund"}'),
        tool(1, "lookup_order", ORDER),
        model(2, '{"refund": false}', name="scripted-strict-1"),
        effect(3, "send_email", "email:T-1", "m2"),
    ], fork=2)  # fmt: skip
    d = diff_runs(parent_run(), branch)
    assert [(s.op, s.parent_step, s.branch_step) for s in d.steps] == [
        ("changed", 2, 2), ("removed", 3, None), ("changed", 4, 3),
    ]  # fmt: skip
    assert d.first_difference == 2
    fd = d.fork_decision
    assert fd is not None and not fd.same
    assert '"refund": true' in fd.parent["output"]["content"]  # type: ignore[index]
    assert '"refund": false' in fd.branch["output"]["content"]  # type: ignore[index]
    text = render(d)
    lines = text.splitlines()
    at = lines.index("decision at the fork:")
    assert at < next(i for i, line in enumerate(lines) if line.startswith("first difference"))
    assert lines[at + 1] == '  parent step 2: scripted-1: {"refund": true}'
    assert lines[at + 2].startswith("  branch step 2: scripted-strict-1:")
    assert "- parent:   3 effect refund committed" in text


def test_a_decision_made_by_tool_calls_shows_the_calls() -> None:
    calling = StepRecord(2, "model", "scripted-1", "m2", "ok", 2, output={
        "content": "", "usage": {}, "tool_calls": [{"name": "refund", "args": {"order": "order-8891"}, "id": "c1"}],
    })  # fmt: skip
    parent = run("P", [model(0, "lookup"), tool(1, "lookup_order", ORDER), calling])
    branch = run("B", [model(0, "lookup"), tool(1, "lookup_order", ORDER), model(2, "Send a photo, please.")], fork=2)
    lines = render(diff_runs(parent, branch)).splitlines()
    at = lines.index("decision at the fork:")
    assert lines[at + 1] == '  parent step 2: scripted-1: calls refund({"order": "order-8891"})'
    assert lines[at + 2] == "  branch step 2: scripted-1: Send a photo, please."


def test_a_model_call_with_other_token_counts_is_the_same_decision() -> None:
    parent = run("P", [model(0, "x")])
    other = StepRecord(0, "model", "other", "m9", "ok", 0, output={"content": "x", "usage": {"input_tokens": 3}})
    branch = run("B", [other], fork=0)
    d = diff_runs(parent, branch)
    assert d.first_difference is None and [s.op for s in d.steps] == ["equal"]
    assert "no step differs from the fork on" in render(d)


def test_a_tool_called_with_other_arguments_is_changed_even_with_the_same_output() -> None:
    d = diff_runs(run("P", [tool(0, "lookup_order", ORDER, "a1")]),
                  run("B", [tool(0, "lookup_order", ORDER, "a2")], fork=0))  # fmt: skip
    assert [s.op for s in d.steps] == ["changed"]


def test_a_replaced_step_is_removed_and_inserted_not_paired() -> None:
    steps = align([model(0, "a"), tool(1, "x", 1), model(2, "b")], [model(0, "a"), tool(1, "y", 1), model(2, "b")])
    assert [(s.op, s.parent_step, s.branch_step) for s in steps] == [
        ("equal", 0, 0), ("removed", 1, None), ("inserted", None, 1), ("equal", 2, 2),
    ]  # fmt: skip


def test_an_effect_simulated_because_its_arguments_differ_shows_both_digests() -> None:
    marker = {"simulated": True, "effect": "send_email", "key": "email:T-1", "reason": ARGS_DIFFER,
              "args_digest": "b" * 64, "committed_args_digest": "a" * 64}  # fmt: skip
    assert args_differ_marker(marker) is marker
    assert args_differ_marker({"simulated": True, "effect": "send_email", "key": "email:T-1"}) is None
    branch = run("B", [
        model(0, '{"intent": "refund"}'),
        tool(1, "lookup_order", ORDER),
        model(2, '{"refund": true}'),
        effect(3, "refund", "refund:order-8891", "r1"),
        effect(4, "send_email", "email:T-1", status="simulated", output=marker),
    ], fork=0)  # fmt: skip
    d = diff_runs(parent_run(), branch)
    assert [s.op for s in d.steps] == ["equal"] * 4 + ["changed"]
    assert d.first_difference == 4
    (e,) = d.args_differ
    assert (e.step, e.name, e.key, e.args_digest, e.committed_args_digest, e.parent_step) == (
        4, "send_email", "email:T-1", "b" * 64, "a" * 64, 4,
    )  # fmt: skip
    assert d.steps[-1].branch is not None and d.steps[-1].branch["reason"] == ARGS_DIFFER
    text = render(d)
    assert f"step 4 send_email key email:T-1: args {'b' * 64}, committed with {'a' * 64}" in text
    assert "effect send_email simulated (args_differ)" in text
    # The JSON form keeps the older keys and adds the new ones.
    data = json.loads(json.dumps(d.to_dict(), default=str))
    assert data["first_difference"] == 4 and data["outcome"]["branch"] == "completed"
    assert {"step", "parent", "branch", "same", "op", "parent_step", "branch_step"} <= set(data["steps"][0])
    assert data["args_differ"][0]["committed_args_digest"] == "a" * 64
    assert data["fork_decision"]["parent_step"] == 0 and data["alignment"]["changed"] == 1


def test_a_digest_the_capture_policy_mangled_is_not_shown_as_one() -> None:
    # A redactor may take a run of digits in a hex digest for a card number (rarely): the committed
    # side then comes from the parent's claim (structure, in the clear), the branch's is unreadable.
    mangled = "abc«redacted:card_number:68461c4333f0»def"
    marker = {"simulated": True, "effect": "send_email", "key": "email:T-1", "reason": ARGS_DIFFER,
              "args_digest": mangled, "committed_args_digest": mangled}  # fmt: skip
    branch = run("B", [effect(0, "send_email", "email:T-1", status="simulated", output=marker)], fork=0)
    parent = run("P", [effect(0, "send_email", "email:T-1", "c" * 64)])
    (e,) = diff_runs(parent, branch).args_differ
    assert (e.args_digest, e.committed_args_digest, e.parent_step) == (None, "c" * 64, 0)
    assert f"args ? (unreadable), committed with {'c' * 64}" in render(diff_runs(parent, branch))


def test_a_run_that_is_not_a_branch_of_the_parent_is_refused() -> None:
    with pytest.raises(SandboxError, match="not a branch"):
        diff_runs(parent_run(), run("B", [], fork=0, parent="other"))


def test_the_sweep_summary_counts_effects_with_changed_arguments() -> None:
    summary = SweepSummary(total=2, completed=2, args_differ=1, args_differ_runs=["P"], branches={"P": "br-1"})
    text = summary.render()
    assert "effects with changed arguments: 1 in 1 runs" in text and "args differ: P -> br-1" in text
    assert "changed arguments" not in SweepSummary(total=1, completed=1).render()


def _tool_called(run_id: str, step: int, args: Any) -> Any:
    from runledger.record.events import Event, ToolCalled
    from runledger.record.records import Recorded

    body = ToolCalled(step=step, name="lookup_order", args=args, args_digest=f"keyed-{run_id}-{step}", output=ORDER)
    event = Event(id=f"e{run_id}{step}", run_id=run_id, agent="a", seq=step, type=body.TYPE, schema_version=1,
                  ts="2026-01-01T00:00:00Z",
                  payload=body.model_dump(mode="json"), prev_hash="0" * 64, hash="1" * 64)  # fmt: skip
    return Recorded(event, step)


def test_keyed_runs_compare_the_arguments_they_hold_not_their_digests() -> None:
    """Each run digests under its own key (digest scheme 2): one call makes two digests. ``diff`` then
    compares the opened arguments, a redaction token by its kind alone (each run's tokens are keyed
    under its own token key), and does not judge arguments it cannot read."""
    parent = run("P", [model(0, "x"), tool(1, "lookup_order", ORDER, "keyed-P-1")])
    branch = run("B", [model(0, "x"), tool(1, "lookup_order", ORDER, "keyed-B-1")], fork=0)
    parent.digest_scheme = branch.digest_scheme = 2
    ours, theirs = "«redacted:card_number:aaaaaaaaaaaa»", "«redacted:card_number:bbbbbbbbbbbb»"
    same = diff_runs(parent, branch, [_tool_called("P", 1, {"order": "order-8891", "card": ours})],
                     [_tool_called("B", 1, {"card": theirs, "order": "order-8891"})])  # fmt: skip
    assert [s.op for s in same.steps] == ["equal", "equal"], same.steps
    other = diff_runs(parent, branch, [_tool_called("P", 1, {"order": "order-8891"})],
                      [_tool_called("B", 1, {"order": "order-7"})])  # fmt: skip
    assert [s.op for s in other.steps] == ["equal", "changed"]
    unread = diff_runs(parent, branch, [_tool_called("P", 1, {"$enc": "A256GCM", "kid": "k", "ct": "x"})],
                       [_tool_called("B", 1, {"order": "order-7"})])  # fmt: skip
    assert [s.op for s in unread.steps] == ["equal", "equal"]  # sealed from this reader: judged by the rest
    # Plain digests (both runs scheme 1) still compare as they are.
    parent.digest_scheme = branch.digest_scheme = 1
    assert [s.op for s in diff_runs(parent, branch).steps] == ["equal", "changed"]
