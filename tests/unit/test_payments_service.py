"""The example payments service honors an ``Idempotency-Key``: a repeated key is answered from the
first refund (nothing refunded twice, even after a restart), another body under the same key is
refused, and a call without a key refunds every time. With fencing tokens kept
(runledger.sdk.fencing), a call with a token older than one admitted for its key is refused."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from runledger import FencingTokens
from runledger.examples.refund_agent.payments import PaymentsService


def post(
    url: str, body: dict[str, Any], key: str | None = None, token: int | None = None
) -> tuple[int, Any, str | None]:
    headers = {"Content-Type": "application/json", **({"Idempotency-Key": key} if key else {})}
    if token is not None:
        headers["Fencing-Token"] = str(token)
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
            assert json.loads(resp.read()) == {"refunds": 1, "replayed": 1, "stale_refused": 0}
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


def test_a_call_with_an_older_fencing_token_than_one_admitted_is_refused(log: Path) -> None:
    """With fencing tokens kept and idempotency keys ignored: what the tokens alone do."""
    tokens = FencingTokens(log.parent / "fencing.db")
    service = PaymentsService(log, fencing=tokens, honour_keys=False).start()
    try:
        newer = post(service.url, {"order": "o1", "amount": 5}, key="refund:o1", token=42)
        older = post(service.url, {"order": "o1", "amount": 5}, key="refund:o1", token=41)
        retry = post(service.url, {"order": "o1", "amount": 5}, key="refund:o1", token=42)
        other_key = post(service.url, {"order": "o2", "amount": 5}, key="refund:o2", token=1)
        malformed = post(service.url, {"order": "o3", "amount": 5}, token=7)  # a token without its key
        assert newer[0] == 200 and retry[0] == 200 and other_key[0] == 200  # the key ignored: the retry refunds
        assert older[0] == 409 and (older[1]["token"], older[1]["highest"]) == (41, 42)
        assert "stale fencing token 41 for key 'refund:o1'" in older[1]["error"]
        assert malformed[0] == 400 and "Idempotency-Key" in malformed[1]["error"]
        assert [c["order"] for c in service.calls()] == ["o1", "o1", "o2"] and service.stale_refused == 1
    finally:
        service.stop()
        tokens.close()
