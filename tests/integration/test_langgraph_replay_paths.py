"""What a LangGraph graph observes live it observes on every path back, on a real nats-server.

The differential property test of tests/unit/test_replay_paths_langgraph.py (the same strategies and
probe graph, tests/langgraph_paths.py) with a few examples, where the path differs from the
in-memory ledger: a fresh saver reads the thread with the server's fast reader (its own decoding of
the checkpoint events), and a re-drive's host reads the parent's record from the server.
"""

from __future__ import annotations

import itertools
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runledger.integrations.langgraph import RunledgerSaver
from runledger.log.client import LedgerClient
from tests import langgraph_paths as probe
from tests.run_contract import InProcessPool
from tests.unit.test_replay_paths_langgraph import HOSTILE, VALUES, index

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ON_SERVER = settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
_ids = itertools.count()


@ON_SERVER
@example(values=HOSTILE, stop_after=3, fork_step=4)
@given(values=VALUES, stop_after=st.integers(min_value=1, max_value=6), fork_step=st.sampled_from([0, 1, 3, 4]))
async def test_a_continued_thread_its_index_and_a_re_drive_observe_what_live_observed(
    client: LedgerClient, values: dict[str, Any], stop_after: int, fork_step: int
) -> None:
    probe.reset(values)
    n = next(_ids)
    live_thread, killed = f"lgs-live-{n}", f"lgs-kill-{n}"
    saver = RunledgerSaver(client, agent=probe.spec())
    live = await probe.drive(client, live_thread, saver=saver)
    as_written = dict(saver.storage[live_thread]), dict(saver.blobs), dict(saver.writes)
    with pytest.raises(probe.Killed):
        await probe.drive(client, killed, stop_after)
    resumed = await probe.drive(client, killed)
    assert resumed == live, probe.differences(live, resumed)
    assert await index(client, live_thread) == as_written, "a fresh saver's index differs from the one that wrote it"
    with tempfile.TemporaryDirectory() as sockets:
        redriven = await probe.redriven(client, live_thread, fork_step, InProcessPool(sockets))
    assert redriven == live, probe.differences(live, redriven)
