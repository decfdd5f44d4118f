"""Classes of failure (runledger.record.failures): the masked message, the signature and its class id, the
shape a failing run records before its message is sealed, and the decision a failure came from."""

from __future__ import annotations

import pytest

from runledger.log.memory import MemoryLedger
from runledger.protect.loading import load_run
from runledger.record.events import ErrorInfo, RunFailed
from runledger.record.failures import decision_step, failure_signature, mask_message, message_shape
from runledger.record.fold import fold
from runledger.sdk.lifecycle import start_run
from tests import tripbot


@pytest.mark.parametrize(
    ("message", "masked"),
    [
        ("unknown currency 'franc' for trip TR-004 at 243.0", "unknown currency <str> for trip TR-<n> at <n>"),
        ("confirmation 3f9a0c1b2d4e of trip TR-013 has no total", "confirmation <hex> of trip TR-<n> has no total"),
        ("confirmation 301234567890 of trip TR-3 has no total", "confirmation <hex> of trip TR-<n> has no total"),
        ("tool 'quote' (step 1) raised LookupError: no hotels in \"El Dorado\" for 3 nights",
         "tool <str> (step <n>) raised LookupError: no hotels in <str> for <n> nights"),
        ("can't find the user's order order-8891 (run 01J8ZKQ3ABCDEFGHJKMNPQRSTV)",
         "can't find the user's order <id> (run <id>)"),
        ("id 123e4567-e89b-12d3-a456-426614174000 at 127.0.0.1:8080, -5 and 1e5", "id <id> at <n>:<n>, <n> and <n>"),
        ("key «redacted:api_key:abcdef012345» refused", "key <secret> refused"),
        ("too many values to unpack (expected 4)\n  got 5", "too many values to unpack (expected <n>) got <n>"),
    ],
)  # fmt: skip
def test_numbers_ids_digests_and_quoted_values_are_masked(message: str, masked: str) -> None:
    assert mask_message(message) == masked


async def test_one_cause_is_one_class_whatever_its_values_and_the_shape_outlives_sealing() -> None:
    client = await MemoryLedger().connect()
    classes: dict[str, set[str]] = {}
    for n in range(40):
        t = tripbot.trip(n)
        result = await start_run(client, tripbot.spec(), t, run_id=f"trip-{n}")
        if not tripbot.cause(t):
            assert result.status == "completed"
            continue
        sealed = fold((await load_run(client, result.run_id, open_content=False)).records)
        assert str(sealed.error["message"]).startswith("«sealed:")  # content: sealed under the run's key
        opened = fold((await load_run(client, result.run_id)).records)
        recorded = failure_signature(sealed)
        assert recorded is not None and recorded.shape == message_shape(opened.error["message"])
        # From the shape the run recorded, or from its message when a reader can open it: one class.
        assert failure_signature(opened, opened.error["message"]) == failure_signature(sealed, opened.error["message"])
        classes.setdefault(tripbot.cause(t), set()).add(recorded.class_id)
    await client.close()
    assert {cause: len(ids) for cause, ids in classes.items()} == {"long stay": 1, "currency": 1, "nowhere": 1}
    assert len(set().union(*classes.values())) == 3


async def test_the_signature_names_the_failing_step_and_the_decision_before_it() -> None:
    client = await MemoryLedger().connect()
    for n in (3, 4, 7):
        await start_run(client, tripbot.spec(), tripbot.trip(n), run_id=f"trip-{n}")
    long_stay, currency, nowhere = [fold((await load_run(client, f"trip-{n}")).records) for n in (3, 4, 7)]
    await client.close()
    signatures = [failure_signature(cp, cp.error["message"]) for cp in (long_stay, currency, nowhere)]
    assert [(s.error_type, s.step, s.where) for s in signatures if s] == [
        ("ValueError", 4, "model 'scripted-trips-1'"),
        ("ValueError", 2, "model 'scripted-trips-1'"),
        ("ToolFailedError", 1, "tool 'quote'"),
    ]
    assert signatures[1] is not None and signatures[1].message == "unknown currency <str> for trip TR-<n> at <n>"
    assert [decision_step(cp) for cp in (long_stay, currency, nowhere)] == [4, 2, 0]


def test_a_run_that_did_not_fail_has_no_signature_and_an_old_run_failed_records_no_shape() -> None:
    from runledger.record.fold import Checkpoint

    assert failure_signature(Checkpoint(status="completed")) is None
    old = RunFailed(reason="exception", error=ErrorInfo(type="ValueError", message="boom 7"))
    assert "message_shape" not in old.model_dump()  # absent: the bytes of runs recorded before it
    new = RunFailed.of("exception", ErrorInfo(type="ValueError", message="boom 7"))
    assert new.message_shape == message_shape("boom 8")
    # A run recorded without a shape whose message is sealed: its class is its type and failing step alone.
    cp = Checkpoint(status="failed", error={"type": "ValueError", "message": "«sealed:A256GCM:k:x»"})
    blind = failure_signature(cp)
    assert blind is not None and blind.shape == "" and blind.where == "the run"
