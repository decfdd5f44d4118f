"""runledger.integrations.langgraph's values: LangGraph's typed bytes as JSON and back, losslessly;
a list recorded as its tail after the parent's value splices back byte for byte; and the fold
tolerates a thread's events (it keeps no state of them)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Interrupt, Send

from runledger.errors import PayloadUnavailableError
from runledger.integrations.langgraph import RunledgerSaver, thread_run_id
from runledger.integrations.langgraph_values import TAIL, record_to_typed, splice_tail, tail_record, typed_to_record
from runledger.log.client import LedgerClient
from runledger.record.canonical import JCS_CHAIN_FORMAT, canonical_json
from runledger.record.events import GENESIS, GraphCheckpointed, GraphWritesSaved, RunStarted, VersionTuple, make_event
from runledger.record.fold import fold

SERDE = JsonPlusSerializer()
NAMES = st.text(max_size=5) | st.sampled_from(["\uffff", "\U0001011b", "\ue000", "a\U00010000", "é", ""])
CHAIN_FORMATS = (1, JCS_CHAIN_FORMAT)


def _through_the_record(value: Any, chain_format: int = JCS_CHAIN_FORMAT) -> Any:
    """The value as a saver reads it back: typed bytes, the JSON tree, canonical JSON bytes (in a run's
    chain format: RFC 8785 for new runs, the legacy form for old ones), back."""
    recorded = json.loads(canonical_json(typed_to_record(SERDE.dumps_typed(value)), chain_format))
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


@pytest.mark.parametrize("chain_format", CHAIN_FORMATS)
def test_key_order_is_kept(chain_format: int) -> None:
    assert list(_through_the_record({"z": 1, "a": 2, "m": 3}, chain_format)) == ["z", "a", "m"]
    # Sorted by code point, not by UTF-16 code units (RFC 8785's order puts the surrogate pair first):
    # the record gave these back swapped.
    assert list(_through_the_record({"\uffff": 1, "\U0001011b": 2}, chain_format)) == ["\uffff", "\U0001011b"]
    assert list(_through_the_record({"\U0001011b": 1, "\uffff": 2}, chain_format)) == ["\U0001011b", "\uffff"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=4),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    """Equal, where NaN (which is not equal to itself) matches NaN, at any depth."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)  # in the same order
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@given(json_values, st.sampled_from(CHAIN_FORMATS))
def test_any_plain_value_reads_back_equal(value: Any, chain_format: int) -> None:
    assert _same(_through_the_record(value, chain_format), value)


def _messages(n: int) -> list[Any]:
    return [
        HumanMessage(content=f"message {i}", id=str(i)) if i % 2 else AIMessage(content=f"reply {i}") for i in range(n)
    ]


def _recorded(record: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(canonical_json(record))
    return loaded


# Lengths on both sides of msgpack's array headers: fixarray (< 16), array16 (< 65,536), array32.
@pytest.mark.parametrize(("before", "after"), [(1, 2), (3, 15), (15, 16), (16, 40), (14, 70_000), (65_535, 65_536)])
def test_a_list_recorded_as_its_tail_splices_back_byte_for_byte(before: int, after: int) -> None:
    items: list[Any] = _messages(after) if after < 100 else list(range(after))
    base, full = SERDE.dumps_typed(items[:before]), SERDE.dumps_typed(items)
    record = tail_record(base, full)
    assert record is not None and record["type"] == TAIL and record["at"] == before
    assert len(record["value"]) == after - before  # only the new elements are recorded
    assert splice_tail(base, _recorded(record)) == full
    assert SERDE.loads_typed(splice_tail(base, _recorded(record))) == items


def test_only_a_list_that_extends_the_base_byte_for_byte_is_a_tail() -> None:
    items = _messages(6)
    base = SERDE.dumps_typed(items[:4])
    changed = [*items[:2], HumanMessage(content="edited", id="2"), *items[3:]]
    assert tail_record(base, SERDE.dumps_typed(changed)) is None  # an element changed: record it whole
    items[1].content = "mutated in place"  # the same object, new content: identity would miss it
    assert tail_record(base, SERDE.dumps_typed(items)) is None
    assert tail_record(base, SERDE.dumps_typed(items[:3])) is None  # shorter
    assert tail_record(SERDE.dumps_typed([]), SERDE.dumps_typed(items)) is None  # nothing to extend
    assert tail_record(SERDE.dumps_typed({"a": 1}), SERDE.dumps_typed({"a": 1, "b": 2})) is None
    assert tail_record(SERDE.dumps_typed("abc"), SERDE.dumps_typed("abcd")) is None
    same = tail_record(base, base)
    assert same is not None and same["value"] == [] and splice_tail(base, same) == base


def test_a_tail_on_the_wrong_base_is_an_error() -> None:
    items = _messages(5)
    record = tail_record(SERDE.dumps_typed(items[:3]), SERDE.dumps_typed(items))
    assert record is not None
    with pytest.raises(ValueError, match="3 elements, the parent's value has 2 elements"):
        splice_tail(SERDE.dumps_typed(items[:2]), record)
    with pytest.raises(ValueError, match="the parent's value is not a list"):
        splice_tail(SERDE.dumps_typed({"x": 1}), record)


def unconnected_client() -> LedgerClient:
    """A client that never connects: the saver's indexing needs none (and refuses what is no client)."""
    from nats.aio.client import Client

    return LedgerClient(nc=Client(), js=cast(Any, None), url="nats://unused")


async def test_a_tail_whose_parent_holds_no_list_is_unavailable() -> None:
    saver = RunledgerSaver(unconnected_client())  # indexing only: no client needed
    record = tail_record(SERDE.dumps_typed([1]), SERDE.dumps_typed([1, 2]))
    first = {
        "thread_id": "t",
        "checkpoint_id": "c1",
        "header": {"channel_versions": {"m": 1}},
        "metadata": {"type": "null"},
    }
    saver._index_checkpoint(
        {**first, "new_versions": {"m": 1}, "channels": ["m"], "values": [typed_to_record(SERDE.dumps_typed([1]))]}
    )
    second = {**first, "checkpoint_id": "c2", "new_versions": {"m": 2}, "channels": ["m"], "values": [record]}
    saver._index_checkpoint({**second, "parent_checkpoint_id": "c1"})
    assert SERDE.loads_typed(saver.blobs[("t", "", "m", 2)]) == [1, 2]
    with pytest.raises(PayloadUnavailableError, match="parent checkpoint c0 holds no earlier value of the channel"):
        saver._index_checkpoint({**second, "checkpoint_id": "c3", "parent_checkpoint_id": "c0"})


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
