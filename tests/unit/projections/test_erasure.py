"""An erased run's rows: content replaced, structure kept, the rewrite done once."""

from __future__ import annotations

from runledger.projections.erasure import ERASED, ERASED_TEXT, erase_checkpoint, erase_payload, erased_json
from runledger.record.fold import Checkpoint, StepRecord

SEALED = {"$enc": "A256GCM", "kid": "a.r", "ct": "AAAA"}


def _checkpoint() -> Checkpoint:
    cp = Checkpoint(run_id="r", agent="a", input=SEALED, output={"plain": "Ann"}, status="failed")
    cp.error = {"type": "ValueError", "message": "Ann's card", "traceback": "tb", "retryable": False}
    cp.steps = {
        0: StepRecord(0, "tool", "lookup", "d0", "ok", 1, output=SEALED),
        1: StepRecord(1, "model", "m", "d1", "ok", 2, output={**SEALED, "usage": {"input_tokens": 3}}),
        2: StepRecord(2, "approval", "send", "d2", "approved", 3, output={"approved": True, "by": "op"}),
        3: StepRecord(3, "clock", "clock", "", "ok", 4, output="2025-01-01T00:00:00Z"),
        4: StepRecord(4, "effect", "pay", "d4", "failed", 5, error={"type": "E", "message": "Ann"}),
    }
    cp.pending_approvals = {"q": {"action": "send", "args": {"to": "Ann"}, "step": 5}}
    return cp


def test_content_goes_structure_stays() -> None:
    cp = _checkpoint()
    erase_checkpoint(cp)
    assert cp.input == ERASED and cp.output == ERASED
    assert cp.error == {"type": "ValueError", "message": ERASED_TEXT, "traceback": ERASED_TEXT, "retryable": False}
    assert cp.steps[0].output == ERASED
    assert cp.steps[1].output == {**ERASED, "usage": {"input_tokens": 3}}  # token usage is structure
    assert cp.steps[2].output == {"approved": True, "by": "op"}  # a decision, not content
    assert cp.steps[3].output == "2025-01-01T00:00:00Z"
    assert cp.steps[4].error == {"type": "E", "message": ERASED_TEXT} and cp.steps[4].status == "failed"
    assert cp.pending_approvals["q"] == {"action": "send", "args": ERASED, "step": 5}
    assert "Ann" not in repr(cp.to_dict())


def test_erasing_twice_changes_nothing() -> None:
    cp = _checkpoint()
    erase_checkpoint(cp)
    steps = dict(cp.steps)
    erase_checkpoint(cp)
    assert all(cp.steps[n] is steps[n] for n in steps)  # the projector rewrites a step's row only once


def test_event_payloads() -> None:
    payload = {"step": 1, "name": "t", "args": {"to": "Ann"}, "args_digest": "d", "output": None,
               "error": {"type": "E", "message": "Ann", "traceback": None}}  # fmt: skip
    assert erase_payload("tool.called", payload) == {
        "step": 1, "name": "t", "args": ERASED, "args_digest": "d", "output": None,
        "error": {"type": "E", "message": ERASED_TEXT, "traceback": None},
    }  # fmt: skip
    assert erased_json("run.completed", '{"output":{"x":"Ann"}}') == '{"output":{"$erased":true}}'
    assert erased_json("run.erased", '{"reason":"r","by":"b","kid":"k"}') is None  # nothing to rewrite
