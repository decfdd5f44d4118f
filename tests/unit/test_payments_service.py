"""The example payments service honors an ``Idempotency-Key``: a repeated key is answered from the
first refund (nothing refunded twice, even after a restart), another body under the same key is
refused, and a call without a key refunds every time."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from runledger.examples.refund_agent.payments import PaymentsService


def post(url: str, body: dict[str, Any], key: str | None = None) -> tuple[int, Any, str | None]:
    headers = {"Content-Type": "application/json", **({"Idempotency-Key": key} if key else {})}
    req = urllib.request.Request(f"{url}/refunds", data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read()), resp.headers.get("Idempotent-Replayed")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), None


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "payments.log"


def test_a_repeated_key_returns_the_first_refund(log: Path) -> None:
    service = PaymentsService(log).start()
    try:
        first = post(service.url, {"order": "o1", "amount": 5}, key="refund:o1")
        again = post(service.url, {"order": "o1", "amount": 5}, key="refund:o1")
        other = post(service.url, {"order": "o1", "amount": 7}, key="refund:o1")
        assert first[0] == 200 and first[2] is None
        assert again == (200, first[1], "true")
        assert other[0] == 422 and "another refund" in other[1]["error"]
        assert [c["refund_id"] for c in service.calls()] == [first[1]["refund_id"]]
        assert service.calls()[0]["idempotency_key"] == "refund:o1"
        with urllib.request.urlopen(f"{service.url}/stats", timeout=10) as resp:
            assert json.loads(resp.read()) == {"refunds": 1, "replayed": 1}
        # Without a key the service is not idempotent: every call refunds.
        assert post(service.url, {"order": "o2", "amount": 1})[0] == 200
        assert post(service.url, {"order": "o2", "amount": 1})[0] == 200
        assert len(service.calls()) == 3
    finally:
        service.stop()
    restarted = PaymentsService(log).start()  # the keys are in the log
    try:
        assert post(restarted.url, {"order": "o1", "amount": 5}, key="refund:o1") == (200, first[1], "true")
        assert len(restarted.calls()) == 3
    finally:
        restarted.stop()
