"""runledger.integrations.langgraph's values: LangGraph's typed bytes as JSON and back, losslessly;
and the fold tolerates a thread's events (it keeps no state of them)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Interrupt, Send

from runledger.integrations.langgraph import record_to_typed, thread_run_id, typed_to_record
from runledger.record.canonical import canonical_json
from runledger.record.events import GENESIS, GraphCheckpointed, GraphWritesSaved, RunStarted, VersionTuple, make_event
from runledger.record.fold import fold

SERDE = JsonPlusSerializer()


def _through_the_record(value: Any) -> Any:
    """The value as a saver reads it back: typed bytes, the JSON tree, canonical JSON bytes, back."""
    recorded = json.loads(canonical_json(typed_to_record(SERDE.dumps_typed(value))))
    return SERDE.loads_typed(record_to_typed(recorded))


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"\x00\xff",
        {"b": 1, "a": [1, 2.5, 1.0, None, True]},
        {"$ref": "not a marker", 3: "int key", (1, 2): "tuple key"},
        [HumanMessage(content="hi", id="1"), AIMessage(content="", tool_calls=[{"name": "t", "args": {}, "id": "c"}])],
        Send("node", {"x": 1}),
        [Interrupt(value={"ask": "?"}, id="i")],
        dt.datetime(2026, 1, 2, tzinfo=dt.UTC),
        uuid.UUID(int=7),
        {1, 2, 3},
        float("-inf"),
        2**63 - 1,
    ],
)
def test_values_read_back_equal(value: Any) -> None:
    assert _through_the_record(value) == value


def test_key_order_is_kept() -> None:
    assert list(_through_the_record({"z": 1, "a": 2, "m": 3})) == ["z", "a", "m"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    """Equal, where NaN (which is not equal to itself) matches NaN, at any depth."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@given(json_values)
def test_any_plain_value_reads_back_equal(value: Any) -> None:
    assert _same(_through_the_record(value), value)


def test_thread_run_ids_are_subject_tokens() -> None:
    assert thread_run_id("T-1") == "T-1"
    assert thread_run_id("T-1", 2) == "T-1-g2"
    odd = thread_run_id("a thread/with.dots")
    assert odd.startswith("lg-") and odd == thread_run_id("a thread/with.dots")


def test_the_fold_keeps_no_state_of_a_threads_events() -> None:
    version = VersionTuple(agent_version="v", model="m", prompt_hash="p")
    bodies = [
        RunStarted(agent="langgraph", version=version, input={"thread_id": "t"}),
        GraphCheckpointed(thread_id="t", checkpoint_id="c1", header={"v": 4}, metadata={"type": "null"}),
        GraphWritesSaved(thread_id="t", checkpoint_id="c1", task_id="k", channels=["x"], writes=[{"type": "null"}]),
    ]
    events = []
    prev_hash = GENESIS
    for seq, body in enumerate(bodies):
        event, _ = make_event(body, run_id="t", agent="langgraph", seq=seq, prev_hash=prev_hash)
        events.append(event)
        prev_hash = event.hash
    cp = fold(events)
    assert cp.status == "running" and cp.next_seq == 3 and cp.steps == {} and cp.last_step == -1
