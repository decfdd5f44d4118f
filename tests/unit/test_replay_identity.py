"""What an agent receives live is what it receives on replay, value for value and in key order.

The live path hands a value through ``as_recorded`` in the run's chain format; the replay path
reads it back from the event's wire bytes, or, when the content is sealed (the default), from
the plaintext its seal opens to. For any JSON value the two are the same, compared as
``json.dumps`` text without ``sort_keys`` (which is how agent code puts a result into its next
prompt), in both chain formats: 2, what new runs record, and 1, what runs recorded before chain
formats existed. The chain the events make verifies in the run's format. The same property
through a real run and a real resume: tests/integration/test_replay_identity.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from runledger.ops.verify import verify_subject
from runledger.protect.capture import DataPolicy, PayloadOpener, PayloadProtector, is_sealed
from runledger.protect.keystore import MemoryKeyStore, RunKeys
from runledger.record.canonical import (
    CHAIN_FORMAT,
    CONTENT_FORMAT,
    JCS_CHAIN_FORMAT,
    LEGACY_CHAIN_FORMAT,
    as_recorded,
    jsonable,
    recorded_chain_format,
)
from runledger.record.events import GENESIS, RunStarted, ToolCalled, decode, decode_fast, make_event
from runledger.record.records import RawRecord
from tests.unit.helpers import VERSION

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=30,
)
FORMATS = pytest.mark.parametrize("chain_format", [JCS_CHAIN_FORMAT, LEGACY_CHAIN_FORMAT], ids=["format2", "format1"])
# Values whose bytes differ between the formats: integral floats, small ones, 2**53 and beyond.
DIFFERING = {"z": 950.0, "a": {"y": 2.0, "b": [3, -0.0]}, "m": 1e16, "k": 1e-07, "big": 2**60, "f": 9007199254740993.0}
SUBJECT = "ledger.run.a.r.a"


def _chain(value: Any, chain_format: int) -> tuple[list[RawRecord], bytes]:
    """A run of ``chain_format`` (its run.started says so) whose tool step returned ``value``."""
    started = RunStarted(agent="a", version=VERSION, input=None, chain_format=recorded_chain_format(chain_format))
    first, first_data = make_event(started, run_id="r", agent="a", seq=0, prev_hash=GENESIS, chain_format=chain_format)
    body = ToolCalled(step=0, name="t", args={}, args_digest="-", output=jsonable(value))
    _, data = make_event(body, run_id="r", agent="a", seq=1, prev_hash=first.hash, chain_format=chain_format)
    return [RawRecord(1, SUBJECT, first_data), RawRecord(2, SUBJECT, data)], data


def _replayed(value: Any, chain_format: int) -> Any:
    raws, data = _chain(value, chain_format)
    verified = verify_subject(SUBJECT, raws)
    assert verified.ok and verified.chain_format == chain_format, verified
    fast = decode_fast(data).payload["output"]
    slow = decode(data).payload["output"]
    assert json.dumps(fast) == json.dumps(slow)
    return fast


def _unsealed(value: Any, chain_format: int) -> Any:
    """``value`` recorded as a step's output is recorded by default (sealed, serialized in the chain's
    format: CONTENT_FORMAT, as the run's writer sets it) and opened as a resume opens it."""
    keys = RunKeys.generate("a.r")
    store = MemoryKeyStore()
    store.keys[keys.kid] = keys
    body = ToolCalled(step=0, name="t", args={}, args_digest="-", output=jsonable(value))

    async def round_trip() -> Any:
        token = CONTENT_FORMAT.set(chain_format)
        try:
            recorded = await PayloadProtector(DataPolicy("full"), keys).protect(body)
        finally:
            CONTENT_FORMAT.reset(token)
        assert value is None or is_sealed(recorded.output), recorded.output  # None is recorded as absent
        return await PayloadOpener(store).open_value(recorded.output)

    return asyncio.run(round_trip())


def test_new_runs_record_format_2() -> None:
    assert CHAIN_FORMAT == JCS_CHAIN_FORMAT  # the format the first test below is about


@FORMATS
@settings(max_examples=200, deadline=None)
@given(value=JSON)
@example(value=DIFFERING)
def test_live_and_replayed_values_serialize_to_the_same_text(value: Any, chain_format: int) -> None:
    live = as_recorded(jsonable(value), chain_format)
    assert json.dumps(live) == json.dumps(_replayed(value, chain_format))


@FORMATS
@settings(max_examples=60, deadline=None)
@given(value=JSON)
@example(value=DIFFERING)
def test_live_and_unsealed_values_serialize_to_the_same_text(value: Any, chain_format: int) -> None:
    live = as_recorded(jsonable(value), chain_format)
    assert json.dumps(live) == json.dumps(_unsealed(value, chain_format))


@FORMATS
def test_an_unsorted_dict_reaches_the_agent_as_the_record_returns_it(chain_format: int) -> None:
    value = {"z": 1, "a": {"y": 2.0, "b": [3]}, "m": 1e16, "k": 1e-07}
    assert json.dumps(as_recorded(value, chain_format)) == json.dumps(_replayed(value, chain_format))
    assert json.dumps(as_recorded(value, chain_format)) == json.dumps(_unsealed(value, chain_format))
    assert list(as_recorded(value, chain_format)) == ["a", "k", "m", "z"]


def test_the_formats_differ_where_the_agent_would_see_it() -> None:
    """The property is not vacuous across formats: format 2 hands back ``950`` for ``950.0``."""
    assert json.dumps(as_recorded(DIFFERING, JCS_CHAIN_FORMAT)["z"]) == "950"
    assert json.dumps(as_recorded(DIFFERING, LEGACY_CHAIN_FORMAT)["z"]) == "950.0"
