"""Stream settings are applied on connect when they changed, and left alone when they did not."""

from __future__ import annotations

from unittest import mock

import pytest

from runledger.log.client import connect
from runledger.log.streams import DAY, StreamSettings
from runledger.log.subjects import LEDGER_STREAM

pytestmark = pytest.mark.integration


async def test_connect_updates_a_stream_only_when_a_setting_changed(nats_url: str) -> None:
    first = await connect(nats_url)
    assert (await first.js.stream_info(LEDGER_STREAM)).config.max_age == 90 * DAY
    await first.close()

    with mock.patch("nats.js.JetStreamContext.update_stream", autospec=True) as update:
        again = await connect(nats_url)  # what every agent does: nothing to change, nothing sent
        await again.close()
    assert update.call_count == 0

    shorter = await connect(nats_url, settings=StreamSettings(retention_days=30))
    info = await shorter.js.stream_info(LEDGER_STREAM)
    assert info.config.max_age == 30 * DAY and info.config.deny_delete and info.config.num_replicas == 1
    await shorter.close()
