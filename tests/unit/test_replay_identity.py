"""What an agent receives live is what it receives on replay, value for value and in key order.

The live path hands a value through ``as_recorded``; the replay path reads it back from the
event's wire bytes. For any JSON value the two are the same, compared as ``json.dumps`` text
without ``sort_keys`` (which is how agent code puts a result into its next prompt).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runledger.record.canonical import as_recorded, jsonable
from runledger.record.events import GENESIS, ToolCalled, decode, decode_fast, make_event

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=30,
)


def _replayed(value: Any) -> Any:
    body = ToolCalled(step=0, name="t", args={}, args_digest="-", output=jsonable(value))
    _, data = make_event(body, run_id="r", agent="a", seq=0, prev_hash=GENESIS)
    fast = decode_fast(data).payload["output"]
    slow = decode(data).payload["output"]
    assert json.dumps(fast) == json.dumps(slow)
    return fast


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_live_and_replayed_values_serialize_to_the_same_text(value: Any) -> None:
    live = as_recorded(jsonable(value))
    assert json.dumps(live) == json.dumps(_replayed(value))


def test_an_unsorted_dict_reaches_the_agent_as_the_record_returns_it() -> None:
    value = {"z": 1, "a": {"y": 2.0, "b": [3]}, "m": 1e16, "k": 1e-07}
    assert json.dumps(as_recorded(value)) == json.dumps(_replayed(value))
    assert list(as_recorded(value)) == ["a", "k", "m", "z"]
