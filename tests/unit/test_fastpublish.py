"""The lean publish path's ack reader: the same PubAck or error as nats-py's ``js.publish``."""

from __future__ import annotations

import json
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg
from nats.js.api import PubAck
from nats.js.errors import APIError, BadRequestError, ServiceUnavailableError

from runledger.log.fastpublish import inbox_for, parse_ack


def _reply(data: bytes, headers: dict[str, str] | None = None) -> Msg:
    return Msg(_client=None, subject="_INBOX.x.1", data=data, headers=headers)  # type: ignore[arg-type]


def _nats_py(data: bytes) -> PubAck:
    """What nats-py's js.publish makes of the same reply (nats/js/client.py)."""
    resp = json.loads(data)
    if "error" in resp:
        raise APIError.from_error(resp["error"])
    return PubAck.from_response(resp)


@pytest.mark.parametrize(
    "data",
    [
        b'{"stream":"LEDGER","seq":1}',
        b'{"stream":"LEDGER","seq":18446744073709551615,"duplicate":true}',
        b'{"stream":"LEDGER","domain":"hub","seq":7}',
        b'{"stream":"LEDGER","seq":7,"duplicate":false}',
        b'{"stream":"LEDGER","seq":9,"batch":"b1","count":3}',
        b'{"stream": "LEDGER", "seq": 4}',
    ],
)
def test_an_ack_reads_as_nats_py_reads_it(data: bytes) -> None:
    assert parse_ack(_reply(data)) == _nats_py(data)


@pytest.mark.parametrize(
    ("code", "err_code", "kind"),
    [(400, 10071, BadRequestError), (503, 10008, ServiceUnavailableError), (500, 10999, APIError)],
)
def test_an_error_ack_raises_what_nats_py_raises(code: int, err_code: int, kind: type[APIError]) -> None:
    data = json.dumps({"error": {"code": code, "err_code": err_code, "description": "wrong last sequence: 5"}})
    with pytest.raises(kind) as info:
        parse_ack(_reply(data.encode()))
    assert info.value.err_code == err_code and info.value.code == code
    with pytest.raises(kind):
        _nats_py(data.encode())


def test_no_responders_is_no_stream() -> None:
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        parse_ack(_reply(b"", {"Status": "503"}))


def test_only_a_plain_jetstream_context_is_served() -> None:
    class StandIn:
        async def publish(self, *args: Any, **kwargs: Any) -> PubAck:
            raise AssertionError

    assert inbox_for(StandIn()) is None
