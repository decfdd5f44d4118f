"""What an agent receives live is what it receives in a real sandbox: the probe agent of
tests/replay_paths.py recorded on nats-server, then re-driven with its guest in a container (the
values cross the broker's socket as JSON lines), from the first model call and from the last; the
guest's typed observations come back in the branch's output and must equal live's, type and key
order at every node. The property over drawn values runs on the in-process guest
(tests/unit/test_replay_paths.py, tests/integration/test_replay_paths.py); containers are slow, so
here the values are the hostile ones."""

from __future__ import annotations

import pytest

from runledger.log.client import LedgerClient
from runledger.sandbox.containers import SandboxPool
from tests import replay_paths as probe
from tests.unit.test_replay_paths import HOSTILE

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.timeout(180)]


@pytest.mark.parametrize("fork_step", [0, 4])
async def test_a_re_drive_in_a_container_observes_what_live_observed(
    client: LedgerClient, pool: SandboxPool, fork_step: int
) -> None:
    probe.reset(HOSTILE)
    live = await probe.live(client, f"probe-box-{fork_step}")
    redriven = await probe.redriven(client, f"probe-box-{fork_step}", fork_step, pool)
    assert redriven == live, probe.differences(live, redriven)
