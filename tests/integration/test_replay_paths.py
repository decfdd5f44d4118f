"""What an agent receives live is what it receives on every path back, on a real nats-server: the
differential property test of tests/unit/test_replay_paths.py (the same strategies and probe agent)
with fewer examples, through a resume after a kill, ``SyncRun``, the replayer (its recording
exported from the server) and a re-drive through the broker to an in-process guest. A real
container's guest: tests/integration/sandbox/test_replay_paths.py."""

from __future__ import annotations

import itertools
import tempfile
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runledger.log.client import LedgerClient
from tests import replay_paths as probe
from tests.run_contract import InProcessPool
from tests.unit.test_replay_paths import HOSTILE, VALUES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ON_SERVER = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
_ids = itertools.count()


def run_id(kind: str) -> str:
    """A fresh run id (every example shares the server)."""
    return f"probe-{kind}-{next(_ids)}"


@ON_SERVER
@example(values=HOSTILE, stop_after=2)
@given(values=VALUES, stop_after=st.integers(min_value=1, max_value=5))
async def test_a_resume_after_a_kill_observes_what_live_observed(
    client: LedgerClient, values: dict[str, Any], stop_after: int
) -> None:
    probe.reset(values)
    live = await probe.live(client, run_id("live"))
    resumed = await probe.resumed(client, run_id("kill"), stop_after)
    assert resumed == live, probe.differences(live, resumed)
    sync_resumed = await probe.resumed(client, run_id("sync"), stop_after, probe.sync_spec)
    assert sync_resumed == live, probe.differences(live, sync_resumed)
    assert len(probe.ACTED) == 3, "the effect ran once in each run"


@ON_SERVER
@example(values=HOSTILE, fork_step=0)
@given(values=VALUES, fork_step=st.sampled_from([0, 1, 3, 4]))
async def test_the_replayer_and_a_re_drive_observe_what_live_observed(
    client: LedgerClient, values: dict[str, Any], fork_step: int
) -> None:
    probe.reset(values)
    recorded = run_id("live")
    live = await probe.live(client, recorded)
    result, replayed = await probe.replayed(client, recorded)
    assert result.ok, str(result)
    assert replayed == live, probe.differences(live, replayed)
    with tempfile.TemporaryDirectory() as sockets:
        redriven = await probe.redriven(client, recorded, fork_step, InProcessPool(sockets))
    assert redriven == live, probe.differences(live, redriven)
