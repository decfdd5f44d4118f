"""What an agent receives live is what it receives on every path back, for any JSON-like value.

A differential property test (tests/replay_paths.py has the probe agent and the paths): Hypothesis
draws the values a model reply (a framework object and a tool call's argument dict), a read tool and
an effect hand the agent, and a value the agent builds itself; the agent's typed observations (type
and key order at every node) live are compared with those of a resume after a kill at a random call,
the blocking ``SyncRun`` (live and resumed), the in-process replayer, and a re-drive through the
broker to the sandbox guest's ``RemoteRun`` (in-process here: a real container in
tests/integration/sandbox/test_replay_paths.py). On the in-memory ledger; the same on nats-server in
tests/integration/test_replay_paths.py.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runledger.log.memory import MemoryLedger
from tests import replay_paths as probe
from tests.run_contract import InProcessPool

# Names: any text, beyond U+FFFF included (JCS sorts those by UTF-16 code units).
NAMES = st.text(max_size=6) | st.sampled_from(["\U0001f600", "\uffff", "a\U00010000", "é", ""])
NUMBERS = (
    st.integers(min_value=-(2**80), max_value=2**80)
    | st.integers(min_value=-(10**6), max_value=10**6).map(float)  # whole-number floats: 210.0
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([-0.0, 0.0, 1e16, 1e-7, 2.0**53, 9007199254740993.0])
)
JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(NAMES, children, max_size=4)  # in the order drawn: not sorted
    ),
    max_leaves=16,
)
VALUES = st.fixed_dictionaries(
    {
        "reply": JSON,
        "args": st.dictionaries(NAMES, JSON, max_size=5),  # a tool call's arguments: a dict
        "result": JSON,
        "effect": JSON,
        "made": JSON,
    }
)
# Unsorted keys and whole-number floats in every position: what broke Pydantic AI resumes and the replayer.
HOSTILE = {
    "reply": {"tag": "a1", "n": 1, "usd": 210.0, "z": {"y": -0.0, "b": (1, 2.0)}},
    "args": {"tag": "a1", "n": 1, "\U0001f600": 2**60, "\uffff": []},
    "result": {"usd": 210.0, "cents": [21000, 0.5], "a": {}},
    "effect": {"paid": 30.0, "ok": True},
    "made": {"usd": 210.0, "total": [1.0, 2.5]},
}
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def on_memory(drive: Any) -> Any:
    async def go() -> Any:
        client = await MemoryLedger().connect()
        try:
            return await drive(client)
        finally:
            await client.close()

    return asyncio.run(go())


@PROPERTY
@example(values=HOSTILE, stop_after=2)
@given(values=VALUES, stop_after=st.integers(min_value=1, max_value=5))
def test_a_resume_after_a_kill_observes_what_live_observed(values: dict[str, Any], stop_after: int) -> None:
    probe.reset(values)

    async def drive(client: Any) -> tuple[str, str]:
        return await probe.live(client, "p-live"), await probe.resumed(client, "p-kill", stop_after)

    live, resumed = on_memory(drive)
    assert resumed == live, probe.differences(live, resumed)
    assert len(probe.ACTED) == 2, "the effect ran once in each run"


@PROPERTY
@example(values=HOSTILE, stop_after=4)
@given(values=VALUES, stop_after=st.integers(min_value=1, max_value=5))
def test_sync_run_live_and_resumed_observes_what_the_async_run_observed(
    values: dict[str, Any], stop_after: int
) -> None:
    probe.reset(values)

    async def drive(client: Any) -> tuple[str, str, str]:
        return (
            await probe.live(client, "p-live"),
            await probe.live(client, "p-sync", probe.sync_spec),
            await probe.resumed(client, "p-sync-kill", stop_after, probe.sync_spec),
        )

    live, sync_live, sync_resumed = on_memory(drive)
    assert sync_live == live, probe.differences(live, sync_live)
    assert sync_resumed == live, probe.differences(live, sync_resumed)


@PROPERTY
@example(values=HOSTILE)
@given(values=VALUES)
def test_the_replayer_replays_unchanged_code_clean_and_observes_what_live_observed(values: dict[str, Any]) -> None:
    probe.reset(values)

    async def drive(client: Any) -> tuple[str, Any, str]:
        live = await probe.live(client, "p-live")
        result, observed = await probe.replayed(client, "p-live")
        return live, result, observed

    live, result, observed = on_memory(drive)
    assert result.ok, str(result)
    assert observed == live, probe.differences(live, observed)


@PROPERTY
@example(values=HOSTILE, fork_step=0)
@example(values=HOSTILE, fork_step=4)
@given(values=VALUES, fork_step=st.sampled_from([0, 1, 3, 4]))
def test_a_re_drive_through_the_sandbox_guest_observes_what_live_observed(
    values: dict[str, Any], fork_step: int
) -> None:
    probe.reset(values)

    async def drive(client: Any) -> tuple[str, str]:
        live = await probe.live(client, "p-live")
        with tempfile.TemporaryDirectory() as sockets:
            return live, await probe.redriven(client, "p-live", fork_step, InProcessPool(sockets))

    live, redriven = on_memory(drive)
    assert redriven == live, probe.differences(live, redriven)
