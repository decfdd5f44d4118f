"""What crosses the sandbox channel is what the record holds: redacted, never a credential."""

from __future__ import annotations

from typing import Any

import pytest

import runledger.sandbox.broker as broker_module
from runledger.log.client import LedgerClient
from runledger.sandbox.rerun import Rerunner, RerunRequest
from runledger.sdk.lifecycle import start_run
from tests.sandbox_agents.secrets import API_KEY, CARD, spec

pytestmark = [pytest.mark.integration, pytest.mark.docker]


async def test_no_planted_secret_crosses_the_channel(
    client: LedgerClient, rerunner: Rerunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    traffic: list[bytes] = []
    original_encode = broker_module.encode
    original_read = broker_module.read_message

    def tee_encode(message: dict[str, Any]) -> bytes:
        data = original_encode(message)
        traffic.append(data)
        return data

    async def tee_read(reader: Any, *limits: Any) -> Any:
        message = await original_read(reader, *limits)
        traffic.append(repr(message).encode())
        return message

    monkeypatch.setattr(broker_module, "encode", tee_encode)
    monkeypatch.setattr(broker_module, "read_message", tee_read)
    parent = await start_run(client, spec(), None, run_id="secret-parent")
    assert parent.status == "completed"
    result = await rerunner.rerun(
        RerunRequest(
            parent_run_id="secret-parent", agent="tests.sandbox_agents.secrets:spec", mode="redrive", fork_step=1
        )
    )
    assert result.status == "completed", result.error
    seen = b"".join(traffic)
    assert b"fetch_profile" in seen and b"Ana" in seen  # the channel was really observed
    assert API_KEY.encode() not in seen
    assert CARD.encode() not in seen and CARD.replace(" ", "").encode() not in seen
    assert b"redacted" in seen
