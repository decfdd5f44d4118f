"""What an OpenAI Agents SDK agent receives live it receives on every path back, for any value.

The differential property test of tests/unit/test_replay_paths.py for
runledger.integrations.openai_agents (the probe agent and its fake Responses API:
tests/openai_agents_paths.py): Hypothesis draws what the server answers (function calls whose
arguments are unsorted objects with whole-number floats and names beyond U+FFFF, a final text, a field
a compatible server adds) and what the function tool returns (any JSON value: unsorted objects,
whole-number floats), and what the agent was handed live (its conversation's items, the raw responses'
output items, the final output; typed at every node) is compared with what a resume after a kill at a
random request and the in-process replayer hand it. On the in-memory ledger.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests import openai_agents_paths as probe
from tests.replay_paths import differences
from tests.unit.test_replay_paths import JSON, NAMES, on_memory
from tests.unit.test_replay_paths import PROPERTY as PROBE_PROPERTY

OBJECTS = st.dictionaries(NAMES, JSON, max_size=4)  # in the order drawn: not sorted


def _call(n: int, args: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": "probe",
             "arguments": json.dumps(args, ensure_ascii=False), "status": "completed"}]  # fmt: skip


def _message(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": text, "annotations": []}]}]  # fmt: skip


VALUES = st.fixed_dictionaries(
    {
        "answers": st.tuples(
            OBJECTS.map(lambda a: _call(1, a)), OBJECTS.map(lambda a: _call(2, a)), st.text(max_size=12).map(_message)
        ).map(list),
        "results": st.lists(JSON, min_size=2, max_size=2),
        "extra": JSON,
    }
)
HOSTILE = {
    "answers": [_call(1, {"z": 1, "usd": 210.0, "\U0001f600": [2.0, -0.0]}), _call(2, {"b": 2, "a": {"y": 1.0}}),
                _message("done \U0001f600")],
    "results": [{"total": 30.0, "items": {"z": 1, "a": 2.0}}, [1.0, {"b": 2.0, "a": 1}]],
    "extra": {"usd": 210.0, "a": {}},
}  # fmt: skip
PROPERTY = settings(PROBE_PROPERTY, max_examples=25)  # each example drives three requests live and again
_ids = itertools.count()


@PROPERTY
@example(values=HOSTILE, stop_at=2)
@example(values=HOSTILE, stop_at=3)
@given(values=VALUES, stop_at=st.integers(min_value=1, max_value=probe.REQUESTS))
def test_a_resume_after_a_kill_observes_what_live_observed(values: dict[str, Any], stop_at: int) -> None:
    probe.reset(values)
    n = next(_ids)

    async def drive(ledger: Any) -> tuple[str, str]:
        live = await probe.live(ledger, f"oaa-live-{n}")
        return live, await probe.resumed(ledger, f"oaa-kill-{n}", stop_at)

    live, resumed = on_memory(drive)
    assert resumed == live, differences(live, resumed)


@PROPERTY
@example(values=HOSTILE)
@given(values=VALUES)
def test_the_replayer_replays_unchanged_code_clean_and_observes_what_live_observed(values: dict[str, Any]) -> None:
    probe.reset(values)
    n = next(_ids)

    async def drive(ledger: Any) -> tuple[str, Any, str]:
        live = await probe.live(ledger, f"oaa-live-{n}")
        result, observed = await probe.replayed(ledger, f"oaa-live-{n}")
        return live, result, observed

    live, result, observed = on_memory(drive)
    assert result.ok, str(result)
    assert observed == live, differences(live, observed)
