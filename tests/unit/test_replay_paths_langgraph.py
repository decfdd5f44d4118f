"""What a LangGraph graph observes live it observes on every path back, for any JSON-like value.

The differential property test of tests/unit/test_replay_paths.py for LangGraph and LangChain (the
probe graph: tests/langgraph_paths.py): Hypothesis draws the ``AIMessage`` a chat model answers (its
content, a text or content blocks; a tool call's argument dict in any key order; metadata with
whole-number floats), a tool's and an effect's results and a value a node writes into the graph's
state. What the nodes observed live on ``RunledgerSaver`` is compared, typed at every node, with

- the same thread killed after a random observation and continued by LangGraph from its checkpoint
  on a fresh saver (its index loaded from the log: the saver's values, channel values and pending
  writes as the record keeps them), and the fresh saver's index itself, byte for byte;
- a re-drive of the recorded thread through the broker to the guest's ``RedriveSaver`` (in-process),
  forked at a random step: the model's replies rebuilt from the record, or answered live on the host.

On the in-memory ledger.
"""

from __future__ import annotations

import itertools
import tempfile
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from runledger.integrations.langgraph import RunledgerSaver
from tests import langgraph_paths as probe
from tests.run_contract import InProcessPool
from tests.unit.test_replay_paths import NAMES, on_memory
from tests.unit.test_replay_paths import PROPERTY as PROBE_PROPERTY

# What a graph's state can hold with any checkpointer: LangGraph's serializer (msgpack) refuses an
# integer beyond 64 bits and reads a tuple back as a list, with its own InMemorySaver as with ours.
NUMBERS = (
    st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.integers(min_value=-(10**6), max_value=10**6).map(float)  # whole-number floats: 210.0
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([-0.0, 1e16, 1e-7, 2.0**53])
)
JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(NAMES, children, max_size=4),
    max_leaves=12,
)
OBJECTS = st.dictionaries(NAMES, JSON, max_size=4)  # in the order drawn: not sorted
CONTENT = st.text(max_size=12) | st.lists(
    st.builds(lambda extra, text: {**extra, "type": "text", "text": text}, OBJECTS, st.text(max_size=8)), max_size=3
)
USAGE = st.none() | st.builds(
    lambda i, o: {"input_tokens": i, "output_tokens": o, "total_tokens": i + o},
    st.integers(0, 10**6), st.integers(0, 10**6),
)  # fmt: skip


def message(calls: bool) -> st.SearchStrategy[dict[str, Any]]:
    """The fields of an ``AIMessage`` as a provider's integration builds one."""
    call = st.fixed_dictionaries({"name": st.just("probe"), "args": OBJECTS, "id": st.text(min_size=1, max_size=6)})
    fields = {
        "content": CONTENT,
        # An id of the model's: LangChain names a reply without one afresh at every call ("lc_run--<uuid>").
        "id": st.text(min_size=1, max_size=8).filter(lambda i: not i.startswith(("run-", "lc_run"))),
        "response_metadata": OBJECTS,
        "additional_kwargs": OBJECTS,
        "usage_metadata": USAGE,
    }
    if calls:
        fields["tool_calls"] = st.lists(call, min_size=1, max_size=1)
    return st.fixed_dictionaries(fields)


VALUES = st.fixed_dictionaries(
    {"reply": message(calls=True), "final": message(calls=False), "result": JSON, "effect": JSON, "data": JSON}
)
HOSTILE = {
    "reply": {
        "content": [{"type": "text", "text": "hi", "extras": {"b": 1.0, "a": 2}}], "id": "ai-1",
        "tool_calls": [{"name": "probe", "args": {"tag": "a1", "n": 1, "usd": 210.0}, "id": "call-1"}],
        "response_metadata": {"z": 1.0, "finish_reason": "tool_calls"}, "additional_kwargs": {"y": [1.5, 2.0]},
    },
    # Doubles JCS writes as digits beyond 64 bits: read back as integers, msgpack refused them live.
    "final": {"content": "done", "id": "ai-2", "response_metadata": {"b": 2, "a": 1.0},
              "additional_kwargs": {"low": -9.223372036854776e18, "high": 2e19}},
    "result": {"usd": 210.0, "cents": [21000, 0.5], "a": {}},
    "effect": {"paid": 30.0, "ok": True},
    # Names in code point order that RFC 8785 sorts the other way (by UTF-16 code units).
    "data": {"z": 1, "a": -0.0, "big": 2**63, "usd": 210.0, "names": {"\uffff": 1, "\U0001011b": [2.0]}},
}  # fmt: skip
PROPERTY = settings(PROBE_PROPERTY, max_examples=40)  # each example drives two threads of a four-node graph
_threads = itertools.count()


async def index(client: Any, thread: str) -> tuple[Any, Any, Any]:
    """A fresh saver's index of the thread (what a new process reads from the log): its checkpoints,
    channel values and pending writes, as LangGraph's serializer's bytes."""
    saver = RunledgerSaver(client, agent=probe.spec())
    await saver.aget_tuple({"configurable": {"thread_id": thread}})
    return dict(saver.storage[thread]), dict(saver.blobs), dict(saver.writes)


@PROPERTY
@example(values=HOSTILE, stop_after=3)
@example(values=HOSTILE, stop_after=5)
@given(values=VALUES, stop_after=st.integers(min_value=1, max_value=6))
def test_a_thread_continued_after_a_kill_observes_what_live_observed(values: dict[str, Any], stop_after: int) -> None:
    probe.reset(values)
    live_thread, killed = f"lg-live-{next(_threads)}", f"lg-kill-{next(_threads)}"

    async def drive(client: Any) -> tuple[Any, Any, Any, Any]:
        saver = RunledgerSaver(client, agent=probe.spec())
        live = await probe.drive(client, live_thread, saver=saver)
        as_written = dict(saver.storage[live_thread]), dict(saver.blobs), dict(saver.writes)
        try:
            await probe.drive(client, killed, stop_after)
        except probe.Killed:
            pass
        else:
            raise AssertionError("the first drive was not killed")
        resumed = await probe.drive(client, killed)
        return live, resumed, as_written, await index(client, live_thread)

    live, resumed, as_written, as_read = on_memory(drive)
    assert resumed == live, probe.differences(live, resumed)
    assert as_read == as_written, "a fresh saver's index differs from the one that wrote the thread"
    assert len(probe.ACTED) == 2, "the effect ran once in each thread"


@PROPERTY
@example(values=HOSTILE, fork_step=0)
@example(values=HOSTILE, fork_step=4)
@given(values=VALUES, fork_step=st.sampled_from([0, 1, 3, 4]))
def test_a_re_drive_of_the_thread_observes_what_live_observed(values: dict[str, Any], fork_step: int) -> None:
    probe.reset(values)
    thread = f"lg-rd-{next(_threads)}"

    async def drive(client: Any) -> tuple[Any, Any]:
        live = await probe.drive(client, thread)
        with tempfile.TemporaryDirectory() as sockets:
            return live, await probe.redriven(client, thread, fork_step, InProcessPool(sockets))

    live, redriven = on_memory(drive)
    assert redriven == live, probe.differences(live, redriven)
